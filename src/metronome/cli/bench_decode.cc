// metronome bench-decode: N sessions prefilled to C tokens, then K batched decode steps; reports
// throughput, the fraction of this machine's fp32 GEMM peak and its read bandwidth, both measured
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

// The measured steps are cut into this many stretches (at most one a step), with the read
// bandwidth probed before the first and after each: on a machine whose speed comes in phases (a
// shared or virtual one: this project's 2-vCPU VM read 26-56 GB/s from one probe to the next) a
// probe seconds away from the steps, in another phase, moved the roofline fraction of the same
// kernels from 0.52 to 1.41. A stretch's fraction is its gemm rate over the mean of the probes on
// either side; the run reports the median stretch.
constexpr int kRooflineStretches = 4;
constexpr int kProbeRepeats = 3;  // passes per probe (best of): ~0.1 s at 1 GiB and ~30 GB/s

// Per-step figures of one decode measurement.
struct DecodeRun {
  std::vector<double> step_ms, step_gflops, gemm_ms, attn_ms, attn_kv_bytes;
  std::array<std::vector<double>, engine::kNumProducts> product_ms;  // gemm_ms by product
  // Jobs the engine's thread pool ran over the measured steps: split across threads, or inline
  // (one chunk, or nested). Times BM_PoolJobHot (bench/thread_pool_benchmark) = its overhead.
  std::int64_t pool_jobs_parallel = 0;
  std::int64_t pool_jobs_inline = 0;
  // With a probe: the read bandwidth before stretch i at [i] and after the last at the end
  // (stretches + 1 figures, GB/s), and each stretch's measured steps [first, end) in step_ms.
  std::vector<double> probe_gbps;
  std::vector<std::size_t> stretch_begin;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
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

int RunBench(const BenchFlags& f) {
  const model::Model m = f.model.Load();
  const std::optional<base::ProcessMemory> mem_loaded = base::ReadProcessMemory();
  const kv::KvPolicy policy = f.kv.Policy();
  const int runs = f.cotenants > 0 ? 2 : 1;
  const std::int64_t total_tokens = f.context + runs * (f.warmup + f.steps) + 1;
  engine::Engine eng(m,
                     f.engine.Options(m.config, policy, f.sessions, total_tokens, f.prefill_chunk));
  std::vector<engine::SessionId> ids;
  for (int s = 0; s < f.sessions; ++s) {
    engine::SessionOptions so;
    so.policy = policy;
    so.max_context = f.kv.max_context > 0 ? f.kv.max_context : total_tokens;
    ids.push_back(eng.OpenSession(so));
  }
  std::mt19937 rng(static_cast<unsigned>(f.seed));
  std::uniform_int_distribution<TokenId> tok(0, m.config.vocab_size - 1);

  // Prefill: every session gets C random tokens, in chunks, several sessions per step.
  const auto tp0 = std::chrono::steady_clock::now();
  std::vector<std::vector<TokenId>> prompts(static_cast<std::size_t>(f.sessions));
  for (auto& p : prompts) {
    p.resize(static_cast<std::size_t>(f.context));
    for (auto& t : p) t = tok(rng);
  }
  std::vector<engine::StepItemResult> results;
  const int sessions_per_step = std::max(1, 2048 / f.prefill_chunk);
  for (std::int64_t begin = 0; begin < f.context; begin += f.prefill_chunk) {
    const std::int64_t n = std::min<std::int64_t>(f.prefill_chunk, f.context - begin);
    for (int s0 = 0; s0 < f.sessions; s0 += sessions_per_step) {
      std::vector<engine::StepItem> items;
      for (int s = s0; s < std::min(f.sessions, s0 + sessions_per_step); ++s) {
        items.push_back({ids[static_cast<std::size_t>(s)],
                         std::span<const TokenId>(prompts[static_cast<std::size_t>(s)])
                             .subspan(static_cast<std::size_t>(begin), static_cast<std::size_t>(n)),
                         engine::LogitsMode::kNone});
      }
      eng.Step(items, &results);
      for (const auto& r : results) {
        if (r.status != engine::StepStatus::kOk) {
          std::fprintf(stderr, "error: prefill failed: %s (raise --kv-pool-mb)\n",
                       engine::ToString(r.status));
          return 3;
        }
      }
    }
  }
  const double prefill_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - tp0).count();

