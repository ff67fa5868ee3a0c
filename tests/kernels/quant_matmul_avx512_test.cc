// The AVX-512 weight kernels against an independent oracle: every block dequantised from the
// layouts documented in quant/blocks.h, activations dequantised exactly, dot products in double.
// The integer dot products are exact, so the only admissible difference is fp32 rounding of
// scales and sums, bounded relative to sum |x_i| (|w_i| + |offset or min term of w_i's block|)
// (the offset trick subtracts a large term). A wrong element order, scale index or offset gives
// errors of the order of the result itself.
#include "metronome/kernels/quant_matmul_avx512.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "metronome/base/half.h"
#include "metronome/kernels/cpu_features.h"
#include "metronome/kernels/quant_matmul.h"
#include "metronome/quant/blocks.h"
#include "metronome/quant/codec.h"
#include "metronome/quant/ggml_type.h"
#include "metronome/quant/row_layout.h"
#include "metronome/quant/weight_matrix.h"
#include "support/test_pool.h"

namespace metronome::kernels::avx512 {
namespace {

using quant::GgmlType;

// One dequantised weight element: its value and the magnitude of the offset/min term that the
// kernel subtracts (for the tolerance).
struct Elem {
  double value;
  double offset_term;
};

int Nib(const std::uint8_t* qs, int i) { return i < 16 ? qs[i] & 15 : qs[i - 16] >> 4; }
int HighBit(const std::uint8_t* qh, int i) {
  std::uint32_t h = 0;
  std::memcpy(&h, qh, 4);
  return static_cast<int>((h >> i) & 1u);
}
void ScaleMinK4(const std::uint8_t* s, int j, int* sc, int* mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Element e of a row of `type` stored at `row` (the formulas of quant/blocks.h, one at a time).
Elem WeightElem(GgmlType type, const std::uint8_t* row, int e) {
  const auto& tr = quant::Traits(type);
  const std::uint8_t* blk = row + static_cast<std::size_t>(e / tr.block_elems) * tr.block_bytes;
  const int i = e % static_cast<int>(tr.block_elems);
  switch (type) {
    case GgmlType::kQ8_0: {
      const auto* b = reinterpret_cast<const quant::BlockQ8_0*>(blk);
      const double d = F16ToFloat(b->d);
      return {d * b->qs[i], 128.0 * std::fabs(d)};
    }
    case GgmlType::kQ4_0: {
      const auto* b = reinterpret_cast<const quant::BlockQ4_0*>(blk);
      const double d = F16ToFloat(b->d);
      return {d * (Nib(b->qs, i) - 8), 8.0 * std::fabs(d)};
    }
    case GgmlType::kQ4_1: {
      const auto* b = reinterpret_cast<const quant::BlockQ4_1*>(blk);
      const double m = F16ToFloat(b->m);
      return {F16ToFloat(b->d) * Nib(b->qs, i) + m, std::fabs(m)};
    }
    case GgmlType::kQ5_0: {
      const auto* b = reinterpret_cast<const quant::BlockQ5_0*>(blk);
      const double d = F16ToFloat(b->d);
      return {d * ((Nib(b->qs, i) | HighBit(b->qh, i) << 4) - 16), 16.0 * std::fabs(d)};
    }
    case GgmlType::kQ5_1: {
      const auto* b = reinterpret_cast<const quant::BlockQ5_1*>(blk);
      const double m = F16ToFloat(b->m);
      return {F16ToFloat(b->d) * (Nib(b->qs, i) | HighBit(b->qh, i) << 4) + m, std::fabs(m)};
    }
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K: {
      const bool five = type == GgmlType::kQ5_K;
      const auto* b4 = reinterpret_cast<const quant::BlockQ4_K*>(blk);
      const auto* b5 = reinterpret_cast<const quant::BlockQ5_K*>(blk);
      const std::uint8_t* scales = five ? b5->scales : b4->scales;
      const std::uint8_t* qs = five ? b5->qs : b4->qs;
      const double d = F16ToFloat(five ? b5->d : b4->d);
      const double dmin = F16ToFloat(five ? b5->dmin : b4->dmin);
      const int g = i / 64;
      const int l = i % 64;
      int q = l < 32 ? qs[32 * g + l] & 15 : qs[32 * g + l - 32] >> 4;
      if (five) q |= ((b5->qh[l % 32] >> (2 * g + (l >= 32 ? 1 : 0))) & 1) << 4;
      int sc = 0;
      int mn = 0;
      ScaleMinK4(scales, i / 32, &sc, &mn);
      return {d * sc * q - dmin * mn, std::fabs(dmin * mn)};
    }
    case GgmlType::kQ6_K: {
      const auto* b = reinterpret_cast<const quant::BlockQ6_K*>(blk);
      const int h = i / 128;
      const int e2 = i % 128;
      const std::uint8_t* ql = b->ql + 64 * h;
      const std::uint8_t* qh = b->qh + 32 * h;
      const int l = e2 % 32;
      int q = 0;
      switch (e2 / 32) {
        case 0:
          q = (ql[l] & 15) | (qh[l] & 3) << 4;
          break;
        case 1:
          q = (ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4;
          break;
        case 2:
          q = (ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4;
          break;
        default:
          q = (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4;
          break;
      }
      const double ds = static_cast<double>(F16ToFloat(b->d)) * b->scales[8 * h + e2 / 16];
      return {ds * (q - 32), 32.0 * std::fabs(ds)};
    }
    default:
      ADD_FAILURE() << "no oracle for " << quant::Name(type);
      return {0.0, 0.0};
  }
}

std::uint16_t RandomScale(std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  return FloatToF16(u(rng));
}

// A random row of whole blocks: random bytes with the f16 scale fields set to sane values (random
// bits would make infinities and NaNs).
std::vector<std::uint8_t> RandomWeights(GgmlType type, int n, int k, std::mt19937& rng) {
  const auto& tr = quant::Traits(type);
  const std::size_t blocks = static_cast<std::size_t>(n) * k / tr.block_elems;
  std::vector<std::uint8_t> w(blocks * tr.block_bytes);
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : w) b = static_cast<std::uint8_t>(byte(rng));
  for (std::size_t b = 0; b < blocks; ++b) {
    std::uint8_t* p = w.data() + b * tr.block_bytes;
    const auto put = [&](std::size_t offset, std::uint16_t v) { std::memcpy(p + offset, &v, 2); };
    switch (type) {
      case GgmlType::kQ8_0:
      case GgmlType::kQ4_0:
      case GgmlType::kQ5_0:
        put(0, RandomScale(rng, -0.02f, 0.02f));
        break;
      case GgmlType::kQ4_1:
      case GgmlType::kQ5_1:
        put(0, RandomScale(rng, 0.0f, 0.02f));
        put(2, RandomScale(rng, -0.2f, 0.0f));
        break;
      case GgmlType::kQ4_K:
      case GgmlType::kQ5_K:
        put(0, RandomScale(rng, 0.0f, 0.002f));
        put(2, RandomScale(rng, 0.0f, 0.002f));
        break;
      case GgmlType::kQ6_K:
        put(offsetof(quant::BlockQ6_K, d), RandomScale(rng, -0.002f, 0.002f));
        break;
      default:
        break;
    }
  }
  return w;
}

// Random activation rows already in blocks (BlockQ8_0 or BlockQ8_K with consistent bsums) and
// their exact values.
struct Activations {
  std::vector<std::uint8_t> blocks;
  std::vector<double> values;  // [m, k]
};

Activations RandomActivations(ActivationFormat format, int m, int k, std::mt19937& rng) {
  std::uniform_int_distribution<int> q(-127, 127);
  std::uniform_real_distribution<float> d(0.001f, 0.05f);
  Activations a;
  a.values.resize(static_cast<std::size_t>(m) * k);
  if (format == ActivationFormat::kQ8Block32) {
    std::vector<quant::ActQ8Block32> blocks(static_cast<std::size_t>(m) * k / quant::kQk32);
    for (std::size_t b = 0; b < blocks.size(); ++b) {
      blocks[b].d = d(rng);
      blocks[b].sum = 0;
      for (int i = 0; i < quant::kQk32; ++i) {
        blocks[b].qs[i] = static_cast<std::int8_t>(q(rng));
        blocks[b].sum += blocks[b].qs[i];
        a.values[b * quant::kQk32 + i] = static_cast<double>(blocks[b].d) * blocks[b].qs[i];
      }
    }
    a.blocks.resize(blocks.size() * sizeof(quant::ActQ8Block32));
    std::memcpy(a.blocks.data(), blocks.data(), a.blocks.size());
  } else {
    std::vector<quant::BlockQ8_K> blocks(static_cast<std::size_t>(m) * k / quant::kQkK);
    for (std::size_t b = 0; b < blocks.size(); ++b) {
      blocks[b].d = d(rng);
      for (int g = 0; g < quant::kQkK / 16; ++g) {
        int sum = 0;
        for (int i = 16 * g; i < 16 * g + 16; ++i) {
          blocks[b].qs[i] = static_cast<std::int8_t>(q(rng));
          sum += blocks[b].qs[i];
          a.values[b * quant::kQkK + i] = static_cast<double>(blocks[b].d) * blocks[b].qs[i];
        }
        blocks[b].bsums[g] = static_cast<std::int16_t>(sum);
      }
    }
    a.blocks.resize(blocks.size() * sizeof(quant::BlockQ8_K));
    std::memcpy(a.blocks.data(), blocks.data(), a.blocks.size());
  }
  return a;
}

struct Shape {
  int m;
  int n;
  int k;
  int split = 1;  // the kernel is run on output rows [split, n), then [0, split)
};

// Runs `kernel` over output rows [row_begin, row_end) of y (ldy columns).
void RunRows(const QuantKernel& kernel, const std::uint8_t* act, std::size_t act_row_bytes, int m,
             const quant::WeightMatrix& w, float* y, int ldy, bool accumulate, int row_begin,
             int row_end) {
  RowsKernelArgs args;
  args.act = reinterpret_cast<const std::byte*>(act);
  args.act_row_bytes = act_row_bytes;
  args.m = m;
  args.w = &w;
  args.y = y;
  args.ldy = ldy;
  args.accumulate = accumulate;
  kernel.rows(args, row_begin, row_end);
}

void CheckQuant(GgmlType type, Shape s, std::uint32_t seed) {
  std::mt19937 rng(seed);
  const std::size_t row_bytes = quant::RowBytes(type, s.k);
  const std::vector<std::uint8_t> w = RandomWeights(type, s.n, s.k, rng);
  const quant::WeightMatrix mat = quant::MakeWeightMatrix(type, s.n, s.k, w.data());
  const Activations x = RandomActivations(ActivationFormatFor(type), s.m, s.k, rng);
  const QuantKernel kernel = Kernel(type, CpuHasAvx512Bf16());
  ASSERT_NE(kernel.rows, nullptr) << quant::Name(type);
  // y is wider than n and prefilled: the kernel must write exactly columns [split, n) of each
  // row when asked for that range (a range not starting at 0, not aligned to the kernel's
  // 16-row vectors), and [0, split) in a second call.
  const int ldy = s.n + 3;
  const int split = std::min(s.split, s.n);
  std::vector<float> y(static_cast<std::size_t>(s.m) * ldy, -7.0f);
  const std::size_t act_row_bytes = ActivationRowBytes(type, s.k);
  RunRows(kernel, x.blocks.data(), act_row_bytes, s.m, mat, y.data(), ldy, false, split, s.n);
  RunRows(kernel, x.blocks.data(), act_row_bytes, s.m, mat, y.data(), ldy, false, 0, split);
  for (int r = 0; r < s.m; ++r) {
    for (int j = 0; j < ldy; ++j) {
      const float got = y[static_cast<std::size_t>(r) * ldy + j];
      if (j >= s.n) {
        ASSERT_EQ(got, -7.0f) << "column " << j << " outside the range was written";
        continue;
      }
      double want = 0.0;
      double scale = 0.0;
      for (int i = 0; i < s.k; ++i) {
        const Elem e = WeightElem(type, w.data() + j * row_bytes, i);
        const double xi = x.values[static_cast<std::size_t>(r) * s.k + i];
        want += e.value * xi;
        scale += (std::fabs(e.value) + e.offset_term) * std::fabs(xi);
      }
      ASSERT_NEAR(got, want, 2e-6 * scale + 1e-30)
          << quant::Name(type) << " m=" << s.m << " n=" << s.n << " k=" << s.k << " row " << r
          << " col " << j;
    }
  }
  // accumulate = true adds to what is there.
  std::vector<float> y2 = y;
  RunRows(kernel, x.blocks.data(), act_row_bytes, s.m, mat, y2.data(), ldy, true, 0, s.n);
  for (int r = 0; r < s.m; ++r) {
    for (int j = 0; j < s.n; ++j) {
      const std::size_t at = static_cast<std::size_t>(r) * ldy + j;
      ASSERT_FLOAT_EQ(y2[at], 2.0f * y[at]) << "accumulate, row " << r << " col " << j;
    }
  }
}

class QuantKernelTest : public ::testing::TestWithParam<GgmlType> {
 protected:
  void SetUp() override {
    if (!CpuHasAvx512Vnni()) GTEST_SKIP() << "CPU lacks AVX-512 F/BW/VL/VNNI";
  }
};

TEST_P(QuantKernelTest, MatchesDequantisedReferenceOnRandomShapes) {
  const GgmlType type = GetParam();
  const int bk = static_cast<int>(quant::Traits(type).block_elems);
  // m = 1, odd m, m at and past the register tiles (6 and 8 activation rows) and far past them;
  // n below, at and past the 16-row output vector and the 32-row panel, not a multiple of
  // either; row ranges starting inside a vector; one block, an odd number of blocks, many.
  const Shape shapes[] = {
      {1, 1, bk},          {1, 7, 3 * bk},      {3, 2, bk},          {4, 5, 2 * bk},
      {5, 3, 5 * bk},      {9, 4, 3 * bk},      {33, 7, 2 * bk},     {2, 9, 18 * bk},
      {6, 16, bk, 0},      {7, 17, 2 * bk, 16}, {13, 32, bk, 5},     {2, 33, 3 * bk, 17},
      {8, 48, 2 * bk, 31}, {19, 70, bk, 33},    {64, 35, 2 * bk, 3}, {45, 100, 3 * bk, 50}};
  std::uint32_t seed = 1;
  for (const Shape& s : shapes) CheckQuant(type, s, seed++);
  std::mt19937 rng(99);
  for (int t = 0; t < 8; ++t) {
    std::uniform_int_distribution<int> m(1, 64);
    std::uniform_int_distribution<int> n(1, 80);
    std::uniform_int_distribution<int> blocks(1, bk == 32 ? 20 : 4);
    const int rows = n(rng);
    std::uniform_int_distribution<int> split(0, rows);
    CheckQuant(type, {m(rng), rows, blocks(rng) * bk, split(rng)}, seed++);
  }
}

INSTANTIATE_TEST_SUITE_P(AllIntTypes, QuantKernelTest,
                         ::testing::Values(GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1,
                                           GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ4_K,
                                           GgmlType::kQ5_K, GgmlType::kQ6_K),
                         [](const auto& p) { return std::string(quant::Name(p.param)); });

TEST(Avx512KernelTable, CoversEveryComputableTypeButF32) {
  if (!CpuHasAvx512Vnni()) GTEST_SKIP() << "CPU lacks AVX-512 F/BW/VL/VNNI";
  for (const GgmlType t : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0,
                           GgmlType::kQ5_1, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K}) {
    EXPECT_EQ(Kernel(t, false).name, "avx512-vnni") << quant::Name(t);
  }
  EXPECT_EQ(Kernel(GgmlType::kF16, false).name, "avx512-f16c");
  EXPECT_EQ(Kernel(GgmlType::kBF16, true).name, "avx512-bf16");
  EXPECT_EQ(Kernel(GgmlType::kBF16, false).rows, nullptr);
  EXPECT_EQ(Kernel(GgmlType::kF32, true).rows, nullptr);
  EXPECT_EQ(Kernel(GgmlType::kQ2_K, true).rows, nullptr);
  // The table MatMul uses picks them up on this CPU.
  EXPECT_EQ(ActiveKernel(GgmlType::kQ4_K).name, "avx512-vnni");
}

// The vector activation quantisers equal quant/codec's scalar ones byte for byte: random rows of
// several magnitudes, a zero block, exact rounding ties (x * 127 / amax = k + 0.5: nearest even),
// negative zeros.
TEST(Avx512ActivationQuantiser, EqualsTheScalarQuantiserBitForBit) {
  if (!CpuHasAvx512Vnni()) GTEST_SKIP() << "CPU lacks AVX-512 F/BW/VL/VNNI";
  std::mt19937 rng(11);
  constexpr int kCols = 3 * quant::kQkK;  // 24 blocks of 32, 3 super-blocks
  for (int trial = 0; trial < 50; ++trial) {
    const float scale = std::ldexp(1.0f, trial % 20 - 10);
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> x(kCols);
    for (float& v : x) v = dist(rng);
    if (trial % 5 == 1) std::fill(x.begin() + 32, x.begin() + 64, 0.0f);  // a zero block
    if (trial % 5 == 2) {
      // amax 127 in each block: x * inv is x itself, so halves are ties.
      for (int i = 0; i < kCols; ++i) {
        x[static_cast<std::size_t>(i)] = i % 32 == 0 ? 127.0f : static_cast<float>(i % 9) - 3.5f;
      }
    }
    if (trial % 5 == 3) x[5] = -0.0f;
    std::vector<quant::ActQ8Block32> want(kCols / quant::kQk32);
    std::vector<quant::ActQ8Block32> got(want.size());
    quant::QuantizeActivationsQ8(x.data(), kCols, want.data());
    avx512::QuantizeActivationsQ8(x.data(), kCols, got.data());
    for (std::size_t b = 0; b < want.size(); ++b) {
      ASSERT_EQ(std::memcmp(&want[b].d, &got[b].d, sizeof(float)), 0) << trial << " block " << b;
      ASSERT_EQ(want[b].sum, got[b].sum) << trial << " block " << b;
      ASSERT_EQ(std::memcmp(want[b].qs, got[b].qs, quant::kQk32), 0) << trial << " block " << b;
    }
    std::vector<quant::BlockQ8_K> want_k(kCols / quant::kQkK);
    std::vector<quant::BlockQ8_K> got_k(want_k.size());
    quant::QuantizeActivationsQ8_K(x.data(), kCols, want_k.data());
    avx512::QuantizeActivationsQ8_K(x.data(), kCols, got_k.data());
    for (std::size_t b = 0; b < want_k.size(); ++b) {
      ASSERT_EQ(std::memcmp(&want_k[b].d, &got_k[b].d, sizeof(float)), 0) << trial << " " << b;
      ASSERT_EQ(std::memcmp(want_k[b].qs, got_k[b].qs, quant::kQkK), 0) << trial << " " << b;
      ASSERT_EQ(std::memcmp(want_k[b].bsums, got_k[b].bsums, sizeof(want_k[b].bsums)), 0)
          << trial << " super-block " << b;
    }
  }
}

// The table's kernel (AVX-512 here) against the scalar reference on real data: fp32 weights
// quantised by QuantizeRow, activations prepared by PrepareActivations, random shapes.
TEST(Avx512KernelTable, ActiveKernelEqualsScalarReference) {
  if (!CpuHasAvx512Vnni()) GTEST_SKIP() << "CPU lacks AVX-512 F/BW/VL/VNNI";
  std::mt19937 rng(5);
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (const GgmlType t :
       {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
        GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kF16, GgmlType::kBF16}) {
    const int bk = t == GgmlType::kF16 || t == GgmlType::kBF16
                       ? 1
                       : static_cast<int>(quant::Traits(t).block_elems);
    for (const Shape s :
         {Shape{1, 37, 256 * 3}, Shape{7, 19, 512}, Shape{33, 5, 256}, Shape{20, 70, 1024}}) {
      const int k = bk == 1 ? s.k - 3 : s.k / bk * bk;  // F16/BF16: a k with a tail
      std::vector<float> wf(static_cast<std::size_t>(s.n) * k);
      std::vector<float> x(static_cast<std::size_t>(s.m) * k);
      for (float& v : wf) v = g(rng);
      for (float& v : x) v = g(rng);
      const std::size_t row_bytes = quant::RowBytes(t, k);
      std::vector<std::uint8_t> w(row_bytes * s.n);
      for (int r = 0; r < s.n; ++r) {
        quant::QuantizeRow(t, wf.data() + static_cast<std::size_t>(r) * k, k,
                           w.data() + r * row_bytes);
      }
      const quant::WeightMatrix mat = quant::MakeWeightMatrix(t, s.n, k, w.data());
      std::vector<float> want(static_cast<std::size_t>(s.m) * s.n);
      std::vector<float> got(want.size());
      MatMulRowsScalar(x.data(), s.m, mat, want.data(), false, 0, s.n);
      std::vector<std::uint8_t> act(ActivationRowBytes(t, k) * s.m);
      PrepareActivations(t, x.data(), s.m, k, reinterpret_cast<std::byte*>(act.data()));
      RunRows(ActiveKernel(t), act.data(), ActivationRowBytes(t, k), s.m, mat, got.data(), s.n,
              false, 0, s.n);
      // Bound: fp32 rounding of sums of k terms of size |x| max|w| (and of the offset terms,
      // of the same size); a wrong index or scale is off by O(result).
      for (int r = 0; r < s.m; ++r) {
        double xabs = 0.0;
        for (int i = 0; i < k; ++i) xabs += std::fabs(x[static_cast<std::size_t>(r) * k + i]);
        const double tol = (t == GgmlType::kBF16 ? 4e-3 : 1e-5) * xabs *
                           *std::max_element(wf.begin(), wf.end(), [](float a, float b) {
                             return std::fabs(a) < std::fabs(b);
                           });
        for (int j = 0; j < s.n; ++j) {
          const std::size_t at = static_cast<std::size_t>(r) * s.n + j;
          ASSERT_NEAR(got[at], want[at], std::fabs(tol))
              << quant::Name(t) << " m=" << s.m << " n=" << s.n << " k=" << k;
        }
      }
    }
  }
}

// A quantised matrix of n x k from normal weights, and the weights it dequantises to.
struct PrefillMatrix {
  std::vector<std::uint8_t> bytes;
  std::vector<float> dequantised;  // [n, k]
  quant::WeightMatrix mat;
};
PrefillMatrix MakePrefillMatrix(GgmlType t, int n, int k, std::mt19937& rng) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  PrefillMatrix p;
  const std::size_t row_bytes = quant::RowBytes(t, k);
  p.bytes.resize(row_bytes * n);
  p.dequantised.resize(static_cast<std::size_t>(n) * k);
  std::vector<float> row(static_cast<std::size_t>(k));
  for (int r = 0; r < n; ++r) {
    for (float& v : row) v = g(rng);
    quant::QuantizeRow(t, row.data(), k, p.bytes.data() + r * row_bytes);
    quant::DequantizeRow(t, p.bytes.data() + r * row_bytes, k,
                         p.dequantised.data() + static_cast<std::size_t>(r) * k);
  }
  p.mat = quant::MakeWeightMatrix(t, n, k, p.bytes.data());
  return p;
}

// DequantGemmKernel (the prefill of types whose kernel is the scalar one) equals the fp32 product
// of the dequantised weights with unquantised x: no activation quantisation on this path.
TEST(DequantGemmKernel, EqualsDequantisedFp32Gemm) {
  std::mt19937 rng(11);
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (const GgmlType t : {GgmlType::kQ8_0, GgmlType::kQ5_1, GgmlType::kQ4_K, GgmlType::kQ6_K}) {
    const int m = kDequantGemmMinRows + 7;
    const int n = 70;  // not a multiple of the row tile
    const int k = 512;
    const PrefillMatrix w = MakePrefillMatrix(t, n, k, rng);
    std::vector<float> x(static_cast<std::size_t>(m) * k);
    for (float& v : x) v = g(rng);
    std::vector<float> y(static_cast<std::size_t>(m) * n, 1.0f);
    RowsKernelArgs args;
    args.act = reinterpret_cast<const std::byte*>(x.data());
    args.act_row_bytes = static_cast<std::size_t>(k) * sizeof(float);
    args.m = m;
    args.w = &w.mat;
    args.y = y.data();
    args.ldy = n;
    args.accumulate = true;
    args.pool = &testing::TestPool();
    DequantGemmKernel().rows(args, 0, n);
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < n; ++j) {
        double want = 1.0;
        double mag = 0.0;
        for (int e = 0; e < k; ++e) {
          const double p = static_cast<double>(x[static_cast<std::size_t>(i) * k + e]) *
                           w.dequantised[static_cast<std::size_t>(j) * k + e];
          want += p;
          mag += std::fabs(p);
        }
        ASSERT_NEAR(y[static_cast<std::size_t>(i) * n + j], want, 1e-5 * mag + 1e-6)
            << quant::Name(t) << " row " << i << " col " << j;
      }
    }
  }
}

// Where the AVX-512 VNNI kernels run, a prefill's many rows stay on them (they beat dequantised
// tiles + sgemm at every row count), in either row layout: MatMul equals the integer reference
// (activations quantised, fp32 rounding apart), which the dequantised path, with x unquantised,
// misses by the activation quantisation (~4e-4 of sum |x w| here, forty times the bound).
TEST(PrefillPath, VnniKernelsKeepEveryRowCount) {
  if (!CpuHasAvx512Vnni()) GTEST_SKIP() << "CPU lacks AVX-512 F/BW/VL/VNNI";
  std::mt19937 rng(12);
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (const GgmlType t : {GgmlType::kQ8_0, GgmlType::kQ5_1, GgmlType::kQ4_K, GgmlType::kQ6_K}) {
    EXPECT_EQ(ActiveKernel(t).dequant_gemm_min_rows, std::numeric_limits<int>::max());
    EXPECT_EQ(ScalarKernel(t).dequant_gemm_min_rows, kDequantGemmMinRows);
    for (const bool interleaved : {false, true}) {
      const int m = 259;  // a prefill chunk and a tail
      const int n = 80;   // whole 16-row groups
      const int k = 512;
      PrefillMatrix w = MakePrefillMatrix(t, n, k, rng);
      if (interleaved) {
        ASSERT_EQ(PreferredRowLayout(w.mat), quant::RowLayout::kInterleaved16);
        w.mat = quant::InterleaveRows(w.mat, reinterpret_cast<std::byte*>(w.bytes.data()));
      }
      std::vector<float> x(static_cast<std::size_t>(m) * k);
      for (float& v : x) v = g(rng);
      std::vector<float> got(static_cast<std::size_t>(m) * n);
      std::vector<float> want(got.size());
      MatMul(testing::TestPool(), x.data(), m, w.mat, got.data(), false);
      MatMulRowsScalar(x.data(), m, w.mat, want.data(), false, 0, n);
      for (int i = 0; i < m; ++i) {
        for (int j = 0; j < n; ++j) {
          double mag = 0.0;
          for (int e = 0; e < k; ++e) {
            mag += std::fabs(static_cast<double>(x[static_cast<std::size_t>(i) * k + e]) *
                             w.dequantised[static_cast<std::size_t>(j) * k + e]);
          }
          const std::size_t at = static_cast<std::size_t>(i) * n + j;
          ASSERT_NEAR(got[at], want[at], 1e-5 * mag)
              << quant::Name(t) << (interleaved ? " interleaved" : "") << " row " << i << " col "
              << j;
        }
      }
    }
  }
}

// ---- BF16 / F16 weights with fp32 activations.

std::vector<float> RandomFloats(std::size_t count, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(count);
  for (float& f : v) f = u(rng);
  return v;
}

enum class HalfKind { kBf16, kF16 };

struct HalfErrors {
  double max_vs_rounded_x;  // against the same products with x rounded as the kernel rounds it
  double max_vs_fp32_x;     // against fp32 x: the cost of the kernel's activation rounding
};

HalfErrors CheckHalf(HalfKind kind, Shape s, std::uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<float> wf = RandomFloats(static_cast<std::size_t>(s.n) * s.k, rng);
  const std::vector<float> x = RandomFloats(static_cast<std::size_t>(s.m) * s.k, rng);
  std::vector<std::uint16_t> w(wf.size());
  for (std::size_t i = 0; i < w.size(); ++i) {
    w[i] = kind == HalfKind::kBf16 ? FloatToBf16(wf[i]) : FloatToF16(wf[i]);
  }
  const int ldy = s.n + 1;
  std::vector<float> y(static_cast<std::size_t>(s.m) * ldy, -7.0f);
  const GgmlType type = kind == HalfKind::kBf16 ? GgmlType::kBF16 : GgmlType::kF16;
  const quant::WeightMatrix mat = quant::MakeWeightMatrix(type, s.n, s.k, w.data());
  RunRows(Kernel(type, true), reinterpret_cast<const std::uint8_t*>(x.data()), s.k * sizeof(float),
          s.m, mat, y.data(), ldy, false, 0, s.n);
  HalfErrors err{0.0, 0.0};
  for (int r = 0; r < s.m; ++r) {
    EXPECT_EQ(y[static_cast<std::size_t>(r) * ldy + s.n], -7.0f);
    for (int j = 0; j < s.n; ++j) {
      double want_rounded = 0.0;
      double want_fp32 = 0.0;
      double scale = 0.0;
      for (int i = 0; i < s.k; ++i) {
        const std::uint16_t h = w[static_cast<std::size_t>(j) * s.k + i];
        const double wi = kind == HalfKind::kBf16 ? Bf16ToFloat(h) : F16ToFloat(h);
        const float xf = x[static_cast<std::size_t>(r) * s.k + i];
        const double xr = kind == HalfKind::kBf16 ? Bf16ToFloat(FloatToBf16(xf)) : xf;
        want_rounded += wi * xr;
        want_fp32 += wi * xf;
        scale += std::fabs(wi * xf);
      }
      const double got = y[static_cast<std::size_t>(r) * ldy + j];
      err.max_vs_rounded_x = std::max(err.max_vs_rounded_x, std::fabs(got - want_rounded) / scale);
      err.max_vs_fp32_x = std::max(err.max_vs_fp32_x, std::fabs(got - want_fp32) / scale);
    }
  }
  return err;
}

const Shape kHalfShapes[] = {{1, 1, 1},   {1, 5, 31},   {3, 4, 32},  {4, 9, 33},
                             {5, 3, 100}, {33, 6, 576}, {2, 2, 1536}};

TEST(Bf16Kernel, MatchesReferenceAndReportsActivationRoundingError) {
  if (!CpuHasAvx512Bf16()) GTEST_SKIP() << "CPU lacks AVX512_BF16";
  HalfErrors worst{0.0, 0.0};
  std::uint32_t seed = 10;
  for (const Shape& s : kHalfShapes) {
    const HalfErrors e = CheckHalf(HalfKind::kBf16, s, seed++);
    worst.max_vs_rounded_x = std::max(worst.max_vs_rounded_x, e.max_vs_rounded_x);
    worst.max_vs_fp32_x = std::max(worst.max_vs_fp32_x, e.max_vs_fp32_x);
  }
  // Same bf16 products: only fp32 summation differs.
  EXPECT_LT(worst.max_vs_rounded_x, 1e-6);
  // Rounding x to bf16 costs at most 2^-9 of each |w x| product (relative to sum |w x|).
  EXPECT_LT(worst.max_vs_fp32_x, 1.0 / 512);
  RecordProperty("bf16_max_relative_error_vs_fp32_x", std::to_string(worst.max_vs_fp32_x));
  std::printf("bf16 kernel: max |y - y_fp32x| / sum|w x| = %.3g (same-rounding error %.3g)\n",
              worst.max_vs_fp32_x, worst.max_vs_rounded_x);
}

TEST(F16Kernel, MatchesReference) {
  if (!CpuHasAvx512Vnni()) GTEST_SKIP() << "CPU lacks AVX-512";
  std::uint32_t seed = 20;
  for (const Shape& s : kHalfShapes) {
    const HalfErrors e = CheckHalf(HalfKind::kF16, s, seed++);
    EXPECT_LT(e.max_vs_fp32_x, 1e-6) << "m=" << s.m << " n=" << s.n << " k=" << s.k;
  }
}

}  // namespace
}  // namespace metronome::kernels::avx512
