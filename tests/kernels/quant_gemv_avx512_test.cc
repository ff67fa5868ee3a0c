// The decode-path (m <= kGemvMaxRows) AVX-512 kernels against the scalar reference kernels on
// quantised random data: every m in 1..kGemvMaxRows, odd weight-row counts (a tail after the
// groups of rows in flight), odd block counts (a half-empty last pair), row ranges that do not
// start at 0, and accumulate. The integer block dots are exact, so the only admissible difference
// is fp32 rounding of scale products and sums (bound relative to sum |x| max |w|, as in
// quant_matmul_avx512_test.cc); a wrong element order, scale index or offset is off by O(result).
#include "metronome/kernels/quant_gemv_avx512.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/quant_product.h"
#include "metronome/kernels/cpu_features.h"
#include "metronome/kernels/quant_matmul.h"
#include "metronome/quant/codec.h"
#include "metronome/quant/ggml_type.h"
#include "metronome/quant/weight_matrix.h"
#include "support/test_pool.h"

namespace metronome::kernels::avx512 {
namespace {

using test_support::MakeProduct;
using test_support::Product;
using test_support::RunKernel;
using test_support::Tolerance;

using quant::GgmlType;

constexpr GgmlType kGemvTypes[] = {
    GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
    GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kF16,  GgmlType::kBF16};

bool IsHalf(GgmlType t) { return t == GgmlType::kF16 || t == GgmlType::kBF16; }

// F16/BF16 rows have no blocks: k with a tail after whole 32-element steps exercises the masks.
// K-quants: k rounded up to whole 256-element super-blocks.
int ColsFor(GgmlType t, int k) {
  if (IsHalf(t)) return k - 3;
  const int block = static_cast<int>(quant::Traits(t).block_elems);
  return (k + block - 1) / block * block;
}

struct Case {
  int n;  // weight rows
  int k;  // columns
  int row_begin;
  int row_end;
};

class GemvKernelTest : public ::testing::TestWithParam<GgmlType> {
 protected:
  void SetUp() override {
    if (!CpuHasAvx512Vnni()) GTEST_SKIP() << "CPU lacks AVX-512 F/BW/VL/VNNI";
    if (GetParam() == GgmlType::kBF16 && !CpuHasAvx512Bf16()) GTEST_SKIP() << "no AVX512_BF16";
  }
};

TEST_P(GemvKernelTest, EqualsScalarKernelForEveryDecodeRowCount) {
  const GgmlType t = GetParam();
  const RowsKernel gemv = GemvKernel(t);
  ASSERT_NE(gemv, nullptr) << quant::Name(t);
  std::mt19937 rng(11);
  // k: odd and even block counts, block counts that end inside a quad of 4 (3, 7, 18, 19), one
  // block into a 16-block scale group (17) and a group of whole quads only (20: scales from the
  // quads' own lines, no gather); n: tails of 1..3 rows after the groups of 4; ranges from 0 and
  // from inside the matrix.
  for (const Case c :
       {Case{1, 32, 0, 1}, Case{7, 224, 0, 7}, Case{37, 608, 3, 36}, Case{130, 1536, 5, 130},
        Case{6, 96, 1, 6}, Case{9, 544, 0, 9}, Case{5, 576, 2, 5}, Case{11, 640, 0, 11}}) {
    const int k = ColsFor(t, c.k);
    for (int m = 1; m <= kGemvMaxRows; ++m) {
      const Product p = MakeProduct(t, m, c.n, k, rng);
      const int ldy = c.n + 3;  // columns past n must stay untouched
      std::vector<float> want(static_cast<std::size_t>(m) * ldy, -7.0f);
      std::vector<float> got(want.size(), -7.0f);
      RunKernel(ScalarKernel(t).rows, p, p.mat, m, want.data(), ldy, false, c.row_begin, c.row_end);
      RunKernel(gemv, p, p.mat, m, got.data(), ldy, false, c.row_begin, c.row_end);
      for (int accumulate = 0; accumulate < 2; ++accumulate) {
        if (accumulate == 1) {  // y += again: both sides double
          RunKernel(ScalarKernel(t).rows, p, p.mat, m, want.data(), ldy, true, c.row_begin,
                    c.row_end);
          RunKernel(gemv, p, p.mat, m, got.data(), ldy, true, c.row_begin, c.row_end);
        }
        for (int i = 0; i < m; ++i) {
          const double tol = (accumulate + 1) * Tolerance(p, i, k);
          for (int j = 0; j < ldy; ++j) {
            const std::size_t at = static_cast<std::size_t>(i) * ldy + j;
            if (j < c.row_begin || j >= c.row_end) {
              ASSERT_EQ(got[at], -7.0f) << "column " << j << " outside the range was written";
              continue;
            }
            ASSERT_NEAR(got[at], want[at], tol)
                << quant::Name(t) << " m=" << m << " n=" << c.n << " k=" << k << " row " << j
                << " accumulate=" << accumulate;
          }
        }
      }
    }
  }
}

// MatMul at decode row counts (the gemv entries, chunks of tiles merged into one call per part,
// a group of parts of different types) equals the scalar reference per part.
TEST_P(GemvKernelTest, MatMulOfAGroupEqualsScalarReference) {
  const GgmlType t = GetParam();
  std::mt19937 rng(23);
  const int k = IsHalf(t) ? 576 : ColsFor(t, 576);  // part b is Q8_0: whole blocks
  for (int m = 1; m <= kGemvMaxRows; ++m) {
    // Enough rows that the pool splits the product, and parts that end inside a 16-row tile.
    const Product a = MakeProduct(t, m, 1000, k, rng);
    const Product b = MakeProduct(GgmlType::kQ8_0, m, 77, k, rng);
    // Both parts multiply the same x.
    std::vector<float> x = a.x;
    const quant::WeightMatrix parts[] = {a.mat, b.mat};
    const int ldy = a.mat.rows + b.mat.rows;
    std::vector<float> got(static_cast<std::size_t>(m) * ldy);
    MatMul(testing::TestPool(), x.data(), m, parts, got.data(), false);
    std::vector<float> want_a(static_cast<std::size_t>(m) * a.mat.rows);
    std::vector<float> want_b(static_cast<std::size_t>(m) * b.mat.rows);
    MatMulRowsScalar(x.data(), m, a.mat, want_a.data(), false, 0, a.mat.rows);
    MatMulRowsScalar(x.data(), m, b.mat, want_b.data(), false, 0, b.mat.rows);
    for (int i = 0; i < m; ++i) {
      const double tol = Tolerance(a, i, k) + Tolerance(b, i, k);
      for (int j = 0; j < ldy; ++j) {
        const float want = j < a.mat.rows
                               ? want_a[static_cast<std::size_t>(i) * a.mat.rows + j]
                               : want_b[static_cast<std::size_t>(i) * b.mat.rows + j - a.mat.rows];
        ASSERT_NEAR(got[static_cast<std::size_t>(i) * ldy + j], want, tol)
            << quant::Name(t) << " m=" << m << " column " << j;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(GemvTypes, GemvKernelTest, ::testing::ValuesIn(kGemvTypes),
                         [](const ::testing::TestParamInfo<GgmlType>& param_info) {
                           return std::string(quant::Name(param_info.param));
                         });

}  // namespace
}  // namespace metronome::kernels::avx512
