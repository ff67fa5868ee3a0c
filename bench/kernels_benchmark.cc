// Kernel benchmarks:
//  * BM_Gemm / BM_GemmOneDnn: the projection shapes of smol-135m at decode batch m = 32 (qkv
//  576->960,
//    o 576->576, gate_up 576->3072, down 1536->576, logits 576->49152), through the engine's GEMM
//    and through oneDNN alone, as GFLOP/s, weight GB/s and a fraction of the in-process
//    square-sgemm peak (peak_fraction); cold = weights streamed from DRAM as in real decode.
//  * BM_PagedAttention: one decode query per session over a paged KV of length `context`, full vs
//    window W=512, per KV element type and attention implementation (`impl`, see
//    kAttentionBenchImpls; the label names it); counter keys_per_query shows the O(W) bound, and
//    ns_per_key the per-key cost.
//  * BM_PagedAttentionDecodeStep: one decode step's attention at smol-135m's shape (sessions x
//    context x 30 layers, bf16, one thread), one call per kv head vs all kv heads together.
//  * BM_PagedAttentionChunk: a prefill chunk's attention at Qwen3-30B-A3B's shape (32 heads, 4 kv
//    heads, head dim 128; window 8192 + 4 sinks, 4 layers, bf16, one thread), the chunk's queries
//    in one call per kv head (what the engine runs) vs one call per query.
// Run: build/release/bench/kernels_benchmark --benchmark_repetitions=5
//        --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "metronome/kernels/gemm.h"
#include "metronome/kernels/paged_attention.h"
#include "metronome/kv/session_kv.h"
#include "support/test_pool.h"

namespace {

using metronome::TokenPos;
namespace kernels = metronome::kernels;
namespace kv = metronome::kv;
namespace base = metronome::base;

double PeakGflops() {
  static const double peak =
      kernels::MeasureGemmPeakGflops(metronome::testing::TestPool(), 1536, 5);
  return peak;
}

// Weights of one smol-135m layer group are a few MB; real decode streams 540 MB of weights per step
// from DRAM. `cold` cycles through 64 copies (> L3 share) so each call reads its weights from
// memory.
void BM_Gemm(benchmark::State& state) {
  const int m = static_cast<int>(state.range(0));
  const int n = static_cast<int>(state.range(1));
  const int k = static_cast<int>(state.range(2));
  std::vector<float> x(static_cast<std::size_t>(m) * k, 0.5f);
  const bool cold = state.range(3) != 0;
  const int copies = cold ? 64 : 1;
  std::vector<std::vector<float>> w(static_cast<std::size_t>(copies),
                                    std::vector<float>(static_cast<std::size_t>(n) * k, 0.25f));
  std::vector<float> y(static_cast<std::size_t>(m) * n);
  std::size_t i = 0;
  for (auto _ : state) {
    const float* wi = w[i++ % w.size()].data();
    kernels::MatMulTransposedB(metronome::testing::TestPool(), x.data(), m, k, wi, n, y.data(),
                               false);
    benchmark::DoNotOptimize(y.data());
  }
  const double flops = 2.0 * m * n * k;
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["weight_GB/s"] =
      benchmark::Counter(4.0 * n * k * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["peak_fraction"] = benchmark::Counter(
      flops * 1e-9 / PeakGflops(), benchmark::Counter::kIsIterationInvariantRate);
}
void GemmShapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"m", "n", "k", "cold"});
  for (const int cold : {0, 1}) {
    b->Args({32, 960, 576, cold});
    b->Args({32, 576, 576, cold});
    b->Args({32, 3072, 576, cold});
    b->Args({32, 576, 1536, cold});
  }
  b->Args({32, 49152, 576, 1});
  b->Unit(benchmark::kMicrosecond)->UseRealTime();
}
BENCHMARK(BM_Gemm)->Apply(GemmShapes);

