// The 16-row interleaved layout: which matrices have it, the byte positions row_layout.h documents
// (the AVX-512 kernels read exactly those), and the way back to the file's rows.
#include "metronome/quant/row_layout.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "metronome/quant/blocks.h"
#include "metronome/quant/codec.h"

namespace metronome::quant {
namespace {

std::vector<std::byte> RandomRows(GgmlType type, int rows, int cols, std::mt19937& rng) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> row(static_cast<std::size_t>(cols));
  const std::size_t row_bytes = RowBytes(type, cols);
  std::vector<std::byte> bytes(row_bytes * static_cast<std::size_t>(rows));
  for (int r = 0; r < rows; ++r) {
    for (float& v : row) v = g(rng);
    QuantizeRow(type, row.data(), cols, bytes.data() + r * row_bytes);
  }
  return bytes;
}

constexpr GgmlType kInterleavedTypes[] = {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1,
                                          GgmlType::kQ5_0, GgmlType::kQ5_1};

TEST(RowLayoutTest, OnlyWholeGroupsOf32ElementTypesWithEvenBlockCounts) {
  for (const GgmlType t : kInterleavedTypes) {
    EXPECT_TRUE(CanInterleave(t, 16, 64)) << Name(t);
    EXPECT_TRUE(CanInterleave(t, 48, 576)) << Name(t);
    EXPECT_FALSE(CanInterleave(t, 24, 64)) << Name(t);  // not whole groups of 16 rows
    EXPECT_FALSE(CanInterleave(t, 16, 96)) << Name(t);  // 3 blocks: no whole pairs
    EXPECT_FALSE(CanInterleave(t, 0, 64)) << Name(t);
  }
  for (const GgmlType t : {GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K}) {
    EXPECT_TRUE(CanInterleave(t, 16, 256)) << Name(t);  // any number of super-blocks
    EXPECT_TRUE(CanInterleave(t, 32, 768)) << Name(t);
    EXPECT_FALSE(CanInterleave(t, 24, 256)) << Name(t);
    EXPECT_FALSE(CanInterleave(t, 16, 64)) << Name(t);
  }
  for (const GgmlType t : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16}) {
    EXPECT_FALSE(CanInterleave(t, 16, 512)) << Name(t);
  }
}

// Q6_K: super-block 1 of row 5 in group 1 of a 3-super-block matrix: scales, ql and qh lanes in
// its body, d in the group's tail, where the header says.
TEST(RowLayoutTest, Q6KBytesWhereTheLayoutSays) {
  std::mt19937 rng(4);
  constexpr int kRows = 32;
  constexpr int kCols = 768;
  const std::vector<std::byte> file = RandomRows(GgmlType::kQ6_K, kRows, kCols, rng);
  const WeightMatrix src = MakeWeightMatrix(GgmlType::kQ6_K, kRows, kCols, file.data());
  std::vector<std::byte> out(src.Bytes());
  const WeightMatrix x = InterleaveRows(src, out.data());
  const auto* block = reinterpret_cast<const BlockQ6_K*>(src.Row(16 + 5)) + 1;
  const std::byte* body = x.Row(16) + 3328;  // super-block 1
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(std::to_integer<std::int8_t>(body[16 * j + 5]), block->scales[j]) << "scale " << j;
  }
  // Triples of lines in reading order: triple 8 h + l = qh vector 8 h + l, ql vectors 16 h + l
  // and 16 h + 8 + l.
  for (int h = 0; h < 2; ++h) {
    for (int l = 0; l < 8; ++l) {
      const std::byte* triple = body + 256 + 3 * 64 * (8 * h + l) + 4 * 5;
      EXPECT_EQ(std::memcmp(triple, block->qh + 4 * (8 * h + l), 4), 0) << "qh " << 8 * h + l;
      EXPECT_EQ(std::memcmp(triple + 64, block->ql + 4 * (16 * h + l), 4), 0)
          << "ql " << 16 * h + l;
      EXPECT_EQ(std::memcmp(triple + 128, block->ql + 4 * (16 * h + 8 + l), 4), 0)
          << "ql " << 16 * h + 8 + l;
    }
  }
  EXPECT_EQ(std::memcmp(x.Row(16) + 3 * 3328 + 32 * 1 + 2 * 5, &block->d, 2), 0) << "d";
}

