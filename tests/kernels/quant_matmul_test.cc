#include "metronome/kernels/quant_matmul.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <thread>
#include <vector>

#include "metronome/quant/codec.h"
#include "metronome/quant/ggml_type.h"
#include "metronome/quant/weight_matrix.h"
#include "support/test_pool.h"

namespace metronome::kernels {
namespace {

using quant::GgmlType;

constexpr GgmlType kTypes[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ8_0,
                               GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                               GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K};

struct Problem {
  GgmlType type;
  int m, rows, cols;
  std::vector<float> x;           // [m, cols]
  std::vector<std::byte> stored;  // rows * RowBytes
  std::vector<float> w_dequant;   // [rows, cols]: the weights the kernel multiplies with
  quant::WeightMatrix w;
};

Problem MakeProblem(GgmlType type, int m, int rows, int cols, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  Problem p{type, m, rows, cols, {}, {}, {}, {}};
  p.x.resize(static_cast<std::size_t>(m) * cols);
  for (float& v : p.x) v = gauss(rng);
  if (!p.x.empty()) p.x[p.x.size() / 2] = 9.0f;  // an outlier: a coarse activation block
  std::vector<float> w(static_cast<std::size_t>(rows) * cols);
  for (float& v : w) v = 0.1f * gauss(rng);
  const std::size_t row_bytes = quant::RowBytes(type, cols);
  p.stored.resize(row_bytes * rows);
  p.w_dequant.resize(w.size());
  for (int r = 0; r < rows; ++r) {
    quant::QuantizeRow(type, w.data() + static_cast<std::size_t>(r) * cols, cols,
                       p.stored.data() + row_bytes * r);
    quant::DequantizeRow(type, p.stored.data() + row_bytes * r, cols,
                         p.w_dequant.data() + static_cast<std::size_t>(r) * cols);
  }
  p.w = quant::MakeWeightMatrix(type, rows, cols, p.stored.data());
  return p;
}

// Reference: the dequantised weights times the fp32 activations, in double. The kernel may differ
// by the activation quantisation (each element within half a step of its block's max|x| / 127,
// times |w|) plus fp32 accumulation (relative 1e-5 of sum |w x|).
struct Reference {
  std::vector<double> y;
  std::vector<double> tol;
};

Reference Expected(const Problem& p) {
  Reference ref;
  ref.y.assign(static_cast<std::size_t>(p.m) * p.rows, 0.0);
  ref.tol.assign(ref.y.size(), 0.0);
  const ActivationFormat fmt = ActivationFormatFor(p.type);
  const int block = fmt == ActivationFormat::kQ8K         ? 256
                    : fmt == ActivationFormat::kQ8Block32 ? 32
                                                          : 0;
  for (int i = 0; i < p.m; ++i) {
    const float* x = p.x.data() + static_cast<std::size_t>(i) * p.cols;
    for (int r = 0; r < p.rows; ++r) {
      const float* w = p.w_dequant.data() + static_cast<std::size_t>(r) * p.cols;
      double y = 0.0;
      double mag = 0.0;
      double quant_err = 0.0;
      for (int k = 0; k < p.cols; ++k) {
        y += static_cast<double>(x[k]) * w[k];
        mag += std::fabs(static_cast<double>(x[k]) * w[k]);
      }
      if (block > 0) {
        for (int b = 0; b < p.cols / block; ++b) {
          double amax = 0.0;
          double wsum = 0.0;
          for (int k = b * block; k < (b + 1) * block; ++k) {
            amax = std::max(amax, std::fabs(static_cast<double>(x[k])));
            wsum += std::fabs(static_cast<double>(w[k]));
          }
          quant_err += 0.5 * amax / 127.0 * wsum;
        }
      }
      const std::size_t o = static_cast<std::size_t>(i) * p.rows + r;
      ref.y[o] = y;
      // BF16 weights: the vdpbf16ps kernel (quant_matmul_avx512.h) rounds x to bf16, at most
      // 2^-9 of each product.
      const double act_rounding = p.type == GgmlType::kBF16 ? mag / 512.0 : 0.0;
      ref.tol[o] = quant_err * 1.001 + act_rounding + 1e-5 * mag + 1e-6;
    }
  }
  return ref;
}

void ExpectNear(const std::vector<float>& y, const Reference& ref, const Problem& p,
                const char* what) {
  for (std::size_t o = 0; o < y.size(); ++o) {
    ASSERT_NEAR(y[o], ref.y[o], ref.tol[o])
        << what << " " << quant::Name(p.type) << " m=" << p.m << " rows=" << p.rows
        << " cols=" << p.cols << " at " << o;
  }
}

TEST(QuantMatMulTest, ScalarKernelEqualsDequantisedGemm) {
  std::uint32_t seed = 1;
  for (const GgmlType type : kTypes) {
    for (const int m : {1, 3, 17}) {
      for (const int rows : {1, 7, 16, 33}) {
        for (const int cols : {256, 512}) {
          const Problem p = MakeProblem(type, m, rows, cols, seed++);
          std::vector<float> y(static_cast<std::size_t>(m) * rows, -1.0f);
          MatMulRowsScalar(p.x.data(), m, p.w, y.data(), false, 0, rows);
          ExpectNear(y, Expected(p), p, "scalar");
        }
      }
    }
  }
}

TEST(QuantMatMulTest, ThirtyTwoElementTypesTakeShortRows) {
  std::uint32_t seed = 100;
  for (const GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0,
                              GgmlType::kQ5_1, GgmlType::kF16, GgmlType::kBF16}) {
    for (const int cols : {32, 96, 288}) {
      const Problem p = MakeProblem(type, 5, 9, cols, seed++);
      std::vector<float> y(static_cast<std::size_t>(5) * 9);
      MatMulRowsScalar(p.x.data(), 5, p.w, y.data(), false, 0, 9);
      ExpectNear(y, Expected(p), p, "scalar");
    }
  }
}

// The dispatcher (active kernels, parallel row tiles, oneDNN for F32) against the same reference;
// m above the row tile and odd; accumulate adds onto what y holds.
TEST(QuantMatMulTest, MatMulEqualsReferenceAndAccumulates) {
  std::uint32_t seed = 200;
  for (const GgmlType type : kTypes) {
    for (const int m : {1, 2, 5, 13, 31, 37, 64, 130}) {  // from 16: dequant+sgemm if scalar
      const int rows = 70;
      const int cols = 512;
      const Problem p = MakeProblem(type, m, rows, cols, seed++);
      const Reference ref = Expected(p);
      std::vector<float> y(static_cast<std::size_t>(m) * rows, 123.0f);
      MatMul(testing::TestPool(), p.x.data(), m, p.w, y.data(), false);
      ExpectNear(y, ref, p, "MatMul");
      std::vector<float> y_acc(y.size());
      Reference shifted = ref;
      for (std::size_t o = 0; o < y_acc.size(); ++o) {
        y_acc[o] = static_cast<float>(o % 5) - 2.0f;
        shifted.y[o] += y_acc[o];
      }
      MatMul(testing::TestPool(), p.x.data(), m, p.w, y_acc.data(), true);
      ExpectNear(y_acc, shifted, p, "MatMul accumulate");
    }
  }
}

// The scalar reference multiplies a prefill's rows itself, however many: it never hands a product
// to DequantGemmKernel, so it prepares every quantised part's activations. It runs on a thread of
// its own, whose activation arena starts empty, so a part left out would meet no arena.
TEST(QuantMatMulTest, ScalarReferenceTakesPrefillRows) {
  for (const GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_K}) {
    const int m = kDequantGemmMinRows + 2;
    const Problem p = MakeProblem(type, m, 9, 256, 600);
    std::vector<float> y(static_cast<std::size_t>(m) * 9);
    std::thread([&] { MatMulRowsScalar(p.x.data(), m, p.w, y.data(), false, 0, 9); }).join();
    ExpectNear(y, Expected(p), p, "scalar");
  }
}

