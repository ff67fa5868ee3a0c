#include "metronome/engine/sampler.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <istream>
#include <numeric>
#include <sstream>
#include <string>

#include "metronome/base/errors.h"
#include "metronome/kernels/vector_ops.h"

namespace metronome::engine {

void SamplerOptions::Validate() const {
  if (!(temperature >= 0.0f && temperature <= 100.0f)) {
    throw ConfigError("temperature = " + std::to_string(temperature) + " must be in [0, 100]");
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    throw ConfigError("top_p = " + std::to_string(top_p) + " must be in (0, 1]");
  }
}

bool AllFinite(std::span<const float> row) noexcept {
  // On the bits, branch-free: a float is NaN or infinite exactly when its exponent bits are all
  // ones. In lanes of a fixed width because -O2's cost model leaves a plain loop over the row
  // scalar; this one vectorises (bench it before simplifying: it runs per sampled row).
  constexpr std::uint32_t kExponent = 0x7f800000u;
  constexpr std::size_t kLanes = 16;
  const auto bad = [](float v) {
    return static_cast<std::uint32_t>((std::bit_cast<std::uint32_t>(v) & kExponent) == kExponent);
  };
  std::array<std::uint32_t, kLanes> lanes{};
  const std::size_t whole = row.size() / kLanes * kLanes;
  for (std::size_t i = 0; i < whole; i += kLanes) {
    for (std::size_t j = 0; j < kLanes; ++j) lanes[j] |= bad(row[i + j]);
  }
  std::uint32_t any = 0;
  for (const std::uint32_t l : lanes) any |= l;
  for (std::size_t i = whole; i < row.size(); ++i) any |= bad(row[i]);
  return any == 0;
}

Sampler::Sampler(const SamplerOptions& options) : options_(options), rng_(options.seed) {
  options.Validate();
}

TokenId Sampler::Sample(std::span<const float> logits) {
  const int n = static_cast<int>(logits.size());
  if (options_.temperature == 0.0f) return kernels::Argmax(logits.data(), n);
  probs_.assign(logits.begin(), logits.end());
  for (float& p : probs_) p /= options_.temperature;
  kernels::Softmax(probs_.data(), n);
  order_.resize(static_cast<std::size_t>(n));
  std::iota(order_.begin(), order_.end(), 0);
  int keep = n;
  if (options_.top_p < 1.0f) {
    std::sort(order_.begin(), order_.end(), [this](int a, int b) {
      return probs_[static_cast<std::size_t>(a)] > probs_[static_cast<std::size_t>(b)];
    });
    float cum = 0.0f;
    for (int i = 0; i < n; ++i) {
      cum += probs_[static_cast<std::size_t>(order_[static_cast<std::size_t>(i)])];
      if (cum >= options_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  float total = 0.0f;
  for (int i = 0; i < keep; ++i)
    total += probs_[static_cast<std::size_t>(order_[static_cast<std::size_t>(i)])];
  const float r = std::uniform_real_distribution<float>(0.0f, total)(rng_);
  float cum = 0.0f;
  for (int i = 0; i < keep; ++i) {
    cum += probs_[static_cast<std::size_t>(order_[static_cast<std::size_t>(i)])];
    if (r < cum) return order_[static_cast<std::size_t>(i)];
  }
  return order_[static_cast<std::size_t>(keep - 1)];
}

std::string Sampler::SaveState() const {
  std::ostringstream out;
  out << rng_;
  return out.str();
}

bool Sampler::RestoreState(std::string_view state) {
  std::istringstream in{std::string(state)};
  std::mt19937_64 restored;
  in >> restored;
  if (in.fail()) return false;
  in >> std::ws;
  if (!in.eof()) return false;
  rng_ = restored;
  return true;
}

}  // namespace metronome::engine
