// Private to the model library (and its tests): the pre-tokenizer split of the GPT-2 family
// tokenizer on its own, so that tests can check each PreTokenizer's words directly.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "metronome/model/tokenizer.h"

namespace metronome::model::internal {

// The words `pre` splits `text` (plain text, no special tokens) into, in order; their
// concatenation is `text`.
[[nodiscard]] std::vector<std::string> PreTokenizeWords(std::string_view text, PreTokenizer pre);

}  // namespace metronome::model::internal
