#include "metronome/base/number_list.h"

#include <algorithm>
#include <exception>
#include <sstream>

namespace metronome::base {

std::variant<std::vector<IntegerWord>, std::string> SplitIntegers(std::string_view text) {
  std::string s(text);
  std::replace(s.begin(), s.end(), ',', ' ');
  std::istringstream in(s);
  std::vector<IntegerWord> words;
  std::string word;
  while (in >> word) {
    std::size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(word, &used);
    } catch (const std::exception&) {  // not a number, or out of range
      used = 0;
    }
    if (used != word.size()) return word;
    words.push_back({word, static_cast<std::int64_t>(v)});
  }
  return words;
}

}  // namespace metronome::base
