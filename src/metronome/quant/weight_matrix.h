// A weight matrix as it is stored: `rows` output rows of `cols` input elements each, in one ggml
// type, row-major, every row a whole number of the type's blocks. The view does not own its bytes:
// they live in the memory-mapped model file or in the model's arena, which outlive it.
//
// This is what the kernels multiply with (kernels::MatMul computes y = x W^T, y[m, rows],
// x[m, cols]). Row r starts at data + r * row_bytes; row_bytes == RowBytes(type, cols) for a
// packed matrix, larger for a strided view (rows of a wider matrix).
//
// `layout` says how the rows' blocks are ordered. kRowMajor is the file's order. kInterleaved16
// (quant/row_layout.h: the same bytes, groups of 16 rows interleaved block by block, for the
// AVX-512 kernels) keeps every 16-row group in the bytes it would occupy row-major, so Bytes() and
// a RowSlice at a multiple of 16 hold, but Row(r) is not row r: read rows through
// quant::CanonicalRow.
#pragma once

#include <cstddef>
#include <cstdint>

#include "metronome/quant/ggml_type.h"

namespace metronome::quant {

enum class RowLayout : std::uint8_t {
  kRowMajor,       // row r's blocks at data + r * row_bytes, as in the file
  kInterleaved16,  // groups of 16 rows interleaved (quant/row_layout.h); packed rows only
};

struct WeightMatrix {
  GgmlType type = GgmlType::kF32;
  int rows = 0;  // output features
  int cols = 0;  // input features; a multiple of Traits(type).block_elems
  const std::byte* data = nullptr;
  std::size_t row_bytes = 0;
  RowLayout layout = RowLayout::kRowMajor;

  [[nodiscard]] const std::byte* Row(int r) const noexcept {
    return data + static_cast<std::size_t>(r) * row_bytes;
  }
  // Bytes the matrix occupies (packed rows).
  [[nodiscard]] std::size_t Bytes() const noexcept {
    return static_cast<std::size_t>(rows) * row_bytes;
  }
  // Rows [row_begin, row_begin + count) as a matrix of their own (a fused group's part). An
  // interleaved matrix slices at multiples of 16 rows only.
  [[nodiscard]] WeightMatrix RowSlice(int row_begin, int count) const noexcept {
    return {type, count, cols, Row(row_begin), row_bytes, layout};
  }
};

// Bytes of one row of `cols` elements of `type`; 0 when `cols` is not a whole number of blocks.
[[nodiscard]] inline std::size_t RowBytes(GgmlType type, int cols) noexcept {
  const GgmlTypeTraits& t = Traits(type);
  if (cols < 0 || static_cast<std::uint32_t>(cols) % t.block_elems != 0) return 0;
  return static_cast<std::size_t>(cols) / t.block_elems * t.block_bytes;
}

// A packed matrix over `data` (RowBytes(type, cols) per row).
[[nodiscard]] inline WeightMatrix MakeWeightMatrix(GgmlType type, int rows, int cols,
                                                   const void* data) noexcept {
  return {type, rows, cols, static_cast<const std::byte*>(data), RowBytes(type, cols)};
}

}  // namespace metronome::quant
