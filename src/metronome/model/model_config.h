// Shape and hyper-parameters of a Llama-family decoder. Filled by the loaders (GGUF metadata,
// llama2.c header, synthetic presets); read by the runtime. Immutable once loaded.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "metronome/base/enum_names.h"

namespace metronome::model {

// The decoder families the engine computes, by GGUF general.architecture.
enum class Architecture : std::uint8_t {
  kLlama,    // "llama"
  kQwen2,    // "qwen2": NeoX pairs, Q/K/V biases
  kQwen3,    // "qwen3": NeoX pairs, per-head RMSNorm of q and k, no biases
  kQwen3Moe  // "qwen3moe": qwen3's attention, a mixture-of-experts FFN in every layer
};
inline constexpr std::array<EnumName<Architecture>, 4> kArchitectureNames = {{
    {Architecture::kLlama, "llama"},
    {Architecture::kQwen2, "qwen2"},
    {Architecture::kQwen3, "qwen3"},
    {Architecture::kQwen3Moe, "qwen3moe"},
}};
[[nodiscard]] inline const char* ArchitectureName(Architecture a) noexcept {
  return NameOf(kArchitectureNames, a, "?");
}
[[nodiscard]] inline std::optional<Architecture> ParseArchitecture(std::string_view name) noexcept {
  return ValueOf(kArchitectureNames, name);
}
// "llama, qwen2, qwen3, qwen3moe" (for messages).
[[nodiscard]] std::string ArchitectureNames();

// How RoPE pairs the dimensions of a head.
enum class RopeStyle : std::uint8_t {
  kInterleaved,  // pairs (2i, 2i+1): llama2.c and GGUF `llama` (llama.cpp ROPE_TYPE_NORM)
  kNeox,         // pairs (i, i + head_dim/2): GGUF `qwen2` (llama.cpp ROPE_TYPE_NEOX)
};

// GGUF `<arch>.rope.scaling.type`: how positions beyond the trained context are squeezed in.
enum class RopeScaling : std::uint8_t {
  kNone,    // "none", or no scaling factor
  kLinear,  // "linear" (llama.cpp's default type when only a factor is given): positions / factor
  kYarn,    // "yarn": frequency-dependent interpolation plus a magnitude factor
};

struct ModelConfig {
  Architecture architecture = Architecture::kLlama;
  std::string name;  // free text for logs, e.g. "stories260K.bin" or "synthetic:tiny"
  int dim = 0;       // residual width
  int num_layers = 0;
  int num_heads = 0;     // query heads
  int num_kv_heads = 0;  // key/value heads; num_heads % num_kv_heads == 0 (GQA)
  int head_dim = 0;      // usually dim / num_heads
  int ffn_dim = 0;       // hidden width of the SwiGLU feed-forward
  int vocab_size = 0;
  int context_length = 0;  // trained context; informational (the KV policy bounds a session)
  float rms_eps = 1e-5f;
  double rope_theta = 10000.0;
  int rope_dim = 0;  // rotated dims per head (<= head_dim); 0 means head_dim
  RopeStyle rope_style = RopeStyle::kInterleaved;
  RopeScaling rope_scaling = RopeScaling::kNone;
  double rope_scaling_factor = 1.0;  // linear and yarn: > 0; 1 with kNone
  // yarn: the context the model had before scaling (rope.scaling.original_context_length); 0
  // means context_length, as llama.cpp reads it.
  int rope_original_context = 0;
  double yarn_beta_fast = 32.0;   // yarn: rope.scaling.yarn_beta_fast (llama.cpp's default 32)
  double yarn_beta_slow = 1.0;    // yarn: rope.scaling.yarn_beta_slow (llama.cpp's default 1)
  double rope_attn_factor = 1.0;  // rope.scaling.attn_factor: q and k scaled once by it
  // Llama 3.1+ `rope_freqs.weight`: per rotary pair, the divisor of its frequency; empty, or
  // rotary_dim()/2 finite values > 0.
  std::vector<float> rope_freq_factors;
  bool has_qkv_bias = false;     // qwen2
  bool has_qk_norm = false;      // qwen3*: RMSNorm (weights [head_dim], rms_eps) of every q and k
                                 // head before RoPE
  bool tied_embeddings = false;  // output projection shares token_embedding
  // Mixture of experts (qwen3moe): 0 experts is a dense SwiGLU FFN of ffn_dim. Otherwise each
  // layer's FFN is num_experts SwiGLU experts of expert_ffn_dim; a router ([num_experts, dim])
  // picks num_experts_used of them per token (softmax over all, the best k, weights renormalised
  // to sum 1) and their outputs are summed with those weights.
  int num_experts = 0;
  int num_experts_used = 0;
  int expert_ffn_dim = 0;

  [[nodiscard]] bool is_moe() const { return num_experts > 0; }

  [[nodiscard]] int q_dim() const { return num_heads * head_dim; }
  [[nodiscard]] int kv_dim() const { return num_kv_heads * head_dim; }
  [[nodiscard]] int qkv_dim() const { return q_dim() + 2 * kv_dim(); }
  [[nodiscard]] int rotary_dim() const { return rope_dim > 0 ? rope_dim : head_dim; }
  // The sizes the weights are laid out by, as element counts (one conversion for every layout).
  struct Extents {
    std::size_t dim, vocab, ffn, q, kv, qkv, head, experts, expert_ffn;
  };
  [[nodiscard]] Extents extents() const {
    const auto n = [](int v) { return static_cast<std::size_t>(v); };
    return {n(dim),       n(vocab_size), n(ffn_dim),     n(q_dim()),       n(kv_dim()),
            n(qkv_dim()), n(head_dim),   n(num_experts), n(expert_ffn_dim)};
  }
  // rope_original_context, or context_length when the file does not give one.
  [[nodiscard]] int yarn_original_context() const {
    return rope_original_context > 0 ? rope_original_context : context_length;
  }

  // Throws ConfigError naming the first field that is out of range or inconsistent (e.g. heads not
  // dividing, sizes <= 0 or absurdly large). `source` names the file for the message.
  void Validate(const std::string& source) const;
};

}  // namespace metronome::model
