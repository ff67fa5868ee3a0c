// Text <-> token ids. Two families: SentencePiece-style BPE with byte fallback (GGUF
// tokenizer.ggml.model = "llama", llama2.c tokenizer files) and GPT-2 byte-level BPE (GGUF "gpt2",
// used by qwen2). Thread-safety: immutable after construction; Encode/Decode are const and may be
// called concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "metronome/base/types.h"

namespace metronome::model {

// How a GPT-2 family vocabulary splits text into words before BPE (GGUF tokenizer.ggml.pre), as
// llama.cpp does for that name:
//   kDefault: no or "default" pre: punctuation runs, the GPT-2 pattern, digit runs, then threes
//   kGpt2:    "gpt-2": 's|'t|... | ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)
//   kLlama3:  "llama-bpe" (also "llama3", "llama-v3"): the GPT-4 pattern with digits in ones to
//             threes, case-insensitive contractions; a word that is itself a token is not merged
//   kQwen2:   "qwen2": the same pattern with single digits
//   kSmollm:  "smollm": single digits first, then the GPT-2 pattern
enum class PreTokenizer : std::uint8_t { kDefault, kGpt2, kLlama3, kQwen2, kSmollm };

// The PreTokenizer for a tokenizer.ggml.pre value ("" is kDefault); nullopt for names the engine
// does not implement.
[[nodiscard]] std::optional<PreTokenizer> ParsePreTokenizer(std::string_view name);
// The accepted names, for messages: "default, gpt-2, llama-bpe, ...".
[[nodiscard]] std::string PreTokenizerNames();
// The spelling written back to a file (the first accepted name of each).
[[nodiscard]] std::string_view PreTokenizerName(PreTokenizer p);

// Raw vocabulary as stored in a GGUF file or a llama2.c tokenizer file.
struct Vocabulary {
  std::vector<std::string> tokens;        // token text; SentencePiece uses U+2581 for space
  std::vector<float> scores;              // merge priority (higher merges first); may be empty
  std::vector<std::int32_t> token_types;  // GGUF token_type (1 normal, 2 unknown, 3 control,
                                          // 6 byte); may be empty
  std::vector<std::string> merges;        // gpt2 only: "left right" merge rules in priority order
  TokenId bos_id = -1;
  TokenId eos_id = -1;
  TokenId unk_id = -1;
  TokenId pad_id = -1;
  std::optional<bool> add_bos;  // GGUF tokenizer.ggml.add_bos_token, when present
  std::optional<bool> add_eos;  // GGUF tokenizer.ggml.add_eos_token, when present
  // gpt2 only: the pre-tokenizer. Vocabularies built in memory default to Qwen2's; the GGUF
  // loader sets what the file names (kDefault when it names none, as llama.cpp does).
  PreTokenizer pre = PreTokenizer::kQwen2;
  std::string chat_template;  // GGUF tokenizer.chat_template; "" when the file has none
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Encodes `text` as plain text: control tokens (BOS, <|im_start|>, ...) are never produced
  // from their spelling, user-defined tokens are (as llama.cpp does without parse_special). With
  // `add_bos` the BOS id is prepended (when the vocabulary has one).
  [[nodiscard]] virtual std::vector<TokenId> Encode(std::string_view text, bool add_bos) const = 0;

  // Bytes of one token as it appears in running text. `prev` is the token before it (or -1): the
  // SentencePiece decoder drops the leading space of the first piece after BOS, as llama2.c does.
  // Special tokens (BOS/EOS/control) decode to "". Out-of-range ids decode to "".
  [[nodiscard]] virtual std::string DecodeToken(TokenId prev, TokenId id) const = 0;

  // Concatenation of DecodeToken over `ids` (prev of the first is -1).
  [[nodiscard]] std::string Decode(std::span<const TokenId> ids) const;

