// Export to GGUF v3 in llama.cpp's `llama`, `qwen3` and `qwen3moe` conventions, so that a model we
// can run (notably a synthetic one) can also be run by llama.cpp, and so that the GGUF loader has a
// round-trip test.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <numbers>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "metronome/base/errors.h"
#include "metronome/base/thread_pool.h"
#include "metronome/model/gguf.h"
#include "metronome/model/internal/gguf_schema.h"
#include "metronome/model/internal/gguf_tensors.h"
#include "metronome/model/internal/synthetic_values.h"
#include "metronome/model/model.h"
#include "metronome/quant/codec.h"
#include "metronome/quant/ggml_type.h"

namespace metronome::model {
namespace {

// The written vocabulary: the loaded tokenizer's, or the synthetic one a synthetic model was made
// with.
Vocabulary ExportVocabulary(const Model& model, const std::string& path, std::string* ggml_model) {
  const ModelConfig& c = model.config;
  if (model.tokenizer != nullptr) {
    *ggml_model = std::string(model.tokenizer->ggml_model());
    return model.tokenizer->vocabulary();
  }
  if (c.name.starts_with("synthetic:")) {
    *ggml_model = "llama";
    Vocabulary v = MakeSyntheticVocabulary(c.vocab_size);
    if (v.tokens.size() != static_cast<std::size_t>(c.vocab_size)) {
      throw ConfigError(path + ": synthetic vocabulary has " + std::to_string(v.tokens.size()) +
                        " tokens, model has " + std::to_string(c.vocab_size));
    }
    return v;
  }
  throw ConfigError(path + ": cannot export '" + c.name +
                    "': it has no tokenizer (give the llama2.c tokenizer with --tokenizer)");
}

struct NamedMix {
  std::string_view name;
  ExportTypes types;
};
// llama.cpp's llama_ftype values for general.file_type.
constexpr NamedMix kMixes[] = {
    {"f32", {GgmlType::kF32, GgmlType::kF32, 0}},
    {"f16", {GgmlType::kF16, GgmlType::kF16, 1}},
    {"bf16", {GgmlType::kBF16, GgmlType::kBF16, 32}},
    {"q8_0", {GgmlType::kQ8_0, GgmlType::kQ8_0, 7}},
    {"q4_0", {GgmlType::kQ4_0, GgmlType::kQ4_0, 2}},
    {"q4_k_m", {GgmlType::kQ4_K, GgmlType::kQ6_K, 15}},
    {"q5_k_m", {GgmlType::kQ5_K, GgmlType::kQ6_K, 17}},
    {"q6_k", {GgmlType::kQ6_K, GgmlType::kQ6_K, 18}},
};

// The 32-element type of about the same bits a 256-element type falls back to (llama.cpp's
// choice for rows that are not whole super-blocks).
GgmlType FallbackType(GgmlType t) {
  switch (t) {
    case GgmlType::kQ4_K:
      return GgmlType::kQ5_0;
    case GgmlType::kQ5_K:
      return GgmlType::kQ5_1;
    default:
      return GgmlType::kQ8_0;
  }
}

// The fp32 values of the vector `t` (a norm: the exporter writes no biases).
const float* NormOf(const ModelWeights& mw, const internal::TensorSpec& t) {
  const auto layer = [&]() -> const LayerWeights& {
    return mw.layers[static_cast<std::size_t>(t.layer)];
  };
  switch (t.part) {
    case internal::TensorPart::kOutputNorm:
      return mw.final_norm;
    case internal::TensorPart::kAttnNorm:
      return layer().attn_norm;
    case internal::TensorPart::kFfnNorm:
      return layer().ffn_norm;
    case internal::TensorPart::kAttnQNorm:
      return layer().q_norm;
    case internal::TensorPart::kAttnKNorm:
      return layer().k_norm;
    default:
      throw ConfigError("cannot export tensor '" + t.name + "'");
  }
}

// The row-major [out, in] fp32 values of the matrix `t`; the parts of a fused group are row
// ranges of it.
std::vector<float> MatrixValues(const ModelWeights& mw, const ModelConfig& c,
                                const internal::TensorSpec& t) {
  const auto all = [](const quant::WeightMatrix& m) { return DequantizeRows(m, 0, m.rows); };
  const auto layer = [&]() -> const LayerWeights& {
    return mw.layers[static_cast<std::size_t>(t.layer)];
  };
  const int q = c.q_dim();
  const int kv = c.kv_dim();
  switch (t.part) {
    case internal::TensorPart::kTokenEmbedding:
      return all(mw.token_embedding);
    case internal::TensorPart::kOutput:
      return all(mw.output);
    case internal::TensorPart::kAttnQ:
      return DequantizeRows(layer().wqkv, 0, q);
    case internal::TensorPart::kAttnK:
      return DequantizeRows(layer().wqkv, q, kv);
    case internal::TensorPart::kAttnV:
      return DequantizeRows(layer().wqkv, q + kv, kv);
    case internal::TensorPart::kAttnOutput:
      return all(layer().wo);
    case internal::TensorPart::kFfnGate:
      return DequantizeRows(layer().w_gate_up, 0, c.ffn_dim);
    case internal::TensorPart::kFfnUp:
      return DequantizeRows(layer().w_gate_up, c.ffn_dim, c.ffn_dim);
    case internal::TensorPart::kFfnDown:
      return all(layer().w_down);
    case internal::TensorPart::kFfnRouter:
      return all(layer().router);
    case internal::TensorPart::kFfnGateExps:
    case internal::TensorPart::kFfnUpExps: {
      // Expert e's gate (or up) rows, experts in order: the 3-D tensor's [n_expert, ff, dim].
      const int first = t.part == internal::TensorPart::kFfnGateExps ? 0 : c.expert_ffn_dim;
      std::vector<float> out;
      for (const MatrixGroup& g : layer().expert_gate_up) {
        const std::vector<float> rows = DequantizeRows(g, first, c.expert_ffn_dim);
        out.insert(out.end(), rows.begin(), rows.end());
      }
      return out;
    }
    case internal::TensorPart::kFfnDownExps: {
      std::vector<float> out;
      for (const quant::WeightMatrix& m : layer().expert_down) {
        const std::vector<float> rows = all(m);
        out.insert(out.end(), rows.begin(), rows.end());
      }
      return out;
    }
    default:
      throw ConfigError("cannot export tensor '" + t.name + "'");
  }
}

// The metadata llama.cpp reads for `c` (and rope_freqs.weight, the one tensor before the
// model's), vocabulary included: the one place the exporter's keys are written.
void WriteHeader(GgufWriter& w, const ModelConfig& c, const Vocabulary& vocab,
                 const std::string& ggml_model, const ExportTypes& types) {
  const std::string arch = ArchitectureName(c.architecture);
  const auto key = [&arch](const char* suffix) { return arch + "." + suffix; };
  w.SetString("general.architecture", arch);
  w.SetString("general.name", c.name);
  w.SetUint32("general.file_type", types.file_type);
  const auto u32 = [](int v) { return static_cast<std::uint32_t>(v); };
  w.SetUint32(key("context_length"), u32(c.context_length));
  w.SetUint32(key("embedding_length"), u32(c.dim));
  w.SetUint32(key("block_count"), u32(c.num_layers));
  w.SetUint32(key("feed_forward_length"), u32(c.ffn_dim));
  w.SetUint32(key("rope.dimension_count"), u32(c.rotary_dim()));
  w.SetUint32(key("attention.head_count"), u32(c.num_heads));
  w.SetUint32(key("attention.head_count_kv"), u32(c.num_kv_heads));
  if (c.is_moe()) {
    w.SetUint32(key("expert_count"), u32(c.num_experts));
    w.SetUint32(key("expert_used_count"), u32(c.num_experts_used));
    w.SetUint32(key("expert_feed_forward_length"), u32(c.expert_ffn_dim));
  }
  if (c.q_dim() != c.dim) {
    // llama.cpp assumes head_dim = dim / heads unless told otherwise.
    w.SetUint32(key("attention.key_length"), u32(c.head_dim));
    w.SetUint32(key("attention.value_length"), u32(c.head_dim));
  }
  w.SetFloat32(key("attention.layer_norm_rms_epsilon"), c.rms_eps);
  w.SetFloat32(key("rope.freq_base"), static_cast<float>(c.rope_theta));
  w.SetUint32(key("vocab_size"), u32(c.vocab_size));
  if (c.rope_scaling != RopeScaling::kNone) {
    w.SetString(key("rope.scaling.type"), c.rope_scaling == RopeScaling::kYarn ? "yarn" : "linear");
    w.SetFloat32(key("rope.scaling.factor"), static_cast<float>(c.rope_scaling_factor));
    if (c.rope_original_context > 0) {
      w.SetUint32(key("rope.scaling.original_context_length"), u32(c.rope_original_context));
    }
  }
  if (c.rope_attn_factor != 1.0) {
    w.SetFloat32(key("rope.scaling.attn_factor"), static_cast<float>(c.rope_attn_factor));
  }

  w.SetString("tokenizer.ggml.model", ggml_model);
  w.SetStringArray("tokenizer.ggml.tokens", vocab.tokens);
  if (!vocab.scores.empty()) w.SetFloat32Array("tokenizer.ggml.scores", vocab.scores);
  if (!vocab.token_types.empty()) w.SetInt32Array("tokenizer.ggml.token_type", vocab.token_types);
  if (vocab.bos_id >= 0) w.SetUint32("tokenizer.ggml.bos_token_id", u32(vocab.bos_id));
  if (vocab.eos_id >= 0) w.SetUint32("tokenizer.ggml.eos_token_id", u32(vocab.eos_id));
  if (vocab.unk_id >= 0) w.SetUint32("tokenizer.ggml.unknown_token_id", u32(vocab.unk_id));
  if (!vocab.merges.empty()) w.SetStringArray("tokenizer.ggml.merges", vocab.merges);
  if (ggml_model == "gpt2")
    w.SetString("tokenizer.ggml.pre", std::string(PreTokenizerName(vocab.pre)));
  if (vocab.add_bos) w.SetBool("tokenizer.ggml.add_bos_token", *vocab.add_bos);
  if (vocab.add_eos) w.SetBool("tokenizer.ggml.add_eos_token", *vocab.add_eos);
  if (!vocab.chat_template.empty()) w.SetString("tokenizer.chat_template", vocab.chat_template);
  if (!c.rope_freq_factors.empty()) {
    const std::vector<float>& f = c.rope_freq_factors;
    w.AddTensor(std::string(internal::kRopeFreqsTensor), {f.size()}, GgmlType::kF32,
                std::span<const float>(f.data(), f.size()));
  }
}

// Throws ConfigError naming `path` unless llama.cpp computes what we compute for `c`.
void CheckExportable(const ModelConfig& c, const std::string& path) {
  // What each architecture's llama.cpp graph computes; a model that differs (qwen2's biases, a
  // llama with NeoX pairs) has no file that says so.
  const bool llama = c.architecture == Architecture::kLlama;
  const bool qwen3 =
      c.architecture == Architecture::kQwen3 || c.architecture == Architecture::kQwen3Moe;
  const bool exportable =
      !c.has_qkv_bias &&
      ((llama && c.rope_style == RopeStyle::kInterleaved && !c.has_qk_norm && !c.is_moe()) ||
       (qwen3 && c.rope_style == RopeStyle::kNeox && c.has_qk_norm &&
        c.is_moe() == (c.architecture == Architecture::kQwen3Moe)));
  if (!exportable) {
    throw ConfigError(path +
                      ": only llama (interleaved RoPE), qwen3 and qwen3moe (NeoX RoPE, q/k "
                      "norms) models without Q/K/V biases can be exported as GGUF");
  }
  c.Validate(c.name);
}

}  // namespace

std::optional<ExportTypes> ParseExportTypes(std::string_view name) {
  for (const auto& m : kMixes) {
    if (m.name == name) return m.types;
  }
  return std::nullopt;
}

std::string ExportTypeNames() {
  std::string s;
  for (const auto& m : kMixes) s += (s.empty() ? "" : "|") + std::string(m.name);
  return s;
}

ExportedTensor ChooseTensorType(const ExportTypes& types, const std::string& name,
                                std::uint64_t cols) {
  // llama.cpp's quantize keeps the router in its source type (it is tiny, and its top-k choice is
  // sensitive to rounding); ours are fp32 at export.
  if (name.ends_with(".ffn_gate_inp.weight")) return {name, {}, GgmlType::kF32, 0, "router"};
  const bool high = name == "output.weight" || name.ends_with(".attn_v.weight") ||
                    name.ends_with(".ffn_down.weight") || name.ends_with(".ffn_down_exps.weight");
  GgmlType t = high ? types.high : types.matrices;
  std::string why = high && types.high != types.matrices ? "more bits (_M mix)" : "";
  if (cols % quant::Traits(t).block_elems != 0) {
    const GgmlType fallback = FallbackType(t);
    const GgmlType chosen =
        cols % quant::Traits(fallback).block_elems == 0 ? fallback : GgmlType::kF16;
    why = "rows of " + std::to_string(cols) + " are not whole " + std::string(quant::Name(t)) +
          " blocks";
    t = chosen;
  }
  return {name, {}, t, 0, why};
}

namespace {

// The elements of a tensor of the table.
std::uint64_t ElementCount(const internal::TensorSpec& t) {
  std::uint64_t n = 1;
  for (const std::uint64_t d : t.shape) n *= d;
  return n;
}

// What `types` writes `t` as: a matrix per ChooseTensorType, a vector (norm) F32, as llama.cpp
// expects whatever the file type.
ExportedTensor TensorTypeOf(const ExportTypes& types, const internal::TensorSpec& t) {
  ExportedTensor e = t.matrix ? ChooseTensorType(types, t.name, t.shape[0])
                              : ExportedTensor{t.name, {}, GgmlType::kF32, 0, "norm"};
  e.shape = t.shape;
  e.bytes = quant::TensorBytes(e.type, ElementCount(t)).value_or(0);
  return e;
}

}  // namespace

std::vector<float> Llama3RopeFreqFactors(double theta, int rotary_dim, double factor,
                                         double low_freq_factor, double high_freq_factor,
                                         double original_context) {
  const double low_freq_wavelen = original_context / low_freq_factor;
  const double high_freq_wavelen = original_context / high_freq_factor;
  std::vector<float> out;
  for (int i = 0; i < rotary_dim / 2; ++i) {
    const double freq = std::pow(theta, -2.0 * i / rotary_dim);
    const double wavelen = 2.0 * std::numbers::pi / freq;
    double f = 1.0;
    if (wavelen > low_freq_wavelen) {
      f = factor;
    } else if (wavelen >= high_freq_wavelen) {
      const double smooth =
          (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
      f = 1.0 / ((1.0 - smooth) / factor + smooth);
    }
    out.push_back(static_cast<float>(f));
  }
  return out;
}

std::vector<ExportedTensor> ExportGguf(const Model& model, const std::string& path,
                                       const ExportTypes& types) {
  const ModelConfig& c = model.config;
  CheckExportable(c, path);
  if (model.weights == nullptr) throw ConfigError(path + ": model has no weights");
  std::string ggml_model;
  const Vocabulary vocab = ExportVocabulary(model, path, &ggml_model);

  GgufWriter w;
  WriteHeader(w, c, vocab, ggml_model, types);

  // Shapes in ggml order ([in, out]) over our row-major [out, in] storage.
  std::vector<ExportedTensor> table;
  const ModelWeights& mw = *model.weights;
  for (const internal::TensorSpec& t : internal::RequiredTensors(c)) {
    ExportedTensor e = TensorTypeOf(types, t);
    const std::uint64_t elems = ElementCount(t);
    if (!t.matrix) {
      w.AddTensor(t.name, t.shape, e.type, std::span<const float>(NormOf(mw, t), elems));
    } else {
      const std::vector<float> values = MatrixValues(mw, c, t);
      w.AddTensor(t.name, e.shape, e.type, std::span<const float>(values.data(), elems));
    }
    table.push_back(std::move(e));
  }
  w.Write(path);
  return table;
}

std::vector<ExportedTensor> WriteSyntheticGguf(const std::string& preset, std::uint64_t seed,
                                               const std::string& path, const ExportTypes& types,
                                               int num_threads) {
  if (num_threads < 0) {
    throw ConfigError("num_threads = " + std::to_string(num_threads) + " must be >= 0");
  }
  Model shell;  // the configuration and vocabulary of the preset, no weights
  shell.config = SyntheticPresetConfig(preset);
  const ModelConfig& c = shell.config;
  CheckExportable(c, path);
  shell.tokenizer = MakeSentencePieceTokenizer(MakeSyntheticVocabulary(c.vocab_size));
  std::string ggml_model;
  const Vocabulary vocab = ExportVocabulary(shell, path, &ggml_model);
  GgufWriter w;
  WriteHeader(w, c, vocab, ggml_model, types);

  auto pool =
      std::make_shared<base::ThreadPool>(base::ThreadPoolOptions{.num_threads = num_threads});
  std::vector<ExportedTensor> table;
  for (const internal::TensorSpec& t : internal::RequiredTensors(c)) {
    ExportedTensor e = TensorTypeOf(types, t);
    const std::uint64_t cols = t.shape[0];
    const std::uint64_t rows = ElementCount(t) / cols;
    const GgmlType type = e.type;
    const std::uint64_t row_bytes = quant::TensorBytes(type, cols).value_or(0);
    // Each chunk of rows is generated into its own fp32 buffer and quantised in place in the
    // output: the only full-tensor memory is the writer's buffer of encoded bytes.
    w.AddStreamedTensor(
        t.name, t.shape, type,
        [pool, t, c, seed, cols, rows, type, row_bytes](std::span<std::uint8_t> out) {
          constexpr std::uint64_t kChunkElems = std::uint64_t{1} << 16;
          const std::uint64_t chunk_rows = std::max<std::uint64_t>(1, kChunkElems / cols);
          const std::uint64_t chunks = (rows + chunk_rows - 1) / chunk_rows;
          pool->ParallelFor(
              static_cast<std::int64_t>(chunks), 1, [&](std::int64_t k0, std::int64_t k1) {
                std::vector<float> values(static_cast<std::size_t>(chunk_rows * cols));
                for (auto k = static_cast<std::uint64_t>(k0); k < static_cast<std::uint64_t>(k1);
                     ++k) {
                  const std::uint64_t r0 = k * chunk_rows;
                  const std::uint64_t n = std::min(chunk_rows, rows - r0);
                  internal::SyntheticTensorRows(c, seed, t, r0, n, values.data());
                  quant::QuantizeRow(type, values.data(), static_cast<std::int64_t>(n * cols),
                                     out.data() + r0 * row_bytes);
                }
              });
        });
    table.push_back(std::move(e));
  }
  w.Write(path);
  return table;
}

void ExportGguf(const Model& model, const std::string& path, GgmlType type) {
  (void)ExportGguf(model, path, ExportTypes{type, type, type == GgmlType::kF16 ? 1u : 0u});
}

}  // namespace metronome::model
