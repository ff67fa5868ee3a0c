#include "metronome/base/enum_names.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace metronome {
namespace {

enum class Color : std::uint8_t { kRed, kGreen, kBlue };
constexpr std::array<EnumName<Color>, 3> kColorNames = {
    {{Color::kRed, "red"}, {Color::kGreen, "green"}, {Color::kBlue, "blue"}}};

TEST(EnumNamesTest, EveryValueRoundTripsThroughItsName) {
  for (const EnumName<Color>& entry : kColorNames) {
    EXPECT_STREQ(NameOf(kColorNames, entry.value, "?"), entry.name);
    EXPECT_EQ(ValueOf(kColorNames, entry.name), entry.value);
  }
}

TEST(EnumNamesTest, AValueOutsideTheTableGetsTheFallback) {
  EXPECT_STREQ(NameOf(kColorNames, static_cast<Color>(7), "unknown"), "unknown");
}

TEST(EnumNamesTest, ParsingIsExactAndCaseSensitive) {
  EXPECT_EQ(ValueOf(kColorNames, "Red"), std::nullopt);
  EXPECT_EQ(ValueOf(kColorNames, "red "), std::nullopt);
  EXPECT_EQ(ValueOf(kColorNames, ""), std::nullopt);
  EXPECT_EQ(ValueOf(kColorNames, "gree"), std::nullopt);
}

TEST(EnumNamesTest, JoinedNamesListsTheTableInOrder) {
  EXPECT_EQ(JoinedNames(kColorNames), "red, green, blue");
  EXPECT_EQ(JoinedNames(kColorNames, "|"), "red|green|blue");
  constexpr std::array<EnumName<Color>, 1> kOne = {{{Color::kRed, "red"}}};
  EXPECT_EQ(JoinedNames(kOne), "red");
}

TEST(EnumNamesTest, LookupsAreConstexpr) {
  static_assert(std::string_view(NameOf(kColorNames, Color::kBlue, "?")) == "blue");
  static_assert(ValueOf(kColorNames, "green") == Color::kGreen);
  static_assert(!ValueOf(kColorNames, "purple").has_value());
}

}  // namespace
}  // namespace metronome
