// The real-time loop's own cost, on the simulator backend (cost-model steps, virtual clock):
//  * BM_SimulatedHour: N window-KV sessions at 80 ms frames for one simulated hour; reports the
//    wall time of the run and the loop's overhead per iteration (the model step itself costs
//    nothing here, so everything measured is scheduler + KV bookkeeping).
//  * BM_WorkloadRunner: the whole `metronome sim` path (WorkloadRunner: AIMD admission, metrics,
//    saturation forecast, loop, KV pool) on the moshi-7b preset; reports wall us per iteration,
//    the modelled H200 step it stands for, and their ratio: the scheduler + KV manager +
//    admission + telemetry overhead as a fraction of the model step.
// Run: build/release/bench/realtime_benchmark
#include <benchmark/benchmark.h>

#include "metronome/base/clock.h"
#include "metronome/realtime/presets.h"
#include "metronome/realtime/realtime_loop.h"
#include "metronome/realtime/workload_runner.h"
#include "metronome/telemetry/metrics.h"

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
    spec.deadline_ms = 80.0;  // resolved: the period
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

// Forwards to a backend and sums the step durations it reports (modelled seconds).
class StepTimeTap final : public realtime::Backend {
 public:
  explicit StepTimeTap(realtime::Backend* inner) : inner_(inner) {}
  realtime::BackendSessionId Open(const kv::KvPolicy& p,
                                  metronome::TokenPos max_context = 0) override {
    return inner_->Open(p, max_context);
  }
  void Close(realtime::BackendSessionId id) override { inner_->Close(id); }
  double Step(std::span<const realtime::BackendItem> items,
              std::vector<realtime::BackendItemResult>* out) override {
    const double s = inner_->Step(items, out);
    step_seconds_ += s;
    return s;
  }
  [[nodiscard]] metronome::kv::PoolStats pool() const override { return inner_->pool(); }
  [[nodiscard]] std::int64_t resident_blocks(realtime::BackendSessionId id) const override {
    return inner_->resident_blocks(id);
  }
  [[nodiscard]] std::vector<std::byte> ExportSession(realtime::BackendSessionId id) const override {
    return inner_->ExportSession(id);
  }
  realtime::BackendImport ImportSession(const metronome::kv::KvPolicy& policy,
                                        metronome::TokenPos max_context,
                                        std::span<const std::byte> state) override {
    return inner_->ImportSession(policy, max_context, state);
  }
  [[nodiscard]] std::string model_identity() const override { return inner_->model_identity(); }
  [[nodiscard]] int vocab_size() const override { return inner_->vocab_size(); }
  [[nodiscard]] int block_tokens() const override { return inner_->block_tokens(); }
  [[nodiscard]] double step_seconds() const { return step_seconds_; }

 private:
  realtime::Backend* inner_;
  double step_seconds_ = 0.0;
};

void BM_WorkloadRunner(benchmark::State& state) {
  const auto sessions = state.range(0);
  const auto sim_s = static_cast<double>(state.range(1));
  const realtime::SimPreset& p = realtime::FindPreset("moshi-7b");
  std::int64_t iterations = 0;
  double step_seconds = 0.0;
  for (auto _ : state) {
    realtime::CostModelBackend inner(p.cost, p.PoolBlocks(), p.block_tokens);
    StepTimeTap backend(&inner);
    ManualClock clock;
    metronome::telemetry::MetricsRegistry registry;
    realtime::WorkloadOptions o;
    o.session.period_ms = p.period_ms;
    o.session.deadline_ms = p.period_ms;  // resolved: the period
    o.session.input_tokens_per_frame = p.tokens_per_frame;
    o.session.output_tokens_per_frame = p.output_tokens_per_frame;
    o.session.policy = kv::KvPolicy::Window(p.window_tokens, p.sinks);
    o.population.sessions = sessions;
    o.population.duration_s = sim_s;
    o.supervisor.admission = "aimd";
    o.supervisor.aimd.initial_limit = sessions;  // warm start: admit the whole population at once
    o.supervisor.log_to_stderr = false;
    realtime::WorkloadRunner runner(&backend, &clock, o, &registry);
    const realtime::RunSummary summary = runner.Run();
    iterations = summary.iterations;
    step_seconds = backend.step_seconds();
    benchmark::DoNotOptimize(summary.frames);
  }
  state.counters["iterations"] = static_cast<double>(iterations);
  state.counters["model_step_ms"] = 1e3 * step_seconds / static_cast<double>(iterations);
  // Printed with an "s" suffix by Google Benchmark, but the value is microseconds per iteration.
  state.counters["us_per_iteration"] = benchmark::Counter(
      static_cast<double>(iterations) * 1e-6,
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  // Overhead / model step = (wall s / iterations) / (modelled s / iterations) = wall / modelled:
  // expressed as a rate of `step_seconds` per wall second, inverted.
  state.counters["overhead_fraction"] = benchmark::Counter(
      step_seconds, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_WorkloadRunner)
    ->Args({200, 60})
    ->Args({500, 3600})
    ->ArgNames({"sessions", "sim_s"})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
