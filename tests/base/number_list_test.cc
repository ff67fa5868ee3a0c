#include "metronome/base/number_list.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace metronome::base {
namespace {

std::vector<std::int64_t> Values(std::string_view text) {
  const auto r = SplitIntegers(text);
  EXPECT_TRUE(std::holds_alternative<std::vector<IntegerWord>>(r)) << text;
  std::vector<std::int64_t> out;
  if (const auto* words = std::get_if<std::vector<IntegerWord>>(&r)) {
    for (const IntegerWord& w : *words) out.push_back(w.value);
  }
  return out;
}

std::string BadWord(std::string_view text) {
  const auto r = SplitIntegers(text);
  const auto* bad = std::get_if<std::string>(&r);
  return bad == nullptr ? std::string("<accepted>") : *bad;
}

TEST(NumberListTest, CommasAndWhitespaceSeparate) {
  EXPECT_EQ(Values("1,4,16"), (std::vector<std::int64_t>{1, 4, 16}));
  EXPECT_EQ(Values(" 1 4\t16\n"), (std::vector<std::int64_t>{1, 4, 16}));
  EXPECT_EQ(Values("1,,4, 16"), (std::vector<std::int64_t>{1, 4, 16}));
  EXPECT_EQ(Values("-3,+5,0"), (std::vector<std::int64_t>{-3, 5, 0}));
  EXPECT_EQ(Values("9223372036854775807"), (std::vector<std::int64_t>{INT64_MAX}));
  EXPECT_TRUE(Values("").empty());
  EXPECT_TRUE(Values(" , ").empty());
}

TEST(NumberListTest, WordsKeepTheirSpellingForMessages) {
  const auto r = SplitIntegers("007,+2");
  const auto& words = std::get<std::vector<IntegerWord>>(r);
  ASSERT_EQ(words.size(), 2u);
  EXPECT_EQ(words[0].word, "007");
  EXPECT_EQ(words[0].value, 7);
  EXPECT_EQ(words[1].word, "+2");
}

TEST(NumberListTest, TheFirstWordThatIsNotAWholeIntegerIsReturned) {
  EXPECT_EQ(BadWord("1,2x,y"), "2x");
  EXPECT_EQ(BadWord("1.5"), "1.5");
  EXPECT_EQ(BadWord("abc"), "abc");
  EXPECT_EQ(BadWord("1;2"), "1;2");
  EXPECT_EQ(BadWord("9223372036854775808"), "9223372036854775808");  // out of int64 range
}

}  // namespace
}  // namespace metronome::base