  // Decode: all sessions together, greedy.
  std::vector<TokenId> next(static_cast<std::size_t>(f.sessions));
  for (auto& t : next) t = tok(rng);
  // Returns 0 and fills *run, or the exit status of a failed step. With a probe, the measured steps
  // run in stretches with the bandwidth probed around each (kRooflineStretches).
  const auto decode = [&](DecodeRun* run, const kernels::ReadBandwidthProbe* probe) -> int {
    const base::ThreadPool& pool = eng.thread_pool();
    std::int64_t parallel_before = 0;
    std::int64_t inline_before = 0;
    const int stretches = probe != nullptr ? std::min(kRooflineStretches, f.steps) : 0;
    for (int k = 0; k < f.warmup + f.steps; ++k) {
      if (k == f.warmup) {
        parallel_before = pool.jobs_run_parallel();
        inline_before = pool.jobs_run_inline();
      }
      // Stretch i starts at measured step i * steps / stretches (the probe's own pool jobs are not
      // the step's: counted apart).
      if (stretches > 0 && k >= f.warmup &&
          static_cast<std::int64_t>(run->stretch_begin.size()) < stretches &&
          static_cast<std::int64_t>(k - f.warmup) * stretches >=
              static_cast<std::int64_t>(run->stretch_begin.size()) * f.steps) {
        const std::int64_t parallel_probe = pool.jobs_run_parallel();
        const std::int64_t inline_probe = pool.jobs_run_inline();
        run->probe_gbps.push_back(probe->MeasureGBps(kProbeRepeats));
        parallel_before += pool.jobs_run_parallel() - parallel_probe;
        inline_before += pool.jobs_run_inline() - inline_probe;
        run->stretch_begin.push_back(run->step_ms.size());
      }
      std::vector<engine::StepItem> items;
      items.reserve(static_cast<std::size_t>(f.sessions));
      for (int s = 0; s < f.sessions; ++s) {
        items.push_back({ids[static_cast<std::size_t>(s)],
                         {&next[static_cast<std::size_t>(s)], 1},
                         engine::LogitsMode::kLast});
      }
      eng.Step(items, &results);
      for (int s = 0; s < f.sessions; ++s) {
        const auto& r = results[static_cast<std::size_t>(s)];
        if (r.status != engine::StepStatus::kOk) {
          std::fprintf(stderr, "error: decode failed: %s\n", engine::ToString(r.status));
          return 3;
        }
        const auto lg = eng.logits(r.first_logits_row);
        next[static_cast<std::size_t>(s)] = kernels::Argmax(lg.data(), static_cast<int>(lg.size()));
      }
      if (k >= f.warmup) {
        run->step_ms.push_back(eng.last_step().seconds * 1e3);
        run->step_gflops.push_back(eng.last_step().flops / eng.last_step().seconds / 1e9);
        run->gemm_ms.push_back(eng.last_step().gemm_seconds * 1e3);
        run->attn_ms.push_back(eng.last_step().attention_seconds * 1e3);
        for (std::size_t p = 0; p < run->product_ms.size(); ++p) {
          run->product_ms[p].push_back(eng.last_step().product_seconds[p] * 1e3);
        }
        // K and V of the keys each session's query saw, all layers: what attention streamed.
        double kv_bytes = 0.0;
        for (const engine::SessionId id : ids) {
          kv_bytes += static_cast<double>(policy.VisibleKeys(eng.session_kv(id)->length() - 1));
        }
        run->attn_kv_bytes.push_back(kv_bytes *
                                     static_cast<double>(eng.kv_layout().bytes_per_token()));
      }
    }
    run->pool_jobs_parallel = pool.jobs_run_parallel() - parallel_before;
    run->pool_jobs_inline = pool.jobs_run_inline() - inline_before;
    if (stretches > 0) run->probe_gbps.push_back(probe->MeasureGBps(kProbeRepeats));
    return 0;
  };
  DecodeRun quiet;
  std::optional<base::ProcessMemory> mem_decoded;
  {
    // The probe's buffer (1 GiB, touched) is resident while the steps run; the memory report is
    // of the engine, so its pages are taken out: VmRSS is read after the buffer is freed, and the
    // peak is the larger of the peak before it existed and the final peak less its resident bytes
    // (exact: the buffer stays whole and resident from its first touch to its release).
    const std::optional<base::ProcessMemory> before_probe = base::ReadProcessMemory();
    std::optional<kernels::ReadBandwidthProbe> probe(std::in_place, eng.thread_pool());
    const std::optional<base::ProcessMemory> with_probe = base::ReadProcessMemory();
    if (const int rc = decode(&quiet, &*probe); rc != 0) return rc;
    const std::optional<base::ProcessMemory> end_with_probe = base::ReadProcessMemory();
    probe.reset();
    mem_decoded = base::ReadProcessMemory();
    if (before_probe && with_probe && end_with_probe && mem_decoded) {
      const std::int64_t probe_bytes = with_probe->rss_bytes - before_probe->rss_bytes;
      mem_decoded->hwm_bytes =
          std::max(before_probe->hwm_bytes, end_with_probe->hwm_bytes - probe_bytes);
    }
  }
  const std::vector<double>& step_ms = quiet.step_ms;
  const double peak = kernels::MeasureGemmPeakGflops(eng.thread_pool(), f.peak_n, 5);
  const double med_ms = Median(step_ms);
  const double med_gflops = Median(quiet.step_gflops);
  const auto* kv0 = eng.session_kv(ids[0]);
  const kv::PoolStats ps = eng.pool_stats();
  const double bytes_per_block = static_cast<double>(ps.bytes_per_block);
  const std::int64_t bound = policy.MaxResidentBlocks(static_cast<int>(ps.block_tokens));

