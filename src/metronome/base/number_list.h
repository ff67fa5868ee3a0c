// The one reader of integer lists such as "1,4,16" (flags like --batch-sessions or --prompt-ids):
// words separated by commas and/or whitespace, each a whole base-10 integer (a sign allowed). The
// caller owns the message: it knows the flag and what the numbers mean, so this returns the first
// word that is not an integer instead of throwing.
//
// Thread-safety: pure.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace metronome::base {

struct IntegerWord {
  std::string word;  // as written, for messages ("token id 7x is ...")
  std::int64_t value = 0;
};

// The words of `text` in order (empty for an empty or blank text), or the first word that is not
// an integer (also one out of int64 range).
[[nodiscard]] std::variant<std::vector<IntegerWord>, std::string> SplitIntegers(
    std::string_view text);

}  // namespace metronome::base