// impl: 0 fp32 KV (AVX-512), 1 bf16 KV widened (AVX-512), 2 bf16 KV vdpbf16ps with q as hi + lo
// (the default on AVX512_BF16 CPUs), 3 bf16 KV vdpbf16ps with q rounded once, 4 bf16 KV portable,
// 5 bf16 KV widened (AVX2: the default on CPUs without AVX-512).
struct AttentionBenchImpl {
  kv::KvDtype dtype;
  kernels::AttentionImpl impl;
};
constexpr AttentionBenchImpl kAttentionBenchImpls[] = {
    {kv::KvDtype::kF32, kernels::AttentionImpl::kAvx512},
    {kv::KvDtype::kBF16, kernels::AttentionImpl::kAvx512},
    {kv::KvDtype::kBF16, kernels::AttentionImpl::kAvx512Bf16},
    {kv::KvDtype::kBF16, kernels::AttentionImpl::kAvx512Bf16RoundedQ},
    {kv::KvDtype::kBF16, kernels::AttentionImpl::kPortable},
    {kv::KvDtype::kBF16, kernels::AttentionImpl::kAvx2},
};

void BM_PagedAttention(benchmark::State& state) {
  const TokenPos context = state.range(0);
  const bool window = state.range(1) != 0;
  const AttentionBenchImpl bench_impl = kAttentionBenchImpls[state.range(2)];
  const kv::KvPolicy policy = window ? kv::KvPolicy::Window(512, 4) : kv::KvPolicy::Full();
  const kernels::AttentionShape shape{9, 3, 64};  // smol-135m
  if (!kernels::AttentionImplAvailable(bench_impl.impl, shape, bench_impl.dtype)) {
    state.SkipWithError("implementation not available on this CPU");
    return;
  }
  state.SetLabel(std::string(kv::ToString(bench_impl.dtype)) + " " +
                 kernels::ToString(bench_impl.impl));
  const int layers = 1;
  kv::BlockPool pool({layers, shape.num_kv_heads, shape.head_dim, 16, bench_impl.dtype},
                     {.num_blocks = static_cast<int>(context / 16 + 8)});
  kv::SessionKv session(&pool, policy, context + 1);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> k(static_cast<std::size_t>(shape.num_kv_heads * shape.head_dim));
  std::vector<float> v(k.size());
  for (TokenPos j = 0; j < context; ++j) {
    (void)session.Reserve(1);
    for (std::size_t i = 0; i < k.size(); ++i) {
      k[i] = d(rng);
      v[i] = d(rng);
    }
    session.WriteKv(0, j, k.data(), v.data());
    session.Commit(1);
  }
  (void)session.Reserve(1);
  std::fill(k.begin(), k.end(), 0.0f);
  session.WriteKv(0, context, k.data(), k.data());  // the decode query's own slot
  std::vector<float> q(static_cast<std::size_t>(shape.q_dim()));
  for (float& x : q) x = d(rng);
  std::vector<float> out(q.size());
  const TokenPos p = context;
  const std::int64_t visible = policy.VisibleKeys(p);
  std::vector<float> scratch(kernels::AttentionScratchFloats(shape, visible));
  const kernels::Rope rope(64, 64, 10000.0, kernels::RopePairing::kInterleaved);
  const base::QueryKeys keys[] = {policy.KeysOf(p)};
  for (auto _ : state) {
    for (int g = 0; g < shape.num_kv_heads; ++g) {
      kernels::PagedAttention(shape, session.View(), keys, rope, 0, g, q.data(), out.data(),
                              q.size(), q.size(), scratch.data(), bench_impl.impl);
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["keys_per_query"] = static_cast<double>(visible);
  state.counters["ns_per_key"] = benchmark::Counter(
      static_cast<double>(visible),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_PagedAttention)
    ->ArgsProduct({{512, 4096, 8192}, {0, 1}, {0, 1, 2, 3, 4, 5}})
    ->ArgNames({"context", "window", "impl"})
    ->Unit(benchmark::kMicrosecond);

// One decode step's attention on one thread, shaped as the engine's at smol-135m: `sessions`
// sessions of `context` tokens in one bf16 pool of 30-layer blocks (so one layer's rows of a
// session's consecutive blocks are a block, 360 KiB, apart: what the hardware prefetcher cannot
// follow), one query per session and layer; `together` 0: one PagedAttention call per kv head (3
// units per session), 1: one PagedAttentionHeads call per session (what the engine runs when a
// step has enough decoding sessions). Counter kv_GB/s: the K/V bytes the queries see per second.
void BM_PagedAttentionDecodeStep(benchmark::State& state) {
  const int sessions = static_cast<int>(state.range(0));
  const TokenPos context = state.range(1);
  const bool together = state.range(2) != 0;
  const kernels::AttentionShape shape{9, 3, 64};
  const int layers = 30;
  const int block_tokens = 16;
  const kv::KvPolicy policy = kv::KvPolicy::Full();
  const auto blocks_per_session = static_cast<int>((context + 1 + block_tokens - 1) / block_tokens);
  kv::BlockPool pool({layers, shape.num_kv_heads, shape.head_dim, block_tokens, kv::KvDtype::kBF16},
                     {.num_blocks = sessions * blocks_per_session});
  std::vector<std::unique_ptr<kv::SessionKv>> kvs;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> k(static_cast<std::size_t>(shape.num_kv_heads * shape.head_dim));
  std::vector<float> v(k.size());
  for (int s = 0; s < sessions; ++s) {
    kvs.push_back(std::make_unique<kv::SessionKv>(&pool, policy, context + 1));
    kv::SessionKv& session = *kvs.back();
    (void)session.Reserve(static_cast<int>(context));
    for (TokenPos j = 0; j < context; ++j) {
      for (int l = 0; l < layers; ++l) {
        for (std::size_t i = 0; i < k.size(); ++i) {
          k[i] = d(rng);
          v[i] = d(rng);
        }
        session.WriteKv(l, j, k.data(), v.data());
      }
    }
    session.Commit(static_cast<int>(context));
    (void)session.Reserve(1);
    std::fill(k.begin(), k.end(), 0.0f);
    for (int l = 0; l < layers; ++l) session.WriteKv(l, context, k.data(), k.data());
  }
  std::vector<float> q(static_cast<std::size_t>(sessions * shape.q_dim()));
  for (float& x : q) x = d(rng);
  std::vector<float> out(q.size());
  std::vector<float> scratch(kernels::AttentionScratchFloats(shape, context + 1));
  const kernels::Rope rope(64, 64, 10000.0, kernels::RopePairing::kInterleaved);
  const auto row = static_cast<std::size_t>(shape.q_dim());
  const base::QueryKeys keys[] = {policy.KeysOf(context)};
  for (auto _ : state) {
    for (int l = 0; l < layers; ++l) {
      for (int s = 0; s < sessions; ++s) {
        const kv::SessionKv& session = *kvs[static_cast<std::size_t>(s)];
        const float* qs = q.data() + static_cast<std::size_t>(s) * row;
        float* os = out.data() + static_cast<std::size_t>(s) * row;
        if (together) {
          kernels::PagedAttentionHeads(shape, session.View(), keys, rope, l, 0, shape.num_kv_heads,
                                       qs, os, row, row, scratch.data());
        } else {
          for (int g = 0; g < shape.num_kv_heads; ++g) {
            kernels::PagedAttention(shape, session.View(), keys, rope, l, g, qs, os, row, row,
                                    scratch.data());
          }
        }
      }
    }
    benchmark::DoNotOptimize(out.data());
  }
  const double kv_bytes = static_cast<double>(sessions) * layers *
                          static_cast<double>(context + 1) * 2.0 * shape.num_kv_heads *
                          shape.head_dim * 2.0;
  state.counters["kv_GB/s"] =
      benchmark::Counter(kv_bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_PagedAttentionDecodeStep)
    ->ArgsProduct({{1, 32}, {512}, {0, 1}})
    ->ArgNames({"sessions", "context", "together"})
    ->Unit(benchmark::kMillisecond);

// A prefill chunk of `queries` tokens after `context` tokens of one session, at Qwen3-30B-A3B's
// attention shape, 4 layers of bf16 KV (one layer's K/V of a kv head: 4 MiB at 8192 keys, beyond
// L2, so a walk reads it from L3 or DRAM), one thread. `together` 1: one PagedAttention call per
// kv head for the whole chunk (the engine's unit; the chunk's queries walk the keys together), 0:
// one call per query and kv head (each query walks them alone). Counters: ns per (query, key)
// pair over all heads of a layer, and the K/V bytes the queries see per second.
void BM_PagedAttentionChunk(benchmark::State& state) {
  const TokenPos context = state.range(0);
  const int queries = static_cast<int>(state.range(1));
  const bool together = state.range(2) != 0;
  const kernels::AttentionShape shape{32, 4, 128};
  const int layers = 4;
  const int block_tokens = 16;
  const kv::KvPolicy policy = kv::KvPolicy::Window(8192, 4, kv::PositionMode::kRolling);
  const TokenPos total = context + queries;
  kv::BlockPool pool({layers, shape.num_kv_heads, shape.head_dim, block_tokens, kv::KvDtype::kBF16},
                     {.num_blocks = static_cast<int>(total / block_tokens + 8)});
  kv::SessionKv session(&pool, policy, total);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> k(static_cast<std::size_t>(shape.num_kv_heads * shape.head_dim));
  std::vector<float> v(k.size());
  const auto write = [&](TokenPos j) {
    for (int l = 0; l < layers; ++l) {
      for (std::size_t i = 0; i < k.size(); ++i) {
        k[i] = d(rng);
        v[i] = d(rng);
      }
      session.WriteKv(l, j, k.data(), v.data());
    }
  };
  (void)session.Reserve(static_cast<int>(context));
  for (TokenPos j = 0; j < context; ++j) write(j);
  session.Commit(static_cast<int>(context));
  (void)session.Reserve(queries);
  for (TokenPos j = context; j < total; ++j) write(j);
  const auto row = static_cast<std::size_t>(shape.q_dim());
  std::vector<float> q(static_cast<std::size_t>(queries) * row);
  for (float& x : q) x = d(rng);
  std::vector<float> out(q.size());
  std::vector<base::QueryKeys> keys;
  double pairs = 0.0;
  for (int i = 0; i < queries; ++i) {
    keys.push_back(policy.KeysOf(context + i));
    pairs += static_cast<double>(keys.back().count());
  }
  std::vector<float> scratch(kernels::AttentionScratchFloats(shape, policy.VisibleKeys(total)));
  const kernels::Rope rope(128, 128, 1000000.0, kernels::RopePairing::kNeox);
  for (auto _ : state) {
    for (int l = 0; l < layers; ++l) {
      for (int g = 0; g < shape.num_kv_heads; ++g) {
        if (together) {
          kernels::PagedAttention(shape, session.View(), keys, rope, l, g, q.data(), out.data(),
                                  row, row, scratch.data());
          continue;
        }
        for (int i = 0; i < queries; ++i) {
          kernels::PagedAttention(
              shape, session.View(),
              std::span<const base::QueryKeys>(keys).subspan(static_cast<std::size_t>(i), 1), rope,
              l, g, q.data() + static_cast<std::size_t>(i) * row,
              out.data() + static_cast<std::size_t>(i) * row, row, row, scratch.data());
        }
      }
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["ns_per_query_key"] = benchmark::Counter(
      pairs * layers, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  const double kv_bytes = pairs * layers * 2.0 * shape.num_kv_heads * shape.head_dim * 2.0;
  state.counters["kv_GB/s"] =
      benchmark::Counter(kv_bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_PagedAttentionChunk)
    ->ArgsProduct({{1024, 8192}, {1, 13, 64}, {0, 1}})
    ->ArgNames({"context", "queries", "together"})
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
