// Shared validation of a raw Vocabulary for the tokenizer implementations (internal to model/).
#pragma once

#include "metronome/model/tokenizer.h"

namespace metronome::model::internal {

// Throws LoadError "<kind> vocabulary: ..." when the vocabulary is empty or too large, scores or
// token types do not match the token count, or bos/eos/unk ids are outside [-1, size).
void ValidateVocabulary(const Vocabulary& vocab, const char* kind);

}  // namespace metronome::model::internal