  std::printf(
      "bench-decode model=%s sessions=%d context=%lld steps=%d kv=%s kv-dtype=%s threads=%d "
      "(detected CPUs %d)\n",
      m.config.name.c_str(), f.sessions, static_cast<long long>(f.context), f.steps,
      policy.ToString().c_str(), kv::ToString(eng.kv_layout().dtype), eng.num_threads(),
      base::DetectedCpuCount());
  std::printf("prefill tokens %lld in %.2f s (%.0f tok/s)\n",
              static_cast<long long>(f.context) * f.sessions, prefill_s,
              static_cast<double>(f.context) * f.sessions / prefill_s);
  std::printf("decode ms per step %.2f (p10 %.2f p90 %.2f)\n", med_ms, Percentile(step_ms, 0.1),
              Percentile(step_ms, 0.9));
  std::printf("decode tokens/s %.1f\n", f.sessions * 1e3 / med_ms);
  // Stalls of a few steps hide from the median; all steps' time is what a user waits for.
  const double mean_ms = Mean(step_ms);
  std::printf("decode tokens/s over all steps %.1f (mean %.2f ms per step)\n",
              f.sessions * 1e3 / mean_ms, mean_ms);
  std::printf("step breakdown ms: gemm %.2f attention %.2f other %.2f\n", Median(quiet.gemm_ms),
              Median(quiet.attn_ms), med_ms - Median(quiet.gemm_ms) - Median(quiet.attn_ms));
  // Which product falls short of the read bandwidth: each one's weight bytes per step over its
  // median time (the small per-layer products pay the thread team's hand-off and a stream start
  // per call; the logits product is one long stream).
  std::printf("gemm by product, us per step (weight GB/s):");
  for (int p = 0; p < engine::kNumProducts; ++p) {
    const auto product = static_cast<engine::Product>(p);
    const double ms = Median(quiet.product_ms[static_cast<std::size_t>(p)]);
    const double bytes = engine::ProductWeightBytes(*m.weights, product);
    std::printf("%s %s %.1f (%.1f)", p == 0 ? "" : ",", std::string(engine::Name(product)).c_str(),
                ms * 1e3, ms > 0.0 ? bytes / (ms * 1e6) : 0.0);
  }
  std::printf("\n");
  // Attention is bound by the K/V it streams: the bytes every session's query sees, per step.
  const double attn_kv_bytes = Median(quiet.attn_kv_bytes);
  const double attn_ms = Median(quiet.attn_ms);
  std::printf("attention KV read per step %s, %.1f GB/s\n", HumanBytes(attn_kv_bytes).c_str(),
              attn_ms > 0.0 ? attn_kv_bytes / (attn_ms * 1e6) : 0.0);
  std::printf("achieved GFLOP/s %.1f\n", med_gflops);
  std::printf("thread pool jobs per step: %.1f parallel, %.1f inline\n",
              static_cast<double>(quiet.pool_jobs_parallel) / f.steps,
              static_cast<double>(quiet.pool_jobs_inline) / f.steps);
  std::printf("fp32 GEMM peak GFLOP/s %.1f (in-run sgemm %dx%dx%d)\n", peak, f.peak_n, f.peak_n,
              f.peak_n);
  std::printf("peak fraction %.2f\n", med_gflops / peak);
  // The roofline denominator: a decode step reads every weight matrix once, so tok/s is at most
  // sessions * bandwidth / weight bytes per step. Probed around the steps (kRooflineStretches).
  const std::vector<double>& probes = quiet.probe_gbps;
  std::printf(
      "read bandwidth GB/s %.1f (median of %zu in-run 1 GiB streaming reads around the "
      "steps, %.1f-%.1f)\n",
      Median(probes), probes.size(), *std::min_element(probes.begin(), probes.end()),
      *std::max_element(probes.begin(), probes.end()));
  // The matrices' bytes a step streams (every product's; not an untied embedding table, of which a
  // step looks up rows) over the step's gemm time: the rate the weight kernels stream W at, and
  // its fraction of the read bandwidth (1.0 = at the roofline), stretch by stretch.
  double weight_bytes = 0.0;
  for (int p = 0; p < engine::kNumProducts; ++p) {
    weight_bytes += engine::ProductWeightBytes(*m.weights, static_cast<engine::Product>(p));
  }
  const double gemm_gbps = weight_bytes / (Median(quiet.gemm_ms) * 1e-3) / 1e9;
  std::vector<double> fractions;
  for (std::size_t i = 0; i < quiet.stretch_begin.size(); ++i) {
    const std::size_t end =
        i + 1 < quiet.stretch_begin.size() ? quiet.stretch_begin[i + 1] : quiet.gemm_ms.size();
    const std::vector<double> stretch(
        quiet.gemm_ms.begin() + static_cast<std::ptrdiff_t>(quiet.stretch_begin[i]),
        quiet.gemm_ms.begin() + static_cast<std::ptrdiff_t>(end));
    const double around = 0.5 * (probes[i] + probes[i + 1]);
    if (around > 0.0) fractions.push_back(weight_bytes / (Median(stretch) * 1e6) / around);
  }
  std::printf(
      "weights MB per step %.1f, gemm reads GB/s %.1f, roofline fraction %.2f (median of "
      "%zu stretches, %.2f-%.2f)\n",
      weight_bytes / 1e6, gemm_gbps, Median(fractions), fractions.size(),
      fractions.empty() ? 0.0 : *std::min_element(fractions.begin(), fractions.end()),
      fractions.empty() ? 0.0 : *std::max_element(fractions.begin(), fractions.end()));
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
  if (mem_loaded && mem_decoded) {
    std::error_code ec;
    const auto file_bytes = std::filesystem::file_size(f.model.model, ec);
    const double pool_bytes = static_cast<double>(ps.num_blocks) * bytes_per_block;
    std::printf("memory: VmRSS after load %s, after decode %s, VmHWM %s; kv pool %s",
                HumanBytes(static_cast<double>(mem_loaded->rss_bytes)).c_str(),
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

  if (f.cotenants > 0) {
    DecodeRun shared;
    {
      // Bounded: the children end themselves after 10 minutes even if this process dies.
      const base::BusyProcesses busy(f.cotenants, 600);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let them reach their loops
      if (const int rc = decode(&shared, nullptr); rc != 0) return rc;
    }
    const double shared_med_ms = Median(shared.step_ms);
    const double shared_mean_ms = Mean(shared.step_ms);
    std::printf(
        "cotenant %d busy processes: decode ms per step %.2f (p10 %.2f p90 %.2f), median "
        "tokens/s %.1f, ratio to quiet %.2f\n",
        f.cotenants, shared_med_ms, Percentile(shared.step_ms, 0.1),
        Percentile(shared.step_ms, 0.9), f.sessions * 1e3 / shared_med_ms, med_ms / shared_med_ms);
    // The headline ratio: over all steps, stalls included.
    std::printf("cotenant decode tokens/s %.1f quiet %.1f ratio %.2f\n",
                f.sessions * 1e3 / shared_mean_ms, f.sessions * 1e3 / mean_ms,
                mean_ms / shared_mean_ms);
  }
  return 0;
}

}  // namespace

const AddCommandFlags kAddBenchDecodeFlags = &AddFlagsAndRun<BenchFlags, RunBench>;

}  // namespace metronome::cli
