#include "metronome/quant/ggml_type.h"

#include <array>
#include <cctype>
#include <limits>

#include "metronome/quant/blocks.h"

namespace metronome::quant {
namespace {

using T = GgmlType;

// Block sizes and bytes follow ggml's published block definitions (ggml-common.h); the computable
// ones are checked against our own structs' sizes below.
constexpr std::array<GgmlTypeTraits, 32> kTable = {{
    {T::kF32, "F32", 1, 4, true},
    {T::kF16, "F16", 1, 2, true},
    {T::kQ4_0, "Q4_0", 32, 18, true},
    {T::kQ4_1, "Q4_1", 32, 20, true},
    {T::kQ5_0, "Q5_0", 32, 22, true},
    {T::kQ5_1, "Q5_1", 32, 24, true},
    {T::kQ8_0, "Q8_0", 32, 34, true},
    {T::kQ8_1, "Q8_1", 32, 36, false},
    {T::kQ2_K, "Q2_K", 256, 84, false},
    {T::kQ3_K, "Q3_K", 256, 110, false},
    {T::kQ4_K, "Q4_K", 256, 144, true},
    {T::kQ5_K, "Q5_K", 256, 176, true},
    {T::kQ6_K, "Q6_K", 256, 210, true},
    {T::kQ8_K, "Q8_K", 256, 292, false},
    {T::kIQ2_XXS, "IQ2_XXS", 256, 66, false},
    {T::kIQ2_XS, "IQ2_XS", 256, 74, false},
    {T::kIQ3_XXS, "IQ3_XXS", 256, 98, false},
    {T::kIQ1_S, "IQ1_S", 256, 50, false},
    {T::kIQ4_NL, "IQ4_NL", 32, 18, false},
    {T::kIQ3_S, "IQ3_S", 256, 110, false},
    {T::kIQ2_S, "IQ2_S", 256, 82, false},
    {T::kIQ4_XS, "IQ4_XS", 256, 136, false},
    {T::kI8, "I8", 1, 1, false},
    {T::kI16, "I16", 1, 2, false},
    {T::kI32, "I32", 1, 4, false},
    {T::kI64, "I64", 1, 8, false},
    {T::kF64, "F64", 1, 8, false},
    {T::kIQ1_M, "IQ1_M", 256, 56, false},
    {T::kBF16, "BF16", 1, 2, true},
    {T::kTQ1_0, "TQ1_0", 256, 54, false},
    {T::kTQ2_0, "TQ2_0", 256, 66, false},
    {T::kMXFP4, "MXFP4", 32, 17, false},
}};

constexpr bool SizeIs(GgmlType type, std::size_t bytes, std::size_t elems) {
  for (const auto& t : kTable) {
    if (t.type == type) return t.block_bytes == bytes && t.block_elems == elems;
  }
  return false;
}
static_assert(SizeIs(T::kQ4_0, sizeof(BlockQ4_0), kQk32));
static_assert(SizeIs(T::kQ4_1, sizeof(BlockQ4_1), kQk32));
static_assert(SizeIs(T::kQ5_0, sizeof(BlockQ5_0), kQk32));
static_assert(SizeIs(T::kQ5_1, sizeof(BlockQ5_1), kQk32));
static_assert(SizeIs(T::kQ8_0, sizeof(BlockQ8_0), kQk32));
static_assert(SizeIs(T::kQ4_K, sizeof(BlockQ4_K), kQkK));
static_assert(SizeIs(T::kQ5_K, sizeof(BlockQ5_K), kQkK));
static_assert(SizeIs(T::kQ6_K, sizeof(BlockQ6_K), kQkK));
static_assert(SizeIs(T::kQ8_K, sizeof(BlockQ8_K), kQkK));

}  // namespace

std::optional<GgmlTypeTraits> FindGgmlType(std::uint32_t id) noexcept {
  for (const auto& t : kTable) {
    if (static_cast<std::uint32_t>(t.type) == id) return t;
  }
  return std::nullopt;
}

const GgmlTypeTraits& Traits(GgmlType type) noexcept {
  for (const auto& t : kTable) {
    if (t.type == type) return t;
  }
  return kTable[0];  // unreachable for a valid enumerator
}

std::optional<GgmlType> ParseGgmlTypeName(std::string_view name) noexcept {
  for (const auto& t : kTable) {
    if (t.name.size() != name.size()) continue;
    bool same = true;
    for (std::size_t i = 0; i < name.size() && same; ++i) {
      same = std::toupper(static_cast<unsigned char>(name[i])) ==
             static_cast<unsigned char>(t.name[i]);
    }
    if (same) return t.type;
  }
  return std::nullopt;
}

std::string ComputableTypeNames() {
  std::string s;
  for (const auto& t : kTable) {
    if (t.computable) s += (s.empty() ? "" : ", ") + std::string(t.name);
  }
  return s;
}

std::optional<std::uint64_t> TensorBytes(GgmlType type, std::uint64_t elems) noexcept {
  const GgmlTypeTraits& t = Traits(type);
  if (elems % t.block_elems != 0) return std::nullopt;
  const std::uint64_t blocks = elems / t.block_elems;
  if (blocks > std::numeric_limits<std::uint64_t>::max() / t.block_bytes) return std::nullopt;
  return blocks * t.block_bytes;
}

}  // namespace metronome::quant
