// Rotary position embedding with exact angles for 64-bit positions. Angles are pos * inv_freq
// computed in double (glibc reduces large arguments exactly), then rounded once to fp32, so a key
// written at position 10^9 is rotated as accurately as one at position 10. Keys are rotated once,
// when written; nothing here is ever applied twice to the same stored key.
//
// Thread-safety: a Rope is immutable after construction.
#pragma once

#include <cstddef>
#include <vector>

#include "metronome/base/types.h"
#include "metronome/model/model_config.h"

namespace metronome::kernels {

// cos/sin rows from Rope::Angles() for a run of consecutive queries, prepared by a caller that
// applies the same rotation many times (once per layer and kv head): query i's num_pairs() cosines
// start at cos + i * stride, its sines at sin + i * stride.
struct RopeAngleRows {
  const float* cos = nullptr;
  const float* sin = nullptr;
  std::size_t stride = 0;  // floats between consecutive queries' rows
};

class Rope {
 public:
  Rope(int head_dim, int rotary_dim, double theta, model::RopeStyle style);

  // cos/sin of the angles for `pos`: writes rotary_dim/2 values to each.
  void Angles(TokenPos pos, float* cos_out, float* sin_out) const noexcept;

  // Rotates every head of `vec` ([num_heads, head_dim]) by the angles from Angles().
  void Apply(float* vec, int num_heads, const float* cos_v, const float* sin_v) const noexcept;

  // Rotates every head of `vec` by position delta `pos` (may be negative): R(pos) composed with
  // whatever rotation vec already has. Used to move an already rotated query. Evaluates the trig
  // of every pair: callers rotating by the same delta repeatedly use Angles() once and Apply().
  void Rotate(float* vec, int num_heads, TokenPos pos) const noexcept;

  [[nodiscard]] int num_pairs() const { return rotary_dim_ / 2; }
  [[nodiscard]] int head_dim() const { return head_dim_; }

 private:
  int head_dim_;
  int rotary_dim_;
  model::RopeStyle style_;
  std::vector<double> inv_freq_;  // [rotary_dim/2]: theta^(-2i/rotary_dim)
};

}  // namespace metronome::kernels
