// The 16-row interleaved layout of a weight matrix (RowLayout::kInterleaved16) and the way back.
//
// Why: at one to a few activation rows a product is a stream over W, and how fast it runs is how
// few instructions the kernel spends per byte it streams. Row-major Q8_0 / Q4_0 blocks are 34 /
// 18 bytes: a kernel must gather quants and fp16 scales out of unaligned lines with permutes and
// reduce a vector per row. Interleaved, one aligned 64-byte load holds 4 quants of each of 16 rows,
// a vpdpbusd against 4 activation bytes broadcast adds them for the 16 rows at once, and one
// 32-byte load holds a block's 16 scales: the output is 16 rows in the lanes of one vector.
// Measured on one core of the development machine (docs/performance.md, "Interleaved rows"):
// the same bytes stream at 2-2.5x the GB/s at one activation row, 3x at four.
//
// Layout (types Q8_0 and Q4_0; rows a multiple of 16; an even number of blocks per row). Group g,
// rows [16 g, 16 g + 16), occupies the bytes [16 g row_bytes, 16 (g + 1) row_bytes) it would hold
// row-major. Inside it, block pairs p (blocks 2p and 2p + 1 of every row of the group) follow each
// other, each 2 x 16 blocks' bytes:
//   bytes [0, 32)    fp16 d of block 2p of row r at byte 2 r; [32, 64) the same for block 2p + 1
//   then block 2p's quants, then block 2p + 1's, as 64-byte vectors whose 32-bit lane r holds 4
//   bytes of row r:
//     Q8_0  8 vectors; vector k: elements 4k .. 4k + 3 as unsigned bytes q + 128
//     Q4_0  4 vectors; vector v: the block's qs bytes 4v .. 4v + 3 as stored (low nibbles:
//           elements 4v .. 4v + 3, high nibbles: elements 16 + 4v .. 16 + 4v + 3)
// With 64-byte aligned data every load of a kernel is a whole cache line. The layout is this
// program's own (built at load, never written to a file).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "metronome/quant/blocks.h"
#include "metronome/quant/ggml_type.h"
#include "metronome/quant/weight_matrix.h"

namespace metronome::quant {

inline constexpr int kInterleaveRows = 16;
// The sizes above, for the code that writes the layout and the kernels that read it: the line of a
// block pair's 2 x 16 fp16 scales, one block's quants for the 16 rows (Q8_0 512 bytes, Q4_0 256),
// and the bias of stored Q8_0 quants (q + 128: unsigned bytes for vpdpbusd).
inline constexpr std::size_t kInterleavedScaleLineBytes = 64;
template <class Block>
inline constexpr std::size_t kInterleavedQuantBytes = kInterleaveRows * sizeof(Block{}.qs);
inline constexpr std::uint8_t kInterleavedQ8_0Bias = 0x80;

// Whether a packed matrix of this type and shape has an interleaved form.
[[nodiscard]] bool CanInterleave(GgmlType type, int rows, int cols) noexcept;

// Writes the interleaved form of the packed row-major matrix `src` (CanInterleave must hold) into
// `dst` (src.Bytes() bytes; may be src.data itself: one group is buffered at a time) and returns
// the matrix over dst.
WeightMatrix InterleaveRows(const WeightMatrix& src, std::byte* dst);

// Row r of `w` in the file's block order: w.Row(r) itself for a row-major matrix, otherwise
// gathered into `scratch` (resized to the row's bytes).
[[nodiscard]] const std::byte* CanonicalRow(const WeightMatrix& w, int r,
                                            std::vector<std::byte>& scratch);

// Row r of `w` (either layout) as w.cols floats (an embedding lookup, export, tests).
void DequantizeMatrixRow(const WeightMatrix& w, int r, float* out);

}  // namespace metronome::quant
