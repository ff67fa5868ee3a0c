// metronome bench-decode: N sessions prefilled to C tokens, then K batched decode steps; reports
// throughput, the fraction of this machine's fp32 GEMM peak and its read bandwidth, both taken
// in the same run (the bandwidth right before and after each stretch of the steps, see
// kRooflineStretches). With --cotenant N the same decode measurement runs again with N busy
// processes on the machine, and the ratio to the quiet figure is printed (how the engine holds up
// when it does not own the cores).
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "metronome/base/busy_processes.h"
#include "metronome/base/errors.h"
#include "metronome/base/process_memory.h"
#include "metronome/base/thread_pool.h"
#include "metronome/cli/commands.h"
#include "metronome/cli/common.h"
#include "metronome/kernels/cpu_features.h"
#include "metronome/kernels/gemm.h"
#include "metronome/kernels/memory_bandwidth.h"
#include "metronome/kernels/paged_attention.h"
#include "metronome/kernels/vector_ops.h"

namespace metronome::cli {
namespace {

struct BenchFlags {
  ModelFlags model;
  KvFlags kv;
  EngineFlags engine;
  int sessions = 8;
  std::int64_t context = 512;
  int steps = 16;
  int warmup = 2;
  int prefill_chunk = 256;
  int peak_n = 1536;
  std::uint64_t seed = 7;
  int cotenants = 0;  // busy processes for the second measurement (0: none)
  void Register(CLI::App* sub);
};

void BenchFlags::Register(CLI::App* sub) {
  model.Register(sub, false);
  kv.Register(sub);
  engine.Register(sub);
  sub->add_option("--sessions", sessions, "Concurrent sessions (N)")->check(CLI::Range(1, 100000));
  sub->add_option("--context", context, "Tokens prefilled per session (C)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 24));
  sub->add_option("--steps", steps, "Measured decode steps (K)")->check(CLI::Range(1, 100000));
  sub->add_option("--warmup", warmup, "Unmeasured decode steps first")->check(CLI::Range(0, 1000));
  sub->add_option("--prefill-chunk", prefill_chunk, "Prefill chunk per session per step")
      ->check(CLI::Range(1, 1 << 16));
  sub->add_option("--peak-n", peak_n, "Size of the in-run sgemm peak measurement")
      ->check(CLI::Range(64, 8192));
  sub->add_option("--seed", seed, "Seed of the random prompts");
  sub->add_option("--cotenant", cotenants,
                  "Measure decode again with N busy processes spinning on the machine and print "
                  "the ratio to the quiet figure (0: off)")
      ->check(CLI::Range(0, 64));
}

// The timed steps are cut into this many stretches (at most one a step), with the read bandwidth
// probed before the first and after each: on a machine whose speed comes in phases (shared or
// virtual cores) a probe seconds away from the steps may fall in another phase, and the roofline
// fraction it yields is then off by any factor; probes on either side of each stretch share its
// phase. A stretch's fraction is its gemm rate over the mean of the probes on either side; the run
// reports the median stretch (the spread shows in bench-decode's probe_gbps).
constexpr int kRooflineStretches = 4;
constexpr int kProbeRepeats = 3;  // passes per probe (best of): ~0.1 s at 1 GiB and ~30 GB/s

// Per-step figures of one decode measurement.
struct DecodeRun {
  std::vector<double> step_ms, step_gflops, gemm_ms, attn_ms, attn_kv_bytes;
  std::array<std::vector<double>, engine::kNumProducts> product_ms;  // gemm_ms by product
  // Weight bytes each step's products read (StepStats::product_bytes): by product, and in all.
  std::array<std::vector<double>, engine::kNumProducts> product_bytes;
  std::vector<double> weight_bytes;
  // Jobs the engine's thread pool ran over the timed steps: split across threads, or inline
  // (one chunk, or nested). Times BM_PoolJobHot (bench/thread_pool_benchmark) = its overhead.
  std::int64_t pool_jobs_parallel = 0;
  std::int64_t pool_jobs_inline = 0;
  // With a probe: the read bandwidth before stretch i at [i] and after the last at the end
  // (stretches + 1 figures, GB/s), and each stretch's timed steps [first, end) in step_ms.
  std::vector<double> probe_gbps;
  std::vector<std::size_t> stretch_begin;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}
// The median over steps [begin, end) of bytes[i] / ms[i], in GB/s (steps that took no time left
// out; 0 if none did).
double MedianRate(const std::vector<double>& bytes, const std::vector<double>& ms,
                  std::size_t begin, std::size_t end) {
  std::vector<double> rates;
  for (std::size_t i = begin; i < end && i < bytes.size() && i < ms.size(); ++i) {
    if (ms[i] > 0.0) rates.push_back(bytes[i] / (ms[i] * 1e6));
  }
  return Median(std::move(rates));
}
double Mean(const std::vector<double>& v) {
  double sum = 0.0;
  for (const double x : v) sum += x;
  return v.empty() ? 0.0 : sum / static_cast<double>(v.size());
}
double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return 0.0;
  return v[static_cast<std::size_t>(std::lround(q * static_cast<double>(v.size() - 1)))];
}

// One bench-decode run: the engine with the N sessions open, and the stages RunBench runs in
// order (prefill, the quiet measurement, the report, the cotenant measurement).
class DecodeBench {
 public:
  explicit DecodeBench(const BenchFlags& f);

