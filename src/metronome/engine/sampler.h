// Next-token choice from a logits row: greedy (temperature 0; lowest index among equal maxima, as
// llama2.c) or temperature sampling with optional nucleus (top-p) truncation from a seeded
// generator, so runs are reproducible.
//
// Thread-safety: a Sampler holds its generator state; use one per session or per thread.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "metronome/base/types.h"

namespace metronome::engine {

struct SamplerOptions {
  float temperature = 0.0f;  // 0: greedy
  float top_p = 1.0f;        // (0, 1]; 1 disables nucleus truncation
  std::uint64_t seed = 42;

  void Validate() const;  // ConfigError naming the field
};

// True when every value of `row` is finite (NaN and infinities are not). The engine's callers
// check each logits row they sample or score (Engine::logits_finite) and fail the item with
// StepStatus::kNonFiniteLogits otherwise: greedy argmax over NaN answers token 0 and a softmax
// over it answers garbage, either looking like a normal output.
[[nodiscard]] bool AllFinite(std::span<const float> row) noexcept;

class Sampler {
 public:
  explicit Sampler(const SamplerOptions& options);
  [[nodiscard]] TokenId Sample(std::span<const float> logits);
  // The generator's state (std::mt19937_64's text form), so that another sampler with the same
  // options continues the same draws: a moved session samples what it would have.
  [[nodiscard]] std::string SaveState() const;
  // False, the state unchanged, when `state` is not SaveState's form.
  bool RestoreState(std::string_view state);

 private:
  SamplerOptions options_;
  std::mt19937_64 rng_;
  std::vector<float> probs_;
  std::vector<int> order_;
};

}  // namespace metronome::engine
