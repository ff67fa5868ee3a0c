#include "metronome/kernels/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "metronome/base/check.h"

namespace metronome::kernels {
namespace {

// The dimension index (counting pairs as 2 dims, as ggml does) where a pair makes `rotations` full
// turns over `original_context` positions: below it pairs rotate fast enough to keep their
// original frequency (extrapolate), above it they are interpolated.
double YarnCorrectionDim(int rotary_dim, double original_context, double rotations, double theta) {
  return rotary_dim * std::log(original_context / (rotations * 2.0 * std::numbers::pi)) /
         (2.0 * std::log(theta));
}

RopeSpec PlainSpec(int head_dim, int rotary_dim, double theta, RopePairing pairing) {
  RopeSpec s;
  s.head_dim = head_dim;
  s.rotary_dim = rotary_dim;
  s.theta = theta;
  s.pairing = pairing;
  return s;
}

}  // namespace

Rope::Rope(int head_dim, int rotary_dim, double theta, RopePairing pairing)
    : Rope(PlainSpec(head_dim, rotary_dim, theta, pairing)) {}

Rope::Rope(const RopeSpec& spec)
    : head_dim_(spec.head_dim), rotary_dim_(spec.rotary_dim), pairing_(spec.pairing) {
  MTR_CHECK(rotary_dim_ >= 2 && rotary_dim_ % 2 == 0 && rotary_dim_ <= head_dim_,
            "rope: rotary_dim must be even and in [2, head_dim]");
  const int pairs = rotary_dim_ / 2;
  MTR_CHECK(spec.freq_factors.empty() || static_cast<int>(spec.freq_factors.size()) == pairs,
            "rope: freq_factors must have rotary_dim/2 entries");
  MTR_CHECK(std::isfinite(spec.freq_scale) && spec.freq_scale > 0.0,
            "rope: freq_scale must be > 0");
  MTR_CHECK(!spec.yarn || spec.yarn_params.original_context > 0.0,
            "rope: yarn needs original_context > 0");
  // The ramp's ends as ggml clamps them: whole dims, inside [0, rotary_dim - 1].
  double low = 0.0;
  double high = 0.0;
  if (spec.yarn) {
    const RopeYarn& y = spec.yarn_params;
    low = std::max(0.0, std::floor(YarnCorrectionDim(rotary_dim_, y.original_context, y.beta_fast,
                                                     spec.theta)));
    high = std::min(
        static_cast<double>(rotary_dim_ - 1),
        std::ceil(YarnCorrectionDim(rotary_dim_, y.original_context, y.beta_slow, spec.theta)));
  }
  freq_.resize(static_cast<std::size_t>(pairs));
  for (int i = 0; i < pairs; ++i) {
    double extrapolated =
        std::pow(spec.theta, -2.0 * static_cast<double>(i) / static_cast<double>(rotary_dim_));
    if (!spec.freq_factors.empty()) {
      const float f = spec.freq_factors[static_cast<std::size_t>(i)];
      MTR_CHECK(std::isfinite(f) && f > 0.0f, "rope: freq_factors must be finite and > 0");
      extrapolated /= static_cast<double>(f);
    }
    const double interpolated = extrapolated * spec.freq_scale;
    double freq = interpolated;
    if (spec.yarn && spec.yarn_params.ext_factor != 0.0) {
      // 1 for pairs below `low` (keep the original frequency), 0 above `high` (interpolate).
      const double y = (static_cast<double>(i) - low) / std::max(0.001, high - low);
      const double mix = (1.0 - std::clamp(y, 0.0, 1.0)) * spec.yarn_params.ext_factor;
      freq = interpolated * (1.0 - mix) + extrapolated * mix;
    }
    freq_[static_cast<std::size_t>(i)] = freq;
  }
  double magnitude = spec.attn_factor;
  if (spec.yarn && spec.yarn_params.ext_factor != 0.0 && spec.freq_scale < 1.0) {
    magnitude *= 1.0 + 0.1 * std::log(1.0 / spec.freq_scale);
  }
  magnitude_ = static_cast<float>(magnitude);
}

void Rope::Angles(TokenPos pos, float* cos_out, float* sin_out) const noexcept {
  const auto p = static_cast<double>(pos);  // exact for |pos| < 2^53
  for (std::size_t i = 0; i < freq_.size(); ++i) {
    const double a = p * freq_[i];
    cos_out[i] = static_cast<float>(std::cos(a));
    sin_out[i] = static_cast<float>(std::sin(a));
  }
}

void Rope::PositionAngles(TokenPos pos, float* cos_out, float* sin_out) const noexcept {
  const auto p = static_cast<double>(pos);
  const double m = magnitude_;
  for (std::size_t i = 0; i < freq_.size(); ++i) {
    const double a = p * freq_[i];
    cos_out[i] = static_cast<float>(m * std::cos(a));
    sin_out[i] = static_cast<float>(m * std::sin(a));
  }
}

void Rope::Apply(float* vec, int num_heads, const float* cos_v, const float* sin_v) const noexcept {
  const int pairs = rotary_dim_ / 2;
  for (int h = 0; h < num_heads; ++h) {
    float* x = vec + static_cast<std::ptrdiff_t>(h) * head_dim_;
    if (pairing_ == RopePairing::kInterleaved) {
      for (int i = 0; i < pairs; ++i) {
        const float a = x[2 * i];
        const float b = x[2 * i + 1];
        x[2 * i] = a * cos_v[i] - b * sin_v[i];
        x[2 * i + 1] = a * sin_v[i] + b * cos_v[i];
      }
    } else {
      for (int i = 0; i < pairs; ++i) {
        const float a = x[i];
        const float b = x[i + pairs];
        x[i] = a * cos_v[i] - b * sin_v[i];
        x[i + pairs] = a * sin_v[i] + b * cos_v[i];
      }
    }
  }
}

void Rope::Rotate(float* vec, int num_heads, TokenPos pos) const noexcept {
  const auto p = static_cast<double>(pos);
  const std::size_t half = freq_.size();
  for (std::size_t i = 0; i < half; ++i) {
    const double a = p * freq_[i];
    const auto c = static_cast<float>(std::cos(a));
    const auto s = static_cast<float>(std::sin(a));
    // Pair members of dim i: (2i, 2i+1) interleaved, (i, i + half) NeoX.
    const std::size_t i0 = pairing_ == RopePairing::kInterleaved ? 2 * i : i;
    const std::size_t i1 = pairing_ == RopePairing::kInterleaved ? 2 * i + 1 : i + half;
    for (int h = 0; h < num_heads; ++h) {
      float* x = vec + static_cast<std::ptrdiff_t>(h) * head_dim_;
      const float x0 = x[i0];
      const float x1 = x[i1];
      x[i0] = x0 * c - x1 * s;
      x[i1] = x0 * s + x1 * c;
    }
  }
}

}  // namespace metronome::kernels
