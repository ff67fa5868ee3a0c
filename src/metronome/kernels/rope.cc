#include "metronome/kernels/rope.h"

#include <cmath>

namespace metronome::kernels {

Rope::Rope(int head_dim, int rotary_dim, double theta, model::RopeStyle style)
    : head_dim_(head_dim), rotary_dim_(rotary_dim), style_(style) {
  inv_freq_.resize(static_cast<std::size_t>(rotary_dim / 2));
  for (int i = 0; i < rotary_dim / 2; ++i) {
    inv_freq_[static_cast<std::size_t>(i)] =
        std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(rotary_dim));
  }
}

void Rope::Angles(TokenPos pos, float* cos_out, float* sin_out) const noexcept {
  const auto p = static_cast<double>(pos);  // exact for |pos| < 2^53
  for (std::size_t i = 0; i < inv_freq_.size(); ++i) {
    const double a = p * inv_freq_[i];
    cos_out[i] = static_cast<float>(std::cos(a));
    sin_out[i] = static_cast<float>(std::sin(a));
  }
}

void Rope::Apply(float* vec, int num_heads, const float* cos_v, const float* sin_v) const noexcept {
  const int pairs = rotary_dim_ / 2;
  for (int h = 0; h < num_heads; ++h) {
    float* x = vec + static_cast<std::ptrdiff_t>(h) * head_dim_;
    if (style_ == model::RopeStyle::kInterleaved) {
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
  const std::size_t half = inv_freq_.size();
  for (std::size_t i = 0; i < half; ++i) {
    const double a = p * inv_freq_[i];
    const auto c = static_cast<float>(std::cos(a));
    const auto s = static_cast<float>(std::sin(a));
    // Pair members of dim i: (2i, 2i+1) interleaved, (i, i + half) NeoX.
    const std::size_t i0 = style_ == model::RopeStyle::kInterleaved ? 2 * i : i;
    const std::size_t i1 = style_ == model::RopeStyle::kInterleaved ? 2 * i + 1 : i + half;
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
