#include "metronome/kernels/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace metronome::kernels {
namespace {

using model::RopeStyle;

TEST(RopeTest, InterleavedMatchesLlama2cFormula) {
  // llama2.c: theta = pos * 10000^(-(i mod hs)/hs) for the pair (i, i+1), i even.
  const int hd = 8;
  Rope rope(hd, hd, 10000.0, RopeStyle::kInterleaved);
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
  Rope rope(hd, hd, 10000.0, RopeStyle::kNeox);
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
  Rope rope(hd, hd, 10000.0, RopeStyle::kInterleaved);
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
  Rope rope(2, 2, 10000.0, RopeStyle::kInterleaved);
  float c = 0.0f, s = 0.0f;
  const TokenPos pos = TokenPos{1} << 40;
  rope.Angles(pos, &c, &s);
  const long double a = static_cast<long double>(pos);
  EXPECT_NEAR(c, static_cast<float>(std::cos(a)), 1e-6f);
  EXPECT_NEAR(s, static_cast<float>(std::sin(a)), 1e-6f);
}

}  // namespace
}  // namespace metronome::kernels
