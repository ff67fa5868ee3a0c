#include "metronome/model/tokenizer.h"

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "metronome/base/errors.h"
#include "metronome/base/mapped_file.h"
#include "metronome/model/internal/gguf_vocabulary.h"

namespace metronome::model {
namespace {

std::string ByteTokenText(int byte) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string s = "<0x";
  s.push_back(kHex[byte >> 4]);
  s.push_back(kHex[byte & 15]);
  s.push_back('>');
  return s;
}

bool IsByteTokenText(std::string_view s) {
  const auto hex = [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F') || (c >= 'a' && c <= 'f');
  };
  return s.size() == 6 && s.substr(0, 3) == "<0x" && hex(s[3]) && hex(s[4]) && s[5] == '>';
}

// Common English words and suffixes; the synthetic vocabulary is built from their prefixes so that
// ordinary text merges into multi-character pieces.
constexpr std::string_view kWords[] = {
    "the",   "and",   "to",    "was",   "he",    "she",   "it",     "of",     "in",    "is",
    "you",   "that",  "for",   "on",    "with",  "they",  "her",    "his",    "said",  "had",
    "but",   "not",   "at",    "be",    "this",  "have",  "from",   "one",    "all",   "we",
    "there", "what",  "so",    "up",    "out",   "if",    "about",  "who",    "get",   "which",
    "go",    "me",    "when",  "make",  "can",   "like",  "time",   "no",     "just",  "him",
    "know",  "take",  "into",  "year",  "your",  "good",  "some",   "could",  "them",  "see",
    "other", "than",  "then",  "now",   "look",  "only",  "come",   "its",    "over",  "think",
    "also",  "back",  "after", "use",   "two",   "how",   "our",    "work",   "first", "well",
    "way",   "even",  "new",   "want",  "any",   "these", "give",   "day",    "most",  "us",
    "are",   "were",  "been",  "has",   "did",   "do",    "very",   "little", "big",   "happy",
    "play",  "once",  "upon",  "named", "girl",  "boy",   "friend", "mom",    "dad",   "help",
    "home",  "tree",  "ball",  "dog",   "cat",   "sun",   "love",   "saw",    "went",  "found",
    "made",  "model", "token", "text",  "world", "hello", "ing",    "ed",     "er",    "est",
    "ly",    "tion",  "ment",  "ness",  "ous",   "able",  "ight",   "ould",   "ter",   "ver",
};

constexpr std::string_view kBigrams[] = {
    "th", "he", "in", "er", "an", "re", "on", "at", "en", "nd", "ti", "es", "or", "te", "of", "ed",
    "is", "it", "al", "ar", "st", "to", "nt", "ng", "se", "ha", "as", "ou", "io", "le", "ve", "co",
    "me", "de", "hi", "ri", "ro", "ic", "ne", "ea", "ra", "ce", "li", "ch", "ll", "be", "ma", "si",
    "om", "ur", "ay", "ap", "pp", "py", "ry", "ly", "wa", "do", "og", "im", "up", "un", "ow",
};

// Throws LoadError "<kind> vocabulary: ..." when the vocabulary is empty or too large, scores or
// token types do not match the token count, or bos/eos/unk/pad ids are outside [-1, size).
// A llama2.c tokenizer file read front to back: max_token_length, then per token its score (f32),
// length (i32) and bytes, all little-endian. Every read names what it was reading when the file
// ends early.
struct Llama2cReader {
  const std::string& path;
  std::span<const std::uint8_t> bytes;
  std::size_t pos = 0;

  std::size_t Remaining() const { return bytes.size() - pos; }

  std::int32_t ReadI32(const char* what) {
    if (Remaining() < 4) {
      throw LoadError(path + ": truncated at byte " + std::to_string(pos) + " (reading " + what +
                      ")");
    }
    std::int32_t v;
    std::memcpy(&v, bytes.data() + pos, 4);
    pos += 4;
    return v;
  }

  float ReadScore(int token) {
    const float score = std::bit_cast<float>(ReadI32("score"));
    if (!std::isfinite(score)) {
      throw LoadError(path + ": token " + std::to_string(token) + " has a non-finite score");
    }
    return score;
  }

  std::string ReadText(int token, std::int32_t max_token_length) {
    const std::int32_t len = ReadI32("length");
    if (len < 0 || len > max_token_length) {
      throw LoadError(path + ": token " + std::to_string(token) + " has length " +
                      std::to_string(len) + " (max_token_length " +
                      std::to_string(max_token_length) + ")");
    }
    if (Remaining() < static_cast<std::size_t>(len)) {
      throw LoadError(path + ": truncated in token " + std::to_string(token) + " (" +
                      std::to_string(len) + " bytes at offset " + std::to_string(pos) + ")");
    }
    std::string text(reinterpret_cast<const char*>(bytes.data() + pos),
                     static_cast<std::size_t>(len));
    pos += static_cast<std::size_t>(len);
    return text;
  }
};

// run.c hard-codes <unk> = 0, BOS = 1, EOS = 2 (spelled "\n<s>\n" and "\n</s>\n").
std::int32_t Llama2cTokenType(int token, std::string_view text) {
  if (token == 0) return internal::kTypeUnknown;
  if (token <= 2) return internal::kTypeControl;
  return IsByteTokenText(text) ? internal::kTypeByte : internal::kTypeNormal;
}

void AddFixedToken(Vocabulary& vocab, std::string text, std::int32_t type) {
  vocab.tokens.push_back(std::move(text));
  vocab.scores.push_back(0.0f);
  vocab.token_types.push_back(type);
}

// The normal pieces of a synthetic vocabulary, appended in order of preference: each text once,
// scores 0, -1, -2, ... (earlier pieces merge first).
class SyntheticPieces {
 public:
  SyntheticPieces(Vocabulary* vocab, std::size_t size)
      : vocab_(vocab), size_(size), seen_(vocab->tokens.begin(), vocab->tokens.end()) {
    seen_.reserve(size);
  }

