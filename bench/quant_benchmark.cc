// Weight kernels per stored type on the smol-135m shape (30 layers of qkv 576->960, o 576->576,
// gate_up 576->3072, down 1536->576, plus the tied logits 576->49152):
//  * BM_DecodeWeights/type/m: every projection of one decode step for m rows (m sessions, one
//    token each), on the threads of OpenMP, weights read from memory once per step. Counters:
//    tok_per_s, weight_MB (per step), GB_per_s, roofline_fraction (weight bytes per second over
//    the read bandwidth measured in this process, bandwidth_GBps), GFLOP_per_s and peak_fraction
//    (over the in-process fp32 GEMM peak, peak_GFLOPs). Matmuls only (with the activation
//    quantisation MatMul does per product): no attention or norms, so tok_per_s is the ceiling
//    the weight kernels put on a decode step.
//    K-quants need k % 256 == 0: matrices with k = 576 take llama.cpp's fallback type (Q4_K ->
//    Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0), only the down projections (k = 1536) are K-quant, as in a
//    `_K_M` file of this shape. F32 runs through oneDNN (kernels::MatMulTransposedB). Matrices
//    are in the layout the engine gives them at load (kernels::PreferredRowLayout).
//  * BM_GemvResident/type/m/interleaved: one decode kernel on the calling thread over a 192 x 1536
//    matrix that stays in this core's L2 (0.3-0.6 MB), so memory is not the limit: the kernel's
//    compute throughput. interleaved 0: the row-major gemv kernel (avx512::GemvKernel); 1: the
//    16-row interleaved kernel (avx512::InterleavedKernel, what the engine runs for the types
//    kernels::PreferredRowLayout interleaves). Counters bytes_per_cycle (weight bytes per cycle of
//    this core, the clock from a chain of dependent adds, CoreGhz) and GB_per_s (per CPU second). A
//    kernel is unpack-bound on this machine when bytes_per_cycle x 2 cores x clock is below the
//    read bandwidth (bandwidth_GBps of BM_DecodeWeights, ~33 GB/s quiet).
//  * BM_DecodeDram/type/m: every product of four Qwen3-8B-sized layers (~0.4 GB in Q4_K, far
//    above the last-level cache) for m rows on the test pool, weights in the engine's layout and
//    huge pages: what the kernels stream from DRAM at real size. Counters GB_per_s,
//    roofline_fraction (over the in-process read bandwidth, bandwidth_GBps, probed after the
//    run) and paired_fraction (the median over iterations of the products' rate over a read of
//    the same bytes right after them: steady where the machine's bandwidth comes in phases).
//  * BM_ExpertsDram/type/m/placement: a Qwen3-MoE layer's expert products (64 experts of width
//    768 on dim 2048, 8 a row, two layers' 3-D tensors in memory, ~0.3 GB in Q4_K) for m rows, as
//    the engine's MoE stage runs them, against the same experts consecutive and as one product:
//    what the expert path streams from DRAM and what its scatter and its many products cost.
//  * BM_ReadStreams/streams/prefetch: 1 GiB read on the test pool as 1, 2 or 4 line-interleaved
//    streams a slice, with no software prefetch, the kernels' (into L2) or the probe's (into L1):
//    what a read pattern alone streams, against the probe (counters as BM_DecodeDram).
//  * BM_RowLayout/type/m/interleaved: the matrices of a type with an interleaved form (Q8_0, Q4_0,
//    Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) in the files' row-major layout against the 16-row
//    interleaved layout (quant/row_layout.h), one thread, CPU time.
//  * BM_Prefill/type/m/path: the down projection (1536 -> 576) for m rows on the test pool:
//    path 0 kernels::MatMul in the engine's layout (what this CPU runs: the AVX-512 VNNI kernel
//    where it has one), 1 kernels::DequantGemmKernel (W's tiles dequantised, oneDNN sgemm on fp32
//    x), 2 the scalar integer kernel and 3 the AVX2 one, each over MatMul's 32-row tiles: the
//    crossovers behind each kernel's dequant_gemm_min_rows (kDequantGemmMinRows). Counters
//    rows_per_s, GFLOP_per_s.
// Weight and activation contents are synthetic (valid scales, arbitrary codes): speed does not
// depend on the values; tests/kernels checks the results.
// Run: build/ci/bench/quant_benchmark --benchmark_repetitions=3 --benchmark_min_time=0.3s
//        --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "metronome/base/half.h"
#include "metronome/base/streamed_memory.h"
#include "metronome/kernels/cpu_features.h"
#include "metronome/kernels/gemm.h"
#include "metronome/kernels/memory_bandwidth.h"
#include "metronome/kernels/quant_gemv_avx512.h"
#include "metronome/kernels/quant_interleaved_avx512.h"
#include "metronome/kernels/quant_matmul.h"
#include "metronome/kernels/quant_matmul_avx2.h"
#include "metronome/kernels/quant_matmul_avx512.h"
#include "metronome/quant/blocks.h"
#include "metronome/quant/ggml_type.h"
#include "metronome/quant/row_layout.h"
#include "metronome/quant/weight_matrix.h"
#include "support/test_pool.h"