  // Every session gets C random tokens, in chunks, several sessions per step; then the first
  // decode token of each is drawn. Returns 0, or the exit status of a failed step.
  int Prefill();
  // The quiet measurement: decode with the bandwidth probed around the stretches, and the memory
  // the engine holds after it (*mem_decoded). Returns 0, or the exit status of a failed step.
  int MeasureQuiet(DecodeRun* quiet, std::optional<base::ProcessMemory>* mem_decoded);
  // The fp32 GEMM peak, GFLOP/s, taken in the same run (after the quiet decode), as its
  // denominator.
  [[nodiscard]] double MeasurePeakGflops() const {
    return kernels::MeasureGemmPeakGflops(eng_.thread_pool(), f_.peak_n, 5);
  }
  // The report of the quiet measurement against the in-run GEMM peak (GFLOP/s).
  void PrintDecode(const DecodeRun& quiet, double peak_gflops) const;
  void PrintRoofline(const DecodeRun& quiet) const;
  void PrintKvAndMemory(const std::optional<base::ProcessMemory>& mem_decoded) const;
  // The same decode measurement with f.cotenants busy processes, and its ratio to `quiet`.
  // Returns 0, or the exit status of a failed step.
  int MeasureCotenants(const DecodeRun& quiet);

 private:
  // Tokens each session's KV must hold: the prompt, every run's decode steps, and one.
  static std::int64_t TotalTokens(const BenchFlags& f) {
    const int runs = f.cotenants > 0 ? 2 : 1;
    return f.context + runs * (f.warmup + f.steps) + 1;
  }
  // Fills *run, or returns the exit status of a failed step. With a probe, the timed steps
  // run in stretches with the bandwidth probed around each (kRooflineStretches).
  int Decode(DecodeRun* run, const kernels::ReadBandwidthProbe* probe);
  // One decode step of every session, greedy: 0, or the exit status of a failed step.
  int DecodeStep();
  // The figures of the step just run.
  void RecordStep(DecodeRun* run) const;

