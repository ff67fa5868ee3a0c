// The thread pool's own cost per parallel job (base::ThreadPool), the per-token overhead the engine
// pays for every matrix product and attention pass it splits across threads:
//  * BM_PoolJobHot: back-to-back jobs of 2 trivial chunks, the workers still spinning from the last
//    job (the engine's case inside a step: one product follows another within the spin time);
//  * BM_PoolJobAfterIdle: the same job after the workers have slept past their spin (the first job
//    of a step after the loop waited for frames): the futex wake-up is paid;
//  * BM_PoolJobInline: the same two chunks run as one inline job (what a job costs without the
//    pool), the baseline of the two above.
// Times are per job (wall). Multiply by `bench-decode`'s "parallel jobs per step" for the pool's
// share of a step. Run: build/ci/bench/thread_pool_benchmark
#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

#include "metronome/base/thread_pool.h"

namespace {

using metronome::base::ThreadPool;

// A chunk's work: a few dependent adds, so the job is all dispatch and join.
std::atomic<std::int64_t> g_sink{0};
void TouchChunk(std::int64_t begin, std::int64_t end) {
  g_sink.fetch_add(end - begin, std::memory_order_relaxed);
}

void BM_PoolJobHot(benchmark::State& state) {
  ThreadPool pool({.num_threads = static_cast<int>(state.range(0))});
  for (auto _ : state) pool.ParallelFor(2, 1, TouchChunk);
  state.counters["parallel_jobs"] = static_cast<double>(pool.jobs_run_parallel());
}
BENCHMARK(BM_PoolJobHot)->Arg(2)->UseRealTime();

void BM_PoolJobAfterIdle(benchmark::State& state) {
  ThreadPool pool({.num_threads = static_cast<int>(state.range(0))});
  for (auto _ : state) {
    // Past the default 50 us spin: the workers are asleep on their futex.
    std::this_thread::sleep_for(std::chrono::microseconds(300));
    const auto start = std::chrono::steady_clock::now();
    pool.ParallelFor(2, 1, TouchChunk);
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
}
// A fixed count: each iteration sleeps 300 us, which the time target would multiply.
BENCHMARK(BM_PoolJobAfterIdle)->Arg(2)->UseManualTime()->Iterations(5000);

void BM_PoolJobInline(benchmark::State& state) {
  ThreadPool pool({.num_threads = 1});
  for (auto _ : state) pool.ParallelFor(2, 1, TouchChunk);
}
BENCHMARK(BM_PoolJobInline)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
