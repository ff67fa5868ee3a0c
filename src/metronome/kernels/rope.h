// Rotary position embedding with exact angles for 64-bit positions. Angles are pos * freq
// computed in double (glibc reduces large arguments exactly), then rounded once to fp32, so a key
// written at position 10^9 is rotated as accurately as one at position 10. Keys are rotated once,
// when written; nothing here is ever applied twice to the same stored key.
//
// Every variant here (plain, per-pair frequency factors, linear interpolation, YaRN) gives each
// pair i an angle that is pos * freq[i] with freq[i] fixed at construction, so rotations compose:
// R(a) then R(b) is R(a + b). That is what lets rolling positions move an already rotated query
// by a delta (Rotate, Angles + Apply). YaRN's magnitude factor is not a rotation: it is applied
// once, when a query or key is first rotated at its position (PositionAngles), never by a delta.
//
// Thread-safety: a Rope is immutable after construction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "metronome/base/types.h"

namespace metronome::kernels {

// How RoPE pairs the dimensions of a head.
enum class RopePairing : std::uint8_t {
  kInterleaved,  // pairs (2i, 2i+1): llama.cpp ROPE_TYPE_NORM (GGUF `llama`, llama2.c)
  kNeox,         // pairs (i, i + rotary_dim/2): llama.cpp ROPE_TYPE_NEOX (GGUF `qwen2`)
};

// YaRN (Peng et al. 2023) as llama.cpp/ggml compute it: pair i's frequency blends the
// interpolated one (freq * freq_scale) and the original one by a ramp over the pair index between
// the "correction dims" of beta_fast and beta_slow rotations over original_context, and q and k
// are scaled by 1 + 0.1 ln(1 / freq_scale) (when freq_scale < 1).
struct RopeYarn {
  double original_context = 0;  // the context the model was trained with before scaling; > 0
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double ext_factor = 1.0;  // weight of the ramp (ggml's ext_factor); 1 for YaRN files
};

// Everything that decides a model's rotary angles; built by the caller from the model's config.
struct RopeSpec {
  int head_dim = 0;    // floats per head
  int rotary_dim = 0;  // leading dims of each head that rotate; even, <= head_dim
  double theta = 10000.0;
  RopePairing pairing = RopePairing::kInterleaved;
  // Per-pair divisors of the frequency (Llama 3.1+ `rope_freqs.weight`): empty, or rotary_dim/2
  // finite values > 0.
  std::vector<float> freq_factors;
  // Position interpolation: 1 / scaling factor (linear and YaRN); 1 for none; > 0.
  double freq_scale = 1.0;
  bool yarn = false;  // use `yarn` below
  RopeYarn yarn_params;
  // Multiplies q and k once, at their position (GGUF rope.scaling.attn_factor); 1 for none.
  double attn_factor = 1.0;
};

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
  // Plain RoPE: theta^(-2i/rotary_dim) per pair.
  Rope(int head_dim, int rotary_dim, double theta, RopePairing pairing);
  // Any variant. The spec must be valid (callers validate what they read from a file; see
  // model::ModelConfig::Validate): MTR_CHECK otherwise.
  explicit Rope(const RopeSpec& spec);

  // cos/sin of the pure rotation by `pos` (a position or a delta): rotary_dim/2 values each.
  void Angles(TokenPos pos, float* cos_out, float* sin_out) const noexcept;
  // The rotation that places a fresh query or key at position `pos`: Angles(pos) times the
  // magnitude factor (1 except with YaRN or attn_factor).
  void PositionAngles(TokenPos pos, float* cos_out, float* sin_out) const noexcept;

  // Rotates every head of `vec` ([num_heads, head_dim]) by the angles from Angles() or
  // PositionAngles().
  void Apply(float* vec, int num_heads, const float* cos_v, const float* sin_v) const noexcept;

  // Rotates every head of `vec` by position delta `pos` (may be negative): R(pos) composed with
  // whatever rotation vec already has. Used to move an already rotated query. Evaluates the trig
  // of every pair: callers rotating by the same delta repeatedly use Angles() once and Apply().
  void Rotate(float* vec, int num_heads, TokenPos pos) const noexcept;

  [[nodiscard]] int num_pairs() const { return rotary_dim_ / 2; }
  [[nodiscard]] int head_dim() const { return head_dim_; }
  // Angular frequency of pair i (radians per position), after every variant's adjustment.
  [[nodiscard]] double frequency(int pair) const { return freq_[static_cast<std::size_t>(pair)]; }
  // The factor PositionAngles multiplies cos/sin by.
  [[nodiscard]] float magnitude() const { return magnitude_; }

 private:
  int head_dim_;
  int rotary_dim_;
  RopePairing pairing_;
  std::vector<double> freq_;  // [rotary_dim/2]
  float magnitude_ = 1.0f;
};

}  // namespace metronome::kernels
