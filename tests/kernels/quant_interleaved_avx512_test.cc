// Weights in the 16-row interleaved layout (quant/row_layout.h) against the scalar reference on the
// same weights row-major: the interleaved kernels at decode and prefill row counts (register
// tiles and their remainders), MatMul over interleaved and row-major parts, and the scalar kernel
// reading interleaved rows. The integer block dots are
// exact; only fp32 rounding of scale products and sums may differ (the bound of
// quant_gemv_avx512_test.cc). A wrong lane, scale, offset or tile index is off by O(result).
#include "metronome/kernels/quant_interleaved_avx512.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <random>
#include <string>
#include <vector>

#include "kernels/quant_product.h"
#include "metronome/kernels/cpu_features.h"
#include "metronome/kernels/quant_matmul.h"
#include "metronome/quant/row_layout.h"
#include "support/test_pool.h"

namespace metronome::kernels::avx512 {
namespace {

using test_support::RunKernel;
using test_support::Tolerance;

using quant::GgmlType;

// A product whose weights are also held in the interleaved layout, where the type and shape have
// it.
struct Product : test_support::Product {
  std::vector<std::byte> wx;
  quant::WeightMatrix interleaved;
};

Product MakeProduct(GgmlType t, int m, int n, int k, std::mt19937& rng) {
  Product p{test_support::MakeProduct(t, m, n, k, rng), {}, {}};
  if (quant::CanInterleave(t, n, k)) {
    p.wx.resize(p.mat.Bytes());
    p.interleaved = quant::InterleaveRows(p.mat, p.wx.data());
  }
  return p;
}

class InterleavedKernelTest : public ::testing::TestWithParam<GgmlType> {
 protected:
  void SetUp() override {
    if (!CpuHasAvx512Vnni()) GTEST_SKIP() << "CPU lacks AVX-512 F/BW/VL/VNNI";
  }
};

struct Case {
  int n;
  int k;
  int row_begin;
  int row_end;
};

TEST_P(InterleavedKernelTest, EqualsScalarKernelForEveryRowCount) {
  const GgmlType t = GetParam();
  const RowsKernel kernel = InterleavedKernel(t);
  ASSERT_NE(kernel, nullptr);
  std::mt19937 rng(17);
  // One pair of blocks, pairs that fill and straddle the prefetch distance, ranges of groups that
  // do not start at 0.
  // K-quants: one super-block, an odd count (groups not on 64-byte lines), the smol down width.
  const bool super = quant::Traits(t).block_elems == quant::kQkK;
  const std::vector<Case> cases =
      super ? std::vector<Case>{{16, 256, 0, 16},
                                {48, 768, 16, 48},
                                {64, 1536, 0, 64},
                                {32, 512, 16, 32}}
            : std::vector<Case>{
                  {16, 64, 0, 16}, {48, 576, 16, 48}, {64, 1536, 0, 64}, {32, 128, 16, 32}};
  for (const Case c : cases) {
    for (const int m : {1, 2, 3, 4, 5, 7, 9, 32, 127}) {
      const Product p = MakeProduct(t, m, c.n, c.k, rng);
      const int ldy = c.n + 3;  // columns past n must stay untouched
      std::vector<float> want(static_cast<std::size_t>(m) * ldy, -7.0f);
      std::vector<float> got(want.size(), -7.0f);
      for (int accumulate = 0; accumulate < 2; ++accumulate) {  // y += again: both sides double
        RunKernel(ScalarKernel(t).rows, p, p.mat, m, want.data(), ldy, accumulate == 1, c.row_begin,
                  c.row_end);
        RunKernel(kernel, p, p.interleaved, m, got.data(), ldy, accumulate == 1, c.row_begin,
                  c.row_end);
        for (int i = 0; i < m; ++i) {
          const double tol = (accumulate + 1) * Tolerance(p, i, c.k);
          for (int j = 0; j < ldy; ++j) {
            const std::size_t at = static_cast<std::size_t>(i) * ldy + j;
            if (j < c.row_begin || j >= c.row_end) {
              ASSERT_EQ(got[at], -7.0f) << "column " << j << " outside the range was written";
              continue;
            }
            ASSERT_NEAR(got[at], want[at], tol)
                << quant::Name(t) << " m=" << m << " n=" << c.n << " k=" << c.k << " row " << j
                << " accumulate=" << accumulate;
          }
        }
      }
    }
  }
}

// MatMul of a group with an interleaved part and a row-major part (m at decode, batched and
// prefill counts) equals the same product with both parts row-major; the scalar kernel reads the
// interleaved matrix's rows exactly.
TEST_P(InterleavedKernelTest, MatMulReadsEitherLayoutAlike) {
  const GgmlType t = GetParam();
  std::mt19937 rng(29);
  const int kCols = quant::Traits(t).block_elems == quant::kQkK ? 768 : 576;
  for (const int m : {1, 4, 6, 32, 130}) {
    const Product a = MakeProduct(t, m, 1008, kCols, rng);  // the pool splits it
    const Product b = MakeProduct(GgmlType::kQ4_1, m, 77, kCols, rng);
    const quant::WeightMatrix mixed[] = {a.interleaved, b.mat};
    const quant::WeightMatrix plain[] = {a.mat, b.mat};
    const int ldy = a.mat.rows + b.mat.rows;
    std::vector<float> got(static_cast<std::size_t>(m) * ldy);
    std::vector<float> want(got.size());
    MatMul(testing::TestPool(), a.x.data(), m, mixed, got.data(), false);
    MatMul(testing::TestPool(), a.x.data(), m, plain, want.data(), false);
    for (int i = 0; i < m; ++i) {
      const double tol = Tolerance(a, i, kCols) + Tolerance(b, i, kCols);
      for (int j = 0; j < ldy; ++j) {
        const std::size_t at = static_cast<std::size_t>(i) * ldy + j;
        ASSERT_NEAR(got[at], want[at], tol) << quant::Name(t) << " m=" << m << " column " << j;
      }
    }
    if (m > 4) continue;
    std::vector<float> scalar_x(static_cast<std::size_t>(m) * a.mat.rows);
    std::vector<float> scalar_r(scalar_x.size());
    MatMulRowsScalar(a.x.data(), m, a.interleaved, scalar_x.data(), false, 0, a.mat.rows);
    MatMulRowsScalar(a.x.data(), m, a.mat, scalar_r.data(), false, 0, a.mat.rows);
    EXPECT_EQ(scalar_x, scalar_r) << quant::Name(t) << " m=" << m;
  }
}

TEST_P(InterleavedKernelTest, PreferredOnlyWhereTheKernelsReadIt) {
  const GgmlType t = GetParam();
  const int cols = 2 * static_cast<int>(quant::Traits(t).block_elems);
  std::vector<std::byte> bytes(quant::RowBytes(t, 2 * cols) * 48);
  EXPECT_EQ(PreferredRowLayout(quant::MakeWeightMatrix(t, 48, 2 * cols, bytes.data())),
            quant::RowLayout::kInterleaved16);
  EXPECT_EQ(PreferredRowLayout(quant::MakeWeightMatrix(t, 40, 2 * cols, bytes.data())),
            quant::RowLayout::kRowMajor);  // not whole 16-row groups
  quant::WeightMatrix strided = quant::MakeWeightMatrix(t, 16, cols, bytes.data());
  strided.row_bytes *= 2;  // rows of a wider matrix
  EXPECT_EQ(PreferredRowLayout(strided), quant::RowLayout::kRowMajor);
  EXPECT_EQ(PreferredRowLayout(quant::MakeWeightMatrix(GgmlType::kF16, 16, 32, bytes.data())),
            quant::RowLayout::kRowMajor);
}

INSTANTIATE_TEST_SUITE_P(InterleavedTypes, InterleavedKernelTest,
                         ::testing::Values(GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1,
                                           GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ4_K,
                                           GgmlType::kQ5_K, GgmlType::kQ6_K),
                         [](const ::testing::TestParamInfo<GgmlType>& param_info) {
                           return std::string(quant::Name(param_info.param));
                         });

}  // namespace
}  // namespace metronome::kernels::avx512