  [[nodiscard]] int vocab_size() const { return static_cast<int>(vocabulary_.tokens.size()); }
  [[nodiscard]] TokenId bos_id() const { return vocabulary_.bos_id; }  // -1 when there is none
  [[nodiscard]] TokenId eos_id() const { return vocabulary_.eos_id; }  // -1 when there is none
  [[nodiscard]] TokenId unk_id() const { return vocabulary_.unk_id; }  // -1 when there is none
  [[nodiscard]] TokenId pad_id() const { return vocabulary_.pad_id; }  // -1 when there is none

  // The token as spelled in the vocabulary ("\u2581Once", "<0x0A>", "<s>", GPT-2's "\u0120the");
  // "" for ids out of range.
  [[nodiscard]] std::string_view Piece(TokenId id) const {
    return id >= 0 && static_cast<std::size_t>(id) < vocabulary_.tokens.size()
               ? std::string_view(vocabulary_.tokens[static_cast<std::size_t>(id)])
               : std::string_view();
  }
  // "sentencepiece" or "gpt2" (the families above).
  [[nodiscard]] std::string_view kind() const { return family_.kind; }
  // The model's convention for prompts: GGUF's tokenizer.ggml.add_bos_token when the file says,
  // otherwise true for SentencePiece vocabularies (llama, llama2.c) and false for GPT-2 ones
  // (qwen2); false when there is no BOS token.
  [[nodiscard]] bool adds_bos() const { return adds_bos_; }
  // GGUF's tokenizer.ggml.add_eos_token (false when absent or there is no EOS token): llama.cpp
  // appends EOS to a tokenized text when it is set.
  [[nodiscard]] bool adds_eos() const {
    return vocabulary_.add_eos.value_or(false) && eos_id() >= 0;
  }

  // GGUF's tokenizer.ggml.model for this kind: "llama" (SentencePiece) or "gpt2".
  [[nodiscard]] std::string_view ggml_model() const { return family_.ggml_model; }
  // The raw vocabulary it was built from (to write it again, e.g. `metronome quantize`).
  [[nodiscard]] const Vocabulary& vocabulary() const { return vocabulary_; }

 protected:
  // What is constant for a family: each implementation passes one, a static constant.
  struct Family {
    std::string_view kind;        // kind(); also names the family in vocabulary errors
    std::string_view ggml_model;  // ggml_model()
    bool adds_bos_by_default;     // the convention for prompts when the file does not say
  };
  // `family` need not outlive the constructor: kind and ggml_model must be string literals.
  // Keeps `vocab` (the implementation reads it back through vocabulary()) after checking it:
  // throws LoadError "<kind> vocabulary: ..." when it is empty or too large, scores or token
  // types do not match the token count, or a special id is outside [-1, size).
  Tokenizer(Vocabulary vocab, const Family& family);

 private:
  Vocabulary vocabulary_;
  Family family_;
  bool adds_bos_;
};

// SentencePiece-style BPE (score-driven merges) with <0xHH> byte fallback. Throws LoadError for an
// unusable vocabulary (e.g. empty, scores of the wrong length).
std::unique_ptr<Tokenizer> MakeSentencePieceTokenizer(Vocabulary vocab);

// GPT-2 byte-level BPE (rank-driven merges over the byte-to-unicode alphabet, with the GPT-2 /
// Qwen2 pre-tokenizer split). Throws LoadError for an unusable vocabulary.
std::unique_ptr<Tokenizer> MakeGpt2Tokenizer(Vocabulary vocab);

// Reads a llama2.c tokenizer file (tok512.bin format: int32 max_token_length, then per token:
// float32 score, int32 length, bytes). `vocab_size` comes from the checkpoint header. The file
// stores spaces as ' ' and BOS/EOS as "\n<s>\n" / "\n</s>\n". Throws LoadError naming the file on
// truncation or absurd lengths.
std::unique_ptr<Tokenizer> LoadLlama2cTokenizer(const std::string& path, int vocab_size);

// A deterministic SentencePiece-style vocabulary of exactly `vocab_size` entries (>= 259):
// <unk>, <s>, </s>, the 256 byte tokens, then generated multi-character pieces. Used by synthetic
// models so that they can encode any text and export a loadable GGUF.
Vocabulary MakeSyntheticVocabulary(int vocab_size);

}  // namespace metronome::model
