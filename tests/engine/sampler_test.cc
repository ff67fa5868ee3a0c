#include "metronome/engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "metronome/base/errors.h"

namespace metronome::engine {
namespace {

TEST(SamplerTest, GreedyPicksLowestIndexOfTheMaximum) {
  Sampler s({0.0f, 1.0f, 1});
  const std::vector<float> lg = {0.1f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(s.Sample(lg), 1);
}

TEST(SamplerTest, SeededSamplingIsReproducibleAndFollowsTheDistribution) {
  const std::vector<float> lg = {0.0f, std::log(3.0f)};  // p = 1/4, 3/4
  Sampler a({1.0f, 1.0f, 9});
  Sampler b({1.0f, 1.0f, 9});
  int ones = 0;
  for (int i = 0; i < 4000; ++i) {
    const TokenId x = a.Sample(lg);
    ASSERT_EQ(x, b.Sample(lg));
    ones += x;
  }
  EXPECT_NEAR(ones / 4000.0, 0.75, 0.03);
}

TEST(SamplerTest, TopPDropsTheTail) {
  const std::vector<float> lg = {5.0f, 0.0f, 0.0f, 0.0f};
  Sampler s({1.0f, 0.5f, 3});
  for (int i = 0; i < 200; ++i) EXPECT_EQ(s.Sample(lg), 0);
}

TEST(SamplerTest, RejectsBadOptions) {
  EXPECT_THROW(Sampler({-1.0f, 1.0f, 1}), ConfigError);
  EXPECT_THROW(Sampler({1.0f, 0.0f, 1}), ConfigError);
}

}  // namespace
}  // namespace metronome::engine
