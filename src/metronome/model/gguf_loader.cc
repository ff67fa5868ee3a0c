#include "metronome/model/internal/gguf_loader.h"

#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
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
#include "metronome/model/internal/gguf_schema.h"
#include "metronome/model/internal/gguf_tensors.h"
#include "metronome/model/model.h"
#include "metronome/quant/ggml_type.h"
#include "metronome/quant/weight_matrix.h"

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

// `<arch>.rope.scaling.*` as llama.cpp reads them: the type defaults to linear, so a factor alone
// scales linearly; "none" never scales; the factor 0 means none; YaRN's original context defaults
// to the trained context (ModelConfig::yarn_original_context). The beta / ext / attn overrides
// llama.cpp does not read for llama and qwen2 are left at its defaults (gguf_schema refuses a file
// whose values differ).
template <typename Key>
void ReadRopeScaling(const GgufFile& g, const Key& key, ModelConfig& c) {
  const GgufValue* type = g.Find(key("rope.scaling.type"));
  const std::string type_name =
      type != nullptr ? g.RequireString(key("rope.scaling.type")) : "linear";
  const std::optional<RopeScaling> scaling = ParseRopeScaling(type_name);
  if (!scaling) {
    throw LoadError(g.source() + ": metadata key '" + key("rope.scaling.type") + "' = '" +
                    type_name +
                    "' is not implemented (supported: " + std::string(kRopeScalingNames) + ")");
  }
  std::optional<double> factor = g.GetFloat(key("rope.scaling.factor"));
  if (!factor) factor = g.GetFloat(key("rope.scale_linear"));
  if (*scaling == RopeScaling::kNone || !factor || *factor == 0.0) {
    c.rope_scaling = *scaling == RopeScaling::kYarn ? RopeScaling::kYarn : RopeScaling::kNone;
    c.rope_scaling_factor = 1.0;
  } else {
    c.rope_scaling = *scaling;
    c.rope_scaling_factor = *factor;
  }
  if (const auto orig = g.GetInt(key("rope.scaling.original_context_length"))) {
    c.rope_original_context = ToInt(g, key("rope.scaling.original_context_length"), *orig);
  }
  c.rope_attn_factor = g.GetFloat(key("rope.scaling.attn_factor")).value_or(1.0);
}

// qwen3moe's experts as llama.cpp reads them: expert_count and expert_used_count required; each
// expert's width from expert_feed_forward_length, else feed_forward_length / expert_used_count.
// feed_forward_length (the dense width, which no layer has) only fills that default.
template <typename Key>
void ReadExperts(const GgufFile& g, const Key& key, ModelConfig& c) {
  c.num_experts = RequireIntField(g, key("expert_count"));
  c.num_experts_used = RequireIntField(g, key("expert_used_count"));
  const auto ff = g.GetInt(key("feed_forward_length"));
  if (ff) c.ffn_dim = ToInt(g, key("feed_forward_length"), *ff);
  if (const auto fe = g.GetInt(key("expert_feed_forward_length"))) {
    c.expert_ffn_dim = ToInt(g, key("expert_feed_forward_length"), *fe);
  } else if (ff && c.num_experts_used > 0) {
    c.expert_ffn_dim = c.ffn_dim / c.num_experts_used;
  } else {
    throw LoadError(g.source() + ": missing metadata key '" + key("expert_feed_forward_length") +
                    "' (and no '" + key("feed_forward_length") + "' to derive it from)");
  }
  if (!ff) c.ffn_dim = c.expert_ffn_dim * c.num_experts_used;  // informational only
}

// Query and kv head counts and the head dim (attention.key_length where the file has it: the Qwen3
// models' differs from embedding_length / head_count), and the rotary dims.
template <typename Key>
void ReadAttentionHeads(const GgufFile& g, const Key& key, ModelConfig& c) {
  c.num_heads = RequireIntField(g, key("attention.head_count"));
  const auto kv_heads = g.GetInt(key("attention.head_count_kv"));
  c.num_kv_heads = kv_heads ? ToInt(g, key("attention.head_count_kv"), *kv_heads) : c.num_heads;
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
}

// The vocabulary size is implied by the token list; files without one fall back to the output
// (or embedding) matrix, whose shape is checked against it later anyway.
int ReadVocabularySize(const GgufFile& g) {
  const GgufValue* tokens = g.Find("tokenizer.ggml.tokens");
  if (const auto* list = tokens ? std::get_if<std::vector<std::string>>(tokens) : nullptr) {
    if (list->size() > INT_MAX) throw LoadError(g.source() + ": token list is too long");
    return static_cast<int>(list->size());
  }
  const GgufTensorInfo* t = g.FindTensor("output.weight");
  if (t == nullptr) t = g.FindTensor("token_embd.weight");
  if (t == nullptr) throw LoadError(g.source() + ": missing tensor 'token_embd.weight'");
  if (t->shape.size() != 2 || t->shape[1] > INT_MAX) {
    throw LoadError(g.source() + ": tensor '" + t->name + "' has shape " + ShapeString(t->shape) +
                    ", expected [embedding_length, vocab]");
  }
  return static_cast<int>(t->shape[1]);
}