// Q4_K / Q5_K: super-block 1 of row 5 in group 1 of a 3-super-block matrix: d, dmin, scale, qh and
// qs lanes where the header says.
TEST(RowLayoutTest, Q4KQ5KBytesWhereTheLayoutSays) {
  std::mt19937 rng(6);
  constexpr int kRows = 32;
  constexpr int kCols = 768;
  for (const GgmlType t : {GgmlType::kQ4_K, GgmlType::kQ5_K}) {
    const bool q5 = t == GgmlType::kQ5_K;
    const std::size_t block_bytes = q5 ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
    const std::vector<std::byte> file = RandomRows(t, kRows, kCols, rng);
    const WeightMatrix src = MakeWeightMatrix(t, kRows, kCols, file.data());
    std::vector<std::byte> out(src.Bytes());
    const WeightMatrix x = InterleaveRows(src, out.data());
    const std::byte* block = src.Row(16 + 5) + block_bytes;  // super-block 1 of row 5
    const std::byte* body = x.Row(16) + 16 * block_bytes;    // super-block 1 of the group
    EXPECT_EQ(std::memcmp(body + 2 * 5, block, 2), 0) << Name(t) << " d";
    EXPECT_EQ(std::memcmp(body + 32 + 2 * 5, block + 2, 2), 0) << Name(t) << " dmin";
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(std::memcmp(body + 64 + 64 * k + 4 * 5, block + 4 + 4 * k, 4), 0)
          << Name(t) << " scales " << k;
    }
    const std::size_t qs_at = 64 + 3 * 64 + (q5 ? 8 * 64 : 0);
    if (q5) {
      for (int u = 0; u < 8; ++u) {
        EXPECT_EQ(std::memcmp(body + 256 + 64 * u + 4 * 5, block + 16 + 4 * u, 4), 0) << "qh " << u;
      }
    }
    const std::byte* qs = block + (q5 ? 48 : 16);
    for (int v = 0; v < 32; ++v) {
      EXPECT_EQ(std::memcmp(body + qs_at + 64 * v + 4 * 5, qs + 4 * v, 4), 0)
          << Name(t) << " qs " << v;
    }
  }
}

// The fifth bits' order the header documents: element 4j + t at bit 8t + 4 + j, element
// 16 + 4j + t at bit 8t + j; and back.
TEST(RowLayoutTest, FifthBitsWhereTheLayoutSays) {
  for (int i = 0; i < 32; ++i) {
    const int j = (i % 16) / 4;
    const int t = i % 4;
    const int at = 8 * t + (i < 16 ? 4 : 0) + j;
    EXPECT_EQ(InterleaveFifthBits(1u << i), 1u << at) << "element " << i;
    EXPECT_EQ(DeinterleaveFifthBits(1u << at), 1u << i) << "element " << i;
  }
  std::mt19937 rng(11);
  for (int n = 0; n < 1000; ++n) {
    const auto v = static_cast<std::uint32_t>(rng());
    EXPECT_EQ(DeinterleaveFifthBits(InterleaveFifthBits(v)), v);
  }
}

