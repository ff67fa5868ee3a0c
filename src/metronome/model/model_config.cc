#include "metronome/model/model_config.h"

#include <string>

#include "metronome/base/errors.h"

namespace metronome::model {
namespace {

// Generous upper bounds: large enough for any real Llama/Qwen model, small enough that a hostile
// file cannot make the loader allocate terabytes before it notices the tensors are missing.
constexpr int kMaxDim = 1 << 16;
constexpr int kMaxLayers = 1024;
constexpr int kMaxVocab = 1 << 22;

void RequireRange(const std::string& source, const char* field, long long value, long long lo,
                  long long hi) {
  if (value < lo || value > hi) {
    throw ConfigError(source + ": model field '" + field + "' = " + std::to_string(value) +
                      " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
}

}  // namespace

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
  if (!(rms_eps > 0.0f && rms_eps < 1.0f)) {
    throw ConfigError(source + ": rms_eps = " + std::to_string(rms_eps) + " is outside (0, 1)");
  }
  if (!(rope_theta > 1.0 && rope_theta < 1e12)) {
    throw ConfigError(source + ": rope_theta = " + std::to_string(rope_theta) +
                      " is outside (1, 1e12)");
  }
}

}  // namespace metronome::model
