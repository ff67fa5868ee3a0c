#include "metronome/kernels/vector_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace metronome::kernels {
namespace {

std::vector<float> Random(int n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-2.0f, 2.0f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

// Every SIMD kernel against its scalar reference, over lengths that exercise the vector body,
// the remainder and the masked tail.
TEST(VectorOpsTest, SimdMatchesScalarReference) {
  for (int n : {1, 3, 8, 15, 16, 17, 31, 32, 33, 64, 100, 576, 1537}) {
    const auto a = Random(n, 1u + static_cast<unsigned>(n));
    const auto b = Random(n, 100u + static_cast<unsigned>(n));
    EXPECT_NEAR(Dot(a.data(), b.data(), n), reference::Dot(a.data(), b.data(), n),
                1e-4f * static_cast<float>(n))
        << n;

    auto y1 = b;
    auto y2 = b;
    Axpy(0.7f, a.data(), y1.data(), n);
    reference::Axpy(0.7f, a.data(), y2.data(), n);
    for (int i = 0; i < n; ++i)
      ASSERT_NEAR(y1[static_cast<std::size_t>(i)], y2[static_cast<std::size_t>(i)], 1e-5f);

    std::vector<float> s1(static_cast<std::size_t>(n)), s2(static_cast<std::size_t>(n));
    auto g = a;
    for (float& v : g) v *= 30.0f;  // silu over a wide range, both signs
    SwiGlu(g.data(), b.data(), s1.data(), n);
    reference::SwiGlu(g.data(), b.data(), s2.data(), n);
    for (int i = 0; i < n; ++i) {
      ASSERT_NEAR(s1[static_cast<std::size_t>(i)], s2[static_cast<std::size_t>(i)],
                  1e-5f * (1.0f + std::abs(s2[static_cast<std::size_t>(i)])));
    }

    std::vector<float> r1(static_cast<std::size_t>(n)), r2(static_cast<std::size_t>(n));
    RmsNorm(a.data(), b.data(), 1e-5f, r1.data(), n);
    reference::RmsNorm(a.data(), b.data(), 1e-5f, r2.data(), n);
    for (int i = 0; i < n; ++i)
      ASSERT_NEAR(r1[static_cast<std::size_t>(i)], r2[static_cast<std::size_t>(i)], 1e-4f);
  }
}

TEST(VectorOpsTest, SoftmaxMatchesScalarReference) {
  for (int n : {1, 7, 16, 17, 100, 513}) {
    auto x = Random(n, 40u + static_cast<unsigned>(n));
    for (float& v : x) v *= 20.0f;  // wide range: exercises large negative exponents
    auto y = x;
    Softmax(x.data(), n);
    reference::Softmax(y.data(), n);
    for (int i = 0; i < n; ++i) {
      const float want = y[static_cast<std::size_t>(i)];
      ASSERT_NEAR(x[static_cast<std::size_t>(i)], want, 1e-6f + 2e-6f * want) << n << " " << i;
    }
  }
}

TEST(VectorOpsTest, SoftmaxSumsToOneAndIsShiftInvariant) {
  auto x = Random(50, 7);
  auto y = x;
  for (float& v : y) v += 100.0f;
  Softmax(x.data(), 50);
  Softmax(y.data(), 50);
  float sum = 0.0f;
  for (int i = 0; i < 50; ++i) {
    sum += x[static_cast<std::size_t>(i)];
    EXPECT_NEAR(x[static_cast<std::size_t>(i)], y[static_cast<std::size_t>(i)], 1e-6f);
  }
  EXPECT_NEAR(sum, 1.0f, 1e-5f);
}

TEST(VectorOpsTest, ArgmaxTakesLowestIndexAmongTies) {
  const std::vector<float> x = {1.0f, 3.0f, 2.0f, 3.0f};
  EXPECT_EQ(Argmax(x.data(), 4), 1);
}

TEST(VectorOpsTest, SwiGluMatchesDefinition) {
  const float g[2] = {0.0f, 2.0f};
  const float u[2] = {5.0f, 3.0f};
  float o[2];
  SwiGlu(g, u, o, 2);
  EXPECT_FLOAT_EQ(o[0], 0.0f);
  EXPECT_NEAR(o[1], 2.0f / (1.0f + std::exp(-2.0f)) * 3.0f, 1e-6f);
}

}  // namespace
}  // namespace metronome::kernels
