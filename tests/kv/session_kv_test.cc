#include "metronome/kv/session_kv.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

namespace metronome::kv {
namespace {

KvLayout Layout(int block_tokens) { return {2, 1, 4, block_tokens}; }

TEST(SessionKvTest, FullModeGrowsAndReportsExhaustion) {
  BlockPool pool(Layout(4), {.num_blocks = 3});
  SessionKv s(&pool, KvPolicy::Full(), 1000);
  EXPECT_EQ(s.Reserve(12), ReserveResult::kOk);  // 3 blocks
  s.Commit(12);
  EXPECT_EQ(s.resident_blocks(), 3);
  EXPECT_EQ(s.Reserve(1), ReserveResult::kPoolExhausted);
  EXPECT_EQ(s.length(), 12);
  EXPECT_EQ(s.resident_blocks(), 3) << "a failed reservation takes nothing";
}

TEST(SessionKvTest, ContextLimitIsReported) {
  BlockPool pool(Layout(4), {.num_blocks = 100});
  SessionKv s(&pool, KvPolicy::Full(), 10);
  EXPECT_EQ(s.Reserve(10), ReserveResult::kOk);
  s.Commit(10);
  EXPECT_EQ(s.Reserve(1), ReserveResult::kContextFull);
}

TEST(SessionKvTest, WindowFreesBlocksBehindTheWindowAndKeepsSinks) {
  // B = 4, W = 6, S = 2: sink block 0 pinned; after 20 tokens the next query (p = 20) sees
  // j in {0, 1} and j > 14, so blocks 1..2 (tokens 4..11) are dead, block 3 (12..15) holds 15.
  BlockPool pool(Layout(4), {.num_blocks = 100});
  SessionKv s(&pool, KvPolicy::Window(6, 2), 1 << 20);
  for (int i = 0; i < 20; ++i) {
    ASSERT_EQ(s.Reserve(1), ReserveResult::kOk);
    s.Commit(1);
  }
  EXPECT_NE(s.BlockOf(0), kNoBlock);
  EXPECT_NE(s.BlockOf(1), kNoBlock);
  EXPECT_EQ(s.BlockOf(4), kNoBlock);
  EXPECT_EQ(s.BlockOf(11), kNoBlock);
  EXPECT_NE(s.BlockOf(15), kNoBlock);
  EXPECT_NE(s.BlockOf(19), kNoBlock);
  EXPECT_EQ(s.resident_blocks(), 3);  // blocks 0, 3, 4
  EXPECT_EQ(s.stats().blocks_freed_by_window, 2);
  EXPECT_EQ(pool.num_used_blocks(), 3);
}

TEST(SessionKvTest, ReleaseReturnsEverything) {
  BlockPool pool(Layout(4), {.num_blocks = 50});
  {
    SessionKv s(&pool, KvPolicy::Window(9, 5), 1 << 20);
    ASSERT_EQ(s.Reserve(37), ReserveResult::kOk);
    s.Commit(37);
    EXPECT_GT(pool.num_used_blocks(), 0);
  }
  EXPECT_EQ(pool.num_used_blocks(), 0);
}

// Property test: random sessions with random policies open, append random chunks and close. The
// pool never leaks or double-frees (BlockPool aborts on a double free), every resident block has
// exactly one owner, and no session exceeds its stated bound.
TEST(SessionKvTest, RandomOperationsKeepPoolAccountingExact) {
  for (int seed = 0; seed < 20; ++seed) {
    std::mt19937 rng(static_cast<unsigned>(seed));
    const int bt = 1 + static_cast<int>(rng() % 8);
    BlockPool pool(Layout(bt), {.num_blocks = 64 + static_cast<int>(rng() % 64)});
    std::map<int, std::unique_ptr<SessionKv>> sessions;
    int next = 0;
    for (int op = 0; op < 2000; ++op) {
      const unsigned r = rng() % 10;
      if (r == 0 || sessions.empty()) {
        KvPolicy p = (rng() % 3 == 0) ? KvPolicy::Full()
                                      : KvPolicy::Window(1 + static_cast<TokenPos>(rng() % 40),
                                                         static_cast<TokenPos>(rng() % 10));
        sessions.emplace(next++, std::make_unique<SessionKv>(&pool, p, 1 << 20));
      } else if (r == 1) {
        auto it = sessions.begin();
        std::advance(it, static_cast<long>(rng() % sessions.size()));
        sessions.erase(it);
      } else {
        auto it = sessions.begin();
        std::advance(it, static_cast<long>(rng() % sessions.size()));
        SessionKv& s = *it->second;
        const int n = 1 + static_cast<int>(rng() % 12);
        const std::int64_t before = s.resident_blocks();
        const int free_before = pool.num_free_blocks();
        const ReserveResult res = s.Reserve(n);
        if (res == ReserveResult::kOk) {
          const std::int64_t in_flight_bound = s.policy().MaxResidentBlocks(bt, n);
          if (in_flight_bound >= 0) {
            ASSERT_LE(s.resident_blocks(), in_flight_bound);
          }
          s.Commit(n);
          const std::int64_t bound = s.policy().MaxResidentBlocks(bt);
          if (bound >= 0) {
            ASSERT_LE(s.resident_blocks(), bound) << s.policy().ToString() << " B=" << bt;
          }
        } else {
          ASSERT_EQ(s.resident_blocks(), before);
          ASSERT_EQ(pool.num_free_blocks(), free_before);
        }
      }
      // Global accounting.
      std::int64_t resident = 0;
      std::set<BlockId> owned;
      for (const auto& [id, s] : sessions) {
        resident += s->resident_blocks();
        const TokenPos len = s->length();
        std::set<BlockId> mine;
        for (TokenPos j = 0; j < len; ++j) {
          const BlockId b = s->BlockOf(j);
          if (b == kNoBlock) continue;
          ASSERT_TRUE(pool.in_use(b));
          mine.insert(b);
        }
        for (TokenPos j = 0; j < len; ++j) {
          if (s->policy().Visible(len, j)) {
            ASSERT_NE(s->BlockOf(j), kNoBlock) << "visible token " << j << " was freed";
          }
        }
        for (BlockId b : mine) ASSERT_TRUE(owned.insert(b).second) << "block shared";
      }
      ASSERT_EQ(resident, pool.num_used_blocks());
      ASSERT_EQ(static_cast<std::int64_t>(owned.size()), resident);
    }
    sessions.clear();
    ASSERT_EQ(pool.num_used_blocks(), 0);
  }
}

TEST(SessionKvTest, BoundFormula) {
  EXPECT_EQ(KvPolicy::Window(512, 4).MaxResidentBlocks(16), 1 + 32 + 1);
  EXPECT_EQ(KvPolicy::Window(7, 3).MaxResidentBlocks(4), 1 + 2 + 1);
  EXPECT_EQ(KvPolicy::Window(7, 3).MaxResidentBlocks(4, 9), 1 + 4 + 1);  // ceil(15/4)
  EXPECT_EQ(KvPolicy::Full().MaxResidentBlocks(16), -1);
}

}  // namespace
}  // namespace metronome::kv
