// The real-time loop's own cost, on the simulator backend (cost-model steps, virtual clock):
//  * BM_SimulatedHour: N window-KV sessions at 80 ms frames for one simulated hour; reports the
//    wall time of the run and the loop's overhead per iteration (the model step itself costs
//    nothing here, so everything measured is scheduler + KV bookkeeping).
// Run: build/release/bench/realtime_benchmark
#include <benchmark/benchmark.h>

#include "metronome/base/clock.h"
#include "metronome/realtime/realtime_loop.h"

namespace {

using metronome::ManualClock;
namespace realtime = metronome::realtime;
namespace kv = metronome::kv;

void BM_SimulatedHour(benchmark::State& state) {
  const int sessions = static_cast<int>(state.range(0));
  const double sim_s = static_cast<double>(state.range(1));
  std::int64_t iterations = 0;
  std::int64_t frames = 0;
  for (auto _ : state) {
    realtime::CostModelBackend backend({.c0_s = 0.010, .c1_s_per_token = 1e-5}, sessions * 8, 16);
    ManualClock clock;
    realtime::RealtimeLoop loop(&backend, &clock);
    realtime::SessionSpec spec;
    spec.period_ms = 80.0;
    spec.input_tokens_per_frame = 1;
    spec.output_tokens_per_frame = 1;
    spec.policy = kv::KvPolicy::Window(64, 4);
    for (int i = 0; i < sessions; ++i) loop.AddSession(spec);
    loop.RunUntil(sim_s);
    iterations = loop.stats().iterations;
    frames = loop.stats().frames;
    benchmark::DoNotOptimize(frames);
  }
  state.counters["iterations"] = static_cast<double>(iterations);
  state.counters["frames"] = static_cast<double>(frames);
  // Printed with an "s" suffix by Google Benchmark, but the value is microseconds per iteration.
  state.counters["us_per_iteration"] = benchmark::Counter(
      static_cast<double>(iterations) * 1e-6,
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_SimulatedHour)
    ->Args({200, 60})
    ->Args({500, 3600})
    ->ArgNames({"sessions", "sim_s"})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
