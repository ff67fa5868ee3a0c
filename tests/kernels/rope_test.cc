#include "metronome/kernels/rope.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

namespace metronome::kernels {
namespace {

TEST(RopeTest, InterleavedMatchesLlama2cFormula) {
  // llama2.c: theta = pos * 10000^(-(i mod hs)/hs) for the pair (i, i+1), i even.
  const int hd = 8;
  Rope rope(hd, hd, 10000.0, RopePairing::kInterleaved);
  std::vector<float> v(2 * hd);
  for (int i = 0; i < 2 * hd; ++i)
    v[static_cast<std::size_t>(i)] = 0.1f * static_cast<float>(i + 1);
  auto expected = v;
  const TokenPos pos = 37;
  for (int i = 0; i < 2 * hd; i += 2) {
    const double freq = std::pow(10000.0, -static_cast<double>(i % hd) / hd);
    const double a = static_cast<double>(pos) * freq;
    const double x0 = v[static_cast<std::size_t>(i)];
    const double x1 = v[static_cast<std::size_t>(i + 1)];
    expected[static_cast<std::size_t>(i)] = static_cast<float>(x0 * std::cos(a) - x1 * std::sin(a));
    expected[static_cast<std::size_t>(i + 1)] =
        static_cast<float>(x0 * std::sin(a) + x1 * std::cos(a));
  }
  rope.Rotate(v.data(), 2, pos);
  for (std::size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(v[i], expected[i], 1e-6f) << i;
}

TEST(RopeTest, NeoxRotatesHalves) {
  const int hd = 4;
  Rope rope(hd, hd, 10000.0, RopePairing::kNeox);
  float v[4] = {1.0f, 0.0f, 0.0f, 0.0f};
  rope.Rotate(v, 1, 3);
  // Pair (0, 2) with frequency 1: (cos 3, sin 3).
  EXPECT_NEAR(v[0], std::cos(3.0f), 1e-6f);
  EXPECT_NEAR(v[2], std::sin(3.0f), 1e-6f);
  EXPECT_FLOAT_EQ(v[1], 0.0f);
}

TEST(RopeTest, RotationsComposeExactlyAtHugePositions) {
  // Rotating by a then by b equals rotating by a + b, even at positions reached after days of
  // streaming: angles are computed from int64 positions in double precision.
  const int hd = 64;
  Rope rope(hd, hd, 10000.0, RopePairing::kInterleaved);
  std::vector<float> a(hd), b(hd);
  for (int i = 0; i < hd; ++i)
    a[static_cast<std::size_t>(i)] = b[static_cast<std::size_t>(i)] =
        std::sin(0.3f * static_cast<float>(i)) + 0.5f;
  const TokenPos big = TokenPos{3'000'000'000};
  rope.Rotate(a.data(), 1, big);
  rope.Rotate(a.data(), 1, -big + 5);
  rope.Rotate(b.data(), 1, 5);
  for (int i = 0; i < hd; ++i)
    EXPECT_NEAR(a[static_cast<std::size_t>(i)], b[static_cast<std::size_t>(i)], 2e-6f) << i;
}

TEST(RopeTest, AnglesAreExactForLargePositions) {
  Rope rope(2, 2, 10000.0, RopePairing::kInterleaved);
  float c = 0.0f, s = 0.0f;
  const TokenPos pos = TokenPos{1} << 40;
  rope.Angles(pos, &c, &s);
  const long double a = static_cast<long double>(pos);
  EXPECT_NEAR(c, static_cast<float>(std::cos(a)), 1e-6f);
  EXPECT_NEAR(s, static_cast<float>(std::sin(a)), 1e-6f);
}

// ---- variants: every frequency checked against the formula written out here, in double ------

// What a pair's frequency must be, straight from the definitions (Llama 3.1 rope_freqs divide the
// frequency; linear interpolation multiplies it by 1/factor; YaRN blends the interpolated and the
// original frequency by a ramp over the pair index between the dims where a pair turns
// beta_fast resp. beta_slow times over the original context, those dims rounded outwards and
// clamped to [0, rotary_dim - 1]).
double ReferenceFrequency(const RopeSpec& s, int i) {
  double f = std::pow(s.theta, -2.0 * i / s.rotary_dim);
  if (!s.freq_factors.empty()) f /= s.freq_factors[static_cast<std::size_t>(i)];
  if (!s.yarn) return f * s.freq_scale;
  const auto dim_of = [&](double turns) {
    return s.rotary_dim *
           std::log(s.yarn_params.original_context / (turns * 2.0 * std::numbers::pi)) /
           (2.0 * std::log(s.theta));
  };
  const double low = std::max(0.0, std::floor(dim_of(s.yarn_params.beta_fast)));
  const double high = std::min(s.rotary_dim - 1.0, std::ceil(dim_of(s.yarn_params.beta_slow)));
  double ramp = (i - low) / std::max(0.001, high - low);
  ramp = 1.0 - std::min(1.0, std::max(0.0, ramp));
  return f * s.freq_scale * (1.0 - ramp) + f * ramp;
}

RopeSpec VariantSpec(int variant) {
  RopeSpec s;
  s.head_dim = 64;
  s.rotary_dim = 64;
  s.theta = 500000.0;
  s.pairing = variant % 2 == 0 ? RopePairing::kInterleaved : RopePairing::kNeox;
  if (variant == 1 || variant == 3) {
    for (int i = 0; i < 32; ++i) s.freq_factors.push_back(1.0f + 0.25f * static_cast<float>(i % 7));
  }
  if (variant == 2) s.freq_scale = 0.25;  // linear x4
  if (variant == 3 || variant == 4) {
    s.theta = 10000.0;
    s.freq_scale = 0.25;
    s.yarn = true;
    s.yarn_params.original_context = 512;
  }
  return s;
}

TEST(RopeTest, EveryVariantsFrequenciesMatchTheFormula) {
  for (int variant = 0; variant <= 4; ++variant) {
    const RopeSpec s = VariantSpec(variant);
    const Rope rope(s);
    for (int i = 0; i < 32; ++i) {
      const double want = ReferenceFrequency(s, i);
      EXPECT_NEAR(rope.frequency(i), want, 1e-12 * want) << "variant " << variant << " pair " << i;
    }
  }
}

TEST(RopeTest, YarnKeepsFastPairsInterpolatesSlowOnesAndScalesMagnitude) {
  const RopeSpec s = VariantSpec(4);  // theta 1e4, factor 4, original context 512, 64 dims
  const Rope rope(s);
  // Pair 0 turns 512 / 2pi ~ 81 times over 512 positions (> beta_fast 32): kept.
  EXPECT_DOUBLE_EQ(rope.frequency(0), 1.0);
  // The slowest pair turns far less than once (< beta_slow 1): fully interpolated.
  EXPECT_NEAR(rope.frequency(31), 0.25 * std::pow(1e4, -62.0 / 64), 1e-18);
  // Magnitude 1 + 0.1 ln 4 on q and k (HF / llama.cpp mscale), only at a position.
  EXPECT_NEAR(rope.magnitude(), 1.0 + 0.1 * std::log(4.0), 1e-6);
  float c[32], sn[32], pc[32], ps[32];
  rope.Angles(7, c, sn);
  rope.PositionAngles(7, pc, ps);
  for (int i = 0; i < 32; ++i) {
    EXPECT_NEAR(pc[i], rope.magnitude() * c[i], 1e-6f);
    EXPECT_NEAR(ps[i], rope.magnitude() * sn[i], 1e-6f);
  }
  EXPECT_FLOAT_EQ(Rope(VariantSpec(1)).magnitude(), 1.0f);
  EXPECT_FLOAT_EQ(Rope(VariantSpec(2)).magnitude(), 1.0f);
}

// Rolling positions move an already rotated query by a delta: with every variant, a vector placed
// at p and then rotated by d must equal one placed at p + d (magnitude applied once).
TEST(RopeTest, EveryVariantComposesPositionAndDelta) {
  for (int variant = 0; variant <= 4; ++variant) {
    const RopeSpec s = VariantSpec(variant);
    const Rope rope(s);
    std::vector<float> a(64), b(64), cos_p(32), sin_p(32);
    for (int i = 0; i < 64; ++i) a[static_cast<std::size_t>(i)] = std::sin(0.7f * i) + 0.2f;
    b = a;
    const TokenPos p = 1'000'003;
    const TokenPos d = 4 + 500 - 1 - p;  // to S + W - 1 for S 4, W 500
    rope.PositionAngles(p, cos_p.data(), sin_p.data());
    rope.Apply(a.data(), 1, cos_p.data(), sin_p.data());
    rope.Rotate(a.data(), 1, d);
    rope.PositionAngles(p + d, cos_p.data(), sin_p.data());
    rope.Apply(b.data(), 1, cos_p.data(), sin_p.data());
    for (int i = 0; i < 64; ++i) {
      EXPECT_NEAR(a[static_cast<std::size_t>(i)], b[static_cast<std::size_t>(i)], 2e-5f)
          << "variant " << variant << " dim " << i;
    }
  }
}

}  // namespace
}  // namespace metronome::kernels
