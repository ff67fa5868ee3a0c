// Small vocabulary types shared by every module.
#pragma once

#include <cstdint>

namespace metronome {

// A token id of the model's vocabulary. Plain int32 because it crosses the tokenizer, the model
// and the wire protocol unchanged; range checks happen where ids enter (see Model::vocab_size).
using TokenId = std::int32_t;

// A token's index in its session's stream (0 = first token ever appended). 64-bit: a session that
// streams for hours at 25 tokens/s must never wrap.
using TokenPos = std::int64_t;

}  // namespace metronome
