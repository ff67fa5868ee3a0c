// y = x W^T for weight matrices in their stored ggml type (quant/weight_matrix.h), batched over
// 1..many activation rows: y[m, w.rows] (+)= x[m, w.cols] W^T, y row-major with w.rows columns.
//
// How a product runs (MatMul):
//   1. F32 weights go to oneDNN's sgemm (gemm.h), unchanged.
//   2. Otherwise x is prepared once for the weight type's dot product (ActivationFormatFor):
//      fp32 rows as they are (F16/BF16 weights), ActQ8Block32 per 32 elements (Q8_0, Q4_0, Q4_1,
//      Q5_0, Q5_1), BlockQ8_K per 256 (Q4_K, Q5_K, Q6_K).
//   3. The output rows are split into 32-row tiles (the one parallel split: ParallelOverRowTiles)
//      and each tile runs the type's RowsKernel for all m activation rows, so each weight block is
//      read from memory once per product and unpacked once per tile.
//   4. A compute-bound product (prefill) on a CPU whose kernel for the type is the scalar or the
//      AVX2 one (m >= its dequant_gemm_min_rows): each tile of W is dequantised to fp32 and
//      multiplied by oneDNN's sgemm instead (x unquantised), over the same split
//      (DequantGemmKernel). The AVX-512 kernels never hand over: the VNNI ones beat it at every
//      row count, and F16/BF16 widen as cheaply as they would dequantise.
//
// Kernels per type: a function table (QuantKernelTable) chosen once, at first use, from the CPU's
// features. The portable scalar kernels (this file's .cc) are the reference: integer dot products
// per block (int32 sums), scaled and accumulated in fp32, in the same order for every CPU. They
// are exact products of the dequantised weights with the quantised activations, up to fp32
// accumulation order; the error against an fp32 GEMM of the dequantised weights therefore comes
// from the activation quantisation alone (half a step of max|x|/127 per element).
// THE SEAM for faster kernels: SelectKernels() in quant_matmul.cc starts from the scalar table and
// overrides the entries a CPU can run faster (e.g. AVX-512 VNNI / BF16 versions in
// quant_matmul_avx512*.cc); a kernel must match the scalar one within the fp32 accumulation
// tolerance (the tests compare them).
//
// Thread-safety: the kernels are pure functions of their arguments; MatMul runs on the thread pool
// its caller passes and a per-thread scratch buffer for the prepared activations.
#pragma once

#include <cstddef>
#include <limits>
#include <span>
#include <string_view>

#include "metronome/quant/ggml_type.h"
#include "metronome/quant/weight_matrix.h"

namespace metronome::base {
class ThreadPool;
}