  const BenchFlags& f_;
  const model::Model m_;
  const std::optional<base::ProcessMemory> mem_loaded_;
  const kv::KvPolicy policy_;
  engine::Engine eng_;
  std::vector<engine::SessionId> ids_;
  std::mt19937 rng_;
  std::uniform_int_distribution<TokenId> tok_;
  std::vector<engine::StepItemResult> results_;
  std::vector<TokenId> next_;  // each session's next input token
  double prefill_s_ = 0.0;
};

DecodeBench::DecodeBench(const BenchFlags& f)
    : f_(f),
      m_(f.model.Load()),
      mem_loaded_(base::ReadProcessMemory()),
      policy_(f.kv.Policy()),
      eng_(m_, f.engine.Options(m_.config, policy_, f.sessions, TotalTokens(f), f.prefill_chunk)),
      rng_(static_cast<unsigned>(f.seed)),
      tok_(0, m_.config.vocab_size - 1) {
  for (int s = 0; s < f.sessions; ++s) {
    engine::SessionOptions so;
    so.policy = policy_;
    so.max_context = f.kv.max_context > 0 ? f.kv.max_context : TotalTokens(f);
    ids_.push_back(eng_.OpenSession(so));
  }
}

int DecodeBench::Prefill() {
  const auto tp0 = std::chrono::steady_clock::now();
  std::vector<std::vector<TokenId>> prompts(static_cast<std::size_t>(f_.sessions));
  for (auto& p : prompts) {
    p.resize(static_cast<std::size_t>(f_.context));
    for (auto& t : p) t = tok_(rng_);
  }
  const int sessions_per_step = std::max(1, 2048 / f_.prefill_chunk);
  for (std::int64_t begin = 0; begin < f_.context; begin += f_.prefill_chunk) {
    const std::int64_t n = std::min<std::int64_t>(f_.prefill_chunk, f_.context - begin);
    for (int s0 = 0; s0 < f_.sessions; s0 += sessions_per_step) {
      std::vector<engine::StepItem> items;
      for (int s = s0; s < std::min(f_.sessions, s0 + sessions_per_step); ++s) {
        items.push_back({ids_[static_cast<std::size_t>(s)],
                         std::span<const TokenId>(prompts[static_cast<std::size_t>(s)])
                             .subspan(static_cast<std::size_t>(begin), static_cast<std::size_t>(n)),
                         engine::LogitsMode::kNone});
      }
      eng_.Step(items, &results_);
      for (const auto& r : results_) {
        if (r.status != engine::StepStatus::kOk) {
          std::fprintf(stderr, "error: prefill failed: %s (raise --kv-pool-mb)\n",
                       engine::ToString(r.status));
          return 3;
        }
      }
    }
  }
  prefill_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - tp0).count();
  // Decode: all sessions together, greedy, from a random token each.
  next_.resize(static_cast<std::size_t>(f_.sessions));
  for (auto& t : next_) t = tok_(rng_);
  return 0;
}

int DecodeBench::Decode(DecodeRun* run, const kernels::ReadBandwidthProbe* probe) {
  const base::ThreadPool& pool = eng_.thread_pool();
  std::int64_t parallel_before = 0;
  std::int64_t inline_before = 0;
  const int stretches = probe != nullptr ? std::min(kRooflineStretches, f_.steps) : 0;
  for (int k = 0; k < f_.warmup + f_.steps; ++k) {
    if (k == f_.warmup) {
      parallel_before = pool.jobs_run_parallel();
      inline_before = pool.jobs_run_inline();
    }
    // Stretch i starts at timed step i * steps / stretches (the probe's own pool jobs are not
    // the step's: counted apart).
    if (stretches > 0 && k >= f_.warmup &&
        static_cast<std::int64_t>(run->stretch_begin.size()) < stretches &&
        static_cast<std::int64_t>(k - f_.warmup) * stretches >=
            static_cast<std::int64_t>(run->stretch_begin.size()) * f_.steps) {
      const std::int64_t parallel_probe = pool.jobs_run_parallel();
      const std::int64_t inline_probe = pool.jobs_run_inline();
      run->probe_gbps.push_back(probe->MeasureGBps(kProbeRepeats));
      parallel_before += pool.jobs_run_parallel() - parallel_probe;
      inline_before += pool.jobs_run_inline() - inline_probe;
      run->stretch_begin.push_back(run->step_ms.size());
    }
    if (const int rc = DecodeStep(); rc != 0) return rc;
    if (k >= f_.warmup) RecordStep(run);
  }
  run->pool_jobs_parallel = pool.jobs_run_parallel() - parallel_before;
  run->pool_jobs_inline = pool.jobs_run_inline() - inline_before;
  if (stretches > 0) run->probe_gbps.push_back(probe->MeasureGBps(kProbeRepeats));
  return 0;
}

int DecodeBench::DecodeStep() {
  std::vector<engine::StepItem> items;
  items.reserve(static_cast<std::size_t>(f_.sessions));
  for (int s = 0; s < f_.sessions; ++s) {
    items.push_back({ids_[static_cast<std::size_t>(s)],
                     {&next_[static_cast<std::size_t>(s)], 1},
                     engine::LogitsMode::kLast});
  }
  eng_.Step(items, &results_);
  for (int s = 0; s < f_.sessions; ++s) {
    const auto& r = results_[static_cast<std::size_t>(s)];
    if (r.status != engine::StepStatus::kOk) {
      std::fprintf(stderr, "error: decode failed: %s\n", engine::ToString(r.status));
      return 3;
    }
    const auto lg = eng_.logits(r.first_logits_row);
    next_[static_cast<std::size_t>(s)] = kernels::Argmax(lg.data(), static_cast<int>(lg.size()));
  }
  return 0;
}

void DecodeBench::RecordStep(DecodeRun* run) const {
  run->step_ms.push_back(eng_.last_step().seconds * 1e3);
  run->step_gflops.push_back(eng_.last_step().flops / eng_.last_step().seconds / 1e9);
  run->gemm_ms.push_back(eng_.last_step().gemm_seconds * 1e3);
  run->attn_ms.push_back(eng_.last_step().attention_seconds * 1e3);
  double weight_bytes = 0.0;
  for (std::size_t p = 0; p < run->product_ms.size(); ++p) {
    run->product_ms[p].push_back(eng_.last_step().product_seconds[p] * 1e3);
    run->product_bytes[p].push_back(eng_.last_step().product_bytes[p]);
    weight_bytes += eng_.last_step().product_bytes[p];
  }
  run->weight_bytes.push_back(weight_bytes);
  // K and V of the keys each session's query saw, all layers: what attention streamed.
  double kv_bytes = 0.0;
  for (const engine::SessionId id : ids_) {
    kv_bytes += static_cast<double>(policy_.VisibleKeys(eng_.session_kv(id)->length() - 1));
  }
  run->attn_kv_bytes.push_back(kv_bytes * static_cast<double>(eng_.kv_layout().bytes_per_token()));
}

int DecodeBench::MeasureQuiet(DecodeRun* quiet, std::optional<base::ProcessMemory>* mem_decoded) {
  // The probe's buffer (1 GiB, touched) is resident while the steps run; the memory report is
  // of the engine, so its pages are taken out: VmRSS is read after the buffer is freed, and the
  // peak is the larger of the peak before it existed and the final peak less its resident bytes
  // (exact: the buffer stays whole and resident from its first touch to its release).
  const std::optional<base::ProcessMemory> before_probe = base::ReadProcessMemory();
  std::optional<kernels::ReadBandwidthProbe> probe(std::in_place, eng_.thread_pool());
  const std::optional<base::ProcessMemory> with_probe = base::ReadProcessMemory();
  if (const int rc = Decode(quiet, &*probe); rc != 0) return rc;
  const std::optional<base::ProcessMemory> end_with_probe = base::ReadProcessMemory();
  probe.reset();
  *mem_decoded = base::ReadProcessMemory();
  if (before_probe && with_probe && end_with_probe && *mem_decoded) {
    const std::int64_t probe_bytes = with_probe->rss_bytes - before_probe->rss_bytes;
    (*mem_decoded)->hwm_bytes =
        std::max(before_probe->hwm_bytes, end_with_probe->hwm_bytes - probe_bytes);
  }
  return 0;
}

void DecodeBench::PrintDecode(const DecodeRun& quiet, double peak_gflops) const {
  const std::vector<double>& step_ms = quiet.step_ms;
  const double med_ms = Median(step_ms);
  const double med_gflops = Median(quiet.step_gflops);
  std::printf(
      "bench-decode model=%s sessions=%d context=%lld steps=%d kv=%s kv-dtype=%s threads=%d "
      "kernels=%s "
      "(detected CPUs %d)\n",
      m_.config.name.c_str(), f_.sessions, static_cast<long long>(f_.context), f_.steps,
      policy_.ToString().c_str(), kv::ToString(eng_.kv_layout().dtype), eng_.num_threads(),
      kernels::ToString(kernels::ActiveCpuIsa()), base::DetectedCpuCount());
  std::printf("prefill tokens %lld in %.2f s (%.0f tok/s)\n",
              static_cast<long long>(f_.context) * f_.sessions, prefill_s_,
              static_cast<double>(f_.context) * f_.sessions / prefill_s_);
  std::printf("decode ms per step %.2f (p10 %.2f p90 %.2f)\n", med_ms, Percentile(step_ms, 0.1),
              Percentile(step_ms, 0.9));
  std::printf("decode tokens/s %.1f\n", f_.sessions * 1e3 / med_ms);
  // Stalls of a few steps hide from the median; all steps' time is what a user waits for.
  const double mean_ms = Mean(step_ms);
  std::printf("decode tokens/s over all steps %.1f (mean %.2f ms per step)\n",
              f_.sessions * 1e3 / mean_ms, mean_ms);
  std::printf("step breakdown ms: gemm %.2f attention %.2f other %.2f\n", Median(quiet.gemm_ms),
              Median(quiet.attn_ms), med_ms - Median(quiet.gemm_ms) - Median(quiet.attn_ms));
  // Which product falls short of the read bandwidth: the weight bytes it read per step over its
  // time, median over the steps (the small per-layer products pay the thread team's hand-off and
  // a stream start per call; the logits product is one long stream). Products the model does not
  // have (a dense model's router) are left out.
  std::printf("gemm by product, us per step (weight GB/s):");
  const char* separator = "";
  for (int p = 0; p < engine::kNumProducts; ++p) {
    const auto i = static_cast<std::size_t>(p);
    if (Median(quiet.product_bytes[i]) == 0.0) continue;
    std::printf("%s %s %.1f (%.1f)", separator,
                std::string(engine::Name(static_cast<engine::Product>(p))).c_str(),
                Median(quiet.product_ms[i]) * 1e3,
                MedianRate(quiet.product_bytes[i], quiet.product_ms[i], 0, quiet.step_ms.size()));
    separator = ",";
  }
  std::printf("\n");
  // Attention is bound by the K/V it streams: the bytes every session's query sees, per step.
  const double attn_kv_bytes = Median(quiet.attn_kv_bytes);
  const double attn_ms = Median(quiet.attn_ms);
  std::printf("attention KV read per step %s, %.1f GB/s\n", HumanBytes(attn_kv_bytes).c_str(),
              attn_ms > 0.0 ? attn_kv_bytes / (attn_ms * 1e6) : 0.0);
  std::printf("achieved GFLOP/s %.1f\n", med_gflops);
  std::printf("thread pool jobs per step: %.1f parallel, %.1f inline\n",
              static_cast<double>(quiet.pool_jobs_parallel) / f_.steps,
              static_cast<double>(quiet.pool_jobs_inline) / f_.steps);
  std::printf("fp32 GEMM peak GFLOP/s %.1f (in-run sgemm %dx%dx%d)\n", peak_gflops, f_.peak_n,
              f_.peak_n, f_.peak_n);
  std::printf("peak fraction %.2f\n", med_gflops / peak_gflops);
}

void DecodeBench::PrintRoofline(const DecodeRun& quiet) const {
  // The roofline denominator: a decode step reads every weight matrix once, so tok/s is at most
  // sessions * bandwidth / weight bytes per step. Probed around the steps (kRooflineStretches).
  const std::vector<double>& probes = quiet.probe_gbps;
  std::printf(
      "read bandwidth GB/s %.1f (median of %zu in-run 1 GiB streaming reads around the "
      "steps, %.1f-%.1f)\n",
      Median(probes), probes.size(), *std::min_element(probes.begin(), probes.end()),
      *std::max_element(probes.begin(), probes.end()));
  // The matrices' bytes each step read (every product's, a mixture of experts' chosen experts
  // only; not an untied embedding table, of which a step looks up rows) over its gemm time: the
  // rate the weight kernels stream W at, and its fraction of the read bandwidth (1.0 = at the
  // roofline), stretch by stretch.
  const double gemm_gbps = MedianRate(quiet.weight_bytes, quiet.gemm_ms, 0, quiet.gemm_ms.size());
  std::vector<double> fractions;
  for (std::size_t i = 0; i < quiet.stretch_begin.size(); ++i) {
    const std::size_t end =
        i + 1 < quiet.stretch_begin.size() ? quiet.stretch_begin[i + 1] : quiet.gemm_ms.size();
    const double around = 0.5 * (probes[i] + probes[i + 1]);
    if (around > 0.0) {
      fractions.push_back(
          MedianRate(quiet.weight_bytes, quiet.gemm_ms, quiet.stretch_begin[i], end) / around);
    }
  }
  std::printf(
      "weights MB per step %.1f, gemm reads GB/s %.1f, roofline fraction %.2f (median of "
      "%zu stretches, %.2f-%.2f)\n",
      Median(quiet.weight_bytes) / 1e6, gemm_gbps, Median(fractions), fractions.size(),
      fractions.empty() ? 0.0 : *std::min_element(fractions.begin(), fractions.end()),
      fractions.empty() ? 0.0 : *std::max_element(fractions.begin(), fractions.end()));
}

void DecodeBench::PrintKvAndMemory(const std::optional<base::ProcessMemory>& mem_decoded) const {
  const auto* kv0 = eng_.session_kv(ids_[0]);
  const kv::PoolStats ps = eng_.pool_stats();
  const double bytes_per_block = static_cast<double>(ps.bytes_per_block);
  const std::int64_t bound = policy_.MaxResidentBlocks(static_cast<int>(ps.block_tokens));
  std::printf(
      "kv resident per session %lld blocks = %s (bound %s), pool used %lld / %lld blocks "
      "(%s / %s), freed by window %lld\n",
      static_cast<long long>(kv0->resident_blocks()),
      HumanBytes(static_cast<double>(kv0->resident_blocks()) * bytes_per_block).c_str(),
      bound >= 0 ? (std::to_string(bound) + " blocks").c_str() : "none (full)",
      static_cast<long long>(ps.used_blocks), static_cast<long long>(ps.num_blocks),
      HumanBytes(static_cast<double>(ps.used_blocks) * bytes_per_block).c_str(),
      HumanBytes(static_cast<double>(ps.num_blocks) * bytes_per_block).c_str(),
      static_cast<long long>(ps.blocks_freed_by_window));

  // Resident memory against what must be resident: the model file (mapped) plus the KV pool.
  if (!mem_loaded_ || !mem_decoded) return;
  std::error_code ec;
  const auto file_bytes = std::filesystem::file_size(f_.model.model, ec);
  const double pool_bytes = static_cast<double>(ps.num_blocks) * bytes_per_block;
  std::printf("memory: VmRSS after load %s, after decode %s, VmHWM %s; kv pool %s",
              HumanBytes(static_cast<double>(mem_loaded_->rss_bytes)).c_str(),
              HumanBytes(static_cast<double>(mem_decoded->rss_bytes)).c_str(),
              HumanBytes(static_cast<double>(mem_decoded->hwm_bytes)).c_str(),
              HumanBytes(pool_bytes).c_str());
  if (!ec) {
    const double denom = static_cast<double>(file_bytes) + pool_bytes;
    std::printf(", model file %s: VmHWM / (file + pool) %.2f",
                HumanBytes(static_cast<double>(file_bytes)).c_str(),
                static_cast<double>(mem_decoded->hwm_bytes) / denom);
  }
  std::printf("\n");
}

int DecodeBench::MeasureCotenants(const DecodeRun& quiet) {
  DecodeRun shared;
  {
    // Bounded: the children end themselves after 10 minutes even if this process dies.
    const base::BusyProcesses busy(f_.cotenants, 600);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let them reach their loops
    if (const int rc = Decode(&shared, nullptr); rc != 0) return rc;
  }
  const double med_ms = Median(quiet.step_ms);
  const double mean_ms = Mean(quiet.step_ms);
  const double shared_med_ms = Median(shared.step_ms);
  const double shared_mean_ms = Mean(shared.step_ms);
  std::printf(
      "cotenant %d busy processes: decode ms per step %.2f (p10 %.2f p90 %.2f), median "
      "tokens/s %.1f, ratio to quiet %.2f\n",
      f_.cotenants, shared_med_ms, Percentile(shared.step_ms, 0.1), Percentile(shared.step_ms, 0.9),
      f_.sessions * 1e3 / shared_med_ms, med_ms / shared_med_ms);
  // The headline ratio: over all steps, stalls included.
  std::printf("cotenant decode tokens/s %.1f quiet %.1f ratio %.2f\n",
              f_.sessions * 1e3 / shared_mean_ms, f_.sessions * 1e3 / mean_ms,
              mean_ms / shared_mean_ms);
  return 0;
}

int RunBench(const BenchFlags& f) {
  DecodeBench bench(f);
  if (const int rc = bench.Prefill(); rc != 0) return rc;
  DecodeRun quiet;
  std::optional<base::ProcessMemory> mem_decoded;
  if (const int rc = bench.MeasureQuiet(&quiet, &mem_decoded); rc != 0) return rc;
  const double peak_gflops = bench.MeasurePeakGflops();
  bench.PrintDecode(quiet, peak_gflops);
  bench.PrintRoofline(quiet);
  bench.PrintKvAndMemory(mem_decoded);
  if (f.cotenants > 0) return bench.MeasureCotenants(quiet);
  return 0;
}

}  // namespace

const AddCommandFlags kAddBenchDecodeFlags = &AddFlagsAndRun<BenchFlags, RunBench>;

}  // namespace metronome::cli
