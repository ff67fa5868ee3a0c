// The AVX2 kernels against the scalar reference kernels: every activation row count they run
// below the dequant+sgemm hand-over (1..15, the K-quants 1..31: every tile size and tail),
// odd weight-row counts, block counts that end inside a group of accumulator chains, row ranges
// that do not start at 0, and accumulate. The integer block dots are exact, so the only
// admissible difference is fp32 rounding of scale products and sums; a wrong element order, scale
// index, offset or a saturated int16 pair is off by O(result). The second test fills every quant
// byte at random (the whole range of each field, not what a quantiser writes) against
// activations at +-127, where vpmaddubsw's int16 pairs are closest to saturating.
#include "metronome/kernels/quant_matmul_avx2.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/quant_product.h"
#include "metronome/kernels/cpu_features.h"
#include "metronome/kernels/quant_matmul.h"
#include "metronome/quant/blocks.h"
#include "metronome/quant/codec.h"
#include "metronome/quant/ggml_type.h"
#include "metronome/quant/weight_matrix.h"

namespace metronome::kernels::avx2 {
namespace {

using test_support::MakeProduct;
using test_support::Product;
using test_support::RunKernel;
using test_support::Tolerance;

using quant::GgmlType;

constexpr GgmlType kTypes[] = {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0,
                               GgmlType::kQ5_1, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K,
                               GgmlType::kF16,  GgmlType::kBF16};

bool IsHalf(GgmlType t) { return t == GgmlType::kF16 || t == GgmlType::kBF16; }

// F16/BF16: k with a tail after whole 8-element steps; the block types: whole blocks.
int ColsFor(GgmlType t, int k) {
  if (IsHalf(t)) return k - 3;
  const int block = static_cast<int>(quant::Traits(t).block_elems);
  return (k + block - 1) / block * block;
}

class Avx2KernelTest : public ::testing::TestWithParam<GgmlType> {
 protected:
  void SetUp() override {
    if (!CpuHasAvx2Fma()) GTEST_SKIP() << "CPU lacks AVX2/FMA";
  }
};

// y over columns [row_begin, row_end) of both kernels, the columns outside untouched.
void ExpectEqualsScalar(GgmlType t, const Product& p, int m, int n, int k, int row_begin,
                        int row_end, const std::vector<double>& tol) {
  const RowsKernel avx2 = Kernel(t).rows;
  ASSERT_NE(avx2, nullptr) << quant::Name(t);
  const int ldy = n + 3;
  std::vector<float> want(static_cast<std::size_t>(m) * ldy, -7.0f);
  std::vector<float> got(want.size(), -7.0f);
  for (int accumulate = 0; accumulate < 2; ++accumulate) {  // the second pass: y += again
    RunKernel(ScalarKernel(t).rows, p, p.mat, m, want.data(), ldy, accumulate == 1, row_begin,
              row_end);
    RunKernel(avx2, p, p.mat, m, got.data(), ldy, accumulate == 1, row_begin, row_end);
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < ldy; ++j) {
        const std::size_t at = static_cast<std::size_t>(i) * ldy + j;
        if (j < row_begin || j >= row_end) {
          ASSERT_EQ(got[at], -7.0f) << "column " << j << " outside the range was written";
          continue;
        }
        ASSERT_NEAR(got[at], want[at], (accumulate + 1) * tol[static_cast<std::size_t>(i)])
            << quant::Name(t) << " m=" << m << " n=" << n << " k=" << k << " row " << j
            << " accumulate=" << accumulate;
      }
    }
  }
}

