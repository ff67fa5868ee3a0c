// Export to GGUF v3 in llama.cpp's `llama` conventions, so that a model we can run (notably a
// synthetic one) can also be run by llama.cpp, and so that the GGUF loader has a round-trip test.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "metronome/base/errors.h"
#include "metronome/model/gguf.h"
#include "metronome/model/model.h"

namespace metronome::model {
namespace {

// llama.cpp's llama_ftype values for general.file_type.
constexpr std::uint32_t kFileTypeAllF32 = 0;
constexpr std::uint32_t kFileTypeMostlyF16 = 1;

// The raw vocabulary is not kept with a loaded model; only synthetic models can regenerate theirs.
Vocabulary ExportVocabulary(const Model& model, const std::string& path) {
  const ModelConfig& c = model.config;
  if (c.name.starts_with("synthetic:")) {
    Vocabulary v = MakeSyntheticVocabulary(c.vocab_size);
    if (v.tokens.size() != static_cast<std::size_t>(c.vocab_size)) {
      throw ConfigError(path + ": synthetic vocabulary has " + std::to_string(v.tokens.size()) +
                        " tokens, model has " + std::to_string(c.vocab_size));
    }
    return v;
  }
  throw ConfigError(path + ": cannot export '" + c.name +
                    "': its vocabulary is not available (only synthetic models can be exported)");
}

}  // namespace

void ExportGguf(const Model& model, const std::string& path, GgmlType type) {
  const ModelConfig& c = model.config;
  if (type != GgmlType::kF32 && type != GgmlType::kF16) {
    throw ConfigError(path + ": export supports tensor types F32 and F16, got ggml type " +
                      std::to_string(static_cast<std::uint32_t>(type)));
  }
  if (c.architecture != Architecture::kLlama || c.rope_style != RopeStyle::kInterleaved ||
      c.has_qkv_bias) {
    throw ConfigError(path +
                      ": only llama-style models (interleaved RoPE, no Q/K/V bias) can be "
                      "exported as GGUF 'llama'");
  }
  if (model.weights == nullptr) throw ConfigError(path + ": model has no weights");
  c.Validate(c.name);
  const Vocabulary vocab = ExportVocabulary(model, path);

  GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.SetString("general.name", c.name);
  w.SetUint32("general.file_type", type == GgmlType::kF32 ? kFileTypeAllF32 : kFileTypeMostlyF16);
  const auto u32 = [](int v) { return static_cast<std::uint32_t>(v); };
  w.SetUint32("llama.context_length", u32(c.context_length));
  w.SetUint32("llama.embedding_length", u32(c.dim));
  w.SetUint32("llama.block_count", u32(c.num_layers));
  w.SetUint32("llama.feed_forward_length", u32(c.ffn_dim));
  w.SetUint32("llama.rope.dimension_count", u32(c.rotary_dim()));
  w.SetUint32("llama.attention.head_count", u32(c.num_heads));
  w.SetUint32("llama.attention.head_count_kv", u32(c.num_kv_heads));
  if (c.q_dim() != c.dim) {
    // llama.cpp assumes head_dim = dim / heads unless told otherwise.
    w.SetUint32("llama.attention.key_length", u32(c.head_dim));
    w.SetUint32("llama.attention.value_length", u32(c.head_dim));
  }
  w.SetFloat32("llama.attention.layer_norm_rms_epsilon", c.rms_eps);
  w.SetFloat32("llama.rope.freq_base", static_cast<float>(c.rope_theta));
  w.SetUint32("llama.vocab_size", u32(c.vocab_size));

  w.SetString("tokenizer.ggml.model", "llama");
  w.SetStringArray("tokenizer.ggml.tokens", vocab.tokens);
  if (!vocab.scores.empty()) w.SetFloat32Array("tokenizer.ggml.scores", vocab.scores);
  if (!vocab.token_types.empty()) w.SetInt32Array("tokenizer.ggml.token_type", vocab.token_types);
  if (vocab.bos_id >= 0) w.SetUint32("tokenizer.ggml.bos_token_id", u32(vocab.bos_id));
  if (vocab.eos_id >= 0) w.SetUint32("tokenizer.ggml.eos_token_id", u32(vocab.eos_id));
  if (vocab.unk_id >= 0) w.SetUint32("tokenizer.ggml.unknown_token_id", u32(vocab.unk_id));

  const auto dim = static_cast<std::uint64_t>(c.dim);
  const auto q = static_cast<std::uint64_t>(c.q_dim());
  const auto kv = static_cast<std::uint64_t>(c.kv_dim());
  const auto ffn = static_cast<std::uint64_t>(c.ffn_dim);
  const auto nvocab = static_cast<std::uint64_t>(c.vocab_size);
  // Shapes in ggml order ([in, out]) over our row-major [out, in] storage.
  const auto matrix = [&](const std::string& name, const float* p, std::uint64_t in,
                          std::uint64_t out) {
    w.AddTensor(name, {in, out}, type, std::span<const float>(p, in * out));
  };
  // llama.cpp expects norms in F32 whatever the file type.
  const auto norm = [&](const std::string& name, const float* p) {
    w.AddTensor(name, {dim}, GgmlType::kF32, std::span<const float>(p, dim));
  };
  const ModelWeights& mw = *model.weights;
  matrix("token_embd.weight", mw.token_embedding, dim, nvocab);
  norm("output_norm.weight", mw.final_norm);
  if (!c.tied_embeddings) matrix("output.weight", mw.output, dim, nvocab);
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& lw = mw.layers[static_cast<std::size_t>(l)];
    const std::string p = "blk." + std::to_string(l) + ".";
    norm(p + "attn_norm.weight", lw.attn_norm);
    matrix(p + "attn_q.weight", lw.wqkv, dim, q);
    matrix(p + "attn_k.weight", lw.wqkv + q * dim, dim, kv);
    matrix(p + "attn_v.weight", lw.wqkv + (q + kv) * dim, dim, kv);
    matrix(p + "attn_output.weight", lw.wo, q, dim);
    norm(p + "ffn_norm.weight", lw.ffn_norm);
    matrix(p + "ffn_gate.weight", lw.w_gate_up, dim, ffn);
    matrix(p + "ffn_up.weight", lw.w_gate_up + ffn * dim, dim, ffn);
    matrix(p + "ffn_down.weight", lw.w_down, ffn, dim);
  }
  w.Write(path);
}

}  // namespace metronome::model