// Block 3 (the second of pair 1) of row 5 in group 1: its d, m, fifth bits and quant lanes where
// the header says (Q8_0 quants offset by 128).
TEST(RowLayoutTest, BytesWhereTheLayoutSays) {
  struct Want {
    GgmlType type;
    int scale_lines;
    int fifth_bit_vectors;
    int quant_vectors;
    std::size_t m, qh, qs;  // field offsets in the file's block (0: none)
  };
  std::mt19937 rng(3);
  constexpr int kRows = 32;
  constexpr int kCols = 128;  // 4 blocks: 2 pairs
  for (const Want w :
       {Want{GgmlType::kQ8_0, 1, 0, 8, 0, 0, 2}, Want{GgmlType::kQ4_0, 1, 0, 4, 0, 0, 2},
        Want{GgmlType::kQ4_1, 2, 0, 4, 2, 0, 4}, Want{GgmlType::kQ5_0, 1, 1, 4, 0, 2, 6},
        Want{GgmlType::kQ5_1, 2, 1, 4, 2, 4, 8}}) {
    const GgmlType t = w.type;
    const InterleavedGeometry geo = InterleavedGeometryOf(t);
    EXPECT_EQ(geo.scale_lines, w.scale_lines) << Name(t);
    EXPECT_EQ(geo.fifth_bit_vectors, w.fifth_bit_vectors) << Name(t);
    EXPECT_EQ(geo.quant_vectors, w.quant_vectors) << Name(t);
    const std::vector<std::byte> file = RandomRows(t, kRows, kCols, rng);
    const WeightMatrix src = MakeWeightMatrix(t, kRows, kCols, file.data());
    std::vector<std::byte> out(src.Bytes());
    const WeightMatrix x = InterleaveRows(src, out.data());
    EXPECT_EQ(x.layout, RowLayout::kInterleaved16);
    EXPECT_EQ(x.Bytes(), src.Bytes());
    const std::size_t block_bytes = Traits(t).block_bytes;
    const std::size_t vectors_bytes =
        64 * static_cast<std::size_t>(w.fifth_bit_vectors + w.quant_vectors);
    const std::byte* block = src.Row(16 + 5) + 3 * block_bytes;
    const std::byte* pair = x.Row(16) + 64 * w.scale_lines + 2 * vectors_bytes;  // pair 1
    EXPECT_EQ(std::memcmp(pair + 32 + 2 * 5, block, 2), 0) << Name(t) << " d";
    if (w.m != 0) {
      EXPECT_EQ(std::memcmp(pair + 64 + 32 + 2 * 5, block + w.m, 2), 0) << Name(t) << " m";
    }
    const std::byte* lanes = pair + 64 * w.scale_lines + vectors_bytes + 4 * 5;  // block 3, row 5
    if (w.qh != 0) {
      std::uint32_t qh = 0;
      std::uint32_t lane = 0;
      std::memcpy(&qh, block + w.qh, 4);
      std::memcpy(&lane, lanes, 4);
      EXPECT_EQ(lane, InterleaveFifthBits(qh)) << Name(t);
      lanes += 64;
    }
    for (int v = 0; v < w.quant_vectors; ++v) {
      for (int e = 0; e < 4; ++e) {
        const auto stored = std::to_integer<std::uint8_t>(lanes[64 * v + e]);
        const auto quant = std::to_integer<std::uint8_t>(block[w.qs + 4 * v + e]);
        EXPECT_EQ(stored, t == GgmlType::kQ8_0 ? static_cast<std::uint8_t>(quant ^ 0x80u) : quant)
            << Name(t) << " vector " << v << " byte " << e;
      }
    }
  }
}

TEST(RowLayoutTest, CanonicalRowsRoundTripInPlaceOrNot) {
  std::mt19937 rng(5);
  for (const GgmlType t : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0,
                           GgmlType::kQ5_1, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K}) {
    const bool super = Traits(t).block_elems == kQkK;
    for (const int cols :
         super ? std::vector<int>{256, 768, 1536} : std::vector<int>{64, 576, 1536}) {
      constexpr int kRows = 48;
      const std::vector<std::byte> file = RandomRows(t, kRows, cols, rng);
      const WeightMatrix src = MakeWeightMatrix(t, kRows, cols, file.data());
      std::vector<std::byte> copy(src.Bytes());
      const WeightMatrix x = InterleaveRows(src, copy.data());
      std::vector<std::byte> in_place = file;
      const WeightMatrix y =
          InterleaveRows(MakeWeightMatrix(t, kRows, cols, in_place.data()), in_place.data());
      EXPECT_EQ(copy, in_place) << Name(t) << " cols " << cols;
      EXPECT_NE(copy, file);
      std::vector<std::byte> scratch;
      std::vector<float> want(static_cast<std::size_t>(cols));
      std::vector<float> got(want.size());
      for (int r = 0; r < kRows; ++r) {
        const std::byte* canonical = CanonicalRow(x, r, scratch);
        ASSERT_EQ(std::memcmp(canonical, src.Row(r), src.row_bytes), 0)
            << Name(t) << " cols " << cols << " row " << r;
        DequantizeRow(t, src.Row(r), cols, want.data());
        DequantizeMatrixRow(y, r, got.data());
        ASSERT_EQ(want, got) << Name(t) << " row " << r;
      }
      EXPECT_EQ(CanonicalRow(src, 7, scratch), src.Row(7));  // row-major: the row itself
      // A 16-aligned slice is the slice of the rows.
      const WeightMatrix slice = x.RowSlice(16, 32);
      EXPECT_EQ(std::memcmp(CanonicalRow(slice, 3, scratch), src.Row(19), src.row_bytes), 0);
    }
  }
}

}  // namespace
}  // namespace metronome::quant
