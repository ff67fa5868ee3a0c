#include "metronome/kv/block_pool.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

#include "metronome/base/errors.h"

namespace metronome::kv {
namespace {

KvLayout SmallLayout() { return {2, 2, 4, 4}; }

TEST(BlockPoolTest, AllocatesEveryBlockOnceThenReportsExhaustion) {
  BlockPool pool(SmallLayout(), {.num_blocks = 5});
  std::set<BlockId> seen;
  for (int i = 0; i < 5; ++i) {
    const BlockId b = pool.Allocate();
    ASSERT_NE(b, kNoBlock);
    EXPECT_TRUE(seen.insert(b).second) << "block handed out twice";
  }
  EXPECT_EQ(pool.Allocate(), kNoBlock);
  EXPECT_EQ(pool.num_free_blocks(), 0);
  pool.Free(*seen.begin());
  EXPECT_EQ(pool.num_free_blocks(), 1);
  EXPECT_EQ(pool.Allocate(), *seen.begin());
}

TEST(BlockPoolTest, AllocateManyIsAllOrNothing) {
  BlockPool pool(SmallLayout(), {.num_blocks = 4});
  BlockId out[8];
  EXPECT_FALSE(pool.AllocateMany(5, out));
  EXPECT_EQ(pool.num_free_blocks(), 4);
  EXPECT_TRUE(pool.AllocateMany(4, out));
  EXPECT_EQ(pool.num_free_blocks(), 0);
}

TEST(BlockPoolTest, LayoutArithmetic) {
  const KvLayout l{3, 2, 8, 16};  // kv_dim 16
  EXPECT_EQ(l.plane_floats(), 16u * 16u);
  EXPECT_EQ(l.block_floats(), 3u * 2u * 16u * 16u);
  EXPECT_EQ(l.bytes_per_token(), 3u * 2u * 16u * sizeof(float));
  EXPECT_EQ(BlockPool::BlocksForMegabytes(l, 1.0),
            static_cast<int>((1 << 20) / l.bytes_per_block()));
}

TEST(BlockPoolTest, PoisonOnFreeFillsNaN) {
  BlockPool pool(SmallLayout(), {.num_blocks = 2, .poison_on_free = true});
  const BlockId b = pool.Allocate();
  float* d = pool.block_data(b);
  d[0] = 1.0f;
  pool.Free(b);
  EXPECT_TRUE(std::isnan(d[0]));
}

TEST(BlockPoolTest, RejectsEmptyPool) {
  EXPECT_THROW(BlockPool(SmallLayout(), {.num_blocks = 0}), ConfigError);
}

TEST(BlockPoolDeathTest, DoubleFreeAborts) {
  BlockPool pool(SmallLayout(), {.num_blocks = 2});
  const BlockId b = pool.Allocate();
  pool.Free(b);
  EXPECT_DEATH(pool.Free(b), "double free");
}

}  // namespace
}  // namespace metronome::kv
