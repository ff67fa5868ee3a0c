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

TEST(RowLayoutTest, OnlyWholeGroupsOfQ8_0AndQ4_0WithEvenBlockCounts) {
  EXPECT_TRUE(CanInterleave(GgmlType::kQ8_0, 16, 64));
  EXPECT_TRUE(CanInterleave(GgmlType::kQ4_0, 48, 576));
  EXPECT_FALSE(CanInterleave(GgmlType::kQ8_0, 24, 64));  // not whole groups of 16 rows
  EXPECT_FALSE(CanInterleave(GgmlType::kQ8_0, 16, 96));  // 3 blocks: no whole pairs
  EXPECT_FALSE(CanInterleave(GgmlType::kQ8_0, 0, 64));
  for (const GgmlType t : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ4_1,
                           GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ4_K, GgmlType::kQ6_K}) {
    EXPECT_FALSE(CanInterleave(t, 16, 512)) << Name(t);
  }
}

// Block 3 (the second of pair 1) of row 5 in group 1: its scale and one quant lane where the
// header says, Q8_0 quants offset by 128.
TEST(RowLayoutTest, BytesWhereTheLayoutSays) {
  std::mt19937 rng(3);
  constexpr int kRows = 32;
  constexpr int kCols = 128;  // 4 blocks: 2 pairs
  for (const GgmlType t : {GgmlType::kQ8_0, GgmlType::kQ4_0}) {
    const std::vector<std::byte> file = RandomRows(t, kRows, kCols, rng);
    const WeightMatrix src = MakeWeightMatrix(t, kRows, kCols, file.data());
    std::vector<std::byte> out(src.Bytes());
    const WeightMatrix x = InterleaveRows(src, out.data());
    EXPECT_EQ(x.layout, RowLayout::kInterleaved16);
    EXPECT_EQ(x.Bytes(), src.Bytes());
    const std::size_t block_bytes = Traits(t).block_bytes;
    const std::size_t quant_bytes = 16 * (block_bytes - 2);
    const std::byte* row = src.Row(16 + 5);
    const std::byte* group = x.Row(16);
    const std::byte* pair = group + 64 + 2 * quant_bytes;  // pair 1
    EXPECT_EQ(std::memcmp(pair + 32 + 2 * 5, row + 3 * block_bytes, 2), 0) << Name(t);
    const std::byte* lanes = pair + 64 + quant_bytes + 4 * 5;  // block 3, row 5, vector 0
    for (int v = 0; v < 2; ++v) {
      for (int e = 0; e < 4; ++e) {
        const auto stored = std::to_integer<std::uint8_t>(lanes[64 * v + e]);
        const auto quant = std::to_integer<std::uint8_t>(row[3 * block_bytes + 2 + 4 * v + e]);
        EXPECT_EQ(stored, t == GgmlType::kQ8_0 ? static_cast<std::uint8_t>(quant ^ 0x80u) : quant)
            << Name(t) << " vector " << v << " byte " << e;
      }
    }
  }
}

TEST(RowLayoutTest, CanonicalRowsRoundTripInPlaceOrNot) {
  std::mt19937 rng(5);
  for (const GgmlType t : {GgmlType::kQ8_0, GgmlType::kQ4_0}) {
    for (const int cols : {64, 576, 1536}) {
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
