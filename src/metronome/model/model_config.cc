#include "metronome/model/model_config.h"

#include <cmath>
#include <string>

#include "metronome/base/errors.h"

namespace metronome::model {
namespace {

// Generous upper bounds: large enough for any real Llama/Qwen model, small enough that a hostile
// file cannot make the loader allocate terabytes before it notices the tensors are missing.
constexpr int kMaxDim = 1 << 16;
constexpr int kMaxLayers = 1024;
constexpr int kMaxVocab = 1 << 22;
constexpr int kMaxExperts = 512;  // llama.cpp's LLAMA_MAX_EXPERTS

void RequireRange(const std::string& source, const char* field, long long value, long long lo,
                  long long hi) {
  if (value < lo || value > hi) {
    throw ConfigError(source + ": model field '" + field + "' = " + std::to_string(value) +
                      " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
}

}  // namespace

std::string ArchitectureNames() {
  std::string s;
  for (const auto& a : kArchitectureNames) s += (s.empty() ? "" : ", ") + std::string(a.name);
  return s;
}

void ModelConfig::Validate(const std::string& source) const {
  RequireRange(source, "dim", dim, 1, kMaxDim);
  RequireRange(source, "num_layers", num_layers, 1, kMaxLayers);
  RequireRange(source, "num_heads", num_heads, 1, kMaxDim);
  RequireRange(source, "num_kv_heads", num_kv_heads, 1, num_heads);
  RequireRange(source, "head_dim", head_dim, 2, kMaxDim);
  RequireRange(source, "ffn_dim", ffn_dim, 1, 4 * kMaxDim);
  RequireRange(source, "vocab_size", vocab_size, 1, kMaxVocab);
  RequireRange(source, "context_length", context_length, 0, 1LL << 40);
  if (num_heads % num_kv_heads != 0) {
    throw ConfigError(source + ": num_heads = " + std::to_string(num_heads) +
                      " is not a multiple of num_kv_heads = " + std::to_string(num_kv_heads));
  }
  if (head_dim % 2 != 0) {
    throw ConfigError(source + ": head_dim = " + std::to_string(head_dim) + " must be even");
  }
  RequireRange(source, "rope_dim", rope_dim, 0, head_dim);
  if (rope_dim % 2 != 0) {
    throw ConfigError(source + ": rope_dim = " + std::to_string(rope_dim) + " must be even");
  }
  if (num_experts > 0) {
    RequireRange(source, "num_experts", num_experts, 2, kMaxExperts);
    RequireRange(source, "num_experts_used", num_experts_used, 1, num_experts);
    RequireRange(source, "expert_ffn_dim", expert_ffn_dim, 1, 4 * kMaxDim);
  } else {
    RequireRange(source, "num_experts", num_experts, 0, 0);
    RequireRange(source, "num_experts_used", num_experts_used, 0, 0);
    RequireRange(source, "expert_ffn_dim", expert_ffn_dim, 0, 0);
  }
  if (!(rms_eps > 0.0f && rms_eps < 1.0f)) {
    throw ConfigError(source + ": rms_eps = " + std::to_string(rms_eps) + " is outside (0, 1)");
  }
  if (!(rope_theta > 1.0 && rope_theta < 1e12)) {
    throw ConfigError(source + ": rope_theta = " + std::to_string(rope_theta) +
                      " is outside (1, 1e12)");
  }
  // Scaling factors far outside what any model uses (real ones are 2 .. 64) are file damage.
  if (!(rope_scaling_factor >= 1e-3 && rope_scaling_factor <= 1e6)) {
    throw ConfigError(source + ": rope_scaling_factor = " + std::to_string(rope_scaling_factor) +
                      " is outside [0.001, 1e6]");
  }
  if (rope_scaling == RopeScaling::kNone && rope_scaling_factor != 1.0) {
    throw ConfigError(source + ": rope_scaling_factor = " + std::to_string(rope_scaling_factor) +
                      " without a scaling type");
  }
  RequireRange(source, "rope_original_context", rope_original_context, 0, 1LL << 40);
  if (rope_scaling == RopeScaling::kYarn) {
    RequireRange(source, "yarn original context", yarn_original_context(), 1, 1LL << 40);
    if (!(yarn_beta_fast > 0.0 && yarn_beta_fast < 1e6 && yarn_beta_slow > 0.0 &&
          yarn_beta_slow < 1e6)) {
      throw ConfigError(source + ": yarn_beta_fast = " + std::to_string(yarn_beta_fast) +
                        " and yarn_beta_slow = " + std::to_string(yarn_beta_slow) +
                        " must lie in (0, 1e6)");
    }
  }
  if (!(rope_attn_factor > 0.0 && rope_attn_factor < 1e3)) {
    throw ConfigError(source + ": rope_attn_factor = " + std::to_string(rope_attn_factor) +
                      " is outside (0, 1000)");
  }
  if (!rope_freq_factors.empty()) {
    if (rope_freq_factors.size() != static_cast<std::size_t>(rotary_dim() / 2)) {
      throw ConfigError(source + ": rope_freq_factors has " +
                        std::to_string(rope_freq_factors.size()) +
                        " values, expected rotary_dim/2 = " + std::to_string(rotary_dim() / 2));
    }
    for (std::size_t i = 0; i < rope_freq_factors.size(); ++i) {
      const float f = rope_freq_factors[i];
      if (!(std::isfinite(f) && f > 0.0f && f < 1e6f)) {
        throw ConfigError(source + ": rope_freq_factors[" + std::to_string(i) +
                          "] = " + std::to_string(f) + " is outside (0, 1e6)");
      }
    }
  }
}

}  // namespace metronome::model
