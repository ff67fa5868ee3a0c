#include "metronome/kv/block_pool.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
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
  const KvLayout l{3, 2, 8, 16, KvDtype::kF32};  // kv_dim 16
  EXPECT_EQ(l.plane_elements(), 16u * 16u);
  EXPECT_EQ(l.block_elements(), 3u * 2u * 16u * 16u);
  EXPECT_EQ(l.bytes_per_token(), 3u * 2u * 16u * sizeof(float));
  // The default element type, bf16: half the bytes.
  const KvLayout h{3, 2, 8, 16};
  EXPECT_EQ(h.dtype, KvDtype::kBF16);
  EXPECT_EQ(h.bytes_per_token(), 3u * 2u * 16u * sizeof(std::uint16_t));
  EXPECT_EQ(BlockPool::BlocksForMegabytes(l, 1.0),
            static_cast<int>((1 << 20) / l.bytes_per_block()));
}

TEST(BlockPoolTest, PoisonOnFreeFillsNaN) {
  BlockPool pool(SmallLayout(), {.num_blocks = 2, .poison_on_free = true});
  const BlockId b = pool.Allocate();
  auto* d = reinterpret_cast<float*>(pool.block_data(b));
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

namespace metronome::kv {
namespace {

TEST(Bf16Test, RoundsToNearestEvenAndKeepsNaN) {
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f)), 1.0f);
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(-2.5f)), -2.5f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + 1.0f / 256.0f)), 1.0f);
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + 3.0f / 256.0f)), 1.0f + 4.0f / 256.0f);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::quiet_NaN()))));
  for (float f : {0.1f, 3.14159f, -1e-20f, 65504.0f}) {
    EXPECT_NEAR(Bf16ToFloat(FloatToBf16(f)), f, std::abs(f) / 256.0f);
  }
}

TEST(Bf16Test, Bf16PoolHalvesBytesPerBlockAndPoisonsWithNaN) {
  KvLayout f32{2, 2, 8, 4, KvDtype::kF32};
  KvLayout bf16 = f32;
  bf16.dtype = KvDtype::kBF16;
  EXPECT_EQ(bf16.bytes_per_block() * 2, f32.bytes_per_block());
  BlockPool pool(bf16, {.num_blocks = 2, .poison_on_free = true});
  const BlockId b = pool.Allocate();
  auto* h = reinterpret_cast<std::uint16_t*>(pool.block_data(b));
  h[0] = FloatToBf16(1.0f);
  pool.Free(b);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(h[0])));
}

}  // namespace
}  // namespace metronome::kv
