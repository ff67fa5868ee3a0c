#include "metronome/engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
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

TEST(SamplerTest, AllFiniteRefusesNanAndInfinitiesAnywhere) {
  std::vector<float> row(1000, 1.0f);
  row[3] = std::numeric_limits<float>::max();
  row[4] = -std::numeric_limits<float>::max();
  row[5] = std::numeric_limits<float>::denorm_min();
  row[6] = -0.0f;
  EXPECT_TRUE(AllFinite(row));
  EXPECT_TRUE(AllFinite({}));
  for (const float bad :
       {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
        std::numeric_limits<float>::signaling_NaN(), std::numeric_limits<float>::infinity(),
        -std::numeric_limits<float>::infinity()}) {
    for (const std::size_t at : {std::size_t{0}, std::size_t{517}, row.size() - 1}) {
      std::vector<float> r = row;
      r[at] = bad;
      EXPECT_FALSE(AllFinite(r)) << bad << " at " << at;
    }
  }
}

}  // namespace
}  // namespace metronome::engine
