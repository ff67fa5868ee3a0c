#include "metronome/kv/kv_policy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace metronome::kv {
namespace {

// The reference: count the keys Visible() admits, straight from the definition.
std::int64_t CountVisible(const KvPolicy& policy, TokenPos p) {
  std::int64_t n = 0;
  for (TokenPos j = 0; j <= p; ++j) n += policy.Visible(p, j) ? 1 : 0;
  return n;
}

TEST(KvPolicyTest, VisibleKeysCountsWhatVisibleAdmits) {
  for (const TokenPos window : {1, 2, 3, 7, 16}) {
    for (const TokenPos sinks : {0, 1, 4, 9}) {
      for (const PositionMode pos : {PositionMode::kAbsolute, PositionMode::kRolling}) {
        const KvPolicy policy = KvPolicy::Window(window, sinks, pos);
        for (TokenPos p = 0; p < 40; ++p) {
          EXPECT_EQ(policy.VisibleKeys(p), CountVisible(policy, p))
              << policy.ToString() << " at p=" << p;
        }
      }
    }
  }
  for (TokenPos p = 0; p < 40; ++p) EXPECT_EQ(KvPolicy::Full().VisibleKeys(p), p + 1);
}

// KeysOf's two ranges hold exactly the keys Visible() admits, sinks before the window, and the
// sinks' rotation is set exactly when the rolling gap is open, by the distance to S + W - 1.
TEST(KvPolicyTest, KeysOfHoldsExactlyTheVisibleKeys) {
  std::vector<KvPolicy> policies = {KvPolicy::Full()};
  for (const TokenPos window : {1, 2, 3, 7, 16}) {
    for (const TokenPos sinks : {0, 1, 4, 9}) {
      for (const PositionMode pos : {PositionMode::kAbsolute, PositionMode::kRolling}) {
        policies.push_back(KvPolicy::Window(window, sinks, pos));
      }
    }
  }
  for (const KvPolicy& policy : policies) {
    for (TokenPos p = 0; p < 40; ++p) {
      const base::QueryKeys keys = policy.KeysOf(p);
      ASSERT_LE(keys.sink_end, keys.window_begin) << policy.ToString() << " at p=" << p;
      ASSERT_LE(keys.window_begin, keys.window_end) << policy.ToString() << " at p=" << p;
      for (TokenPos j = 0; j <= p + 1; ++j) {
        const bool in_ranges = j < keys.sink_end || (j >= keys.window_begin && j < keys.window_end);
        EXPECT_EQ(in_ranges, j <= p && policy.Visible(p, j))
            << policy.ToString() << " at p=" << p << " j=" << j;
      }
      EXPECT_EQ(keys.count(), CountVisible(policy, p));
      EXPECT_EQ(keys.rotate_sinks, policy.RollingGap(p));
      if (keys.rotate_sinks) {
        EXPECT_EQ(p + keys.sink_rotation, policy.sinks + policy.window - 1);
      }
    }
  }
}

TEST(KvPolicyTest, VisibleKeysOfChunkSumsTheChunksQueries) {
  const KvPolicy policy = KvPolicy::Window(5, 2);
  EXPECT_EQ(policy.VisibleKeysOfChunk(10, 0), 0);
  // Queries 0..3 see 1, 2, 3, 4 keys; query 9 sees the 2 sinks and keys 5..9.
  EXPECT_EQ(policy.VisibleKeysOfChunk(0, 4), 1 + 2 + 3 + 4);
  EXPECT_EQ(policy.VisibleKeysOfChunk(9, 1), 2 + 5);
  std::int64_t sum = 0;
  for (TokenPos p = 3; p < 3 + 17; ++p) sum += CountVisible(policy, p);
  EXPECT_EQ(policy.VisibleKeysOfChunk(3, 17), sum);
}

}  // namespace
}  // namespace metronome::kv