namespace metronome::kernels {

// The scalar integer kernels' crossover: from this many activation rows on, MatMul multiplies
// weights whose kernel is the scalar one by dequantising tiles of W to fp32 and running oneDNN's
// sgemm instead. The product is compute-bound there, the scalar kernels run far below the fp32
// peak, and dequantising is paid once for all the rows. The AVX-512 VNNI kernels keep every row
// count: a vpdpbusd does four fp32 FMAs' multiply-adds, and they beat dequantised tiles + sgemm
// from 1 row on (bench/quant_benchmark BM_Prefill; docs/performance.md, "Prefill: integer
// kernels vs dequantised sgemm").
inline constexpr int kDequantGemmMinRows = 16;
// Up to this many activation rows (decode: one to a few sessions) MatMul runs a type's `gemv`
// kernel where it has one: W is streamed once, so those kernels are built for read bandwidth.
inline constexpr int kGemvMaxRows = 4;

// The row layout MatMul reads `w` fastest in on this CPU: kInterleaved16 (quant/row_layout.h) for
// a packed matrix of whole 16-row groups of Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K or Q6_K where
// AVX-512 VNNI runs, otherwise kRowMajor. The interleaved kernels read whole lines with no
// permutes, gathers or horizontal sums, so every type streams faster interleaved at every row
// count (bench/quant_benchmark BM_RowLayout, BM_GemvResident; docs/performance.md, "Weight
// kernels"); Q6_K qualifies because its body is stored in the order its kernel reads it, one
// ascending stream. Loaders' callers relayout with it (model::ModelWeights::PlaceForKernels).
// MatMul computes the same products in either layout.
[[nodiscard]] quant::RowLayout PreferredRowLayout(const quant::WeightMatrix& w) noexcept;

// y[m, w.rows] = x[m, w.cols] W^T (accumulate = false) or += (accumulate = true), any computable
// type, its output rows split over `pool`'s threads. Preconditions: w.cols a multiple of the
// type's block size; x, y do not alias.
void MatMul(base::ThreadPool& pool, const float* x, int m, const quant::WeightMatrix& w, float* y,
            bool accumulate) noexcept;
// A group of matrices with the same cols read as one: y[m, sum of rows] whose columns are the
// parts' rows in order (a fused Q/K/V or gate/up whose parts are separate tensors, possibly of
// different types). x is prepared once per activation format; all parts' row tiles share one
// parallel loop.
void MatMul(base::ThreadPool& pool, const float* x, int m,
            std::span<const quant::WeightMatrix> parts, float* y, bool accumulate) noexcept;

// One product of a set MatMul runs as one: y[m, sum of the parts' rows] (+)= x[m, cols] W^T, the
// parts as in the grouped MatMul above.
struct MatMulProduct {
  const float* x = nullptr;
  int m = 0;
  std::span<const quant::WeightMatrix> parts;
  float* y = nullptr;
  bool accumulate = false;
};
// Several products, each with activations of its own (a MoE layer's experts, each over the rows
// routed to it), as one: every product's activations prepared, then all their row tiles in one
// parallel loop. The pool is woken once and its threads stay balanced over the whole set however
// small each product is, where a product at a time pays the wake-up, the ramp of a new stream and
// the wait for the slowest thread per product. The products' outputs must not overlap.
void MatMul(base::ThreadPool& pool, std::span<const MatMulProduct> products) noexcept;

// MatMul as a CPU without SIMD kernels (neither AVX2 nor AVX-512) runs it: the scalar kernel
// table, whose quantised types hand prefill rows to DequantGemmKernel. For tests on any CPU.
void MatMulOnScalarKernels(base::ThreadPool& pool,
                           std::span<const MatMulProduct> products) noexcept;

// The name of what MatMul runs for m activation rows of `w` ("onednn" for packed F32, else a
// QuantKernel's name), for benchmarks' labels.
[[nodiscard]] std::string_view MatMulKernelName(const quant::WeightMatrix& w, int m) noexcept;

// The single-threaded reference: output columns [row_begin, row_end) of y (all m rows), through
// the scalar kernels regardless of the CPU (F32 too: a plain fp32 dot). For tests and as the
// definition the fast kernels are checked against.
void MatMulRowsScalar(const float* x, int m, const quant::WeightMatrix& w, float* y,
                      bool accumulate, int row_begin, int row_end) noexcept;

// ---- the per-type kernel interface (for kernel implementations and their tests) ----

enum class ActivationFormat {
  kF32,        // the fp32 rows of x themselves (F32, F16, BF16 weights)
  kQ8Block32,  // quant::ActQ8Block32 per 32 elements (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1)
  kQ8K,        // quant::BlockQ8_K per 256 elements (Q4_K, Q5_K, Q6_K)
};
[[nodiscard]] ActivationFormat ActivationFormatFor(quant::GgmlType type) noexcept;
// Bytes of one prepared activation row of `cols` elements for weights of `type`.
[[nodiscard]] std::size_t ActivationRowBytes(quant::GgmlType type, int cols) noexcept;
// Prepares m rows of x (row stride cols) into `out` (m * ActivationRowBytes bytes, any alignment
// of 4). For kF32 it copies.
void PrepareActivations(quant::GgmlType type, const float* x, int m, int cols,
                        std::byte* out) noexcept;

struct RowsKernelArgs {
  const std::byte* act = nullptr;  // m prepared rows, act_row_bytes apart
  std::size_t act_row_bytes = 0;
  int m = 0;
  const quant::WeightMatrix* w = nullptr;
  float* y = nullptr;  // [m, ldy]; the kernel writes columns [row_begin, row_end)
  int ldy = 0;
  bool accumulate = false;
  // The pool the product runs on, for a kernel that runs a library product of its own (the
  // dequantised prefill's sgemm); nullptr: the calling thread alone.
  base::ThreadPool* pool = nullptr;
};
// Computes y[i, r] (+)= dot(act row i, W row r) for all i < m, r in [row_begin, row_end).
using RowsKernel = void (*)(const RowsKernelArgs& args, int row_begin, int row_end);

struct QuantKernel {
  RowsKernel rows = nullptr;
  std::string_view name;  // "scalar", "avx512-vnni", ... (printed by benchmarks)
  // Optional: used instead of `rows` when m <= kGemvMaxRows (the same products, same tolerance).
  RowsKernel gemv = nullptr;
  // From this many activation rows on, MatMul runs DequantGemmKernel instead: the scalar kernels
  // of the quantised-activation types, kDequantGemmMinRows. Default: never.
  int dequant_gemm_min_rows = std::numeric_limits<int>::max();
};

// The prefill kernel of the types whose integer kernel is slower than fp32 sgemm at many rows:
// W's rows dequantised to fp32 a 32-row tile at a time, and oneDNN's sgemm on the unquantised x
// (args.act: m fp32 rows of w->cols; args.pool: the pool the sgemm runs on, required). It equals
// an fp32 GEMM of the dequantised weights: no activation quantisation.
[[nodiscard]] const QuantKernel& DequantGemmKernel() noexcept;

// The scalar kernel of a computable type (always available).
[[nodiscard]] const QuantKernel& ScalarKernel(quant::GgmlType type) noexcept;
// The kernel MatMul uses for `type` on this CPU (selected once).
[[nodiscard]] const QuantKernel& ActiveKernel(quant::GgmlType type) noexcept;

}  // namespace metronome::kernels
