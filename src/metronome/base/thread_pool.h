// A persistent thread pool for the engine's data-parallel loops, built to hold up on a machine it
// does not own. OpenMP's spin-waiting team (libgomp) collapses when other processes share the
// cores: every parallel region waits for its slowest, descheduled member. Here:
//   - workers spin for a bounded time (ThreadPoolOptions::spin_us) after a job, then sleep on a
//     futex, so idle workers give their cores back;
//   - a job is a range of items cut into fixed-size chunks that the calling thread and the workers
//     claim one at a time from a shared counter: a worker that is not running claims nothing, and
//     the caller does its share, so a job never waits for a thread that has not started on it (only
//     for chunks already being worked on);
//   - small jobs (one chunk) run on the calling thread without touching the workers.
// Linux only (futex, sched_getaffinity, cgroup files).
//
// Invariants (tests/base/thread_pool_test.cc):
//   - every item in [0, n) is passed to `fn` exactly once, in exactly one [begin, end) chunk;
//   - ParallelFor returns only after every chunk has returned (all writes `fn` made are visible to
//     the caller);
//   - the slot passed to `fn` is in [0, num_threads()); chunks running at the same time in one
//     call have different slots, so per-slot scratch needs no locking (slot 0 is the caller);
//   - nesting and concurrency: a ParallelFor issued while the pool is running another job (from
//     inside `fn`, or from another thread) runs entirely inline on its calling thread, in order,
//     with slot 0 — correct, never a deadlock, just not parallel. Scratch indexed by slot must
//     therefore belong to one caller (the engine's does: it is per Engine, and one Engine is
//     stepped by one thread at a time);
//   - there is no process-wide pool: whoever runs kernels owns a pool and passes it (an Engine
//     owns one of EngineOptions::num_threads threads), so two engines never resize or share
//     each other's threads;
//   - `fn` must not throw: the hot path is noexcept, an escaping exception terminates;
//   - no allocation per call.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

namespace metronome::base {

// ---- CPUs this process may use ----------------------------------------------------------------

// CPUs allowed by a cgroup v2 `cpu.max` text ("<quota_us> <period_us>" or "max <period_us>"):
// quota / period (fractional), nullopt when unlimited or not parseable.
[[nodiscard]] std::optional<double> ParseCgroupV2CpuMax(std::string_view text);
// The same for cgroup v1: cpu.cfs_quota_us ("-1" = unlimited) and cpu.cfs_period_us texts.
[[nodiscard]] std::optional<double> ParseCgroupV1CpuQuota(std::string_view quota_text,
                                                          std::string_view period_text);
// The rule: min(affinity_cpus, ceil(quota_cpus)), at least 1. `affinity_cpus` <= 0 means unknown
// (then std::thread::hardware_concurrency() is used by the caller, not here: treated as 1).
[[nodiscard]] int CpuCountFrom(int affinity_cpus, std::optional<double> quota_cpus);
// CpuCountFrom(sched_getaffinity count, quota from /sys/fs/cgroup/cpu.max or, without it, the
// cgroup v1 /sys/fs/cgroup/cpu{,,cpuacct}/cpu.cfs_{quota,period}_us). Read once per call.
[[nodiscard]] int DetectedCpuCount();

// ---- the pool ---------------------------------------------------------------------------------

struct ThreadPoolOptions {
  int num_threads = 0;    // threads including the caller; 0: DetectedCpuCount()
  double spin_us = 50.0;  // how long an idle worker (or a waiting caller) spins before sleeping, us
};

class ThreadPool {
 public:
  explicit ThreadPool(const ThreadPoolOptions& options = {});
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Threads that run a job: the caller plus num_threads() - 1 workers.
  [[nodiscard]] int num_threads() const noexcept { return num_threads_; }

  // fn(begin, end) over [0, n) in chunks of at least `min_items_per_chunk` items (the last may be
  // shorter). One chunk's worth of items or less runs inline on the caller.
  template <typename Fn>
  void ParallelFor(std::int64_t n, std::int64_t min_items_per_chunk, Fn&& fn) noexcept {
    ParallelForSlot(n, min_items_per_chunk,
                    [&fn](int /*slot*/, std::int64_t b, std::int64_t e) { fn(b, e); });
  }

  // fn(slot, begin, end): as ParallelFor, plus the slot of the thread running the chunk (see the
  // invariants above).
  template <typename Fn>
  void ParallelForSlot(std::int64_t n, std::int64_t min_items_per_chunk, Fn&& fn) noexcept {
    using F = std::remove_reference_t<Fn>;
    Run(n, min_items_per_chunk, &Trampoline<F>, const_cast<void*>(static_cast<const void*>(&fn)));
  }

  // Counters for tests and diagnostics (relaxed; exact once the pool is idle).
  [[nodiscard]] std::int64_t jobs_run_inline() const noexcept {
    return inline_jobs_.load(std::memory_order_relaxed);
  }
  [[nodiscard]] std::int64_t jobs_run_parallel() const noexcept {
    return parallel_jobs_.load(std::memory_order_relaxed);
  }

 private:
  using ChunkFn = void (*)(void* ctx, int slot, std::int64_t begin, std::int64_t end);
  template <typename F>
  static void Trampoline(void* ctx, int slot, std::int64_t begin, std::int64_t end) {
    (*static_cast<F*>(ctx))(slot, begin, end);
  }

  void Run(std::int64_t n, std::int64_t min_items_per_chunk, ChunkFn fn, void* ctx) noexcept;
  void WorkerLoop(int slot) noexcept;
  // Claims and runs chunks of job `epoch` until none is left: its own segment's, then the others'.
  void RunChunks(std::uint32_t epoch, int slot) noexcept;

  int num_threads_ = 1;
  std::int64_t spin_ns_ = 0;

  // The current job. Written by the caller before it publishes the job's segments, read only by
  // threads holding a claimed chunk of that epoch (the job cannot finish, so the caller cannot
  // overwrite them, until that chunk is done).
  ChunkFn fn_ = nullptr;
  void* ctx_ = nullptr;
  std::int64_t n_ = 0;
  std::int64_t chunk_ = 1;
  std::atomic<std::uint32_t> num_chunks_{0};  // relaxed: ordered by the segments' release

  // The job's chunks are cut into one contiguous segment per slot. A thread claims its own
  // segment's chunks from the front, in order, so the memory it reads is one sequential stream
  // (what the hardware prefetcher follows; a stream restarted at every chunk loses decode
  // bandwidth: bench-decode, docs/performance.md). A thread whose segment is exhausted takes chunks
  // from the back of the others' segments, so a descheduled thread delays at most the chunk it is
  // running.
  // Word layout: (epoch << 32) | (front << 16) | back, chunks [front, back) unclaimed.
  struct alignas(64) Segment {
    std::atomic<std::uint64_t> word{0};
  };
  std::unique_ptr<Segment[]> segments_;  // num_threads_ of them

  // Cache-line separated hot words.
  alignas(64) std::atomic<std::uint32_t> epoch_{0};  // futex word the workers sleep on
  alignas(64) std::atomic<std::uint32_t> done_{0};   // chunks finished in the current job (futex)
  alignas(64) std::atomic<int> sleeping_workers_{0};
  std::atomic<int> caller_sleeping_{0};
  std::atomic<bool> busy_{false};  // a job is running: nested/concurrent calls run inline
  std::atomic<bool> stop_{false};
  std::atomic<std::int64_t> inline_jobs_{0};
  std::atomic<std::int64_t> parallel_jobs_{0};

  std::vector<std::thread> workers_;
};

}  // namespace metronome::base
