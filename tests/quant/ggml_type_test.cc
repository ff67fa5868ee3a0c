#include "metronome/quant/ggml_type.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

namespace metronome::quant {
namespace {

TEST(GgmlTypeTest, EveryIdInTheTableRoundTrips) {
  int known = 0;
  for (std::uint32_t id = 0; id < 64; ++id) {
    const auto t = FindGgmlType(id);
    if (!t) continue;
    ++known;
    EXPECT_EQ(static_cast<std::uint32_t>(t->type), id);
    EXPECT_EQ(Traits(t->type).name, t->name);
    EXPECT_EQ(ParseGgmlTypeName(t->name), t->type) << t->name;
    EXPECT_GT(t->block_elems, 0u);
    EXPECT_GT(t->block_bytes, 0u);
  }
  EXPECT_EQ(known, 32);
}

TEST(GgmlTypeTest, RetiredAndUnknownIdsAreNotFound) {
  for (std::uint32_t id : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 40u, 1000u}) {
    EXPECT_FALSE(FindGgmlType(id)) << id;
  }
}

TEST(GgmlTypeTest, BlockSizesOfTheCommonTypes) {
  struct Row {
    GgmlType type;
    std::uint64_t elems;
    std::uint64_t bytes;
  };
  // One row of 4096 elements, as a 7B model's hidden size: the bytes llama.cpp stores.
  const Row rows[] = {{GgmlType::kF32, 4096, 16384},     {GgmlType::kF16, 4096, 8192},
                      {GgmlType::kBF16, 4096, 8192},     {GgmlType::kQ8_0, 4096, 128 * 34},
                      {GgmlType::kQ4_0, 4096, 128 * 18}, {GgmlType::kQ4_1, 4096, 128 * 20},
                      {GgmlType::kQ5_0, 4096, 128 * 22}, {GgmlType::kQ5_1, 4096, 128 * 24},
                      {GgmlType::kQ4_K, 4096, 16 * 144}, {GgmlType::kQ5_K, 4096, 16 * 176},
                      {GgmlType::kQ6_K, 4096, 16 * 210}};
  for (const Row& r : rows) {
    EXPECT_EQ(TensorBytes(r.type, r.elems), r.bytes) << Name(r.type);
    EXPECT_TRUE(Traits(r.type).computable) << Name(r.type);
  }
  EXPECT_FALSE(Traits(GgmlType::kIQ2_XXS).computable);
}

TEST(GgmlTypeTest, PartialBlocksAndOverflowAreRejected) {
  EXPECT_FALSE(TensorBytes(GgmlType::kQ8_0, 33));
  EXPECT_FALSE(TensorBytes(GgmlType::kQ4_K, 255));
  EXPECT_TRUE(TensorBytes(GgmlType::kQ4_K, 0));
  EXPECT_FALSE(TensorBytes(GgmlType::kF32, std::numeric_limits<std::uint64_t>::max()));
}

TEST(GgmlTypeTest, NamesParseCaseInsensitively) {
  EXPECT_EQ(ParseGgmlTypeName("q4_k"), GgmlType::kQ4_K);
  EXPECT_EQ(ParseGgmlTypeName("Bf16"), GgmlType::kBF16);
  EXPECT_FALSE(ParseGgmlTypeName("q4_k_m"));  // a file-type mix, not a tensor type
  EXPECT_FALSE(ParseGgmlTypeName(""));
}

}  // namespace
}  // namespace metronome::quant
