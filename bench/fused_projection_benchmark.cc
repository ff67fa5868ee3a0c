// Fused projections as grouped products vs one concatenated matrix (issue 10: "fused QKV / gate-up
// either concatenated at load in the native type or run as grouped GEMMs: measure").
//
// The GGUF loader keeps q/k/v (and gate/up) as separate tensors, zero-copy in the mapped file, and
// runs them as one kernels::MatMul over a MatrixGroup: activations prepared once, all parts' row
// tiles in one parallel loop. The alternative is a copy of the parts concatenated at load (one
// matrix, one product). Both are measured on smol-135m's shapes (qkv 576 -> 576 + 192 + 192,
// gate_up 576 -> 2 x 1536), per type (F32: oneDNN; Q8_0: our integer kernels) and batch rows m.
// `cold` cycles through enough copies (> the L3 share) that each call reads its weights from
// memory, as in decode. The counter weight_GBps is what the roofline compares.
// Run: build/release/bench/fused_projection_benchmark --benchmark_repetitions=5
//        --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstddef>
#include <random>
#include <string>
#include <vector>

#include "metronome/kernels/quant_matmul.h"
#include "metronome/quant/codec.h"
#include "metronome/quant/weight_matrix.h"
#include "support/test_pool.h"

namespace {

namespace kernels = metronome::kernels;
namespace quant = metronome::quant;

constexpr int kDim = 576;
constexpr quant::GgmlType kTypes[] = {quant::GgmlType::kF32, quant::GgmlType::kQ8_0};

// One copy of a group: each part in its own allocation (as separate tensors in a file), and the
// same rows concatenated in one allocation.
struct GroupCopy {
  std::vector<std::vector<std::byte>> part_bytes;
  std::vector<quant::WeightMatrix> parts;
  std::vector<std::byte> fused_bytes;
  quant::WeightMatrix fused;
};

GroupCopy MakeGroup(quant::GgmlType type, const std::vector<int>& part_rows, std::mt19937* rng) {
  std::normal_distribution<float> nd(0.0f, 0.05f);
  const std::size_t row_bytes = quant::RowBytes(type, kDim);
  GroupCopy g;
  int total_rows = 0;
  for (const int rows : part_rows) total_rows += rows;
  g.fused_bytes.resize(static_cast<std::size_t>(total_rows) * row_bytes);
  std::vector<float> row(kDim);
  std::size_t fused_at = 0;
  for (const int rows : part_rows) {
    std::vector<std::byte>& bytes =
        g.part_bytes.emplace_back(static_cast<std::size_t>(rows) * row_bytes);
    for (int r = 0; r < rows; ++r) {
      for (float& x : row) x = nd(*rng);
      quant::QuantizeRow(type, row.data(), kDim,
                         bytes.data() + static_cast<std::size_t>(r) * row_bytes);
    }
    std::copy(bytes.begin(), bytes.end(),
              g.fused_bytes.begin() + static_cast<std::ptrdiff_t>(fused_at));
    fused_at += bytes.size();
  }
  for (std::size_t p = 0; p < part_rows.size(); ++p) {
    g.parts.push_back(quant::MakeWeightMatrix(type, part_rows[p], kDim, g.part_bytes[p].data()));
  }
  g.fused = quant::MakeWeightMatrix(type, total_rows, kDim, g.fused_bytes.data());
  return g;
}

// Args: type index, m, concatenated (0 grouped, 1 one matrix), shape (0 qkv, 1 gate_up).
void BM_FusedProjection(benchmark::State& state) {
  const quant::GgmlType type = kTypes[state.range(0)];
  const int m = static_cast<int>(state.range(1));
  const bool concatenated = state.range(2) != 0;
  const std::vector<int> part_rows =
      state.range(3) == 0 ? std::vector<int>{576, 192, 192} : std::vector<int>{1536, 1536};
  int total_rows = 0;
  for (const int rows : part_rows) total_rows += rows;
  const std::size_t bytes_per_copy =
      static_cast<std::size_t>(total_rows) * quant::RowBytes(type, kDim);
  // > 100 MB in all: past any L3 share, so every call streams its weights from memory.
  const int copies = static_cast<int>(std::max<std::size_t>(2, (128u << 20) / bytes_per_copy));
  std::mt19937 rng(5);
  std::vector<GroupCopy> groups;
  for (int c = 0; c < copies; ++c) groups.push_back(MakeGroup(type, part_rows, &rng));
  std::vector<float> x(static_cast<std::size_t>(m) * kDim);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& v : x) v = nd(rng);
  std::vector<float> y(static_cast<std::size_t>(m) * static_cast<std::size_t>(total_rows));
  std::size_t i = 0;
  for (auto _ : state) {
    const GroupCopy& g = groups[i++ % groups.size()];
    if (concatenated) {
      kernels::MatMul(metronome::testing::TestPool(), x.data(), m, g.fused, y.data(), false);
    } else {
      kernels::MatMul(metronome::testing::TestPool(), x.data(), m, g.parts, y.data(), false);
    }
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel(std::string(quant::Traits(type).name) +
                 (concatenated ? " concatenated" : " grouped"));
  state.counters["weight_GBps"] = benchmark::Counter(static_cast<double>(bytes_per_copy) / 1e9,
                                                     benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_FusedProjection)
    ->ArgsProduct({{0, 1}, {1, 32}, {0, 1}, {0, 1}})
    ->ArgNames({"type", "m", "concat", "shape"})
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