  // Appends text unless it is already a token; false once the vocabulary is full.
  bool Add(const std::string& text) {
    if (vocab_->tokens.size() == size_) return false;
    if (seen_.insert(text).second) {
      vocab_->tokens.push_back(text);
      vocab_->scores.push_back(score_);
      vocab_->token_types.push_back(internal::kTypeNormal);
      score_ -= 1.0f;
    }
    return vocab_->tokens.size() < size_;
  }

 private:
  Vocabulary* vocab_;
  std::size_t size_;
  std::unordered_set<std::string> seen_;
  float score_ = 0.0f;
};

// Single characters first (every merge bottoms out in them), then word starts and the most
// frequent English letter pairs: even a small vocabulary gets about two characters a piece.
// False once the vocabulary is full.
bool AddCharactersAndPairs(SyntheticPieces& pieces) {
  const std::string marker(internal::kSpaceMarker);
  if (!pieces.Add(marker)) return false;
  for (char c = '!'; c <= '~'; ++c) {
    if (!pieces.Add(std::string(1, c))) return false;
  }
  for (char c = 'a'; c <= 'z'; ++c) {
    if (!pieces.Add(marker + c)) return false;
  }
  for (const std::string_view pair : kBigrams) {
    if (!pieces.Add(std::string(pair))) return false;
  }
  return true;
}

// Every prefix of every word: first after the space marker, then bare (for suffixes and words
// glued to punctuation), then capitalised after the marker. Small vocabularies only have room for
// the first of these. Including all prefixes makes each word reachable whatever order the merges
// happen in: a prefix followed by any piece from the rest of the word concatenates to a longer
// prefix, which is again a piece. False once the vocabulary is full.
bool AddWordPrefixes(SyntheticPieces& pieces) {
  const std::string marker(internal::kSpaceMarker);
  for (int variant = 0; variant < 3; ++variant) {
    for (const std::string_view word : kWords) {
      const std::string lead = variant == 1 ? "" : marker;
      std::string body(word);
      if (variant == 2) body[0] = static_cast<char>(body[0] - 'a' + 'A');
      for (std::size_t n = 1; n <= body.size(); ++n) {
        if (lead.empty() && n == 1) continue;  // single characters are already in
        if (!pieces.Add(lead + body.substr(0, n))) return false;
      }
    }
  }
  return true;
}

// Steps s through 'a'..'z' strings of its length like an odometer; false after "zz...z".
bool NextLowercase(std::string& s) {
  for (std::size_t k = s.size(); k-- > 0;) {
    if (s[k] != 'z') {
      ++s[k];
      return true;
    }
    s[k] = 'a';
  }
  return false;
}

// Until the vocabulary is full: every lowercase string of length 1, 2, ... after the marker and
// of length 2, 3, ... alone, in lexicographic order. Each has its one-shorter prefix earlier, and
// there are infinitely many, so this always fills the vocabulary.
void AddPadding(SyntheticPieces& pieces) {
  const std::string marker(internal::kSpaceMarker);
  for (std::size_t length = 1;; ++length) {
    std::string s(length, 'a');
    do {
      if (!pieces.Add(marker + s)) return;
    } while (NextLowercase(s));
    if (length >= 2) {
      do {
        if (!pieces.Add(s)) return;
      } while (NextLowercase(s));
    }
  }
}

void ValidateVocabulary(const Vocabulary& vocab, std::string_view kind) {
  const std::string prefix = std::string(kind) + " vocabulary: ";
  const std::size_t n = vocab.tokens.size();
  if (n == 0) throw LoadError(prefix + "no tokens");
  if (n > static_cast<std::size_t>(INT32_MAX)) {
    throw LoadError(prefix + "too many tokens (" + std::to_string(n) + ")");
  }
  if (!vocab.scores.empty() && vocab.scores.size() != n) {
    throw LoadError(prefix + std::to_string(vocab.scores.size()) + " scores for " +
                    std::to_string(n) + " tokens");
  }
  if (!vocab.token_types.empty() && vocab.token_types.size() != n) {
    throw LoadError(prefix + std::to_string(vocab.token_types.size()) + " token types for " +
                    std::to_string(n) + " tokens");
  }
  const auto check_id = [&](TokenId id, const char* what) {
    if (id < -1 || id >= static_cast<TokenId>(n)) {
      throw LoadError(prefix + what + " " + std::to_string(id) + " out of range for " +
                      std::to_string(n) + " tokens");
    }
  };
  check_id(vocab.bos_id, "bos_id");
  check_id(vocab.eos_id, "eos_id");
  check_id(vocab.unk_id, "unk_id");
  check_id(vocab.pad_id, "pad_id");
}

}  // namespace

