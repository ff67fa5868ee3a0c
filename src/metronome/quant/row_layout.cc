#include "metronome/quant/row_layout.h"

#include <cstdint>
#include <cstring>

#include "metronome/base/check.h"
#include "metronome/quant/blocks.h"
#include "metronome/quant/codec.h"

namespace metronome::quant {
namespace {

constexpr int kScaleBytes = 2;  // one fp16 d
constexpr int kLaneBytes = 4;   // bytes of one row in a 64-byte vector
constexpr std::size_t kVectorBytes = 64;

// Bytes of one block's quants for the 16 rows.
std::size_t QuantBytes(GgmlType type) noexcept {
  return type == GgmlType::kQ8_0 ? kInterleavedQuantBytes<BlockQ8_0>
                                 : kInterleavedQuantBytes<BlockQ4_0>;
}

// Where block b of row r (0..15) of a group lives: its scale and its 4-byte lanes.
struct Place {
  std::size_t scale;  // byte offset of d in the group
  std::size_t lanes;  // byte offset of lane r of the block's first vector
};
Place PlaceOf(GgmlType type, int b, int r) noexcept {
  const std::size_t quant_bytes = QuantBytes(type);
  const std::size_t pair =
      static_cast<std::size_t>(b / 2) * (kInterleavedScaleLineBytes + 2 * quant_bytes);
  const auto half = static_cast<std::size_t>(b % 2);
  return {pair + half * kInterleaveRows * kScaleBytes + static_cast<std::size_t>(r) * kScaleBytes,
          pair + kInterleavedScaleLineBytes + half * quant_bytes +
              static_cast<std::size_t>(r) * kLaneBytes};
}

// Copies a block's quant bytes between the file form (vector k's 4 bytes at 4 k) and the group
// (vector k's lane at 64 k), a 4-byte word at a time; Q8_0 quants gain or lose their offset of 128
// either way (the prefill path reads every row back through here).
void CopyQuantLanes(GgmlType type, const std::byte* src, std::size_t src_stride, std::byte* dst,
                    std::size_t dst_stride) noexcept {
  const std::size_t vectors = QuantBytes(type) / kVectorBytes;
  const std::uint32_t flip = type == GgmlType::kQ8_0 ? kInterleavedQ8_0Bias * 0x01010101u : 0u;
  for (std::size_t k = 0; k < vectors; ++k) {
    std::uint32_t word = 0;
    std::memcpy(&word, src + k * src_stride, kLaneBytes);
    word ^= flip;
    std::memcpy(dst + k * dst_stride, &word, kLaneBytes);
  }
}

void BlockToGroup(GgmlType type, const std::byte* block, std::byte* group, Place at) noexcept {
  std::memcpy(group + at.scale, block, kScaleBytes);
  CopyQuantLanes(type, block + kScaleBytes, kLaneBytes, group + at.lanes, kVectorBytes);
}

void BlockFromGroup(GgmlType type, const std::byte* group, std::byte* block, Place at) noexcept {
  std::memcpy(block, group + at.scale, kScaleBytes);
  CopyQuantLanes(type, group + at.lanes, kVectorBytes, block + kScaleBytes, kLaneBytes);
}

}  // namespace

bool CanInterleave(GgmlType type, int rows, int cols) noexcept {
  if (type != GgmlType::kQ8_0 && type != GgmlType::kQ4_0) return false;
  return rows > 0 && rows % kInterleaveRows == 0 && cols > 0 && cols % (2 * kQk32) == 0;
}

WeightMatrix InterleaveRows(const WeightMatrix& src, std::byte* dst) {
  MTR_CHECK(src.layout == RowLayout::kRowMajor && CanInterleave(src.type, src.rows, src.cols) &&
                src.row_bytes == RowBytes(src.type, src.cols),
            "InterleaveRows: not a packed row-major Q8_0/Q4_0 matrix of whole 16-row groups");
  const std::size_t block_bytes = Traits(src.type).block_bytes;
  const int blocks = src.cols / kQk32;
  const std::size_t group_bytes = kInterleaveRows * src.row_bytes;
  std::vector<std::byte> file(group_bytes);  // the group's rows as read (dst may be src.data)
  for (int g = 0; g < src.rows / kInterleaveRows; ++g) {
    std::memcpy(file.data(), src.data + g * group_bytes, group_bytes);
    std::byte* group = dst + g * group_bytes;
    for (int r = 0; r < kInterleaveRows; ++r) {
      for (int b = 0; b < blocks; ++b) {
        BlockToGroup(src.type, file.data() + r * src.row_bytes + b * block_bytes, group,
                     PlaceOf(src.type, b, r));
      }
    }
  }
  WeightMatrix out = src;
  out.data = dst;
  out.layout = RowLayout::kInterleaved16;
  return out;
}

const std::byte* CanonicalRow(const WeightMatrix& w, int r, std::vector<std::byte>& scratch) {
  if (w.layout == RowLayout::kRowMajor) return w.Row(r);
  const std::size_t block_bytes = Traits(w.type).block_bytes;
  scratch.resize(w.row_bytes);
  const std::byte* group = w.Row(r - r % kInterleaveRows);
  for (int b = 0; b < w.cols / kQk32; ++b) {
    BlockFromGroup(w.type, group, scratch.data() + b * block_bytes,
                   PlaceOf(w.type, b, r % kInterleaveRows));
  }
  return scratch.data();
}

void DequantizeMatrixRow(const WeightMatrix& w, int r, float* out) {
  thread_local std::vector<std::byte> scratch;
  DequantizeRow(w.type, CanonicalRow(w, r, scratch), w.cols, out);
}

}  // namespace metronome::quant