// The per-pair rotary frequency factors of kRopeFreqsTensor (llama3-style scaling), empty without
// it. Checked against rotary_dim/2 by Validate; bounded here so the copy stays small.
std::vector<float> ReadRopeFreqFactors(const GgufFile& g) {
  const GgufTensorInfo* t = g.FindTensor(std::string(kRopeFreqsTensor));
  if (t == nullptr) return {};
  if (t->shape.size() != 1 || t->shape[0] > static_cast<std::uint64_t>(kMaxQDim)) {
    throw LoadError(g.source() + ": tensor '" + t->name + "' has shape " + ShapeString(t->shape) +
                    ", expected [rope dims / 2]");
  }
  if (!quant::TensorBytes(t->type, t->shape[0]) ||
      *quant::TensorBytes(t->type, t->shape[0]) > t->data.size()) {
    throw LoadError(g.source() + ": tensor '" + t->name + "' is truncated");
  }
  std::vector<float> factors(static_cast<std::size_t>(t->shape[0]));
  DequantizeToF32(t->type, t->data, t->shape[0], factors.data());
  return factors;
}

ModelConfig ReadConfig(const GgufFile& g) {
  const std::string arch = g.RequireString("general.architecture");
  ModelConfig c;
  const std::optional<Architecture> parsed = ParseArchitecture(arch);
  if (!parsed) {
    throw LoadError(g.source() + ": unsupported architecture '" + arch +
                    "' (supported: " + ArchitectureNames() + ")");
  }
  // llama.cpp's conventions per architecture: llama's q/k rows are permuted for interleaved pairs,
  // the Qwen families' are not (NeoX pairs); qwen2 has Q/K/V biases, qwen3 per-head q/k norms.
  c.architecture = *parsed;
  c.rope_style =
      c.architecture == Architecture::kLlama ? RopeStyle::kInterleaved : RopeStyle::kNeox;
  c.has_qkv_bias = c.architecture == Architecture::kQwen2;
  c.has_qk_norm =
      c.architecture == Architecture::kQwen3 || c.architecture == Architecture::kQwen3Moe;
  const auto key = [&arch](const char* suffix) { return arch + "." + suffix; };
  c.name = std::filesystem::path(g.source()).filename().string();
  c.dim = RequireIntField(g, key("embedding_length"));
  c.num_layers = RequireIntField(g, key("block_count"));
  if (c.architecture == Architecture::kQwen3Moe) {
    ReadExperts(g, key, c);
  } else {
    c.ffn_dim = RequireIntField(g, key("feed_forward_length"));
  }
  ReadAttentionHeads(g, key, c);
  c.context_length = RequireIntField(g, key("context_length"));
  const auto eps = g.GetFloat(key("attention.layer_norm_rms_epsilon"));
  if (!eps) {
    throw LoadError(g.source() + ": missing metadata key '" +
                    key("attention.layer_norm_rms_epsilon") + "'");
  }
  c.rms_eps = ToFloat(*eps);
  c.rope_theta = g.GetFloat(key("rope.freq_base")).value_or(10000.0);
  ReadRopeScaling(g, key, c);

  c.vocab_size = ReadVocabularySize(g);
  c.tied_embeddings = g.FindTensor("output.weight") == nullptr;
  c.rope_freq_factors = ReadRopeFreqFactors(g);

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

// The checks a tensor's type must pass before its bytes are used: a type we compute with, rows
// that are whole blocks, and (for vectors) a type we convert.
void CheckTensorType(const GgufFile& g, const GgufTensorInfo& t, const TensorSpec& spec) {
  const quant::GgmlTypeTraits& traits = quant::Traits(t.type);
  if (!traits.computable) {
    throw LoadError(g.source() + ": tensor '" + t.name + "' has type " + std::string(traits.name) +
                    ", which this engine does not compute with (supported: " +
                    quant::ComputableTypeNames() + ")");
  }
  if (spec.shape[0] % traits.block_elems != 0) {
    throw LoadError(g.source() + ": tensor '" + t.name + "' has rows of " +
                    std::to_string(spec.shape[0]) + " elements, not a whole number of " +
                    std::string(traits.name) + " blocks of " + std::to_string(traits.block_elems));
  }
  const auto bytes = quant::TensorBytes(t.type, t.num_elements());
  if (!bytes || *bytes > t.data.size()) {
    throw LoadError(g.source() + ": tensor '" + t.name + "' holds " +
                    std::to_string(t.data.size()) + " bytes, too few for its shape " +
                    ShapeString(t.shape) + " as " + std::string(traits.name));
  }
}

// A view's bytes must be aligned for the loads the kernels make (fp32: 4 bytes; f16 scales and
// 16-bit types: 2).
bool AlignedForType(const std::uint8_t* p, quant::GgmlType type) {
  const std::size_t align = type == quant::GgmlType::kF32 ? 4 : 2;
  return reinterpret_cast<std::uintptr_t>(p) % align == 0;
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
  if (const auto* add_eos = GetTyped<bool>(g, "tokenizer.ggml.add_eos_token", "a bool")) {
    v.add_eos = *add_eos;
  }
  if (const auto* tmpl = GetTyped<std::string>(g, "tokenizer.chat_template", "a string")) {
    v.chat_template = *tmpl;
  }
  if (model == "llama") return MakeSentencePieceTokenizer(std::move(v));
  // llama.cpp runs a gpt2 vocabulary without tokenizer.ggml.pre with its "default" pre-tokenizer.
  const auto* pre_name = GetTyped<std::string>(g, "tokenizer.ggml.pre", "a string");
  const std::optional<PreTokenizer> pre = ParsePreTokenizer(pre_name ? *pre_name : "");
  if (!pre) {
    throw LoadError(g.source() + ": metadata key 'tokenizer.ggml.pre' = '" + *pre_name +
                    "' is not implemented (supported: " + PreTokenizerNames() + ")");
  }
  v.pre = *pre;
  if (v.merges.empty()) {
    throw LoadError(g.source() + ": gpt2 tokenizer without tokenizer.ggml.merges");
  }
  return MakeGpt2Tokenizer(std::move(v));
}

// Where each required tensor's bytes will live: a view into the file (a matrix whose backing is
// kept alive and whose bytes are aligned for its type) or an arena slot (fp32 vectors, and the
// matrices that cannot be views), each slot 64-byte aligned.
struct TensorPlacement {
  std::vector<const GgufTensorInfo*> infos;  // one per spec, in RequiredTensors order
  std::vector<std::size_t> arena_offset;     // SIZE_MAX: a view into the file
  std::size_t arena_bytes = 0;
};

// Every tensor is checked here, before anything is allocated: the parser has bounded the tensor
// data by the file size, so a hostile header cannot make us allocate more than a small multiple of
// the file.
TensorPlacement PlaceTensors(const GgufFile& g, std::span<const TensorSpec> specs, bool backed) {
  constexpr std::size_t kAlign = 64;
  const auto round_up = [](std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; };
  TensorPlacement p;
  p.infos.reserve(specs.size());
  p.arena_offset.assign(specs.size(), SIZE_MAX);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const GgufTensorInfo& t = ExpectTensor(g, specs[i].name, specs[i].shape);
    CheckTensorType(g, t, specs[i]);
    p.infos.push_back(&t);
    if (specs[i].matrix && backed && AlignedForType(t.data.data(), t.type)) continue;
    p.arena_offset[i] = p.arena_bytes;
    const std::size_t n = static_cast<std::size_t>(t.num_elements());
    p.arena_bytes +=
        round_up(specs[i].matrix ? static_cast<std::size_t>(*quant::TensorBytes(t.type, n))
                                 : n * sizeof(float));
  }
  return p;
}