namespace {

namespace kernels = metronome::kernels;
namespace avx512 = metronome::kernels::avx512;
namespace quant = metronome::quant;
using quant::GgmlType;

double PeakGflops() {
  static const double peak =
      kernels::MeasureGemmPeakGflops(metronome::testing::TestPool(), 1536, 5);
  return peak;
}
double BandwidthGBps() {
  static const double bw =
      kernels::MeasureReadBandwidthGBps(metronome::testing::TestPool(), std::size_t{1} << 30, 5);
  return bw;
}

struct AlignedFree {
  void operator()(std::uint8_t* p) const noexcept { ::operator delete[](p, std::align_val_t{64}); }
};
using Bytes = std::unique_ptr<std::uint8_t[], AlignedFree>;
Bytes AllocBytes(std::size_t n) { return Bytes(new (std::align_val_t{64}) std::uint8_t[n]); }

// Synthetic weights: arbitrary codes (xorshift), every f16 scale a small normal number.
void Fill(GgmlType type, std::uint8_t* p, std::size_t bytes) {
  std::uint64_t s = 0x9e3779b97f4a7c15ULL;
  for (std::size_t i = 0; i < bytes; ++i) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    p[i] = static_cast<std::uint8_t>(s);
  }
  const auto& tr = quant::Traits(type);
  const std::uint16_t scale = metronome::FloatToF16(0.01f);
  const auto put = [&](std::size_t at) { std::memcpy(p + at, &scale, 2); };
  for (std::size_t b = 0; b + tr.block_bytes <= bytes; b += tr.block_bytes) {
    switch (type) {
      case GgmlType::kF32: {
        const float v = 0.01f;
        std::memcpy(p + b, &v, 4);
        break;
      }
      case GgmlType::kF16:
      case GgmlType::kBF16:
        put(b);
        break;
      case GgmlType::kQ8_0:
      case GgmlType::kQ4_0:
      case GgmlType::kQ5_0:
        put(b);
        break;
      case GgmlType::kQ4_1:
      case GgmlType::kQ5_1:
      case GgmlType::kQ4_K:
      case GgmlType::kQ5_K:
        put(b);
        put(b + 2);
        break;
      case GgmlType::kQ6_K:
        put(b + offsetof(quant::BlockQ6_K, d));
        break;
      default:
        break;
    }
  }
}

// The type a matrix of row length k gets when the file asks for `wanted` (llama.cpp's fallback
// for K-quants on rows that are not whole super-blocks).
GgmlType TypeFor(GgmlType wanted, int k) {
  if (k % static_cast<int>(quant::Traits(wanted).block_elems) == 0) return wanted;
  switch (wanted) {
    case GgmlType::kQ4_K:
      return GgmlType::kQ5_0;
    case GgmlType::kQ5_K:
      return GgmlType::kQ5_1;
    default:
      return GgmlType::kQ8_0;
  }
}

struct Matrix {
  GgmlType type;
  int n;
  int k;
  std::size_t bytes;
  Bytes data;
  quant::WeightMatrix view;  // over data, in the file's layout or the one the engine prefers
};

enum class Layout { kFile, kPreferred };

// A matrix of synthetic blocks; kPreferred relays it out as every command does at load
// (kernels::PreferredRowLayout, in place).
Matrix MakeMatrix(GgmlType wanted, int n, int k, Layout layout = Layout::kFile) {
  Matrix mat{TypeFor(wanted, k), n, k, 0, nullptr, {}};
  mat.bytes = *quant::TensorBytes(mat.type, static_cast<std::uint64_t>(n) * k);
  mat.data = AllocBytes(mat.bytes);
  Fill(mat.type, mat.data.get(), mat.bytes);
  mat.view = quant::MakeWeightMatrix(mat.type, n, k, mat.data.get());
  if (layout == Layout::kPreferred &&
      kernels::PreferredRowLayout(mat.view) == quant::RowLayout::kInterleaved16) {
    mat.view = quant::InterleaveRows(mat.view, reinterpret_cast<std::byte*>(mat.data.get()));
  }
  return mat;
}

// y[m, n] = x W^T through the engine's entry point (activation preparation, the kernel table, the
// one parallel split).
void MatMul(const Matrix& w, const std::vector<float>& x, int m, float* y) {
  kernels::MatMul(metronome::testing::TestPool(), x.data(), m, w.view, y, false);
}

constexpr int kDim = 576;
constexpr int kLayers = 30;
constexpr int kQkv = 960;
constexpr int kFfn = 1536;
constexpr int kVocab = 49152;

struct ModelWeights {
  GgmlType type = GgmlType::kF32;
  std::vector<Matrix> matrices;  // per layer: qkv, o, gate_up, down; then logits
  std::size_t bytes = 0;
  double params = 0.0;
};

// One model in memory at a time (an f32 copy is 540 MB), in the layout asked for.
const ModelWeights& Weights(GgmlType type, Layout layout = Layout::kPreferred) {
  static ModelWeights w;
  static Layout held = Layout::kFile;
  if (w.type == type && held == layout && !w.matrices.empty()) return w;
  w.matrices.clear();
  w.type = type;
  held = layout;
  w.bytes = 0;
  w.params = 0.0;
  for (int l = 0; l < kLayers; ++l) {
    w.matrices.push_back(MakeMatrix(type, kQkv, kDim, layout));
    w.matrices.push_back(MakeMatrix(type, kDim, kDim, layout));
    w.matrices.push_back(MakeMatrix(type, 2 * kFfn, kDim, layout));
    w.matrices.push_back(MakeMatrix(type, kDim, kFfn, layout));
  }
  w.matrices.push_back(MakeMatrix(type, kVocab, kDim, layout));
  for (const Matrix& mat : w.matrices) {
    w.bytes += mat.bytes;
    w.params += static_cast<double>(mat.n) * mat.k;
  }
  return w;
}

// The kernel MatMul runs for m rows of `w`, for a label.
std::string PathName(const quant::WeightMatrix& w, int m) {
  return std::string(kernels::MatMulKernelName(w, m));
}

// For the benchmarks that call an AVX-512 kernel directly; those that go through kernels::MatMul
// measure whatever this CPU runs (the label names it).
bool Supported(GgmlType type, benchmark::State& state) {
  const bool ok = type == GgmlType::kF32 || (type == GgmlType::kBF16 ? kernels::CpuHasAvx512Bf16()
                                                                     : kernels::CpuHasAvx512Vnni());
  if (!ok) state.SkipWithError("CPU lacks the AVX-512 features of this kernel");
  return ok;
}

