#include "metronome/model/tokenizer.h"

namespace metronome::model {

std::string Tokenizer::Decode(std::span<const TokenId> ids) const {
  std::string out;
  TokenId prev = -1;
  for (const TokenId id : ids) {
    out += DecodeToken(prev, id);
    prev = id;
  }
  return out;
}

}  // namespace metronome::model