// Hands out the placed tensors in RequiredTensors order: matrices as views or arena copies,
// vectors converted to fp32 into consecutive arena slots.
class TensorReader {
 public:
  TensorReader(std::span<const TensorSpec> specs, const TensorPlacement& placement,
               ModelWeights& weights)
      : specs_(specs),
        placement_(placement),
        weights_(weights),
        arena_(weights.AllocateArena(placement.arena_bytes)) {}

  // The next tensor, a matrix. The experts' 3-D tensors are one matrix of every expert's rows
  // (each expert a row slice).
  quant::WeightMatrix Matrix() {
    const std::size_t i = next_++;
    const GgufTensorInfo& t = *placement_.infos[i];
    const auto cols = static_cast<int>(specs_[i].shape[0]);
    std::uint64_t all_rows = 1;
    for (std::size_t d = 1; d < specs_[i].shape.size(); ++d) all_rows *= specs_[i].shape[d];
    const auto rows = static_cast<int>(all_rows);
    if (placement_.arena_offset[i] == SIZE_MAX) {
      return quant::MakeWeightMatrix(t.type, rows, cols, t.data.data());
    }
    std::byte* dst = arena_ + placement_.arena_offset[i];
    std::memcpy(dst, t.data.data(), quant::RowBytes(t.type, cols) * static_cast<std::size_t>(rows));
    return quant::MakeWeightMatrix(t.type, rows, cols, dst);
  }