const GgmlType kTypes[] = {GgmlType::kF32,  GgmlType::kBF16, GgmlType::kF16,  GgmlType::kQ8_0,
                           GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                           GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K};

void BM_DecodeWeights(benchmark::State& state) {
  const GgmlType type = kTypes[state.range(0)];
  const int m = static_cast<int>(state.range(1));
  const double bw = BandwidthGBps();
  const double peak = PeakGflops();
  const ModelWeights& w = Weights(type);
  int interleaved = 0;  // matrices the interleaved kernel reads
  for (const Matrix& mat : w.matrices) {
    interleaved += mat.view.layout == quant::RowLayout::kInterleaved16 ? 1 : 0;
  }
  state.SetLabel(std::string(quant::Name(type)) + " " + PathName(w.matrices[3].view, m) +
                 (interleaved > 0 ? ", " + std::to_string(interleaved) + " of " +
                                        std::to_string(w.matrices.size()) + " interleaved"
                                  : ""));
  const std::vector<float> x576(static_cast<std::size_t>(m) * kDim, 0.5f);
  const std::vector<float> x1536(static_cast<std::size_t>(m) * kFfn, 0.5f);
  std::vector<float> y(static_cast<std::size_t>(m) * kVocab);
  for (auto _ : state) {
    for (const Matrix& mat : w.matrices) {
      MatMul(mat, mat.k == kDim ? x576 : x1536, m, y.data());
    }
    benchmark::DoNotOptimize(y.data());
  }
  using C = benchmark::Counter;
  state.counters["tok_per_s"] = C(m, C::kIsIterationInvariantRate);
  state.counters["weight_MB"] = static_cast<double>(w.bytes) * 1e-6;
  state.counters["GB_per_s"] = C(static_cast<double>(w.bytes) * 1e-9, C::kIsIterationInvariantRate);
  state.counters["roofline_fraction"] =
      C(static_cast<double>(w.bytes) * 1e-9 / bw, C::kIsIterationInvariantRate);
  state.counters["bandwidth_GBps"] = bw;
  state.counters["GFLOP_per_s"] = C(2.0 * m * w.params * 1e-9, C::kIsIterationInvariantRate);
  state.counters["peak_fraction"] =
      C(2.0 * m * w.params * 1e-9 / peak, C::kIsIterationInvariantRate);
  state.counters["peak_GFLOPs"] = peak;
}
BENCHMARK(BM_DecodeWeights)
    ->ArgsProduct({benchmark::CreateDenseRange(0, 10, 1), {1, 32}})
    ->ArgNames({"type", "m"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// A kernel call over all of `mat` for m prepared activation rows, y[m, mat.rows].
kernels::RowsKernelArgs ArgsFor(const quant::WeightMatrix& mat, const std::vector<std::byte>& act,
                                int m, float* y) {
  kernels::RowsKernelArgs args;
  args.act = act.data();
  args.act_row_bytes = kernels::ActivationRowBytes(mat.type, mat.cols);
  args.m = m;
  args.w = &mat;
  args.y = y;
  args.ldy = mat.rows;
  return args;
}

// The clock of the calling core in GHz: dependent adds retire at one per cycle, so cycles = adds;
// timed in CPU time of this thread (a loaded machine's preemption does not count). Best of 5.
double CoreGhz() {
  static const double ghz = [] {
    const auto cpu_s = [] {
      timespec t{};
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
      return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
    };
    constexpr long kAdds = 200'000'000;
    double best = 0.0;
    for (int pass = 0; pass < 5; ++pass) {
      std::uint64_t v = 0;
      const double t0 = cpu_s();
      for (long i = 0; i < kAdds; i += 8) {
        // Eight dependent adds per iteration: the loop's own increment and branch run beside them.
        asm volatile(
            "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\t"
            "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0"
            : "+r"(v));
      }
      const double dt = cpu_s() - t0;
      benchmark::DoNotOptimize(v);
      best = std::max(best, static_cast<double>(kAdds) / dt * 1e-9);
    }
    return best;
  }();
  return ghz;
}

void BM_GemvResident(benchmark::State& state) {
  const GgmlType type = kTypes[state.range(0)];
  const int m = static_cast<int>(state.range(1));
  const bool interleaved = state.range(2) != 0;
  if (!Supported(type, state)) return;
  const kernels::RowsKernel gemv =
      interleaved ? avx512::InterleavedKernel(type) : avx512::GemvKernel(type);
  if (gemv == nullptr) {
    state.SkipWithError(interleaved ? "no interleaved kernel for this type"
                                    : "no gemv kernel for this type");
    return;
  }
  state.SetLabel(std::string(quant::Name(type)) + (interleaved ? " interleaved" : " row-major"));
  constexpr int kRows = 192;
  const Matrix w = MakeMatrix(type, kRows, kFfn);
  quant::WeightMatrix mat = quant::MakeWeightMatrix(w.type, kRows, kFfn, w.data.get());
  if (interleaved) mat = quant::InterleaveRows(mat, reinterpret_cast<std::byte*>(w.data.get()));
  const std::vector<float> x(static_cast<std::size_t>(m) * kFfn, 0.5f);
  std::vector<std::byte> act(kernels::ActivationRowBytes(type, kFfn) * static_cast<std::size_t>(m));
  kernels::PrepareActivations(type, x.data(), m, kFfn, act.data());
  std::vector<float> y(static_cast<std::size_t>(m) * kRows);
  const kernels::RowsKernelArgs args = ArgsFor(mat, act, m, y.data());
  const double ghz = CoreGhz();
  for (auto _ : state) {
    gemv(args, 0, kRows);
    benchmark::DoNotOptimize(y.data());
  }
  using C = benchmark::Counter;
  const auto bytes = static_cast<double>(w.bytes);
  state.counters["GB_per_s"] = C(bytes * 1e-9, C::kIsIterationInvariantRate);
  state.counters["bytes_per_cycle"] = C(bytes / (ghz * 1e9), C::kIsIterationInvariantRate);
  state.counters["core_GHz"] = ghz;
}
BENCHMARK(BM_GemvResident)
    ->ArgsProduct({benchmark::CreateDenseRange(1, 10, 1), {1, 4}, {0, 1}})
    ->ArgNames({"type", "m", "interleaved"})
    ->Unit(benchmark::kMicrosecond);

// One decoder layer of a Qwen3-8B (dim 4096, 32 query and 8 KV heads of 128, FFN 12288) in one
// type and the engine's layout, kLayersInMemory of them (~0.4 GB in Q4_K): far above any last-level
// cache, so every product streams its weights from DRAM as a real-size decode step does.
struct RealSizeLayers {
  GgmlType type = GgmlType::kF32;
  metronome::base::StreamedBuffer memory;     // huge pages, as the engine places its weights
  std::vector<quant::WeightMatrix> matrices;  // per layer: qkv, o, gate_up, down
  std::size_t bytes = 0;
};
constexpr int kRealDim = 4096;
constexpr int kRealQkv = 4096 + 2 * 1024;
constexpr int kRealFfn = 12288;
constexpr int kLayersInMemory = 4;

// n x k weights of type t at `at`, synthetic contents in the layout the engine gives them at load
// (kernels::PreferredRowLayout); `at` moves past them.
quant::WeightMatrix PlaceMatrix(GgmlType t, int n, int k, std::uint8_t*& at) {
  const std::size_t bytes = *quant::TensorBytes(t, static_cast<std::uint64_t>(n) * k);
  Fill(t, at, bytes);
  quant::WeightMatrix view = quant::MakeWeightMatrix(t, n, k, at);
  if (kernels::PreferredRowLayout(view) == quant::RowLayout::kInterleaved16) {
    view = quant::InterleaveRows(view, reinterpret_cast<std::byte*>(at));
  }
  at += bytes;
  return view;
}

// One pass over the slice's lines as kStreams line-interleaved streams (BM_ReadStreams), with
// software prefetch 0 none, 1 into L2 3 KiB ahead, 2 into L1 1 KiB ahead (the probe's).
template <int kStreams, int kPrefetch>
std::uint64_t ReadSlice(const std::uint64_t* slice, std::size_t lines_per_stream) {
  constexpr std::size_t kLineWords = 8;
  constexpr std::size_t kAheadWords = (kPrefetch == 1 ? 3072 : 1024) / sizeof(std::uint64_t);
  const std::size_t stride = lines_per_stream * kLineWords;
  std::uint64_t sums[kStreams][kLineWords] = {};
  for (std::size_t i = 0; i < lines_per_stream; ++i) {
    for (int st = 0; st < kStreams; ++st) {
      const std::uint64_t* line = slice + static_cast<std::size_t>(st) * stride + i * kLineWords;
      if constexpr (kPrefetch == 1) __builtin_prefetch(line + kAheadWords, 0, 2);  // prefetcht1
      if constexpr (kPrefetch == 2) __builtin_prefetch(line + kAheadWords, 0, 3);  // prefetcht0
      for (std::size_t w = 0; w < kLineWords; ++w) sums[st][w] += line[w];
    }
  }
  std::uint64_t total = 0;
  for (const auto& stream : sums) {
    for (const std::uint64_t v : stream) total += v;
  }
  return total;
}

// Lines a stream of one slice reads when [p, p + bytes) is read on the pool as 4 slices a thread,
// each as `streams` line-interleaved streams (whole lines: a remainder is left unread).
std::size_t PoolLinesPerStream(std::size_t bytes, std::size_t streams) {
  const auto slices = static_cast<std::size_t>(metronome::testing::TestPool().num_threads()) * 4;
  return bytes / 64 / slices / streams;
}

// The bytes such a read covers.
std::size_t PoolReadBytes(std::size_t bytes, std::size_t streams) {
  const auto slices = static_cast<std::size_t>(metronome::testing::TestPool().num_threads()) * 4;
  return slices * PoolLinesPerStream(bytes, streams) * streams * 64;
}

// Reads [p, p + bytes) on the pool so, each slice with ReadSlice<kStreams, kPrefetch>.
template <int kStreams, int kPrefetch>
void ReadOnPool(const std::byte* p, std::size_t bytes) {
  auto& pool = metronome::testing::TestPool();
  const std::size_t slices = static_cast<std::size_t>(pool.num_threads()) * 4;
  const std::size_t lines_per_stream = PoolLinesPerStream(bytes, kStreams);
  const std::size_t slice_words = lines_per_stream * 8 * kStreams;
  const auto* words = reinterpret_cast<const std::uint64_t*>(p);
  std::vector<std::uint64_t> totals(slices);
  pool.ParallelFor(static_cast<std::int64_t>(slices), 1, [&](std::int64_t b, std::int64_t e) {
    for (auto i = static_cast<std::size_t>(b); i < static_cast<std::size_t>(e); ++i) {
      totals[i] = ReadSlice<kStreams, kPrefetch>(words + i * slice_words, lines_per_stream);
    }
  });
  benchmark::DoNotOptimize(totals.data());
}

template <int kStreams>
void ReadOnPoolWith(int prefetch, const std::byte* p, std::size_t bytes) {
  switch (prefetch) {
    case 1:
      return ReadOnPool<kStreams, 1>(p, bytes);
    case 2:
      return ReadOnPool<kStreams, 2>(p, bytes);
    default:
      return ReadOnPool<kStreams, 0>(p, bytes);
  }
}

template <int kStreams, int kPrefetch>
double ReadOnPoolSecondsAs(const std::byte* p, std::size_t bytes) {
  const auto start = std::chrono::steady_clock::now();
  ReadOnPool<kStreams, kPrefetch>(p, bytes);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Seconds to read [p, p + bytes) on the pool, the faster of the probe's two patterns
// (kernels::ReadBandwidthProbe): each slice as 4 line-interleaved streams prefetched into L1, or as
// one stream prefetched into L2. The read the paired fraction divides by.
double ReadOnPoolSeconds(const std::byte* p, std::size_t bytes) {
  return std::min(ReadOnPoolSecondsAs<4, 2>(p, bytes), ReadOnPoolSecondsAs<1, 1>(p, bytes));
}

// The DRAM benchmarks' counters for `bytes` of weights read an iteration: GB_per_s, and
// roofline_fraction over bandwidth_GBps, probed right after the products, not once per process
// (a shared machine's speed comes in phases); one probe buffer for the process.
void SetDramCounters(benchmark::State& state, std::size_t bytes) {
  static kernels::ReadBandwidthProbe probe(metronome::testing::TestPool());
  const double bw = probe.MeasureGBps(3);
  using C = benchmark::Counter;
  const double gb = static_cast<double>(bytes) * 1e-9;
  state.counters["GB_per_s"] = C(gb, C::kIsIterationInvariantRate);
  state.counters["roofline_fraction"] = C(gb / bw, C::kIsIterationInvariantRate);
  state.counters["bandwidth_GBps"] = bw;
}

const RealSizeLayers& RealLayers(GgmlType type) {
  static RealSizeLayers w;
  if (w.type == type && !w.matrices.empty()) return w;
  struct Shape {
    int n;
    int k;
  };
  const Shape layer[] = {
      {kRealQkv, kRealDim}, {kRealDim, kRealDim}, {2 * kRealFfn, kRealDim}, {kRealDim, kRealFfn}};
  const auto bytes_of = [type](Shape s) {
    return *quant::TensorBytes(TypeFor(type, s.k), static_cast<std::uint64_t>(s.n) * s.k);
  };
  std::size_t total = 0;
  for (const Shape s : layer) total += bytes_of(s) * kLayersInMemory;
  w.matrices.clear();
  w.memory = metronome::base::AllocateStreamed(total);
  w.type = type;
  w.bytes = total;
  auto* at = reinterpret_cast<std::uint8_t*>(w.memory.get());
  for (int l = 0; l < kLayersInMemory; ++l) {
    for (const Shape s : layer) w.matrices.push_back(PlaceMatrix(TypeFor(type, s.k), s.n, s.k, at));
  }
  return w;
}

// BM_DecodeDram/type/m (see the top of the file): the ceiling the weight kernels put on a
// real-size decode step.
void BM_DecodeDram(benchmark::State& state) {
  const GgmlType type = kTypes[state.range(0)];
  const int m = static_cast<int>(state.range(1));
  const RealSizeLayers& w = RealLayers(type);
  state.SetLabel(std::string(quant::Name(type)) + " " + PathName(w.matrices[3], m));
  const std::vector<float> x_dim(static_cast<std::size_t>(m) * kRealDim, 0.5f);
  const std::vector<float> x_ffn(static_cast<std::size_t>(m) * kRealFfn, 0.5f);
  std::vector<float> y(static_cast<std::size_t>(m) * 2 * kRealFfn);
  // Per iteration the products' time and the time to read the same bytes right after: their
  // ratio is the roofline fraction against a read made within milliseconds of the products, which
  // a machine whose bandwidth changes in phases of seconds leaves comparable between runs.
  std::vector<double> paired;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    for (const quant::WeightMatrix& mat : w.matrices) {
      kernels::MatMul(metronome::testing::TestPool(), (mat.cols == kRealDim ? x_dim : x_ffn).data(),
                      m, mat, y.data(), false);
    }
    benchmark::DoNotOptimize(y.data());
    const double products_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.PauseTiming();
    paired.push_back(ReadOnPoolSeconds(static_cast<const std::byte*>(w.memory.get()), w.bytes) /
                     products_s);
    state.ResumeTiming();
  }
  SetDramCounters(state, w.bytes);
  std::nth_element(paired.begin(), paired.begin() + static_cast<std::ptrdiff_t>(paired.size() / 2),
                   paired.end());
  state.counters["paired_fraction"] = paired[paired.size() / 2];
}
BENCHMARK(BM_DecodeDram)
    ->ArgsProduct({{3, 8, 9, 10}, {1, 8}})
    ->ArgNames({"type", "m"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// A Qwen3-MoE layer's experts (the qwen3moe-mid shape: kMoeExperts experts of width kMoeFfn on
// dim kMoeDim) as the 3-D tensors of a file, in the engine's layout and huge pages:
// kMoeLayersInMemory layers, far above any last-level cache. Expert e of a layer is rows
// [e x n, (e + 1) x n) of each tensor viewed as a matrix (16-row groups never cross an expert).
struct MoeLayers {
  GgmlType type = GgmlType::kF32;
  metronome::base::StreamedBuffer memory;
  // Per layer: the gate, up and down tensors as matrices of kMoeExperts x their rows.
  std::vector<quant::WeightMatrix> gate, up, down;
};
constexpr int kMoeDim = 2048;
constexpr int kMoeFfn = 768;
constexpr int kMoeExperts = 64;
constexpr int kMoeUsed = 8;
constexpr int kMoeLayersInMemory = 2;

const MoeLayers& MoeLayersOf(GgmlType type) {
  static MoeLayers w;
  if (w.type == type && !w.gate.empty()) return w;
  const GgmlType t = TypeFor(type, kMoeFfn);  // both widths are whole K-quant super-blocks
  // Each of the three tensors holds kMoeExperts x kMoeFfn x kMoeDim weights.
  const std::size_t tensor =
      *quant::TensorBytes(t, static_cast<std::uint64_t>(kMoeExperts) * kMoeFfn * kMoeDim);
  w.gate.clear();
  w.up.clear();
  w.down.clear();
  w.memory = metronome::base::AllocateStreamed(3 * tensor * kMoeLayersInMemory);
  w.type = type;
  auto* at = reinterpret_cast<std::uint8_t*>(w.memory.get());
  for (int l = 0; l < kMoeLayersInMemory; ++l) {
    w.gate.push_back(PlaceMatrix(t, kMoeExperts * kMoeFfn, kMoeDim, at));
    w.up.push_back(PlaceMatrix(t, kMoeExperts * kMoeFfn, kMoeDim, at));
    w.down.push_back(PlaceMatrix(t, kMoeExperts * kMoeDim, kMoeFfn, at));
  }
  return w;
}

// One routing of m rows to kMoeUsed distinct experts each, drawn uniformly: rows_of[e] the rows
// routed to expert e.
std::vector<int> DrawRouting(int m, std::uint64_t& seed) {
  const auto next = [&seed] {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<int>(seed >> 33);
  };
  std::vector<int> rows_of(kMoeExperts, 0);
  std::vector<int> experts(kMoeExperts);
  for (int r = 0; r < m; ++r) {
    for (int e = 0; e < kMoeExperts; ++e) experts[static_cast<std::size_t>(e)] = e;
    for (int j = 0; j < kMoeUsed; ++j) {
      std::swap(experts[static_cast<std::size_t>(j)],
                experts[static_cast<std::size_t>(j + next() % (kMoeExperts - j))]);
      ++rows_of[static_cast<std::size_t>(experts[static_cast<std::size_t>(j)])];
    }
  }
  return rows_of;
}

// BM_ExpertsDram/type/m/placement: the expert products of every layer in memory for m rows of
// kMoeUsed experts each, gate|up as one set of products (kernels::MatMul over MatMulProducts, one
// per expert over the rows routed to it) and down as another, as the engine's MoE stage runs
// them; an iteration runs kRoutings routings (drawn at random, seed 1), so the experts it reads
// far exceed any last-level cache before they come round again. placement 2: the drawn experts
// where they lie in the tensors (the engine's access); 1: as many experts with the same row
// counts, consecutive in the tensors (what scattering costs); 0: those consecutive experts' rows
// as one product per projection over all m rows (what splitting into products costs; at m = 1
// the same work, above it every row meets every expert). Counters GB_per_s (the read experts'
// bytes per second), roofline_fraction (over the in-process read bandwidth) and experts
// (distinct experts a layer, mean over the routings).
void BM_ExpertsDram(benchmark::State& state) {
  constexpr int kRoutings = 8;
  const GgmlType type = kTypes[state.range(0)];
  const int m = static_cast<int>(state.range(1));
  const int placement = static_cast<int>(state.range(2));
  const MoeLayers& w = MoeLayersOf(type);
  state.SetLabel(std::string(quant::Name(type)) + " " + PathName(w.down[0], 1));
  const int slots = m * kMoeUsed;
  const std::vector<float> in(static_cast<std::size_t>(slots) * kMoeDim, 0.5f);
  const std::vector<float> hidden(static_cast<std::size_t>(slots) * kMoeFfn, 0.5f);
  // Outputs: [slots, n] for the products per expert, [m, experts x n] for placement 0.
  const auto outputs = static_cast<std::size_t>(m) * kMoeExperts;
  std::vector<float> gate_up(outputs * 2 * kMoeFfn);
  std::vector<float> out(outputs * kMoeDim);
  // Per (routing, layer): the parts of its products (gate, up, down per expert) and its two sets.
  struct Step {
    std::vector<quant::WeightMatrix> parts;
    std::vector<kernels::MatMulProduct> first, second;
  };
  std::vector<Step> steps(static_cast<std::size_t>(kRoutings) * kMoeLayersInMemory);
  std::size_t bytes = 0;
  double experts_sum = 0.0;
  std::uint64_t seed = 1;
  for (int r = 0; r < kRoutings; ++r) {
    const std::vector<int> rows_of = DrawRouting(m, seed);
    std::vector<int> chosen;  // the experts the products read, with their row counts
    std::vector<int> counts;
    for (int e = 0; e < kMoeExperts; ++e) {
      if (rows_of[static_cast<std::size_t>(e)] == 0) continue;
      chosen.push_back(e);
      counts.push_back(rows_of[static_cast<std::size_t>(e)]);
    }
    const int experts = static_cast<int>(chosen.size());
    experts_sum += experts;
    if (placement != 2) {  // consecutive, from an offset that moves with the routing
      const int first = (r * experts) % (kMoeExperts - experts + 1);
      for (int i = 0; i < experts; ++i) chosen[static_cast<std::size_t>(i)] = first + i;
    }
    for (int l = 0; l < kMoeLayersInMemory; ++l) {
      Step& step = steps[static_cast<std::size_t>(r * kMoeLayersInMemory + l)];
      auto& p = step.parts;
      p.reserve(3 * static_cast<std::size_t>(experts));
      if (placement == 0) {
        const int e0 = chosen[0];
        p.push_back(w.gate[l].RowSlice(e0 * kMoeFfn, experts * kMoeFfn));
        p.push_back(w.up[l].RowSlice(e0 * kMoeFfn, experts * kMoeFfn));
        p.push_back(w.down[l].RowSlice(e0 * kMoeDim, experts * kMoeDim));
        step.first.push_back({in.data(), m, std::span(p.data(), 2), gate_up.data(), false});
        step.second.push_back({hidden.data(), m, std::span(p.data() + 2, 1), out.data(), false});
        for (const auto& part : p) bytes += part.Bytes();
        continue;
      }
      int slot = 0;
      for (int i = 0; i < experts; ++i) {
        const int e = chosen[static_cast<std::size_t>(i)];
        const int n = counts[static_cast<std::size_t>(i)];
        p.push_back(w.gate[l].RowSlice(e * kMoeFfn, kMoeFfn));
        p.push_back(w.up[l].RowSlice(e * kMoeFfn, kMoeFfn));
        p.push_back(w.down[l].RowSlice(e * kMoeDim, kMoeDim));
        const quant::WeightMatrix* q = &p[p.size() - 3];
        const auto at = static_cast<std::size_t>(slot);
        step.first.push_back(
            {&in[at * kMoeDim], n, std::span(q, 2), &gate_up[at * 2 * kMoeFfn], false});
        step.second.push_back(
            {&hidden[at * kMoeFfn], n, std::span(q + 2, 1), &out[at * kMoeDim], false});
        for (int j = 0; j < 3; ++j) bytes += q[j].Bytes();
        slot += n;
      }
    }
  }
  auto& pool = metronome::testing::TestPool();
  for (auto _ : state) {
    for (const Step& step : steps) {
      kernels::MatMul(pool, step.first);
      kernels::MatMul(pool, step.second);
    }
    benchmark::DoNotOptimize(out.data());
  }
  SetDramCounters(state, bytes);
  state.counters["experts"] = experts_sum / kRoutings;
}
BENCHMARK(BM_ExpertsDram)
    ->ArgsProduct({{8, 10}, {1, 8}, {0, 1, 2}})
    ->ArgNames({"type", "m", "placement"})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// BM_ReadStreams/streams/prefetch: how a read pattern streams from DRAM, beside the probe the
// roofline divides by. 1 GiB in huge pages, 4 slices a pool thread, each slice read as `streams`
// line-interleaved streams (1: what a decode kernel reads, one 16-row group after another; 4: the
// probe's pattern) with software prefetch 0 none, 1 into L2 3 KiB ahead (the K-quant kernels'
// hint and lead), 2 into L1 1 KiB ahead (the probe's). Nothing is computed: the read pattern alone.
void BM_ReadStreams(benchmark::State& state) {
  const auto streams = static_cast<int>(state.range(0));
  const auto prefetch = static_cast<int>(state.range(1));
  constexpr std::size_t kBytes = std::size_t{1} << 30;
  static const metronome::base::StreamedBuffer memory = [] {
    metronome::base::StreamedBuffer m = metronome::base::AllocateStreamed(kBytes);
    std::memset(m.get(), 1, kBytes);
    return m;
  }();
  const auto* p = static_cast<const std::byte*>(memory.get());
  for (auto _ : state) {
    switch (streams) {
      case 1:
        ReadOnPoolWith<1>(prefetch, p, kBytes);
        break;
      case 2:
        ReadOnPoolWith<2>(prefetch, p, kBytes);
        break;
      default:
        ReadOnPoolWith<4>(prefetch, p, kBytes);
        break;
    }
  }
  SetDramCounters(state, PoolReadBytes(kBytes, static_cast<std::size_t>(streams)));
}
BENCHMARK(BM_ReadStreams)
    ->ArgsProduct({{1, 2, 4}, {0, 1, 2}})
    ->ArgNames({"streams", "prefetch"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_Prefill(benchmark::State& state) {
  const GgmlType type = kTypes[state.range(0)];
  const int m = static_cast<int>(state.range(1));
  const auto path = static_cast<int>(state.range(2));
  if (path == 3 && !kernels::CpuHasAvx2Fma()) {
    state.SkipWithError("CPU lacks AVX2/FMA");
    return;
  }
  // Path 0 is kernels::MatMul on the layout the engine reads (the interleaved kernel; its gemv
  // form at m <= kGemvMaxRows); paths 1 to 3 run one kernel over MatMul's 32-row tiles.
  const Matrix w = MakeMatrix(type, kDim, kFfn, path == 0 ? Layout::kPreferred : Layout::kFile);
  const kernels::QuantKernel kernel = path == 1   ? kernels::DequantGemmKernel()
                                      : path == 3 ? kernels::avx2::Kernel(type)
                                                  : kernels::ScalarKernel(type);
  state.SetLabel(std::string(quant::Name(type)) + " " +
                 (path == 0 ? PathName(w.view, m) : std::string(kernel.name)));
  const std::vector<float> x(static_cast<std::size_t>(m) * kFfn, 0.5f);
  std::vector<float> y(static_cast<std::size_t>(m) * kDim);
  std::vector<std::byte> act(kernels::ActivationRowBytes(type, kFfn) * static_cast<std::size_t>(m));
  auto& pool = metronome::testing::TestPool();
  kernels::RowsKernelArgs args = ArgsFor(w.view, act, m, y.data());
  args.pool = &pool;
  if (path == 1) {  // x as it is
    args.act = reinterpret_cast<const std::byte*>(x.data());
    args.act_row_bytes = static_cast<std::size_t>(kFfn) * sizeof(float);
  }
  constexpr int kTile = 32;  // MatMul's row tile
  for (auto _ : state) {
    if (path == 0) {
      MatMul(w, x, m, y.data());
    } else {
      if (path >= 2) kernels::PrepareActivations(type, x.data(), m, kFfn, act.data());
      pool.ParallelFor((kDim + kTile - 1) / kTile, 1, [&](std::int64_t b, std::int64_t e) {
        kernel.rows(args, static_cast<int>(b) * kTile, std::min(kDim, static_cast<int>(e) * kTile));
      });
    }
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["rows_per_s"] =
      benchmark::Counter(m, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP_per_s"] = benchmark::Counter(2.0 * m * kDim * kFfn * 1e-9,
                                                     benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Prefill)
    ->ArgsProduct({{3, 4, 8, 10}, {1, 4, 16, 32, 64, 128, 256, 512}, {0, 1, 2, 3}})
    ->ArgNames({"type", "m", "path"})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// The prepared activations of m rows of 0.5 for the projections' two input widths of a `type` set:
// [0] for k = kDim, [1] for k = kFfn (each in its matrices' type: TypeFor).
std::vector<std::vector<std::byte>> ProjectionActivations(GgmlType type, int m) {
  std::vector<std::vector<std::byte>> act(2);
  for (const int k : {kDim, kFfn}) {
    const std::vector<float> x(static_cast<std::size_t>(m) * k, 0.5f);
    auto& a = act[k == kDim ? 0 : 1];
    a.resize(kernels::ActivationRowBytes(TypeFor(type, k), k) * static_cast<std::size_t>(m));
    kernels::PrepareActivations(TypeFor(type, k), x.data(), m, k, a.data());
  }
  return act;
}

// The decode kernels of one type on the calling thread alone, the general rows kernel (gemv 0)
// against the m <= kGemvMaxRows kernel (gemv 1: avx512::GemvKernel, installed or not), over every
// projection of the smol-135m shape. CPU time, one thread: a kernel-against-kernel ratio that a
// loaded machine distorts less than the multi-threaded wall time of BM_DecodeWeights. Counter
// GB_per_s (weight bytes per CPU second of this thread).
void BM_DecodeKernel(benchmark::State& state) {
  const GgmlType type = kTypes[state.range(0)];
  const int m = static_cast<int>(state.range(1));
  const bool gemv = state.range(2) != 0;
  if (!Supported(type, state)) return;
  if (gemv && avx512::GemvKernel(type) == nullptr) {
    state.SkipWithError("no gemv kernel for this type");
    return;
  }
  state.SetLabel(std::string(quant::Name(type)) + (gemv ? " gemv" : " rows"));
  const ModelWeights& w = Weights(type, Layout::kFile);  // the row-major kernels' layout
  std::vector<float> y(static_cast<std::size_t>(m) * kVocab);
  const std::vector<std::vector<std::byte>> act = ProjectionActivations(type, m);
  std::vector<quant::WeightMatrix> mats;
  for (const Matrix& mat : w.matrices) mats.push_back(mat.view);
  for (auto _ : state) {
    for (const quant::WeightMatrix& mat : mats) {
      // Only the benchmarked type's matrices switch kernels (a K-quant set's k = 576 fallback
      // matrices run their table kernel in both variants), so the difference is that type's.
      const kernels::RowsKernel rows = kernels::ActiveKernel(mat.type).rows;
      const kernels::RowsKernel fast =
          gemv && mat.type == type ? avx512::GemvKernel(mat.type) : nullptr;
      const kernels::RowsKernelArgs args = ArgsFor(mat, act[mat.cols == kDim ? 0 : 1], m, y.data());
      (fast != nullptr ? fast : rows)(args, 0, mat.rows);
    }
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GB_per_s"] = benchmark::Counter(static_cast<double>(w.bytes) * 1e-9,
                                                  benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_DecodeKernel)
    ->ArgsProduct({{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {1, 4}, {0, 1}})
    ->ArgNames({"type", "m", "gemv"})
    ->Unit(benchmark::kMillisecond);

// The same stream in the two row layouts of the matrices of one type that has an interleaved form
// (quant/row_layout.h): those projections of the smol-135m shape (all of them; for the K-quants the
// down projections) for m rows on the calling thread alone (CPU time, like BM_GemvResident),
// interleaved 0 = the files' row-major layout through the kernel table (the gemv kernel at
// m <= 4), 1 = the 16-row interleaved copies through avx512::InterleavedKernel. Counter GB_per_s
// (weight bytes per CPU second of this thread).
void BM_RowLayout(benchmark::State& state) {
  const GgmlType type = kTypes[state.range(0)];
  const int m = static_cast<int>(state.range(1));
  const bool interleaved = state.range(2) != 0;
  if (!Supported(type, state)) return;
  state.SetLabel(std::string(quant::Name(type)) + (interleaved ? " interleaved" : " row-major"));
  const ModelWeights& w = Weights(type, Layout::kFile);
  std::vector<float> y(static_cast<std::size_t>(m) * kVocab);
  const std::vector<std::vector<std::byte>> act = ProjectionActivations(type, m);
  std::vector<Bytes> copies;
  std::vector<quant::WeightMatrix> mats;
  std::size_t bytes = 0;
  for (const Matrix& mat : w.matrices) {
    if (mat.type != type) continue;
    quant::WeightMatrix wm = mat.view;
    if (interleaved) {
      copies.push_back(AllocBytes(mat.bytes));
      wm = quant::InterleaveRows(wm, reinterpret_cast<std::byte*>(copies.back().get()));
    }
    mats.push_back(wm);
    bytes += mat.bytes;
  }
  for (auto _ : state) {
    for (const quant::WeightMatrix& mat : mats) {
      const kernels::QuantKernel& table = kernels::ActiveKernel(mat.type);
      const kernels::RowsKernel kernel =
          interleaved
              ? avx512::InterleavedKernel(mat.type)
              : (m <= kernels::kGemvMaxRows && table.gemv != nullptr ? table.gemv : table.rows);
      kernel(ArgsFor(mat, act[mat.cols == kDim ? 0 : 1], m, y.data()), 0, mat.rows);
    }
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GB_per_s"] = benchmark::Counter(static_cast<double>(bytes) * 1e-9,
                                                  benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_RowLayout)
    ->ArgsProduct({{3, 4, 5, 6, 7, 8, 9, 10}, {1, 4, 8, 32}, {0, 1}})
    ->ArgNames({"type", "m", "interleaved"})
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
