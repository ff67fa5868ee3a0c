// The 16-row interleaved layout of a weight matrix (RowLayout::kInterleaved16) and the way back.
//
// Why: at one to a few activation rows a product is a stream over W, and how fast it runs is how
// few instructions the kernel spends per byte it streams. Row-major 32-element blocks are 18 to 34
// bytes: a kernel must gather quants and fp16 scales out of unaligned lines with permutes and
// reduce a vector per row; K-quant super-blocks pack their sub-block scales per row. Interleaved,
// one aligned 64-byte load holds 4 quants of each of 16 rows, a vpdpbusd against 4 activation
// bytes broadcast adds them for the 16 rows at once, and the 16 rows' scales of a block sit
// together: the output is 16 rows in the lanes of one vector. The same bytes stream faster at
// every row count (bench/quant_benchmark BM_RowLayout; docs/performance.md, "Weight kernels").
//
// Layout of the 32-element types Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 (rows a multiple of 16; an even
// number of blocks per row). Group g, rows [16 g, 16 g + 16), occupies the bytes [16 g row_bytes,
// 16 (g + 1) row_bytes) it would hold row-major. Inside it, block pairs p (blocks 2p and 2p + 1 of
// every row of the group) follow each other, each 2 x 16 blocks' bytes (InterleavedGeometry):
//   scale lines, 64 bytes each: the fp16 d of block 2p of row r at byte 2 r, the same for block
//     2p + 1 at 32 + 2 r; for Q4_1 / Q5_1 a second line holds the fp16 m the same way
//   then block 2p's vectors, then block 2p + 1's, 64 bytes each, 32-bit lane r holding row r's:
//     Q5_0 / Q5_1  first one fifth-bit vector: the block's qh permuted (InterleaveFifthBits) so
//                  that bit 4 + j of byte t is the fifth bit of element 4j + t and bit j that of
//                  element 16 + 4j + t (j, t < 4): the bits of quant vector j's low and high
//                  nibbles, one shift and mask away from where the quants need them
//     Q8_0  8 quant vectors; vector k: elements 4k .. 4k + 3 as unsigned bytes q + 128
//     Q4_0, Q4_1, Q5_0, Q5_1  4 quant vectors; vector v: the block's qs bytes 4v .. 4v + 3 as
//           stored (low nibbles: elements 4v .. 4v + 3, high nibbles: elements 16 + 4v .. + 3)
// Q6_K (rows a multiple of 16; any number of 256-element super-blocks S per row): the group holds
// S super-block bodies of kQ6KBodyBytes, then a tail of S x 32 bytes with the fp16 d of super-block
// s of row r at 32 s + 2 r. Body of super-block s, from s x kQ6KBodyBytes on:
//   bytes [0, 256)      the int8 sub-block scales: scale j of row r at byte 16 j + r (one 16-byte
//                       load, sign-extended, gives sub-block j's 16 row scales)
//   then 16 triples of lines in the order the kernel reads them (one sequential stream, which the
//   hardware prefetchers follow; ggml's order, ql then qh, is read as three interleaved
//   sequences): triple t = 8 h + l (h < 2, l < 8) holds qh vector t, ql vector 16 h + l and ql
//   vector 16 h + 8 + l (Q6KQhOffset, Q6KQlOffset), where ql vector v has lane r = ql[4v .. 4v + 3]
//   of row r and qh vector u lane r = qh[4u .. 4u + 3] of row r, both as stored
// Q4_K / Q5_K (rows a multiple of 16; any number of super-blocks): super-block s of the group
// occupies bytes [s x 16 x block_bytes, (s + 1) x 16 x block_bytes), in order:
//   one line: the fp16 d of row r at 2 r, the fp16 dmin at 32 + 2 r
//   3 scale vectors, lane r = scales[4k .. 4k + 3] of row r (the 12 packed 6-bit scales and mins)
//   Q5_K only: 8 qh vectors, lane r = qh[4u .. 4u + 3] of row r
//   32 qs vectors, lane r = qs[4v .. 4v + 3] of row r
// With 64-byte aligned data every load of a kernel is a whole cache line (Q6_K: in every group
// when S is even). The layout is this program's own (built at load, never written to a file).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "metronome/quant/blocks.h"
#include "metronome/quant/ggml_type.h"
#include "metronome/quant/weight_matrix.h"