Tokenizer::Tokenizer(Vocabulary vocab, const Family& family)
    : vocabulary_(std::move(vocab)),
      family_(family),
      adds_bos_(vocabulary_.bos_id >= 0 &&
                vocabulary_.add_bos.value_or(family.adds_bos_by_default)) {
  ValidateVocabulary(vocabulary_, family.kind);
}

std::string Tokenizer::Decode(std::span<const TokenId> ids) const {
  std::string out;
  TokenId prev = -1;
  for (const TokenId id : ids) {
    out += DecodeToken(prev, id);
    prev = id;
  }
  return out;
}

std::unique_ptr<Tokenizer> LoadLlama2cTokenizer(const std::string& path, int vocab_size) {
  static_assert(std::endian::native == std::endian::little,
                "llama2.c tokenizer files are little-endian");
  if (vocab_size <= 0) {
    throw LoadError(path + ": vocab_size " + std::to_string(vocab_size) + " is not positive");
  }
  const MappedFile file(path);
  Llama2cReader reader{path, file.bytes()};
  const std::int32_t max_token_length = reader.ReadI32("max_token_length");
  // Real files have single-digit maxima; a huge value means this is not a tokenizer file.
  constexpr std::int32_t kMaxTokenLength = 1 << 16;
  if (max_token_length <= 0 || max_token_length > kMaxTokenLength) {
    throw LoadError(path + ": absurd max_token_length " + std::to_string(max_token_length));
  }
  // Each token takes at least 8 bytes, so a vocab_size the file cannot hold is rejected before
  // anything is allocated for it.
  if (static_cast<std::size_t>(vocab_size) > reader.Remaining() / 8) {
    throw LoadError(path + ": truncated: " + std::to_string(reader.bytes.size()) +
                    " bytes cannot hold " + std::to_string(vocab_size) + " tokens");
  }

  Vocabulary vocab;
  vocab.tokens.reserve(static_cast<std::size_t>(vocab_size));
  vocab.scores.reserve(static_cast<std::size_t>(vocab_size));
  vocab.token_types.reserve(static_cast<std::size_t>(vocab_size));
  for (int i = 0; i < vocab_size; ++i) {
    const float score = reader.ReadScore(i);
    std::string text = reader.ReadText(i, max_token_length);
    const std::int32_t type = Llama2cTokenType(i, text);
    vocab.tokens.push_back(std::move(text));
    vocab.scores.push_back(score);
    vocab.token_types.push_back(type);
  }
  // Trailing bytes mean the file holds more tokens than the checkpoint's classifier: the pair
  // does not belong together.
  if (reader.Remaining() != 0) {
    throw LoadError(path + ": " + std::to_string(reader.Remaining()) + " trailing bytes after " +
                    std::to_string(vocab_size) + " tokens (vocab_size mismatch?)");
  }
  vocab.unk_id = 0;
  vocab.bos_id = vocab_size > 1 ? 1 : -1;
  vocab.eos_id = vocab_size > 2 ? 2 : -1;
  try {
    return MakeSentencePieceTokenizer(std::move(vocab));
  } catch (const LoadError& e) {
    throw LoadError(path + ": " + e.what());
  }
}

Vocabulary MakeSyntheticVocabulary(int vocab_size) {
  constexpr int kFixed = 3 + 256;
  constexpr int kMaxVocab = 1 << 21;  // far above real vocabularies; bounds the allocation
  if (vocab_size < kFixed || vocab_size > kMaxVocab) {
    throw ConfigError("synthetic vocab_size " + std::to_string(vocab_size) + " outside [" +
                      std::to_string(kFixed) + ", " + std::to_string(kMaxVocab) + "]");
  }
  const auto size = static_cast<std::size_t>(vocab_size);
  Vocabulary vocab;
  vocab.tokens.reserve(size);
  vocab.scores.reserve(size);
  vocab.token_types.reserve(size);
  vocab.unk_id = 0;
  vocab.bos_id = 1;
  vocab.eos_id = 2;
  AddFixedToken(vocab, "<unk>", internal::kTypeUnknown);
  AddFixedToken(vocab, "<s>", internal::kTypeControl);
  AddFixedToken(vocab, "</s>", internal::kTypeControl);
  for (int b = 0; b < 256; ++b) AddFixedToken(vocab, ByteTokenText(b), internal::kTypeByte);

  SyntheticPieces pieces(&vocab, size);
  if (AddCharactersAndPairs(pieces) && AddWordPrefixes(pieces)) AddPadding(pieces);
  return vocab;
}

}  // namespace metronome::model
