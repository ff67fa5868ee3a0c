// One way to name an enum's values: a constexpr table of {value, name} pairs, read both ways.
// The table is the single place a name is spelled, so ToString and Parse for an enum cannot drift.
//
//   constexpr std::array<EnumName<Color>, 2> kColorNames = {{{Color::kRed, "red"}, ...}};
//   const char* ToString(Color c) { return NameOf(kColorNames, c, "?"); }
//   std::optional<Color> ParseColor(std::string_view s) { return ValueOf(kColorNames, s); }
//   "... is not one of " + JoinedNames(kColorNames)
//
// Invariants the caller keeps (checked by the enum's own test): every value appears once, every
// name once. Names are C strings (string literals) so that they serve printf("%s") and
// std::string_view callers alike. Lookups are linear: tables are a handful of entries.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace metronome {

template <typename Enum>
struct EnumName {
  Enum value;
  const char* name;  // a string literal: NUL-terminated, static storage
};

// The name of `value` in `table`, or `fallback` for a value the table lacks (a value cast from
// an out-of-range integer).
template <typename Enum, std::size_t N>
[[nodiscard]] constexpr const char* NameOf(const std::array<EnumName<Enum>, N>& table, Enum value,
                                           const char* fallback) noexcept {
  for (const EnumName<Enum>& entry : table) {
    if (entry.value == value) return entry.name;
  }
  return fallback;
}

// The value named `name` (exact, case-sensitive), or nullopt.
template <typename Enum, std::size_t N>
[[nodiscard]] constexpr std::optional<Enum> ValueOf(const std::array<EnumName<Enum>, N>& table,
                                                    std::string_view name) noexcept {
  for (const EnumName<Enum>& entry : table) {
    if (std::string_view(entry.name) == name) return entry.value;
  }
  return std::nullopt;
}

// The table's names in its order, joined by `separator` ("red, green, blue"): the choices a
// message about a name outside the table lists, spelled by the table itself.
template <typename Enum, std::size_t N>
[[nodiscard]] std::string JoinedNames(const std::array<EnumName<Enum>, N>& table,
                                      std::string_view separator = ", ") {
  std::string joined;
  for (const EnumName<Enum>& entry : table) {
    if (!joined.empty()) joined += separator;
    joined += entry.name;
  }
  return joined;
}

}  // namespace metronome