namespace metronome::quant {

inline constexpr int kInterleaveRows = 16;
inline constexpr std::size_t kInterleavedLineBytes = 64;  // one scale line or vector
// The bias of stored Q8_0 quants (q + 128: unsigned bytes for vpdpbusd).
inline constexpr std::uint8_t kInterleavedQ8_0Bias = 0x80;

// The sizes above for one type, for the code that writes the layout and the kernels that read it.
struct InterleavedGeometry {
  int scale_lines = 0;        // per block pair: d, then m for the types with a min
  int fifth_bit_vectors = 0;  // per block: 1 for Q5_0 / Q5_1
  int quant_vectors = 0;      // per block: 8 for Q8_0, 4 for the nibble types

  [[nodiscard]] constexpr std::size_t BlockBytes() const noexcept {
    return static_cast<std::size_t>(fifth_bit_vectors + quant_vectors) * kInterleavedLineBytes;
  }
  [[nodiscard]] constexpr std::size_t PairBytes() const noexcept {
    return static_cast<std::size_t>(scale_lines) * kInterleavedLineBytes + 2 * BlockBytes();
  }
};

// The geometry of `type`'s interleaved form; all zero for a type without one.
[[nodiscard]] constexpr InterleavedGeometry InterleavedGeometryOf(GgmlType type) noexcept {
  switch (type) {
    case GgmlType::kQ8_0:
      return {1, 0, 8};
    case GgmlType::kQ4_0:
      return {1, 0, 4};
    case GgmlType::kQ4_1:
      return {2, 0, 4};
    case GgmlType::kQ5_0:
      return {1, 1, 4};
    case GgmlType::kQ5_1:
      return {2, 1, 4};
    default:
      return {};
  }
}

// Q6_K's sizes in the layout above.
inline constexpr std::size_t kQ6KScaleBytes = kInterleaveRows * (kQkK / 16);
inline constexpr std::size_t kQ6KBodyBytes =
    kQ6KScaleBytes + kInterleaveRows * (kQkK / 2) + kInterleaveRows * (kQkK / 4);
inline constexpr std::size_t kQ6KTailBytesPerSuper = kInterleaveRows * 2;
inline constexpr int kQ6KQlVectors = kQkK / 2 / 4;
inline constexpr int kQ6KQhVectors = kQkK / 4 / 4;
// Byte offset in a Q6_K body of qh vector u and of ql vector v (the triples above: line 3 t of
// the lines after the scales holds qh vector t, lines 3 t + 1 and 3 t + 2 ql vectors 16 h + l and
// 16 h + 8 + l, t = 8 h + l); row r's lane is r x 4 bytes further.
constexpr std::size_t Q6KLineOffset(int line) noexcept {
  return kQ6KScaleBytes + static_cast<std::size_t>(line) * kInterleavedLineBytes;
}
constexpr std::size_t Q6KQhOffset(int u) noexcept { return Q6KLineOffset(3 * u); }
constexpr std::size_t Q6KQlOffset(int v) noexcept {
  const int h = v / 16;
  const int l = v % 8;
  return Q6KLineOffset(3 * (8 * h + l) + 1 + (v % 16) / 8);
}

// Q4_K / Q5_K: vectors of one super-block's 16 rows in the layout above.
inline constexpr int kKScaleVectors = kKScaleBytes / 4;
inline constexpr int kQ5KHighBitVectors = kQkK / 8 / 4;
inline constexpr int kKQuantVectors = kQkK / 2 / 4;

// A block's 32 fifth bits (qh read as a little-endian uint32, bit i for element i) in the order of
// the fifth-bit vector's lane, and back.
[[nodiscard]] std::uint32_t InterleaveFifthBits(std::uint32_t qh) noexcept;
[[nodiscard]] std::uint32_t DeinterleaveFifthBits(std::uint32_t lane) noexcept;

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
