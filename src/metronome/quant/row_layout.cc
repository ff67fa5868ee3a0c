#include "metronome/quant/row_layout.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "metronome/base/check.h"
#include "metronome/quant/blocks.h"
#include "metronome/quant/codec.h"

namespace metronome::quant {
namespace {

constexpr int kHalfBytes = 2;  // one fp16 d or m
constexpr int kLaneBytes = 4;  // bytes of one row in a 64-byte vector
constexpr std::size_t kNoField = ~std::size_t{0};

// Every group keeps the bytes it would hold row-major.
static_assert(InterleavedGeometryOf(GgmlType::kQ8_0).PairBytes() == 2 * 16 * sizeof(BlockQ8_0));
static_assert(InterleavedGeometryOf(GgmlType::kQ4_0).PairBytes() == 2 * 16 * sizeof(BlockQ4_0));
static_assert(InterleavedGeometryOf(GgmlType::kQ4_1).PairBytes() == 2 * 16 * sizeof(BlockQ4_1));
static_assert(InterleavedGeometryOf(GgmlType::kQ5_0).PairBytes() == 2 * 16 * sizeof(BlockQ5_0));
static_assert(InterleavedGeometryOf(GgmlType::kQ5_1).PairBytes() == 2 * 16 * sizeof(BlockQ5_1));

// Where a block's fields are in the file's block (ggml's layouts, blocks.h).
struct Fields {
  std::size_t m = kNoField;   // fp16 min
  std::size_t qh = kNoField;  // 4 bytes of fifth bits
  std::size_t qs = 0;         // the quants
};
Fields FieldsOf(GgmlType type) noexcept {
  switch (type) {
    case GgmlType::kQ8_0:
      return {kNoField, kNoField, offsetof(BlockQ8_0, qs)};
    case GgmlType::kQ4_0:
      return {kNoField, kNoField, offsetof(BlockQ4_0, qs)};
    case GgmlType::kQ4_1:
      return {offsetof(BlockQ4_1, m), kNoField, offsetof(BlockQ4_1, qs)};
    case GgmlType::kQ5_0:
      return {kNoField, offsetof(BlockQ5_0, qh), offsetof(BlockQ5_0, qs)};
    default:  // Q5_1; CanInterleave admits no other type
      return {offsetof(BlockQ5_1, m), offsetof(BlockQ5_1, qh), offsetof(BlockQ5_1, qs)};
  }
}

// Where block b of row r (0..15) of a group lives.
struct Place {
  std::size_t d;      // byte offset of d in the group
  std::size_t m;      // of m (types with a min)
  std::size_t fifth;  // of lane r of the fifth-bit vector (Q5_0 / Q5_1)
  std::size_t quant;  // of lane r of the block's first quant vector
};
Place PlaceOf(const InterleavedGeometry& geo, int b, int r) noexcept {
  const std::size_t pair = static_cast<std::size_t>(b / 2) * geo.PairBytes();
  const auto half = static_cast<std::size_t>(b % 2);
  const std::size_t scale =
      pair + half * kInterleaveRows * kHalfBytes + static_cast<std::size_t>(r) * kHalfBytes;
  const std::size_t block = pair +
                            static_cast<std::size_t>(geo.scale_lines) * kInterleavedLineBytes +
                            half * geo.BlockBytes() + static_cast<std::size_t>(r) * kLaneBytes;
  return {scale, scale + kInterleavedLineBytes, block,
          block + static_cast<std::size_t>(geo.fifth_bit_vectors) * kInterleavedLineBytes};
}

// Copies a block's quant bytes between the file form (vector k's 4 bytes at 4 k) and the group
// (vector k's lane at 64 k), a 4-byte word at a time; Q8_0 quants gain or lose their offset of 128
// either way (CanonicalRow reads every row back through here).
void CopyQuantLanes(GgmlType type, int vectors, const std::byte* src, std::size_t src_stride,
                    std::byte* dst, std::size_t dst_stride) noexcept {
  const std::uint32_t flip = type == GgmlType::kQ8_0 ? kInterleavedQ8_0Bias * 0x01010101u : 0u;
  for (int k = 0; k < vectors; ++k) {
    std::uint32_t word = 0;
    const auto at = static_cast<std::size_t>(k);
    std::memcpy(&word, src + at * src_stride, kLaneBytes);
    word ^= flip;
    std::memcpy(dst + at * dst_stride, &word, kLaneBytes);
  }
}

std::uint32_t LoadWord(const std::byte* p) noexcept {
  std::uint32_t v = 0;
  std::memcpy(&v, p, sizeof v);
  return v;
}
void StoreWord(std::byte* p, std::uint32_t v) noexcept { std::memcpy(p, &v, sizeof v); }

// One mapping between a block of the file and its places in a group, in either direction: kToGroup
// writes the group from the block (InterleaveRows), kFromGroup the block from the group
// (CanonicalRow). Each field's place is written once, in the Move functions below.
enum class Way { kToGroup, kFromGroup };
template <Way W>
using FileBytes = std::conditional_t<W == Way::kToGroup, const std::byte*, std::byte*>;
template <Way W>
using GroupBytes = std::conditional_t<W == Way::kToGroup, std::byte*, const std::byte*>;

template <Way W>
void MoveBytes(FileBytes<W> file, GroupBytes<W> group, std::size_t n) noexcept {
  if constexpr (W == Way::kToGroup) {
    std::memcpy(group, file, n);
  } else {
    std::memcpy(file, group, n);
  }
}
// `vectors` 4-byte words: consecutive in the file, a lane of consecutive vectors in the group.
template <Way W>
void MoveLanes(GgmlType type, int vectors, FileBytes<W> file, GroupBytes<W> group) noexcept {
  if constexpr (W == Way::kToGroup) {
    CopyQuantLanes(type, vectors, file, kLaneBytes, group, kInterleavedLineBytes);
  } else {
    CopyQuantLanes(type, vectors, group, kInterleavedLineBytes, file, kLaneBytes);
  }
}
template <Way W>
void MoveFifthBits(FileBytes<W> file, GroupBytes<W> group) noexcept {
  if constexpr (W == Way::kToGroup) {
    StoreWord(group, InterleaveFifthBits(LoadWord(file)));
  } else {
    StoreWord(file, DeinterleaveFifthBits(LoadWord(group)));
  }
}

// The 32-element types: block b of row r (0..15).
template <Way W>
void MoveBlock(GgmlType type, FileBytes<W> block, GroupBytes<W> group, int b, int r) noexcept {
  const InterleavedGeometry geo = InterleavedGeometryOf(type);
  const Fields f = FieldsOf(type);
  const Place at = PlaceOf(geo, b, r);
  MoveBytes<W>(block, group + at.d, kHalfBytes);
  if (f.m != kNoField) MoveBytes<W>(block + f.m, group + at.m, kHalfBytes);
  if (f.qh != kNoField) MoveFifthBits<W>(block + f.qh, group + at.fifth);
  MoveLanes<W>(type, geo.quant_vectors, block + f.qs, group + at.quant);
}

// Q6_K: super-block s of row r (0..15) (row_layout.h).
static_assert(kQ6KBodyBytes + kQ6KTailBytesPerSuper == kInterleaveRows * sizeof(BlockQ6_K));
// The ql and qh vectors fill the body's lines after the scales exactly once.
consteval bool Q6KLinesArePermutation() {
  constexpr int kLines = kQ6KQlVectors + kQ6KQhVectors;
  static_assert(kQ6KScaleBytes + kLines * kInterleavedLineBytes == kQ6KBodyBytes);
  std::array<int, kLines> uses{};
  const auto use = [&uses](std::size_t offset) {
    ++uses.at((offset - kQ6KScaleBytes) / kInterleavedLineBytes);
  };
  for (int v = 0; v < kQ6KQlVectors; ++v) use(Q6KQlOffset(v));
  for (int u = 0; u < kQ6KQhVectors; ++u) use(Q6KQhOffset(u));
  for (const int n : uses) {
    if (n != 1) return false;
  }
  return true;
}
static_assert(Q6KLinesArePermutation());
template <Way W>
void MoveSuperQ6K(FileBytes<W> block, GroupBytes<W> group, int supers, int s, int r) noexcept {
  const GroupBytes<W> body = group + static_cast<std::size_t>(s) * kQ6KBodyBytes;
  const auto row = static_cast<std::size_t>(r);
  for (std::size_t j = 0; j < kQkK / 16; ++j) {
    MoveBytes<W>(block + offsetof(BlockQ6_K, scales) + j, body + kInterleaveRows * j + row, 1);
  }
  for (int v = 0; v < kQ6KQlVectors; ++v) {
    MoveLanes<W>(GgmlType::kQ6_K, 1,
                 block + offsetof(BlockQ6_K, ql) + static_cast<std::size_t>(v) * kLaneBytes,
                 body + Q6KQlOffset(v) + row * kLaneBytes);
  }
  for (int u = 0; u < kQ6KQhVectors; ++u) {
    MoveLanes<W>(GgmlType::kQ6_K, 1,
                 block + offsetof(BlockQ6_K, qh) + static_cast<std::size_t>(u) * kLaneBytes,
                 body + Q6KQhOffset(u) + row * kLaneBytes);
  }
  MoveBytes<W>(block + offsetof(BlockQ6_K, d),
               group + static_cast<std::size_t>(supers) * kQ6KBodyBytes +
                   static_cast<std::size_t>(s) * kQ6KTailBytesPerSuper + row * kHalfBytes,
               kHalfBytes);
}

// Q4_K / Q5_K: super-block s of row r (0..15).
template <class Block>
constexpr bool kHasHighBits = std::is_same_v<Block, BlockQ5_K>;
template <class Block>
constexpr std::size_t kKBodyBytes = kInterleaveRows * sizeof(Block);
static_assert(kKBodyBytes<BlockQ4_K> ==
              kInterleavedLineBytes * (1 + kKScaleVectors + kKQuantVectors));
static_assert(kKBodyBytes<BlockQ5_K> ==
              kInterleavedLineBytes * (1 + kKScaleVectors + kQ5KHighBitVectors + kKQuantVectors));

template <Way W, class Block>
void MoveSuperK(FileBytes<W> block, GroupBytes<W> group, int s, int r) noexcept {
  const GroupBytes<W> body = group + static_cast<std::size_t>(s) * kKBodyBytes<Block>;
  const auto row = static_cast<std::size_t>(r);
  const std::size_t lane = row * kLaneBytes;
  constexpr std::size_t kScalesAt = kInterleavedLineBytes;
  constexpr std::size_t kQhAt = kScalesAt + kKScaleVectors * kInterleavedLineBytes;
  constexpr std::size_t kQsAt =
      kQhAt + (kHasHighBits<Block> ? kQ5KHighBitVectors * kInterleavedLineBytes : 0);
  MoveBytes<W>(block + offsetof(Block, d), body + row * kHalfBytes, kHalfBytes);
  MoveBytes<W>(block + offsetof(Block, dmin),
               body + kInterleaveRows * kHalfBytes + row * kHalfBytes, kHalfBytes);
  MoveLanes<W>(GgmlType::kQ4_K, kKScaleVectors, block + offsetof(Block, scales),
               body + kScalesAt + lane);
  if constexpr (kHasHighBits<Block>) {
    MoveLanes<W>(GgmlType::kQ5_K, kQ5KHighBitVectors, block + offsetof(Block, qh),
                 body + kQhAt + lane);
  }
  MoveLanes<W>(GgmlType::kQ4_K, kKQuantVectors, block + offsetof(Block, qs), body + kQsAt + lane);
}

// Block b (of `blocks` per row) of row r, whatever the type.
template <Way W>
void Move(GgmlType type, int blocks, FileBytes<W> block, GroupBytes<W> group, int b,
          int r) noexcept {
  switch (type) {
    case GgmlType::kQ6_K:
      MoveSuperQ6K<W>(block, group, blocks, b, r);
      break;
    case GgmlType::kQ4_K:
      MoveSuperK<W, BlockQ4_K>(block, group, b, r);
      break;
    case GgmlType::kQ5_K:
      MoveSuperK<W, BlockQ5_K>(block, group, b, r);
      break;
    default:
      MoveBlock<W>(type, block, group, b, r);
      break;
  }
}

// Bit position in the fifth-bit lane of element i's bit (row_layout.h).
constexpr int FifthBitPosition(int i) noexcept {
  const int low = i < kQk32 / 2 ? 1 : 0;  // a low nibble: elements 0..15
  const int e = i % (kQk32 / 2);
  return 8 * (e % 4) + 4 * low + e / 4;
}

}  // namespace

std::uint32_t InterleaveFifthBits(std::uint32_t qh) noexcept {
  std::uint32_t lane = 0;
  for (int i = 0; i < kQk32; ++i) lane |= ((qh >> i) & 1u) << FifthBitPosition(i);
  return lane;
}

std::uint32_t DeinterleaveFifthBits(std::uint32_t lane) noexcept {
  std::uint32_t qh = 0;
  for (int i = 0; i < kQk32; ++i) qh |= ((lane >> FifthBitPosition(i)) & 1u) << i;
  return qh;
}

bool CanInterleave(GgmlType type, int rows, int cols) noexcept {
  if (rows <= 0 || rows % kInterleaveRows != 0 || cols <= 0) return false;
  if (type == GgmlType::kQ4_K || type == GgmlType::kQ5_K || type == GgmlType::kQ6_K) {
    return cols % kQkK == 0;
  }
  return InterleavedGeometryOf(type).quant_vectors > 0 && cols % (2 * kQk32) == 0;
}

WeightMatrix InterleaveRows(const WeightMatrix& src, std::byte* dst) {
  MTR_CHECK(src.layout == RowLayout::kRowMajor && CanInterleave(src.type, src.rows, src.cols) &&
                src.row_bytes == RowBytes(src.type, src.cols),
            "InterleaveRows: not a packed row-major matrix of whole 16-row groups of a type with "
            "an interleaved form");
  const std::size_t block_bytes = Traits(src.type).block_bytes;
  const int blocks = src.cols / static_cast<int>(Traits(src.type).block_elems);
  const std::size_t group_bytes = kInterleaveRows * src.row_bytes;
  std::vector<std::byte> file(group_bytes);  // the group's rows as read (dst may be src.data)
  for (int g = 0; g < src.rows / kInterleaveRows; ++g) {
    std::memcpy(file.data(), src.data + g * group_bytes, group_bytes);
    std::byte* group = dst + g * group_bytes;
    for (int r = 0; r < kInterleaveRows; ++r) {
      for (int b = 0; b < blocks; ++b) {
        Move<Way::kToGroup>(src.type, blocks, file.data() + r * src.row_bytes + b * block_bytes,
                            group, b, r);
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
  const int blocks = w.cols / static_cast<int>(Traits(w.type).block_elems);
  for (int b = 0; b < blocks; ++b) {
    Move<Way::kFromGroup>(w.type, blocks, scratch.data() + b * block_bytes, group, b,
                          r % kInterleaveRows);
  }
  return scratch.data();
}

void DequantizeMatrixRow(const WeightMatrix& w, int r, float* out) {
  thread_local std::vector<std::byte> scratch;
  DequantizeRow(w.type, CanonicalRow(w, r, scratch), w.cols, out);
}

}  // namespace metronome::quant
