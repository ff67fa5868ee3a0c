#include "metronome/model/internal/gguf_loader.h"

#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "metronome/base/errors.h"
#include "metronome/base/mapped_file.h"
#include "metronome/model/gguf.h"
#include "metronome/model/model.h"

namespace metronome::model {
namespace internal {
namespace {

constexpr std::int64_t kMaxQDim = std::int64_t{1} << 20;

// Converts a metadata integer to the int fields of ModelConfig. Range checks beyond "fits an int"
// are ModelConfig::Validate's job.
int ToInt(const GgufFile& g, const std::string& key, std::int64_t v) {
  if (v < 0 || v > INT_MAX) {
    throw LoadError(g.source() + ": metadata key '" + key + "' = " + std::to_string(v) +
                    " is out of range");
  }
  return static_cast<int>(v);
}

// double -> float without the undefined behaviour of converting an out-of-range value.
float ToFloat(double d) {
  if (d > FLT_MAX) return HUGE_VALF;
  if (d < -FLT_MAX) return -HUGE_VALF;
  return static_cast<float>(d);  // NaN stays NaN
}

int RequireIntField(const GgufFile& g, const std::string& key) {
  return ToInt(g, key, g.RequireInt(key));
}

std::string ShapeString(const std::vector<std::uint64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

ModelConfig ReadConfig(const GgufFile& g) {
  const std::string arch = g.RequireString("general.architecture");
  ModelConfig c;
  if (arch == "llama") {
    c.architecture = Architecture::kLlama;
    c.rope_style = RopeStyle::kInterleaved;
    c.has_qkv_bias = false;
  } else if (arch == "qwen2") {
    c.architecture = Architecture::kQwen2;
    c.rope_style = RopeStyle::kNeox;
    c.has_qkv_bias = true;
  } else {
    throw LoadError(g.source() + ": unsupported architecture '" + arch +
                    "' (supported: llama, qwen2)");
  }
  const auto key = [&arch](const char* suffix) { return arch + "." + suffix; };
  c.name = std::filesystem::path(g.source()).filename().string();
  c.dim = RequireIntField(g, key("embedding_length"));
  c.num_layers = RequireIntField(g, key("block_count"));
  c.ffn_dim = RequireIntField(g, key("feed_forward_length"));
  c.num_heads = RequireIntField(g, key("attention.head_count"));
  const auto kv_heads = g.GetInt(key("attention.head_count_kv"));
  c.num_kv_heads = kv_heads ? ToInt(g, key("attention.head_count_kv"), *kv_heads) : c.num_heads;
  c.context_length = RequireIntField(g, key("context_length"));
  if (const auto kl = g.GetInt(key("attention.key_length"))) {
    c.head_dim = ToInt(g, key("attention.key_length"), *kl);
  } else if (c.num_heads > 0) {
    if (c.dim % c.num_heads != 0) {
      throw LoadError(g.source() + ": embedding_length " + std::to_string(c.dim) +
                      " is not a multiple of head_count " + std::to_string(c.num_heads));
    }
    c.head_dim = c.dim / c.num_heads;
  }
  if (const auto rd = g.GetInt(key("rope.dimension_count"))) {
    c.rope_dim = ToInt(g, key("rope.dimension_count"), *rd);
  }
  const auto eps = g.GetFloat(key("attention.layer_norm_rms_epsilon"));
  if (!eps) {
    throw LoadError(g.source() + ": missing metadata key '" +
                    key("attention.layer_norm_rms_epsilon") + "'");
  }
  c.rms_eps = ToFloat(*eps);
  c.rope_theta = g.GetFloat(key("rope.freq_base")).value_or(10000.0);

  // The vocabulary size is implied by the token list; files without one fall back to the output
  // (or embedding) matrix, whose shape is checked against it later anyway.
  const GgufValue* tokens = g.Find("tokenizer.ggml.tokens");
  if (const auto* list = tokens ? std::get_if<std::vector<std::string>>(tokens) : nullptr) {
    if (list->size() > INT_MAX) throw LoadError(g.source() + ": token list is too long");
    c.vocab_size = static_cast<int>(list->size());
  } else {
    const GgufTensorInfo* t = g.FindTensor("output.weight");
    if (t == nullptr) t = g.FindTensor("token_embd.weight");
    if (t == nullptr) throw LoadError(g.source() + ": missing tensor 'token_embd.weight'");
    if (t->shape.size() != 2 || t->shape[1] > INT_MAX) {
      throw LoadError(g.source() + ": tensor '" + t->name + "' has shape " + ShapeString(t->shape) +
                      ", expected [embedding_length, vocab]");
    }
    c.vocab_size = static_cast<int>(t->shape[1]);
  }
  c.tied_embeddings = g.FindTensor("output.weight") == nullptr;

  // Validate bounds each factor; the product must also stay far from int overflow.
  if (static_cast<std::int64_t>(c.num_heads) * c.head_dim > kMaxQDim) {
    throw LoadError(g.source() + ": head_count " + std::to_string(c.num_heads) + " x key_length " +
                    std::to_string(c.head_dim) + " is too large");
  }
  try {
    c.Validate(g.source());
  } catch (const ConfigError& e) {
    throw LoadError(e.what());  // the message already names the source and the field
  }
  return c;
}

// Visits every tensor the runtime needs with its llama.cpp name, its ggml shape and where it goes
// in `w` (null destinations when `w` is null, for the validation pass).
void ForEachTensor(
    const ModelConfig& c, ModelWeights* w,
    const std::function<void(const std::string&, std::vector<std::uint64_t>, float*)>& fn) {
  const auto dim = static_cast<std::uint64_t>(c.dim);
  const auto q = static_cast<std::uint64_t>(c.q_dim());
  const auto kv = static_cast<std::uint64_t>(c.kv_dim());
  const auto ffn = static_cast<std::uint64_t>(c.ffn_dim);
  const auto vocab = static_cast<std::uint64_t>(c.vocab_size);
  const auto at = [w](float* base, std::uint64_t offset) -> float* {
    return w == nullptr ? nullptr : base + offset;
  };
  fn("token_embd.weight", {dim, vocab}, w ? w->token_embedding : nullptr);
  fn("output_norm.weight", {dim}, w ? w->final_norm : nullptr);
  if (!c.tied_embeddings) fn("output.weight", {dim, vocab}, w ? w->output : nullptr);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LayerWeights* lw = w ? &w->layers[static_cast<std::size_t>(l)] : nullptr;
    float* wqkv = lw ? lw->wqkv : nullptr;
    float* bqkv = lw ? lw->bqkv : nullptr;
    float* gate_up = lw ? lw->w_gate_up : nullptr;
    fn(p + "attn_norm.weight", {dim}, lw ? lw->attn_norm : nullptr);
    // Fused rows: Wq, then Wk, then Wv (each row-major [out, in] = ggml [in, out]).
    fn(p + "attn_q.weight", {dim, q}, at(wqkv, 0));
    fn(p + "attn_k.weight", {dim, kv}, at(wqkv, q * dim));
    fn(p + "attn_v.weight", {dim, kv}, at(wqkv, (q + kv) * dim));
    if (c.has_qkv_bias) {
      fn(p + "attn_q.bias", {q}, at(bqkv, 0));
      fn(p + "attn_k.bias", {kv}, at(bqkv, q));
      fn(p + "attn_v.bias", {kv}, at(bqkv, q + kv));
    }
    fn(p + "attn_output.weight", {q, dim}, lw ? lw->wo : nullptr);
    fn(p + "ffn_norm.weight", {dim}, lw ? lw->ffn_norm : nullptr);
    fn(p + "ffn_gate.weight", {dim, ffn}, at(gate_up, 0));
    fn(p + "ffn_up.weight", {dim, ffn}, at(gate_up, ffn * dim));
    fn(p + "ffn_down.weight", {ffn, dim}, lw ? lw->w_down : nullptr);
  }
}

const GgufTensorInfo& ExpectTensor(const GgufFile& g, const std::string& name,
                                   const std::vector<std::uint64_t>& shape) {
  const GgufTensorInfo* t = g.FindTensor(name);
  if (t == nullptr) throw LoadError(g.source() + ": missing tensor '" + name + "'");
  if (t->shape != shape) {
    throw LoadError(g.source() + ": tensor '" + name + "' has shape " + ShapeString(t->shape) +
                    ", expected " + ShapeString(shape) + " (ggml order) for this configuration");
  }
  return *t;
}

// -1 for absent keys and for llama.cpp's "none" marker (0xFFFFFFFF as uint32).
TokenId SpecialTokenId(const GgufFile& g, const std::string& key, std::size_t vocab) {
  const auto v = g.GetInt(key);
  if (!v || *v == 0xFFFFFFFFLL || *v < 0) return -1;
  if (static_cast<std::uint64_t>(*v) >= vocab) {
    throw LoadError(g.source() + ": metadata key '" + key + "' = " + std::to_string(*v) +
                    " is not a token id (vocabulary of " + std::to_string(vocab) + ")");
  }
  return static_cast<TokenId>(*v);
}

template <typename T>
const T* GetTyped(const GgufFile& g, const std::string& key, const char* expected) {
  const GgufValue* v = g.Find(key);
  if (v == nullptr) return nullptr;
  const auto* typed = std::get_if<T>(v);
  if (typed == nullptr) {
    throw LoadError(g.source() + ": metadata key '" + key + "' is not " + expected);
  }
  return typed;
}

std::unique_ptr<Tokenizer> ReadTokenizer(const GgufFile& g, const ModelConfig& c) {
  const GgufValue* model_value = g.Find("tokenizer.ggml.model");
  if (model_value == nullptr) return nullptr;  // weights-only file
  const std::string model = g.RequireString("tokenizer.ggml.model");
  if (model != "llama" && model != "gpt2") {
    throw LoadError(g.source() + ": unsupported tokenizer.ggml.model '" + model +
                    "' (supported: llama, gpt2)");
  }
  Vocabulary v;
  const auto* tokens =
      GetTyped<std::vector<std::string>>(g, "tokenizer.ggml.tokens", "a string array");
  if (tokens == nullptr)
    throw LoadError(g.source() + ": missing metadata key 'tokenizer.ggml.tokens'");
  if (tokens->size() != static_cast<std::size_t>(c.vocab_size)) {
    throw LoadError(g.source() + ": tokenizer.ggml.tokens has " + std::to_string(tokens->size()) +
                    " entries but the model's vocabulary is " + std::to_string(c.vocab_size));
  }
  const std::size_t n = tokens->size();
  v.tokens = *tokens;
  if (const auto* scores =
          GetTyped<std::vector<double>>(g, "tokenizer.ggml.scores", "a float array")) {
    if (scores->size() != n) {
      throw LoadError(g.source() + ": tokenizer.ggml.scores has " + std::to_string(scores->size()) +
                      " entries, expected " + std::to_string(n));
    }
    v.scores.reserve(n);
    for (const double s : *scores) v.scores.push_back(ToFloat(s));
  }
  if (const auto* types =
          GetTyped<std::vector<std::int64_t>>(g, "tokenizer.ggml.token_type", "an integer array")) {
    if (types->size() != n) {
      throw LoadError(g.source() + ": tokenizer.ggml.token_type has " +
                      std::to_string(types->size()) + " entries, expected " + std::to_string(n));
    }
    v.token_types.reserve(n);
    for (const std::int64_t t : *types) {
      if (t < INT32_MIN || t > INT32_MAX) {
        throw LoadError(g.source() + ": tokenizer.ggml.token_type value " + std::to_string(t) +
                        " is out of range");
      }
      v.token_types.push_back(static_cast<std::int32_t>(t));
    }
  }
  if (const auto* merges =
          GetTyped<std::vector<std::string>>(g, "tokenizer.ggml.merges", "a string array")) {
    v.merges = *merges;
  }
  v.bos_id = SpecialTokenId(g, "tokenizer.ggml.bos_token_id", n);
  v.eos_id = SpecialTokenId(g, "tokenizer.ggml.eos_token_id", n);
  v.unk_id = SpecialTokenId(g, "tokenizer.ggml.unknown_token_id", n);
  v.pad_id = SpecialTokenId(g, "tokenizer.ggml.padding_token_id", n);
  if (const auto* add_bos = GetTyped<bool>(g, "tokenizer.ggml.add_bos_token", "a bool")) {
    v.add_bos = *add_bos;
  }
  if (model == "llama") return MakeSentencePieceTokenizer(std::move(v));
  if (v.merges.empty()) {
    throw LoadError(g.source() + ": gpt2 tokenizer without tokenizer.ggml.merges");
  }
  return MakeGpt2Tokenizer(std::move(v));
}

}  // namespace

Model LoadGgufModelFromBytes(std::span<const std::uint8_t> bytes, const std::string& source) {
  const GgufFile g(bytes, source);
  Model m;
  m.config = ReadConfig(g);
  const ModelConfig& c = m.config;
  // Every tensor is checked before the weights are allocated: the parser has bounded the tensor
  // data by the file size, so a hostile header cannot make us allocate more than a small multiple
  // of the file.
  ForEachTensor(c, nullptr,
                [&](const std::string& name, const std::vector<std::uint64_t>& shape, float*) {
                  ExpectTensor(g, name, shape);
                });
  m.tokenizer = ReadTokenizer(g, c);
  m.weights = std::make_unique<ModelWeights>(c);
  ForEachTensor(c, m.weights.get(),
                [&](const std::string& name, const std::vector<std::uint64_t>& shape, float* dst) {
                  const GgufTensorInfo& t = ExpectTensor(g, name, shape);
                  DequantizeToF32(t.type, t.data, t.num_elements(), dst);
                });
  return m;
}

ModelConfig ReadGgufConfig(const GgufFile& g) { return ReadConfig(g); }

std::unique_ptr<Tokenizer> ReadGgufTokenizer(const GgufFile& g, const ModelConfig& c) {
  return ReadTokenizer(g, c);
}

void ForEachGgufTensorShape(
    const ModelConfig& c,
    const std::function<void(const std::string&, const std::vector<std::uint64_t>&)>& fn) {
  ForEachTensor(c, nullptr,
                [&fn](const std::string& name, const std::vector<std::uint64_t>& shape, float*) {
                  fn(name, shape);
                });
}

}  // namespace internal

Model LoadGgufModel(const std::string& path) {
  const MappedFile file(path);
  return internal::LoadGgufModelFromBytes(file.bytes(), path);
}

}  // namespace metronome::model