  // The next tensor, a vector, as fp32.
  float* Vector() {
    const std::size_t i = next_++;
    const GgufTensorInfo& t = *placement_.infos[i];
    auto* dst = reinterpret_cast<float*>(arena_ + placement_.arena_offset[i]);
    DequantizeToF32(t.type, t.data, t.num_elements(), dst);
    weights_.AddVectorFloats(static_cast<std::size_t>(t.num_elements()));
    return dst;
  }

 private:
  std::span<const TensorSpec> specs_;
  const TensorPlacement& placement_;
  ModelWeights& weights_;
  std::byte* arena_;
  std::size_t next_ = 0;
};

// One layer's tensors, in RequiredTensors' order for the layer.
void ReadLayer(const ModelConfig& c, TensorReader& r, LayerWeights& lw) {
  lw.attn_norm = r.Vector();
  lw.wqkv = {r.Matrix(), r.Matrix(), r.Matrix()};
  if (c.has_qkv_bias) {
    // Three consecutive slots; each is rounded up to 64 bytes, so gather them into the first.
    float* q = r.Vector();
    float* k = r.Vector();
    float* v = r.Vector();
    const auto qd = static_cast<std::size_t>(c.q_dim());
    const auto kvd = static_cast<std::size_t>(c.kv_dim());
    std::memmove(q + qd, k, kvd * sizeof(float));
    std::memmove(q + qd + kvd, v, kvd * sizeof(float));
    lw.bqkv = q;
  }
  if (c.has_qk_norm) {
    lw.q_norm = r.Vector();
    lw.k_norm = r.Vector();
  }
  lw.wo = r.Matrix();
  lw.ffn_norm = r.Vector();
  if (!c.is_moe()) {
    lw.w_gate_up = {r.Matrix(), r.Matrix()};
    lw.w_down = r.Matrix();
    return;
  }
  lw.router = r.Matrix();
  const quant::WeightMatrix gate = r.Matrix();
  const quant::WeightMatrix up = r.Matrix();
  const quant::WeightMatrix down = r.Matrix();
  for (int e = 0; e < c.num_experts; ++e) {
    lw.expert_gate_up.push_back({gate.RowSlice(e * c.expert_ffn_dim, c.expert_ffn_dim),
                                 up.RowSlice(e * c.expert_ffn_dim, c.expert_ffn_dim)});
    lw.expert_down.push_back(down.RowSlice(e * c.dim, c.dim));
  }
}

}  // namespace

Model LoadGgufModelFromBytes(std::span<const std::uint8_t> bytes, const std::string& source,
                             std::shared_ptr<const void> backing) {
  const GgufFile g(bytes, source);
  Model m;
  m.config = ReadConfig(g);
  const ModelConfig& c = m.config;
  RequireSupportedGguf(g, c);
  const std::vector<TensorSpec> specs = RequiredTensors(c);
  const TensorPlacement placement = PlaceTensors(g, specs, backing != nullptr);
  m.tokenizer = ReadTokenizer(g, c);

  auto weights = std::make_unique<ModelWeights>();
  TensorReader r(specs, placement, *weights);
  weights->token_embedding = r.Matrix();
  weights->final_norm = r.Vector();
  weights->output = c.tied_embeddings ? weights->token_embedding : r.Matrix();
  weights->layers.resize(static_cast<std::size_t>(c.num_layers));
  for (LayerWeights& lw : weights->layers) ReadLayer(c, r, lw);
  weights->KeepAlive(std::move(backing));
  m.weights = std::move(weights);
  return m;
}

ModelConfig ReadGgufConfig(const GgufFile& g) { return ReadConfig(g); }

std::unique_ptr<Tokenizer> ReadGgufTokenizer(const GgufFile& g, const ModelConfig& c) {
  return ReadTokenizer(g, c);
}

}  // namespace internal

Model LoadGgufModel(const std::string& path) {
  auto file = std::make_shared<const MappedFile>(path);
  const std::span<const std::uint8_t> bytes = file->bytes();
  Model m = internal::LoadGgufModelFromBytes(bytes, path, file);
  m.weights->SetPageRelease(
      [file](const std::byte* begin, std::size_t n) { file->ReleasePages(begin, n); });
  return m;
}

}  // namespace metronome::model
