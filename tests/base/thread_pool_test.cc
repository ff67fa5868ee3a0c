#include "metronome/base/thread_pool.h"

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "metronome/base/busy_processes.h"

namespace metronome::base {
namespace {

// Runs one ParallelForSlot and checks: every item exactly once, slots in range, no two chunks of
// the call on one slot at the same time.
void CheckExactlyOnce(ThreadPool& pool, std::int64_t n, std::int64_t min_chunk) {
  std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
  std::vector<std::atomic<int>> slot_busy(static_cast<std::size_t>(pool.num_threads()));
  std::atomic<int> bad_slot{0};
  std::atomic<int> slot_overlap{0};
  pool.ParallelForSlot(n, min_chunk, [&](int slot, std::int64_t b, std::int64_t e) {
    if (slot < 0 || slot >= pool.num_threads() || b < 0 || e > n || b >= e) {
      bad_slot.fetch_add(1);
      return;
    }
    if (slot_busy[static_cast<std::size_t>(slot)].exchange(1) != 0) slot_overlap.fetch_add(1);
    for (std::int64_t i = b; i < e; ++i) hits[static_cast<std::size_t>(i)].fetch_add(1);
    slot_busy[static_cast<std::size_t>(slot)].store(0);
  });
  EXPECT_EQ(bad_slot.load(), 0) << "n=" << n << " min_chunk=" << min_chunk;
  EXPECT_EQ(slot_overlap.load(), 0) << "n=" << n << " min_chunk=" << min_chunk;
  for (std::int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(hits[static_cast<std::size_t>(i)].load(), 1)
        << "item " << i << " of n=" << n << " min_chunk=" << min_chunk
        << " threads=" << pool.num_threads();
  }
}

TEST(ThreadPool, EveryItemExactlyOnceUnderRandomSizesAndThreadCounts) {
  std::mt19937 rng(12345);
  for (const int threads : {1, 2, 3, 4, 7}) {
    ThreadPoolOptions o;
    o.num_threads = threads;
    ThreadPool pool(o);
    ASSERT_EQ(pool.num_threads(), threads);
    for (int rep = 0; rep < 150; ++rep) {
      const std::int64_t n = std::uniform_int_distribution<std::int64_t>(0, 3000)(rng);
      const std::int64_t min_chunk = std::uniform_int_distribution<std::int64_t>(0, 200)(rng);
      CheckExactlyOnce(pool, n, min_chunk);
    }
    if (threads > 1) {
      EXPECT_GT(pool.jobs_run_parallel(), 0) << "threads=" << threads;
    }
  }
}

// The claim order that keeps each thread's reads one sequential stream: the chunks are cut into
// one contiguous segment per slot (segment s = chunks [total s / T, total (s + 1) / T)); a slot
// runs its own segment's chunks as an ascending prefix of it, and what it takes from another
// segment comes from that segment's back, descending. Random sizes, and a slow first chunk on
// each slot in half the jobs so that the others steal.
TEST(ThreadPool, OwnSegmentInOrderStolenChunksFromTheBack) {
  std::mt19937 rng(777);
  for (const int threads : {2, 3, 4}) {
    ThreadPoolOptions o;
    o.num_threads = threads;
    ThreadPool pool(o);
    int jobs_with_steals = 0;
    for (int rep = 0; rep < 60; ++rep) {
      const std::int64_t n = std::uniform_int_distribution<std::int64_t>(8, 2000)(rng);
      const bool stall = rep % 2 == 1;
      const std::int64_t stalled_slot = rep % threads;
      // Per slot, the chunks' begins in the order the slot ran them (a slot runs one at a time).
      std::vector<std::vector<std::int64_t>> begins(static_cast<std::size_t>(threads));
      std::vector<std::int64_t> chunk_sizes;
      std::atomic<std::int64_t> max_chunk{0};
      pool.ParallelForSlot(n, 1, [&](int slot, std::int64_t b, std::int64_t e) {
        auto& mine = begins[static_cast<std::size_t>(slot)];
        if (stall && slot == stalled_slot && mine.empty()) {
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        mine.push_back(b);
        std::int64_t m = max_chunk.load();
        while (e - b > m && !max_chunk.compare_exchange_weak(m, e - b)) {
        }
      });
      const std::int64_t chunk = max_chunk.load();
      ASSERT_GT(chunk, 0);
      const std::int64_t total = (n + chunk - 1) / chunk;
      const auto segment_of = [&](std::int64_t c) {
        for (int s = 0; s < threads; ++s) {
          if (c < total * (s + 1) / threads) return s;
        }
        return threads;
      };
      bool stole = false;
      for (int slot = 0; slot < threads; ++slot) {
        const auto& mine = begins[static_cast<std::size_t>(slot)];
        std::int64_t expect_own = total * slot / threads;  // next chunk of its own segment
        std::vector<std::int64_t> next_stolen(static_cast<std::size_t>(threads), -1);
        bool left_own = false;
        for (const std::int64_t b : mine) {
          ASSERT_EQ(b % chunk, 0) << "n=" << n;
          const std::int64_t c = b / chunk;
          const int seg = segment_of(c);
          if (seg == slot) {
            ASSERT_FALSE(left_own) << "slot " << slot << " ran its own chunk " << c
                                   << " after stealing (n=" << n << ", threads=" << threads << ")";
            ASSERT_EQ(c, expect_own) << "slot " << slot << " out of order (n=" << n << ")";
            ++expect_own;
          } else {
            left_own = true;
            stole = true;
            auto& want = next_stolen[static_cast<std::size_t>(seg)];
            if (want >= 0) {
              ASSERT_LT(c, want) << "slot " << slot << " stole chunk " << c << " of segment " << seg
                                 << " not from the back (n=" << n << ")";
            } else {
              // The first chunk taken from a segment is at or below its last one.
              ASSERT_LT(c, total * (seg + 1) / threads);
            }
            want = c;
          }
        }
      }
      if (stole) ++jobs_with_steals;
    }
    // The stalled slot's segment was taken over in the jobs with a stall: the stealing path ran.
    EXPECT_GT(jobs_with_steals, 0) << "threads=" << threads;
  }
}

// Back-to-back small jobs of different sizes: a worker still leaving the previous job (every
// chunk claimed, its snapshot of the counter stale) must not claim a chunk of the next one while
// the caller is publishing it. It once could: the bound check read the new job's chunk count
// against the old job's counter, the claim succeeded, a bogus chunk ran and counted towards the
// new job, whose caller then waited forever (done > total).
TEST(ThreadPool, BackToBackJobsNeverRunAStaleChunk) {
  ThreadPoolOptions o;
  o.num_threads = 2;
  ThreadPool pool(o);
  std::mt19937 rng(7);
  for (int rep = 0; rep < 200000; ++rep) {
    const std::int64_t n = std::uniform_int_distribution<std::int64_t>(2, 9)(rng);
    std::array<std::atomic<int>, 9> hits{};
    std::atomic<int> bad{0};
    pool.ParallelFor(n, 1, [&](std::int64_t b, std::int64_t e) {
      if (b < 0 || e > n || b >= e) {
        bad.fetch_add(1);
        return;
      }
      for (std::int64_t i = b; i < e; ++i) hits[static_cast<std::size_t>(i)].fetch_add(1);
    });
    ASSERT_EQ(bad.load(), 0) << "job " << rep;
    for (std::int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(hits[static_cast<std::size_t>(i)].load(), 1) << "job " << rep << " item " << i;
    }
  }
}

TEST(ThreadPool, SleepingWorkersWakeForLaterJobs) {
  // spin 0: workers go to sleep at once after every job, so each job exercises the futex wake.
  ThreadPoolOptions o;
  o.num_threads = 3;
  o.spin_us = 0.0;
  ThreadPool pool(o);
  for (int rep = 0; rep < 200; ++rep) CheckExactlyOnce(pool, 1000, 10);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let them fall asleep
  CheckExactlyOnce(pool, 1000, 10);
}

TEST(ThreadPool, SmallJobsRunInlineOnTheCaller) {
  ThreadPoolOptions o;
  o.num_threads = 4;
  ThreadPool pool(o);
  const auto caller = std::this_thread::get_id();
  int calls = 0;
  bool on_caller = true;
  pool.ParallelForSlot(64, 64, [&](int slot, std::int64_t b, std::int64_t e) {
    ++calls;  // not atomic on purpose: inline means one thread, one call
    on_caller = on_caller && std::this_thread::get_id() == caller && slot == 0;
    EXPECT_EQ(b, 0);
    EXPECT_EQ(e, 64);
  });
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(on_caller);
  EXPECT_EQ(pool.jobs_run_inline(), 1);
  EXPECT_EQ(pool.jobs_run_parallel(), 0);
  pool.ParallelFor(0, 1, [&](std::int64_t, std::int64_t) { ++calls; });
  EXPECT_EQ(calls, 1) << "an empty range calls nothing";
}

TEST(ThreadPool, OneThreadPoolRunsEverythingInline) {
  ThreadPoolOptions o;
  o.num_threads = 1;
  ThreadPool pool(o);
  const auto caller = std::this_thread::get_id();
  bool on_caller = true;
  pool.ParallelFor(100000, 1, [&](std::int64_t, std::int64_t) {
    on_caller = on_caller && std::this_thread::get_id() == caller;
  });
  EXPECT_TRUE(on_caller);
  EXPECT_EQ(pool.jobs_run_parallel(), 0);
}

TEST(ThreadPool, NestedCallsRunInlineOnTheirThread) {
  ThreadPoolOptions o;
  o.num_threads = 3;
  ThreadPool pool(o);
  constexpr std::int64_t kOuter = 64;
  constexpr std::int64_t kInner = 500;
  std::vector<std::atomic<int>> hits(kOuter * kInner);
  std::atomic<int> inner_off_thread{0};
  pool.ParallelFor(kOuter, 1, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) {
      const auto me = std::this_thread::get_id();
      pool.ParallelForSlot(kInner, 1, [&](int slot, std::int64_t ib, std::int64_t ie) {
        if (std::this_thread::get_id() != me || slot != 0) inner_off_thread.fetch_add(1);
        for (std::int64_t j = ib; j < ie; ++j) {
          hits[static_cast<std::size_t>(i * kInner + j)].fetch_add(1);
        }
      });
    }
  });
  EXPECT_EQ(inner_off_thread.load(), 0);
  for (std::size_t k = 0; k < hits.size(); ++k) ASSERT_EQ(hits[k].load(), 1) << k;
}

TEST(ThreadPool, ConcurrentCallersAreBothServedExactlyOnce) {
  ThreadPoolOptions o;
  o.num_threads = 3;
  ThreadPool pool(o);
  std::atomic<int> failures{0};
  const auto caller = [&](std::uint64_t seed) {
    std::mt19937 rng(static_cast<unsigned>(seed));
    for (int rep = 0; rep < 300; ++rep) {
      const std::int64_t n = std::uniform_int_distribution<std::int64_t>(1, 2000)(rng);
      std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
      pool.ParallelFor(n, 8, [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t i = b; i < e; ++i) hits[static_cast<std::size_t>(i)].fetch_add(1);
      });
      for (const auto& h : hits) {
        if (h.load() != 1) failures.fetch_add(1);
      }
    }
  };
  std::thread a(caller, 1);
  std::thread b(caller, 2);
  a.join();
  b.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(CpuCount, ParsesCgroupV2CpuMax) {
  EXPECT_FALSE(ParseCgroupV2CpuMax("max 100000\n").has_value());
  EXPECT_DOUBLE_EQ(ParseCgroupV2CpuMax("200000 100000\n").value(), 2.0);
  EXPECT_DOUBLE_EQ(ParseCgroupV2CpuMax("150000 100000").value(), 1.5);
  EXPECT_DOUBLE_EQ(ParseCgroupV2CpuMax("  50000 100000  ").value(), 0.5);
  EXPECT_FALSE(ParseCgroupV2CpuMax("").has_value());
  EXPECT_FALSE(ParseCgroupV2CpuMax("100000").has_value());
  EXPECT_FALSE(ParseCgroupV2CpuMax("abc 100000").has_value());
  EXPECT_FALSE(ParseCgroupV2CpuMax("100000 0").has_value());
  EXPECT_FALSE(ParseCgroupV2CpuMax("-5 100000").has_value());
  EXPECT_FALSE(ParseCgroupV2CpuMax("100000 100000x").has_value());
}

TEST(CpuCount, ParsesCgroupV1Quota) {
  EXPECT_FALSE(ParseCgroupV1CpuQuota("-1\n", "100000\n").has_value());
  EXPECT_DOUBLE_EQ(ParseCgroupV1CpuQuota("300000\n", "100000\n").value(), 3.0);
  EXPECT_FALSE(ParseCgroupV1CpuQuota("x", "100000").has_value());
  EXPECT_FALSE(ParseCgroupV1CpuQuota("100000", "").has_value());
}

TEST(CpuCount, QuotaCapsAffinityAndTheResultIsAtLeastOne) {
  EXPECT_EQ(CpuCountFrom(8, std::nullopt), 8);
  EXPECT_EQ(CpuCountFrom(8, 2.0), 2);
  EXPECT_EQ(CpuCountFrom(8, 1.5), 2) << "a fractional quota still lets ceil(quota) run at once";
  EXPECT_EQ(CpuCountFrom(8, 0.25), 1);
  EXPECT_EQ(CpuCountFrom(2, 16.0), 2) << "a quota above the affinity does not add CPUs";
  EXPECT_EQ(CpuCountFrom(0, std::nullopt), 1);
  EXPECT_EQ(CpuCountFrom(-3, 4.0), 1);
}

TEST(CpuCount, DetectedCountIsWithinTheMachine) {
  const int n = DetectedCpuCount();
  EXPECT_GE(n, 1);
  const unsigned hw = std::thread::hardware_concurrency();
  if (hw > 0) {
    EXPECT_LE(n, static_cast<int>(hw));
  }
}

// Throughput of many small jobs (the engine's pattern: a decode step is a few hundred jobs of tens
// of microseconds): jobs per second over `seconds`.
double SmallJobsPerSecond(ThreadPool& pool, double seconds) {
  std::vector<float> data(1 << 15, 1.0f);
  std::vector<double> partial(static_cast<std::size_t>(pool.num_threads()), 0.0);
  const auto t0 = std::chrono::steady_clock::now();
  std::int64_t jobs = 0;
  double sink = 0.0;
  for (;;) {
    pool.ParallelForSlot(static_cast<std::int64_t>(data.size()), 1024,
                         [&](int slot, std::int64_t b, std::int64_t e) {
                           double s = 0.0;
                           for (std::int64_t i = b; i < e; ++i) {
                             s += data[static_cast<std::size_t>(i)];
                           }
                           partial[static_cast<std::size_t>(slot)] += s;
                         });
    ++jobs;
    sink += partial[0];
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (el >= seconds) {
      EXPECT_GT(sink, 0.0);
      return static_cast<double>(jobs) / el;
    }
  }
}

// A collapse detector, not a performance assertion. With two busy processes on the machine, a
// pool that waits for descheduled workers (a spin-waiting team with a static split) runs the jobs
// far slower than one thread doing them alone; ours, whose caller takes the chunks no running
// worker has claimed, stays near or above that. Both are measured in alternating rounds under the
// same load, so a busy machine (other builds) cannot make it fail, and the bound (0.25x of the
// serial rate) leaves room for the hand-off cost: only a collapse fails it. (The same test against
// a static-split, always-spinning variant of this pool measured 19 jobs/s pooled vs thousands
// serial.)
TEST(ThreadPoolCotenant, ThroughputDoesNotCollapseWithBusyProcesses) {
  ThreadPoolOptions o;
  o.num_threads = std::max(2, DetectedCpuCount());
  ThreadPool pool(o);
  ThreadPoolOptions one;
  one.num_threads = 1;
  ThreadPool serial(one);
  const double quiet = SmallJobsPerSecond(pool, 0.2);
  double pooled = 0.0;
  double alone = 0.0;
  {
    const BusyProcesses spinners(2, 20);
    ASSERT_EQ(spinners.started(), 2);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (int round = 0; round < 4; ++round) {
      pooled += SmallJobsPerSecond(pool, 0.15);
      alone += SmallJobsPerSecond(serial, 0.15);
    }
  }
  std::printf(
      "jobs/s: %d threads quiet %.0f; with 2 busy processes %d threads %.0f, 1 thread %.0f\n",
      pool.num_threads(), quiet, pool.num_threads(), pooled / 4, alone / 4);
  EXPECT_GT(pooled, 0.1 * alone);
}

}  // namespace
}  // namespace metronome::base