TEST_P(Avx2KernelTest, EqualsScalarKernelForEveryRowCountBelowTheHandOver) {
  const GgmlType t = GetParam();
  // The K-quants' sub-block tiles hand over later (kSuperDequantGemmMinRows, 32), the rest at 16.
  const int hand_over = Kernel(t).dequant_gemm_min_rows;
  const bool k_quant = quant::Traits(t).block_elems == quant::kQkK;
  EXPECT_EQ(hand_over, k_quant ? 2 * kDequantGemmMinRows : kDequantGemmMinRows);
  std::mt19937 rng(5);
  struct Case {
    int n, k, row_begin, row_end;
  };
  // k: 1, 3, 5, 7, 19 blocks of 32 (tails after chains of 4 and 2); 1, 3, 5 super-blocks.
  for (const Case c :
       {Case{1, 32, 0, 1}, Case{7, 96, 0, 7}, Case{37, 608, 3, 36}, Case{9, 224, 1, 9},
        Case{5, 160, 2, 5}, Case{11, 1280, 0, 11}, Case{6, 768, 1, 6}}) {
    const int k = ColsFor(t, c.k);
    for (int m = 1; m < hand_over; ++m) {
      const Product p = MakeProduct(t, m, c.n, k, rng);
      std::vector<double> tol(static_cast<std::size_t>(m));
      for (int i = 0; i < m; ++i) tol[static_cast<std::size_t>(i)] = Tolerance(p, i, k, false);
      ExpectEqualsScalar(t, p, m, c.n, k, c.row_begin, c.row_end, tol);
    }
  }
}

TEST_P(Avx2KernelTest, RandomQuantBytesAgainstExtremeActivations) {
  const GgmlType t = GetParam();
  if (IsHalf(t)) GTEST_SKIP() << "no integer quants";
  std::mt19937 rng(17);
  const int n = 13;
  const int k = ColsFor(t, 768);
  for (int m = 1; m <= 5; ++m) {
    Product p = MakeProduct(t, m, n, k, rng);
    // Every byte at random, then each block's fp16 scales set back to what the quantiser wrote
    // (a random fp16 may be Inf or NaN): the fields that hold quants, sub-block scales and mins
    // take any value their bits allow.
    const std::vector<std::uint8_t> quantised = p.w;
    std::uniform_int_distribution<int> byte(0, 255);
    for (std::uint8_t& b : p.w) b = static_cast<std::uint8_t>(byte(rng));
    const quant::GgmlTypeTraits& traits = quant::Traits(t);
    const std::size_t block_bytes = traits.block_bytes;
    const bool scales_last = t == GgmlType::kQ6_K;  // Q6_K's d ends the block
    const std::size_t halves =
        t == GgmlType::kQ4_1 || t == GgmlType::kQ5_1 || t == GgmlType::kQ4_K || t == GgmlType::kQ5_K
            ? 2
            : 1;
    for (std::size_t at = 0; at < p.w.size(); at += block_bytes) {
      const std::size_t from = scales_last ? at + block_bytes - 2 : at;
      std::memcpy(&p.w[from], &quantised[from], 2 * halves);
    }
    // Activations quantised to +-127: x = +-1 everywhere.
    std::bernoulli_distribution sign(0.5);
    for (float& v : p.x) v = sign(rng) ? 1.0f : -1.0f;
    PrepareActivations(t, p.x.data(), m, k, p.act.data());
    // The bound: fp32 rounding relative to sum |w x| of the dequantised weights.
    std::vector<float> row(static_cast<std::size_t>(k));
    double wx = 0.0;
    for (int r = 0; r < n; ++r) {
      quant::DequantizeRow(t, p.mat.Row(r), k, row.data());
      double s = 0.0;
      for (const float v : row) s += std::fabs(v);
      wx = std::max(wx, s);
    }
    ExpectEqualsScalar(t, p, m, n, k, 0, n,
                       std::vector<double>(static_cast<std::size_t>(m), 1e-5 * wx));
  }
}

INSTANTIATE_TEST_SUITE_P(Types, Avx2KernelTest, ::testing::ValuesIn(kTypes),
                         [](const ::testing::TestParamInfo<GgmlType>& param_info) {
                           return std::string(quant::Name(param_info.param));
                         });

}  // namespace
}  // namespace metronome::kernels::avx2