// MatMul on the scalar table, as a CPU without the AVX-512 kernels runs it: a product of two
// quantised parts runs on the scalar kernels below kDequantGemmMinRows rows (the reference's
// results, bit for bit) and from there through DequantGemmKernel, which equals the fp32 product of
// the dequantised weights with x unquantised to 1e-5 of sum |x w| (the quantised activations miss
// it by ~4e-4), each part in its columns of y, added to what y held.
TEST(QuantMatMulTest, ScalarTableHandsPrefillRowsToDequantisedSgemm) {
  for (const int m : {5, kDequantGemmMinRows, 130}) {
    const Problem a = MakeProblem(GgmlType::kQ4_K, m, 70, 512, 700);
    const Problem b = MakeProblem(GgmlType::kQ8_0, 1, 33, 512, 701);  // its weights, a's x
    const Problem* part_of[] = {&a, &b};
    const quant::WeightMatrix parts[] = {a.w, b.w};
    const int ldy = a.rows + b.rows;
    std::vector<float> start(static_cast<std::size_t>(m) * ldy);
    for (std::size_t o = 0; o < start.size(); ++o) start[o] = static_cast<float>(o % 5) - 2.0f;
    std::vector<float> y = start;
    const MatMulProduct product{a.x.data(), m, parts, y.data(), true};
    MatMulOnScalarKernels(testing::TestPool(), std::span(&product, 1));
    int column = 0;
    for (const Problem* p : part_of) {
      std::vector<float> scalar(static_cast<std::size_t>(m) * p->rows);
      MatMulRowsScalar(a.x.data(), m, p->w, scalar.data(), false, 0, p->rows);
      for (int i = 0; i < m; ++i) {
        const float* x = a.x.data() + static_cast<std::size_t>(i) * a.cols;
        for (int r = 0; r < p->rows; ++r) {
          const std::size_t at = static_cast<std::size_t>(i) * ldy + column + r;
          if (m < kDequantGemmMinRows) {
            ASSERT_EQ(y[at], start[at] + scalar[static_cast<std::size_t>(i) * p->rows + r])
                << quant::Name(p->type) << " m=" << m << " row " << i << " col " << r;
            continue;
          }
          const float* w = p->w_dequant.data() + static_cast<std::size_t>(r) * p->cols;
          double want = start[at];
          double mag = 0.0;
          for (int k = 0; k < p->cols; ++k) {
            want += static_cast<double>(x[k]) * w[k];
            mag += std::fabs(static_cast<double>(x[k]) * w[k]);
          }
          ASSERT_NEAR(y[at], want, 1e-5 * mag + 1e-6)
              << quant::Name(p->type) << " m=" << m << " row " << i << " col " << r;
        }
      }
      column += p->rows;
    }
  }
}

