// A random quantised product y = x W^T for the kernel tests (quant_gemv_avx512_test.cc,
// quant_interleaved_avx512_test.cc): normal weights quantised per row, normal activations
// prepared for the type, the error bound a kernel may differ from the scalar reference by, and a
// call of a rows kernel over it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "metronome/kernels/quant_matmul.h"
#include "metronome/quant/codec.h"
#include "metronome/quant/ggml_type.h"
#include "metronome/quant/weight_matrix.h"

namespace metronome::kernels::test_support {

using quant::GgmlType;

struct Product {
  std::vector<float> wf;  // fp32 weights before quantisation [n, k]
  std::vector<float> x;   // [m, k]
  std::vector<std::uint8_t> w;
  quant::WeightMatrix mat;
  std::vector<std::byte> act;
};

inline Product MakeProduct(GgmlType t, int m, int n, int k, std::mt19937& rng) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  Product p;
  p.wf.resize(static_cast<std::size_t>(n) * k);
  p.x.resize(static_cast<std::size_t>(m) * k);
  for (float& v : p.wf) v = g(rng);
  for (float& v : p.x) v = g(rng);
  const std::size_t row_bytes = quant::RowBytes(t, k);
  p.w.resize(row_bytes * static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    quant::QuantizeRow(t, p.wf.data() + static_cast<std::size_t>(r) * k, k,
                       p.w.data() + static_cast<std::size_t>(r) * row_bytes);
  }
  p.mat = quant::MakeWeightMatrix(t, n, k, p.w.data());
  p.act.resize(ActivationRowBytes(t, k) * static_cast<std::size_t>(m));
  PrepareActivations(t, p.x.data(), m, k, p.act.data());
  return p;
}

// BF16 against kernels that round the activations to bf16 (the AVX-512 ones: both sides multiply
// bf16-rounded activations, but in a different order of pairs; the scalar reference uses the fp32
// x, so the bound is the activation rounding, 2^-8 relative per product, as
// quant_matmul_avx512_test.cc's BF16 bound); every other case differs by fp32 summation order.
inline double Tolerance(const Product& p, int row, int k, bool bf16_activations_rounded = true) {
  double xabs = 0.0;
  for (int i = 0; i < k; ++i) xabs += std::fabs(p.x[static_cast<std::size_t>(row) * k + i]);
  double wmax = 0.0;
  for (const float v : p.wf) wmax = std::max(wmax, static_cast<double>(std::fabs(v)));
  return (p.mat.type == GgmlType::kBF16 && bf16_activations_rounded ? 4e-3 : 1e-5) * xabs * wmax;
}

// kernel(args, row_begin, row_end) for p's activations against `w` (p.mat, or the same weights in
// another layout).
inline void RunKernel(RowsKernel kernel, const Product& p, const quant::WeightMatrix& w, int m,
                      float* y, int ldy, bool accumulate, int row_begin, int row_end) {
  RowsKernelArgs args;
  args.act = p.act.data();
  args.act_row_bytes = ActivationRowBytes(w.type, w.cols);
  args.m = m;
  args.w = &w;
  args.y = y;
  args.ldy = ldy;
  args.accumulate = accumulate;
  kernel(args, row_begin, row_end);
}

}  // namespace metronome::kernels::test_support
