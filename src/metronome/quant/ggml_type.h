// ggml's tensor types: the one table of every type id a GGUF file may name (ggml's enum values),
// with its name, block size and block bytes, and which of them this engine computes with.
//
// A tensor of `n` elements of type T occupies n / block_elems(T) * block_bytes(T) bytes and needs
// n % block_elems(T) == 0 (quantised types store whole blocks only; a row of a weight matrix is a
// whole number of blocks). Ids that ggml has retired (4, 5, 31-33, 36-38) are unknown here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace metronome::quant {

enum class GgmlType : std::uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
};

struct GgmlTypeTraits {
  GgmlType type;
  std::string_view name;      // ggml's spelling: "F32", "Q4_K", ...
  std::uint32_t block_elems;  // elements per block (1 for plain scalar types)
  std::uint32_t block_bytes;  // bytes per block
  // True for the types whose weights this engine loads and multiplies with (see quant/blocks.h).
  bool computable;
};

// nullopt for an id ggml does not (or no longer) define.
[[nodiscard]] std::optional<GgmlTypeTraits> FindGgmlType(std::uint32_t id) noexcept;
// The traits of a valid enumerator (every GgmlType value above is in the table).
[[nodiscard]] const GgmlTypeTraits& Traits(GgmlType type) noexcept;
[[nodiscard]] inline std::string_view Name(GgmlType type) noexcept { return Traits(type).name; }
// Case-insensitive lookup by name ("q8_0", "Q4_K", "bf16").
[[nodiscard]] std::optional<GgmlType> ParseGgmlTypeName(std::string_view name) noexcept;

// The names of the computable types, "F32, F16, Q4_0, ..." (for error messages and --help).
[[nodiscard]] std::string ComputableTypeNames();

// Bytes of `elems` elements of `type`, or nullopt when `elems` is not a whole number of blocks or
// the byte count would overflow 64 bits.
[[nodiscard]] std::optional<std::uint64_t> TensorBytes(GgmlType type, std::uint64_t elems) noexcept;

}  // namespace metronome::quant