TEST(QuantMatMulTest, RowRangeWritesOnlyItsColumns) {
  for (const GgmlType type : {GgmlType::kQ4_K, GgmlType::kQ8_0, GgmlType::kBF16}) {
    const Problem p = MakeProblem(type, 4, 20, 256, 300);
    const Reference ref = Expected(p);
    std::vector<float> y(static_cast<std::size_t>(4) * 20, 7.0f);
    MatMulRowsScalar(p.x.data(), 4, p.w, y.data(), false, 5, 11);
    for (int i = 0; i < 4; ++i) {
      for (int r = 0; r < 20; ++r) {
        const std::size_t o = static_cast<std::size_t>(i) * 20 + r;
        if (r >= 5 && r < 11) {
          EXPECT_NEAR(y[o], ref.y[o], ref.tol[o]) << quant::Name(type);
        } else {
          EXPECT_EQ(y[o], 7.0f) << quant::Name(type);
        }
      }
    }
  }
}

// A row slice of a wider matrix (a fused group's part) multiplies like the rows it covers.
TEST(QuantMatMulTest, RowSliceMatchesTheFullMatrix) {
  const Problem p = MakeProblem(GgmlType::kQ6_K, 3, 24, 256, 400);
  std::vector<float> full(static_cast<std::size_t>(3) * 24);
  MatMul(testing::TestPool(), p.x.data(), 3, p.w, full.data(), false);
  const quant::WeightMatrix part = p.w.RowSlice(8, 10);
  std::vector<float> y(static_cast<std::size_t>(3) * 10);
  MatMul(testing::TestPool(), p.x.data(), 3, part, y.data(), false);
  for (int i = 0; i < 3; ++i) {
    for (int r = 0; r < 10; ++r) EXPECT_EQ(y[i * 10 + r], full[i * 24 + 8 + r]);
  }
}

