// SentencePiece-style BPE as run by llama2.c's encode() and llama.cpp's "llama" tokenizer: the text
// (with a dummy-prefix space) is split into UTF-8 characters, characters missing from the
// vocabulary fall back to <0xHH> byte tokens, and then the adjacent pair whose concatenation is a
// vocabulary piece with the highest score is merged until no pair qualifies (ties: leftmost).
//
// Space representation: GGUF vocabularies spell space as U+2581 ("▁"), llama2.c tokenizer files
// as ' '. Every piece is normalised to ' ' at construction, so input text is used unchanged and
// both kinds of vocabulary produce the same ids for the same pieces.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <queue>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "metronome/base/errors.h"
#include "metronome/model/internal/bpe_merge.h"
#include "metronome/model/internal/gguf_vocabulary.h"
#include "metronome/model/tokenizer.h"

namespace metronome::model {
namespace {

// Returns the byte value of a "<0xHH>" piece (either hex case), or -1.
int ParseByteToken(std::string_view s) {
  if (s.size() != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>') return -1;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int hi = hex(s[3]);
  const int lo = hex(s[4]);
  if (hi < 0 || lo < 0) return -1;
  return hi * 16 + lo;
}

std::string NormaliseSpaces(std::string_view piece) {
  std::string out;
  out.reserve(piece.size());
  std::size_t i = 0;
  while (i < piece.size()) {
    if (piece.substr(i, internal::kSpaceMarker.size()) == internal::kSpaceMarker) {
      out.push_back(' ');
      i += internal::kSpaceMarker.size();
    } else {
      out.push_back(piece[i]);
      ++i;
    }
  }
  return out;
}

// Length of the UTF-8 "character" starting at text[i], split the way llama2.c splits: a byte plus
// the continuation bytes that follow it, at most 4 in all. Invalid sequences thus become short
// chunks that fall back to byte tokens instead of failing.
std::size_t CharLength(std::string_view text, std::size_t i) {
  std::size_t n = 1;
  while (n < 4 && i + n < text.size() && (static_cast<unsigned char>(text[i + n]) & 0xC0) == 0x80) {
    ++n;
  }
  return n;
}

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(Vocabulary vocab);

  std::vector<TokenId> Encode(std::string_view text, bool add_bos) const override;
  std::string DecodeToken(TokenId prev, TokenId id) const override;

 private:
  enum class Kind : std::uint8_t { kNormal, kByte, kSpecial };

  // Mergeable pieces only (normal and user-defined tokens): byte and control tokens must never
  // be produced by matching their spelling ("<0x41>", "<s>") in user text.
  std::unordered_map<std::string, TokenId, internal::StringHash, std::equal_to<>> piece_to_id_;
  std::vector<float> scores_;
  std::vector<std::string> decoded_;  // bytes each id stands for in running text
  std::vector<Kind> kinds_;
  TokenId byte_to_id_[256];  // -1 where the vocabulary has no <0xHH> token
};

SentencePieceTokenizer::SentencePieceTokenizer(Vocabulary vocab_in)
    : Tokenizer(std::move(vocab_in),
                {.kind = "sentencepiece", .ggml_model = "llama", .adds_bos_by_default = true}) {
  const Vocabulary& vocab = vocabulary();
  const std::size_t n = vocab.tokens.size();

  for (TokenId& b : byte_to_id_) b = -1;
  scores_.resize(n);
  decoded_.resize(n);
  kinds_.resize(n, Kind::kNormal);
  piece_to_id_.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto id = static_cast<TokenId>(i);
    // Without scores, earlier ids merge first (the order SentencePiece vocabularies are saved in).
    const float score = vocab.scores.empty() ? -static_cast<float>(i) : vocab.scores[i];
    if (!std::isfinite(score)) {
      // NaN would break the strict weak ordering the merge queue relies on.
      throw LoadError("sentencepiece vocabulary: token " + std::to_string(i) +
                      " has a non-finite score");
    }
    scores_[i] = score;
    const std::int32_t type = vocab.token_types.empty() ? 0 : vocab.token_types[i];
    const int byte = ParseByteToken(vocab.tokens[i]);
    if (type == internal::kTypeByte && byte < 0) {
      throw LoadError("sentencepiece vocabulary: byte token " + std::to_string(i) +
                      " is not <0xHH>");
    }
    // Without token types, the spelling alone identifies byte tokens.
    const bool is_byte = byte >= 0 && (type == internal::kTypeByte || vocab.token_types.empty());
    const bool is_special = type == internal::kTypeUnknown || type == internal::kTypeControl ||
                            type == internal::kTypeUnused || id == bos_id() || id == eos_id() ||
                            id == unk_id();
    if (is_byte) {
      kinds_[i] = Kind::kByte;
      decoded_[i] = std::string(1, static_cast<char>(byte));
      if (byte_to_id_[byte] < 0) byte_to_id_[byte] = id;
    } else if (is_special) {
      kinds_[i] = Kind::kSpecial;
    } else {
      decoded_[i] = NormaliseSpaces(vocab.tokens[i]);
      // First id wins for duplicate spellings (e.g. both "▁" and " " present).
      if (!decoded_[i].empty()) piece_to_id_.emplace(decoded_[i], id);
    }
  }
}

std::vector<TokenId> SentencePieceTokenizer::Encode(std::string_view text, bool add_bos) const {
  std::vector<TokenId> out;
  if (add_bos && bos_id() >= 0) out.push_back(bos_id());
  if (text.empty()) return out;

  // SentencePiece's add_dummy_prefix (llama2.c prepends " " to non-empty text), so that a word at
  // the start is encoded like the same word after a space.
  std::string buf;
  buf.reserve(text.size() + 1);
  buf.push_back(' ');
  buf.append(text);

  // Symbols form a doubly linked list in text order (internal/bpe_merge.h); a merge grows the left
  // symbol and kills the right one (len = 0).
  struct Symbol {
    std::size_t start;
    std::size_t len;
    std::size_t prev;
    std::size_t next;
    TokenId id;
    bool mergeable;  // false for byte-fallback symbols, as in llama2.c
  };
  std::vector<Symbol> symbols;
  symbols.reserve(buf.size());
  const std::string_view view(buf);
  for (std::size_t i = 0; i < view.size();) {
    const std::size_t len = CharLength(view, i);
    const auto it = piece_to_id_.find(view.substr(i, len));
    if (it != piece_to_id_.end()) {
      symbols.push_back({i, len, 0, 0, it->second, true});
    } else {
      for (std::size_t b = 0; b < len; ++b) {
        const TokenId id = byte_to_id_[static_cast<unsigned char>(view[i + b])];
        // A vocabulary without byte tokens maps unknown bytes to <unk>, or drops them if it has
        // no <unk> either: Encode must not fail on user text.
        if (id >= 0 || unk_id() >= 0) {
          symbols.push_back({i + b, 1, 0, 0, id >= 0 ? id : unk_id(), false});
        }
      }
    }
    i += len;
  }
  internal::LinkInOrder(symbols);

  struct Candidate {
    float score;
    std::size_t left;
    std::size_t right;
    std::size_t len;  // combined length when queued; a mismatch later means the entry is stale
    TokenId id;
  };
  // Highest score first; equal scores: leftmost first, which matches llama2.c's linear scan.
  const auto worse = [](const Candidate& a, const Candidate& b) {
    if (a.score != b.score) return a.score < b.score;
    return a.left > b.left;
  };
  const auto propose = [&](std::size_t left, std::size_t right) -> std::optional<Candidate> {
    const Symbol& l = symbols[left];
    const Symbol& r = symbols[right];
    if (!l.mergeable || !r.mergeable) return std::nullopt;
    const auto it = piece_to_id_.find(view.substr(l.start, l.len + r.len));
    if (it == piece_to_id_.end()) return std::nullopt;
    return Candidate{scores_[static_cast<std::size_t>(it->second)], left, right, l.len + r.len,
                     it->second};
  };
  const auto merge = [&](const Candidate& c) {
    Symbol& l = symbols[c.left];
    Symbol& r = symbols[c.right];
    if (l.len == 0 || r.len == 0 || l.len + r.len != c.len) return false;
    l.len += r.len;
    l.id = c.id;
    r.len = 0;
    return true;
  };
  internal::MergeBestFirst<Candidate>(symbols, propose, worse, merge);
  internal::ForEachLinked(symbols, [&](const Symbol& s) { out.push_back(s.id); });
  return out;
}

std::string SentencePieceTokenizer::DecodeToken(TokenId prev, TokenId id) const {
  if (id < 0 || id >= vocab_size()) return "";
  const auto i = static_cast<std::size_t>(id);
  // The first piece after BOS loses the dummy-prefix space that Encode added, as in llama2.c.
  // Unlike llama2.c (and like llama.cpp) this includes a <0x20> byte token, which is what carries
  // the prefix in a vocabulary without a space piece; otherwise such text would not round-trip.
  if (prev >= 0 && prev == bos_id() && kinds_[i] != Kind::kSpecial && !decoded_[i].empty() &&
      decoded_[i][0] == ' ') {
    return decoded_[i].substr(1);
  }
  return decoded_[i];
}

}  // namespace

std::unique_ptr<Tokenizer> MakeSentencePieceTokenizer(Vocabulary vocab) {
  return std::make_unique<SentencePieceTokenizer>(std::move(vocab));
}

}  // namespace metronome::model