// A set of products with activations of their own (a MoE layer's experts) computes each product
// exactly as MatMul computes it alone: fused parts of mixed types, F32 through oneDNN, prefill
// rows, accumulation, an empty product; outputs interleaved in one buffer.
TEST(QuantMatMulTest, ASetOfProductsEqualsEachProductAlone) {
  const Problem q4k = MakeProblem(GgmlType::kQ4_K, 3, 70, 512, 500);
  const Problem q6k = MakeProblem(GgmlType::kQ6_K, 3, 40, 512, 501);
  const Problem q8 = MakeProblem(GgmlType::kQ8_0, 1, 33, 512, 502);
  const Problem f32 = MakeProblem(GgmlType::kF32, 2, 20, 512, 503);
  const Problem prefill = MakeProblem(GgmlType::kQ5_K, 130, 48, 512, 504);
  const std::vector<quant::WeightMatrix> fused = {q4k.w, q6k.w};  // q4k's x for both
  struct Case {
    const float* x;
    int m;
    std::span<const quant::WeightMatrix> parts;
    bool accumulate;
  };
  const std::vector<Case> cases = {
      {q4k.x.data(), 3, fused, false},
      {q8.x.data(), 1, {&q8.w, 1}, true},
      {f32.x.data(), 2, {&f32.w, 1}, false},
      {q8.x.data(), 0, {&q8.w, 1}, false},
      {prefill.x.data(), 130, {&prefill.w, 1}, true},
  };
  std::vector<MatMulProduct> products;
  std::vector<std::size_t> offsets;
  std::size_t total = 0;
  for (const Case& c : cases) {
    int rows = 0;
    for (const auto& w : c.parts) rows += w.rows;
    offsets.push_back(total);
    total += static_cast<std::size_t>(c.m) * rows;
  }
  std::vector<float> together(total);
  std::vector<float> alone(total);
  for (std::size_t o = 0; o < total; ++o) together[o] = alone[o] = static_cast<float>(o % 7) - 3.0f;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    products.push_back({c.x, c.m, c.parts, together.data() + offsets[i], c.accumulate});
    MatMul(testing::TestPool(), c.x, c.m, c.parts, alone.data() + offsets[i], c.accumulate);
  }
  MatMul(testing::TestPool(), products);
  for (std::size_t o = 0; o < total; ++o) ASSERT_EQ(together[o], alone[o]) << "at " << o;
}

TEST(QuantMatMulTest, EveryComputableTypeHasAKernel) {
  for (std::uint32_t id = 0; id < 40; ++id) {
    const auto t = quant::FindGgmlType(id);
    if (!t || !t->computable) continue;
    EXPECT_NE(ScalarKernel(t->type).rows, nullptr) << t->name;
    EXPECT_NE(ActiveKernel(t->type).rows, nullptr) << t->name;
    EXPECT_FALSE(ActiveKernel(t->type).name.empty()) << t->name;
  }
}

}  // namespace
}  // namespace metronome::kernels
