#include "metronome/model/tokenizer.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "metronome/base/errors.h"
#include "metronome/model/internal/pre_tokenizer.h"
#include "support/shared_data.h"

namespace metronome::model {
namespace {

// CPU seconds this thread has run: unlike wall time, not stretched by other processes on the cores.
double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

using ::metronome::testing::SharedModelPath;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteFile(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/tokenizer_test_" + name;
}

void AppendI32(std::string& out, std::int32_t v) {
  char b[4];
  std::memcpy(b, &v, 4);
  out.append(b, 4);
}

void AppendF32(std::string& out, float v) {
  char b[4];
  std::memcpy(b, &v, 4);
  out.append(b, 4);
}

// Parses the llama2.c tokenizer format independently of the code under test.
Vocabulary ReadTok512Vocabulary(const std::string& path) {
  const std::string bytes = ReadFile(path);
  std::size_t pos = 4;
  Vocabulary vocab;
  while (pos < bytes.size()) {
    float score;
    std::int32_t len;
    std::memcpy(&score, bytes.data() + pos, 4);
    std::memcpy(&len, bytes.data() + pos + 4, 4);
    pos += 8;
    vocab.tokens.emplace_back(bytes.substr(pos, static_cast<std::size_t>(len)));
    vocab.scores.push_back(score);
    pos += static_cast<std::size_t>(len);
  }
  return vocab;
}

class Tok512Test : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = SharedModelPath("tok512.bin");
    if (path_.empty()) GTEST_SKIP() << "shared/models/tok512.bin not available";
    tok_ = LoadLlama2cTokenizer(path_, 512);
  }

  std::vector<TokenId> Enc(std::string_view text) const { return tok_->Encode(text, true); }

  std::string path_;
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(Tok512Test, Basics) {
  EXPECT_EQ(tok_->vocab_size(), 512);
  EXPECT_EQ(tok_->bos_id(), 1);
  EXPECT_EQ(tok_->eos_id(), 2);
  EXPECT_EQ(tok_->DecodeToken(-1, 0), "");  // <unk>
  EXPECT_EQ(tok_->DecodeToken(-1, 1), "");  // "\n<s>\n"
  EXPECT_EQ(tok_->DecodeToken(-1, 2), "");  // "\n</s>\n"
  EXPECT_EQ(tok_->DecodeToken(-1, 3), std::string(1, '\0'));
  EXPECT_EQ(tok_->DecodeToken(-1, 3 + 0x41), "A");
  EXPECT_EQ(tok_->DecodeToken(-1, 258), "\xFF");
  EXPECT_EQ(tok_->DecodeToken(-1, 265), " the");
  EXPECT_EQ(tok_->DecodeToken(1, 265), "the");  // leading space dropped after BOS only
  EXPECT_EQ(tok_->DecodeToken(265, 265), " the");
  // Also for the <0x20> byte token (llama2.c keeps it; llama.cpp strips it): in a vocabulary
  // without a " " piece it carries the dummy prefix.
  EXPECT_EQ(tok_->DecodeToken(1, 3 + ' '), "");
  EXPECT_EQ(tok_->DecodeToken(1, 3 + 'a'), "a");
  EXPECT_EQ(tok_->DecodeToken(-1, -1), "");
  EXPECT_EQ(tok_->DecodeToken(-1, 512), "");
  EXPECT_EQ(tok_->DecodeToken(-1, 1 << 30), "");
}

// run.c prints each piece as generated and then one "\n" after the loop, so the reference text is
// the decoded ids plus exactly that final newline (the last generated id is ".", 426).
TEST_F(Tok512Test, DecodesGreedyReferenceOutput) {
  const std::string ids_path = SharedModelPath("stories260K.greedy256.tokens.txt");
  const std::string text_path = SharedModelPath("stories260K.greedy256.txt");
  if (ids_path.empty() || text_path.empty()) GTEST_SKIP() << "reference files not available";
  std::istringstream in(ReadFile(ids_path));
  std::vector<TokenId> ids;
  for (TokenId id; in >> id;) ids.push_back(id);
  ASSERT_EQ(ids.size(), 257u);
  ASSERT_EQ(ids[0], 1);
  EXPECT_EQ(ids.back(), 426);
  const std::string expected = ReadFile(text_path);
  ASSERT_EQ(expected.size(), 566u);
  ASSERT_EQ(expected.back(), '\n');
  EXPECT_EQ(tok_->Decode(ids), expected.substr(0, expected.size() - 1));
  // The same through the incremental path a server uses, token by token with its predecessor.
  std::string streamed;
  for (std::size_t i = 1; i < ids.size(); ++i) streamed += tok_->DecodeToken(ids[i - 1], ids[i]);
  EXPECT_EQ(streamed + "\n", expected);
  // And the text survives a round trip through the encoder.
  const std::string body = expected.substr(0, expected.size() - 1);
  EXPECT_EQ(tok_->Decode(Enc(body)), body);
}

// Expected ids derived by hand from tok512.bin's pieces and scores (score = -(id - 259)); each
// step merges the adjacent pair whose concatenation has the highest score.
TEST_F(Tok512Test, KnownEncodings) {
  // " the": pairs " t"(259, score 0), "th"(absent), "he"(260, -1) -> " t" first; then " th"(308,
  // -49) vs "he"(-1) -> "he"; then " t"+"he" = " the"(265).
  EXPECT_EQ(Enc("the"), (std::vector<TokenId>{1, 265}));
  EXPECT_EQ(tok_->Encode("the", false), (std::vector<TokenId>{265}));
  // " Lily": "il"(290, -31) beats " L"(307, -48); then " L"(-48) beats "ily"(310, -51); then
  // "ily"; then " Lily"(317).
  EXPECT_EQ(Enc("Lily"), (std::vector<TokenId>{1, 317}));
  // " Once" -> " O" -> " On" -> "ce" -> " Once"(403); " upon" -> "on" -> " u" -> " up" ->
  // " upon"(407); " a"(261); " time" -> " t" -> "im" -> "ime" -> " time"(378). These are also the
  // first ids of the greedy reference run.
  EXPECT_EQ(Enc("Once upon a time"), (std::vector<TokenId>{1, 403, 407, 261, 378}));
  // '\n' is not a piece: byte fallback to <0x0A> = 3 + 10, which never merges.
  EXPECT_EQ(Enc("a\nb"), (std::vector<TokenId>{1, 261, 13, 430}));
  // U+1F600 is not a piece: its four UTF-8 bytes F0 9F 98 80 become byte tokens (3 + byte) after
  // the lone dummy-prefix space (410).
  EXPECT_EQ(Enc("\xF0\x9F\x98\x80"), (std::vector<TokenId>{1, 410, 243, 162, 155, 131}));
  // "é" is a piece of its own (485); " é" is not.
  EXPECT_EQ(Enc("\xC3\xA9"), (std::vector<TokenId>{1, 410, 485}));
  // The spelling of a byte token in the text is ordinary text, not that byte.
  EXPECT_EQ(Enc("<0x41>"), (std::vector<TokenId>{1, 410, 504, 477, 444, 484, 475, 505}));
  // Runs of spaces: " " is a piece (410) but "  " is not, so each space stays alone; " the"
  // takes the last one.
  EXPECT_EQ(Enc("  the"), (std::vector<TokenId>{1, 410, 410, 265}));
  EXPECT_EQ(Enc(""), (std::vector<TokenId>{1}));
  EXPECT_EQ(tok_->Encode("", false), (std::vector<TokenId>{}));
}

TEST_F(Tok512Test, RoundTrips) {
  const std::vector<std::string> texts = {
      "",
      "a",
      "Once upon a time, there was a little girl named Lily.",
      "  leading and trailing spaces  ",
      "\ttabs\tand\nnew\r\nlines\n\n\n",
      " ",
      "caf\xC3\xA9 ni\xC3\xB1o \xE2\x80\x9Cquoted\xE2\x80\x9D \xE2\x82\xAC"
      "5",
      "emoji \xF0\x9F\x98\x80\xF0\x9F\x8E\x89 and CJK \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E",
      "rare: ~`^{}|@#",
      std::string("nul\0byte", 8),
      "invalid \xFF\xFE utf8 \xC3 \x80\x80 truncated \xE2\x82",
      "<0x41> <s> </s> <unk>",
  };
  for (const auto& text : texts) {
    EXPECT_EQ(tok_->Decode(Enc(text)), text) << "text: " << text;
    // Without BOS the dummy-prefix space stays visible.
    if (!text.empty()) {
      EXPECT_EQ(tok_->Decode(tok_->Encode(text, false)), " " + text);
    }
  }
}

// An O(n^2) transcription of llama2.c's encode() loop, independent of the queue-based code under
// test: it rescans all adjacent pairs after every merge.
std::vector<TokenId> NaiveEncode(const Vocabulary& vocab, std::string_view text) {
  std::unordered_map<std::string, TokenId> lookup;
  for (std::size_t i = 3; i < vocab.tokens.size(); ++i) {
    if (vocab.tokens[i].rfind("<0x", 0) != 0) lookup.emplace(vocab.tokens[i], static_cast<int>(i));
  }
  struct Sym {
    std::string text;
    TokenId id;
    bool mergeable;
  };
  std::vector<Sym> syms;
  const std::string s = text.empty() ? "" : " " + std::string(text);
  for (std::size_t i = 0; i < s.size();) {
    std::size_t len = 1;
    while (len < 4 && i + len < s.size() &&
           (static_cast<unsigned char>(s[i + len]) & 0xC0) == 0x80) {
      ++len;
    }
    const std::string ch = s.substr(i, len);
    if (auto it = lookup.find(ch); it != lookup.end()) {
      syms.push_back({ch, it->second, true});
    } else {
      for (unsigned char b : ch) syms.push_back({"", static_cast<TokenId>(b) + 3, false});
    }
    i += len;
  }
  for (;;) {
    float best = -1e30f;
    std::size_t best_i = syms.size();
    TokenId best_id = -1;
    for (std::size_t i = 0; i + 1 < syms.size(); ++i) {
      if (!syms[i].mergeable || !syms[i + 1].mergeable) continue;
      auto it = lookup.find(syms[i].text + syms[i + 1].text);
      if (it != lookup.end() && vocab.scores[static_cast<std::size_t>(it->second)] > best) {
        best = vocab.scores[static_cast<std::size_t>(it->second)];
        best_i = i;
        best_id = it->second;
      }
    }
    if (best_i == syms.size()) break;
    syms[best_i].text += syms[best_i + 1].text;
    syms[best_i].id = best_id;
    syms.erase(syms.begin() + static_cast<std::ptrdiff_t>(best_i) + 1);
  }
  std::vector<TokenId> ids;
  for (const auto& sym : syms) ids.push_back(sym.id);
  return ids;
}

TEST_F(Tok512Test, MatchesNaiveLlama2cLoopOnRandomText) {
  const Vocabulary vocab = ReadTok512Vocabulary(path_);
  const std::vector<std::string> parts = {
      "the",   "Lily", " ",   "  ",       "\n",           "\xC3\xA9", "\xF0\x9F\x98\x80",
      "ab",    "x",    "Tim", "my",       "happy",        "day",      ",",
      ".",     "'",    "\"",  "\xC3\xB1", "\xE2\x82\xAC", "\xFF",     "ing",
      "ittle", "Once", "up",  "on",       "ee",           "aaa",      "ll",
      "T"};
  std::mt19937 rng(12345);
  for (int trial = 0; trial < 300; ++trial) {
    std::string text;
    const int n = 1 + static_cast<int>(rng() % 30);
    for (int k = 0; k < n; ++k) text += parts[rng() % parts.size()];
    EXPECT_EQ(tok_->Encode(text, false), NaiveEncode(vocab, text)) << "text: " << text;
  }
}

TEST_F(Tok512Test, LongInputIsFast) {
  std::string text;
  while (text.size() < 100000) {
    text += "Once upon a time, there was a little girl named Lily. She loved to play outside. ";
  }
  std::string same(100000, 'e');  // one long run of a single repeated piece
  const double start = ThreadCpuSeconds();
  const auto ids = Enc(text);
  const auto same_ids = Enc(same);
  const double seconds = ThreadCpuSeconds() - start;
  EXPECT_EQ(tok_->Decode(ids), text);
  EXPECT_EQ(tok_->Decode(same_ids), same);
  EXPECT_LT(ids.size(), text.size() / 3);
  // CPU time of this thread, so co-tenants on the machine do not count; generous for sanitizer
  // builds: an O(n^2) encoder takes minutes here.
  EXPECT_LT(seconds, 10.0);
  RecordProperty("encode_200kb_seconds", std::to_string(seconds));
}

TEST(AidreamsTokenizerTest, LoadsAndRoundTrips) {
  const std::string path = SharedModelPath("aidreams260K.tok512.bin");
  if (path.empty()) GTEST_SKIP() << "aidreams260K.tok512.bin not available";
  const auto tok = LoadLlama2cTokenizer(path, 512);
  const std::string text = "Echoes of vectors unfold, a gentle hum of precision.";
  const auto ids = tok->Encode(text, true);
  EXPECT_LT(ids.size(), text.size());
  EXPECT_EQ(tok->Decode(ids), text);
}

// ---- GGUF-embedded vocabulary -----------------------------------------------------------------

// Just enough of GGUF v3 to pull the tokenizer arrays out of the metadata.
class MiniGguf {
 public:
  explicit MiniGguf(std::string bytes) : b_(std::move(bytes)) {}

  Vocabulary ReadVocabulary() {
    if (b_.substr(0, 4) != "GGUF" || U32() != 3) {
      ADD_FAILURE() << "not GGUF v3";
      return {};
    }
    U64();  // tensor count
    const std::uint64_t kv_count = U64();
    Vocabulary vocab;
    for (std::uint64_t k = 0; k < kv_count && ok_; ++k) {
      const std::string key = Str();
      const std::uint32_t type = U32();
      if (key == "tokenizer.ggml.tokens" || key == "tokenizer.ggml.scores" ||
          key == "tokenizer.ggml.token_type") {
        const std::uint32_t elem = U32();
        const std::uint64_t n = U64();
        for (std::uint64_t i = 0; i < n && ok_; ++i) {
          if (elem == 8) {
            vocab.tokens.push_back(Str());
          } else if (elem == 6) {
            vocab.scores.push_back(std::bit_cast<float>(U32()));
          } else if (elem == 5) {
            vocab.token_types.push_back(static_cast<std::int32_t>(U32()));
          } else {
            ADD_FAILURE() << key << ": unexpected element type " << elem;
            return {};
          }
        }
      } else if (key == "tokenizer.ggml.bos_token_id") {
        vocab.bos_id = static_cast<TokenId>(Scalar(type));
      } else if (key == "tokenizer.ggml.eos_token_id") {
        vocab.eos_id = static_cast<TokenId>(Scalar(type));
      } else if (key == "tokenizer.ggml.unknown_token_id") {
        vocab.unk_id = static_cast<TokenId>(Scalar(type));
      } else {
        Skip(type);
      }
    }
    EXPECT_TRUE(ok_) << "GGUF metadata truncated";
    return vocab;
  }

 private:
  static std::size_t ScalarSize(std::uint32_t type) {
    static constexpr std::size_t kSizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return type < std::size(kSizes) ? kSizes[type] : 0;
  }
  const char* Take(std::size_t n) {
    if (!ok_ || b_.size() - pos_ < n) {
      ok_ = false;
      return nullptr;
    }
    const char* p = b_.data() + pos_;
    pos_ += n;
    return p;
  }
  std::uint64_t Le(std::size_t n) {
    std::uint64_t v = 0;
    const char* p = Take(n);
    if (p != nullptr) std::memcpy(&v, p, n);
    return v;
  }
  std::uint32_t U32() { return static_cast<std::uint32_t>(Le(4)); }
  std::uint64_t U64() { return Le(8); }
  std::string Str() {
    const std::uint64_t n = U64();
    const char* p = Take(static_cast<std::size_t>(n));
    return p == nullptr ? "" : std::string(p, static_cast<std::size_t>(n));
  }
  std::uint64_t Scalar(std::uint32_t type) { return Le(ScalarSize(type)); }
  void Skip(std::uint32_t type) {
    if (type == 8) {
      Str();
    } else if (type == 9) {
      const std::uint32_t elem = U32();
      const std::uint64_t n = U64();
      for (std::uint64_t i = 0; i < n && ok_; ++i) Skip(elem);
    } else if (ScalarSize(type) > 0) {
      Take(ScalarSize(type));
    } else {
      ok_ = false;
    }
  }

  std::string b_;
  std::size_t pos_ = 4;  // the magic is checked in place; the version is read first
  bool ok_ = true;
};

std::string SpacesToMarker(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == ' ') {
      out += "\xE2\x96\x81";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

const std::vector<std::string>& SampleTexts() {
  static const std::vector<std::string> texts = {
      "Once upon a time, there was a little girl named Lily.",
      "Lily's mom said, \"Lily, let's go to the park.\"",
      "  two  spaces\nand a newline",
      "caf\xC3\xA9 \xF0\x9F\x98\x80 \xE2\x80\x9Cq\xE2\x80\x9D \xFF",
      "\xE2\x96\x81 literal marker",
      "",
  };
  return texts;
}

TEST(GgufVocabularyTest, EmbeddedVocabularyMatchesTok512) {
  const std::string gguf_path = SharedModelPath("stories260K.gguf");
  const std::string tok_path = SharedModelPath("tok512.bin");
  if (gguf_path.empty() || tok_path.empty()) GTEST_SKIP() << "shared model files not available";
  MiniGguf gguf(ReadFile(gguf_path));
  const Vocabulary vocab = gguf.ReadVocabulary();
  ASSERT_EQ(vocab.tokens.size(), 512u);
  ASSERT_EQ(vocab.scores.size(), 512u);
  ASSERT_EQ(vocab.token_types.size(), 512u);
  EXPECT_EQ(vocab.bos_id, 1);
  EXPECT_EQ(vocab.eos_id, 2);
  EXPECT_EQ(vocab.unk_id, 0);
  EXPECT_EQ(vocab.tokens[1], "<s>");
  EXPECT_EQ(vocab.tokens[265], "\xE2\x96\x81the");
  EXPECT_EQ(vocab.token_types[3], 6);

  const auto from_gguf = MakeSentencePieceTokenizer(vocab);
  const auto from_bin = LoadLlama2cTokenizer(tok_path, 512);
  for (const auto& text : SampleTexts()) {
    const auto ids = from_gguf->Encode(text, true);
    EXPECT_EQ(ids, from_bin->Encode(text, true)) << "text: " << text;
    EXPECT_EQ(from_gguf->Decode(ids), text);
  }
  for (TokenId prev : {-1, 1, 265}) {
    for (TokenId id = -1; id <= 512; ++id) {
      EXPECT_EQ(from_gguf->DecodeToken(prev, id), from_bin->DecodeToken(prev, id)) << id;
    }
  }
}

// The same check without the GGUF file: tok512.bin's pieces respelled the GGUF way, and without
// token types (byte tokens are then recognised by their spelling).
TEST(GgufVocabularyTest, MarkerSpelledVocabularyMatchesTok512) {
  const std::string tok_path = SharedModelPath("tok512.bin");
  if (tok_path.empty()) GTEST_SKIP() << "tok512.bin not available";
  Vocabulary vocab = ReadTok512Vocabulary(tok_path);
  for (auto& t : vocab.tokens) t = SpacesToMarker(t);
  vocab.tokens[1] = "<s>";
  vocab.tokens[2] = "</s>";
  vocab.bos_id = 1;
  vocab.eos_id = 2;
  vocab.unk_id = 0;
  const auto marker = MakeSentencePieceTokenizer(vocab);
  const auto plain = LoadLlama2cTokenizer(tok_path, 512);
  for (const auto& text : SampleTexts()) {
    EXPECT_EQ(marker->Encode(text, true), plain->Encode(text, true)) << "text: " << text;
  }
  EXPECT_EQ(marker->DecodeToken(-1, 410), " ");
  EXPECT_EQ(marker->DecodeToken(1, 265), "the");
}

TEST(SentencePieceTokenizerTest, RejectsBadVocabularies) {
  EXPECT_THROW(MakeSentencePieceTokenizer(Vocabulary{}), LoadError);
  Vocabulary v;
  v.tokens = {"<unk>", "a", "b"};
  v.scores = {0.0f, 1.0f};
  EXPECT_THROW(MakeSentencePieceTokenizer(v), LoadError);
  v.scores = {0.0f, 1.0f, std::numeric_limits<float>::quiet_NaN()};
  EXPECT_THROW(MakeSentencePieceTokenizer(v), LoadError);
  v.scores.clear();
  v.token_types = {2, 1};
  EXPECT_THROW(MakeSentencePieceTokenizer(v), LoadError);
  v.token_types = {2, 6, 1};  // "a" is no <0xHH>
  EXPECT_THROW(MakeSentencePieceTokenizer(v), LoadError);
  v.token_types.clear();
  v.bos_id = 3;
  EXPECT_THROW(MakeSentencePieceTokenizer(v), LoadError);
  v.bos_id = -2;
  EXPECT_THROW(MakeSentencePieceTokenizer(v), LoadError);
  v.bos_id = -1;
  v.eos_id = 7;
  EXPECT_THROW(MakeSentencePieceTokenizer(v), LoadError);
  v.eos_id = -1;
  v.unk_id = 3;
  EXPECT_THROW(MakeSentencePieceTokenizer(v), LoadError);
  v.unk_id = 0;
  // Valid now; without byte tokens, unknown characters map to <unk> instead of failing.
  const auto tok = MakeSentencePieceTokenizer(v);
  EXPECT_EQ(tok->bos_id(), -1);
  EXPECT_EQ(tok->Encode("ab", true), (std::vector<TokenId>{0, 1, 2}));  // ' ' is unknown
  EXPECT_EQ(tok->Encode("a\xC3\xA9", false), (std::vector<TokenId>{0, 1, 0, 0}));
}

// ---- GPT-2 byte-level BPE ---------------------------------------------------------------------

// GPT-2's bytes_to_unicode, written out for the test: printable Latin-1 bytes map to themselves,
// the rest to U+0100 + k in byte order.
std::string ByteLevel(std::string_view raw) {
  std::string out;
  for (unsigned char b : raw) {
    std::uint32_t cp = b;
    if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)) {
      std::uint32_t k = 0;
      for (unsigned c = 0; c < b; ++c) {
        if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE)) ++k;
      }
      cp = 256 + k;
    }
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  return out;
}

class Gpt2Test : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int b = 0; b < 256; ++b) Add(ByteLevel(std::string(1, static_cast<char>(b))), 1);
    // (left, right) in raw bytes, in rank order.
    const std::vector<std::pair<std::string, std::string>> merges = {
        {" ", "t"},  {"h", "e"},    {" t", "he"},     {"i", "n"},   {"in", "g"},
        {"'", "s"},  {" ", " "},    {"1", "2"},       {"\n", "\n"}, {"c", "a"},
        {"ca", "t"}, {" ", "cat"},  {"t", "h"},       {"!", "!"},   {"a", "1"},
        {"x", "!"},  {"x", "\xC3"}, {"\xA1", "\xD9"},  // crosses two Arabic-Indic digits
    };
    for (const auto& [l, r] : merges) {
      if (!vocab_ids_.contains(ByteLevel(l + r))) Add(ByteLevel(l + r), 1);
      vocab_.merges.push_back(ByteLevel(l) + " " + ByteLevel(r));
    }
    Add("<|im_start|>", 3);
    Add("<|im_end|>", 3);
    Add("<|im", 4);  // a user-defined prefix of a control token: the longer match must win
    Add("<tool>", 4);
    Add("<|endoftext|>", 3);
    vocab_.bos_id = vocab_ids_.at("<|endoftext|>");
    vocab_.eos_id = vocab_ids_.at("<|im_end|>");
    tok_ = MakeGpt2Tokenizer(vocab_);
  }

  void Add(const std::string& text, std::int32_t type) {
    vocab_ids_.emplace(text, static_cast<TokenId>(vocab_.tokens.size()));
    vocab_.tokens.push_back(text);
    vocab_.token_types.push_back(type);
  }

  // Ids of pieces given as raw bytes (special tokens by their own spelling).
  std::vector<TokenId> Ids(std::initializer_list<std::string_view> pieces) const {
    std::vector<TokenId> ids;
    for (std::string_view p : pieces) {
      const auto special = vocab_ids_.find(std::string(p));
      const bool is_special = p.size() > 1 && p[0] == '<' && special != vocab_ids_.end();
      ids.push_back(is_special ? special->second : vocab_ids_.at(ByteLevel(p)));
    }
    return ids;
  }

  std::vector<TokenId> Enc(std::string_view text) const { return tok_->Encode(text, false); }

  Vocabulary vocab_;
  std::map<std::string, TokenId> vocab_ids_;
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(Gpt2Test, PreTokenizerAndMerges) {
  // Pre-tokens: "the" " cat" "'s" " " "1" "2" " cats" "\n\n" "sing". "the": "he" (rank 1) beats
  // "th" (rank 12) and there is no "t he" rule.
  EXPECT_EQ(Enc("the cat's 12 cats\n\nsing"),
            Ids({"t", "he", " cat", "'s", " ", "1", "2", " cat", "s", "\n\n", "s", "ing"}));
  // " the" is one pre-token: " t", then "he", then " t"+"he".
  EXPECT_EQ(Enc(" the"), Ids({" the"}));
  // Contractions are case-insensitive; "don" and "'t" split.
  EXPECT_EQ(Enc("don't THE'S"), Ids({"d", "o", "n", "'", "t", " ", "T", "H", "E", "'", "S"}));
  // Two spaces before a word: the first stands alone, the second leads the word.
  EXPECT_EQ(Enc("x  \n b"), Ids({"x", "  ", "\n", " ", "b"}));
  // Trailing whitespace at the end of text is one pre-token; "  " merges leftmost first.
  EXPECT_EQ(Enc("x   "), Ids({"x", "  ", " "}));
  // Whitespace before a word keeps one space for the word: "   a" -> "  " + " a".
  EXPECT_EQ(Enc("   a"), Ids({"  ", " ", "a"}));
  // Punctuation runs take one leading space and trailing newlines.
  EXPECT_EQ(Enc("hi!!! ?\n"), Ids({"h", "i", "!!", "!", " ", "?", "\n"}));
  // Digits are split one by one and never merged with letters ("a1" is a rule, but "a" and "1"
  // are different pre-tokens); "x!" likewise.
  EXPECT_EQ(Enc("a12x!"), Ids({"a", "1", "2", "x", "!"}));
  // A letter-run may take one leading non-letter: "(hello" then ")".
  EXPECT_EQ(Enc("(he)"), Ids({"(", "he", ")"}));
  // Unicode classes: "é" (C3 A9) is a letter, so "xé" is one pre-token and "x"+"\xC3" merges;
  // "×" (C3 97) is a symbol, so "x×" is two and nothing merges.
  EXPECT_EQ(Enc("x\xC3\xA9"), Ids({"x\xC3", "\xA9"}));
  EXPECT_EQ(Enc("x\xC3\x97"), Ids({"x", "\xC3", "\x97"}));
  // Arabic-Indic digits (D9 A1, D9 A2) are numbers, split individually: "\xA1\xD9" never merges.
  EXPECT_EQ(Enc("\xD9\xA1\xD9\xA2"), Ids({"\xD9", "\xA1", "\xD9", "\xA2"}));
  EXPECT_EQ(Enc(""), (std::vector<TokenId>{}));
}

// As llama.cpp tokenizes plain text (no parse_special): user-defined tokens are matched
// literally, control tokens never, so a text cannot smuggle in <|im_start|> or EOS.
TEST_F(Gpt2Test, UserDefinedTokensAreMatchedLiterallyControlTokensNever) {
  const std::string chat = "<|im_start|>user\nHi<|im_end|>";
  const std::vector<TokenId> ids = Enc(chat);
  for (const TokenId id : ids) {
    EXPECT_NE(id, vocab_ids_.at("<|im_start|>"));
    EXPECT_NE(id, vocab_ids_.at("<|im_end|>"));
  }
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), vocab_ids_.at("<|im"));  // the user-defined prefix does match
  EXPECT_EQ(tok_->Decode(ids), chat);             // so the text survives as text
  EXPECT_EQ(Enc("a<|im b"), Ids({"a", "<|im", " ", "b"}));
  EXPECT_EQ(Enc("<tool><tool>"), Ids({"<tool>", "<tool>"}));
  EXPECT_EQ(Enc("<|im_end"), Ids({"<|im", "_", "e", "n", "d"}));
  EXPECT_EQ(tok_->Encode("hi", true), Ids({"<|endoftext|>", "h", "i"}));
  // Control tokens decode to nothing; user-defined ones to their text.
  const std::vector<TokenId> with_control = {vocab_ids_.at("<|im_start|>"), vocab_ids_.at("<tool>"),
                                             vocab_ids_.at("<|im_end|>")};
  EXPECT_EQ(tok_->Decode(with_control), "<tool>");
}

TEST_F(Gpt2Test, DecodeRoundTripsArbitraryBytes) {
  const std::vector<std::string> texts = {
      "Hello, world! It's 2024.\n\n  indented\ttab\r\n",
      "caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80",
      "invalid \xFF\xFE\xC3 \x80\x80 \xE2\x82 \xED\xA0\x80 \xF4\x90\x80\x80 \xC0\xAF",
      std::string("nul\0inside", 10),
  };
  for (const auto& t : texts) EXPECT_EQ(tok_->Decode(Enc(t)), t) << "text: " << t;
  std::mt19937 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    std::string t(rng() % 40, '\0');
    for (char& c : t) c = static_cast<char>(rng() % 256);
    EXPECT_EQ(tok_->Decode(Enc(t)), t);
  }
  for (int b = 0; b < 256; ++b)
    EXPECT_EQ(tok_->DecodeToken(-1, b), std::string(1, static_cast<char>(b)));
  EXPECT_EQ(tok_->DecodeToken(-1, -1), "");
  EXPECT_EQ(tok_->DecodeToken(-1, tok_->vocab_size()), "");
}

TEST_F(Gpt2Test, LongInputIsFast) {
  std::string text;
  while (text.size() < 100000) text += "the cat's sing!!!! 12345 \n\n x  ";
  const std::string bangs(100000, '!');  // a single 100 KB pre-token
  const double start = ThreadCpuSeconds();
  EXPECT_EQ(tok_->Decode(Enc(text)), text);
  EXPECT_EQ(tok_->Decode(Enc(bangs)), bangs);
  const double seconds = ThreadCpuSeconds() - start;
  EXPECT_LT(seconds, 10.0);  // CPU time, as in Tok512Test.LongInputIsFast
  RecordProperty("gpt2_encode_200kb_seconds", std::to_string(seconds));
}

TEST(Gpt2TokenizerTest, RejectsBadVocabularies) {
  EXPECT_THROW(MakeGpt2Tokenizer(Vocabulary{}), LoadError);
  Vocabulary v;
  for (int b = 0; b < 256; ++b) v.tokens.push_back(ByteLevel(std::string(1, static_cast<char>(b))));
  EXPECT_NO_THROW(MakeGpt2Tokenizer(v));
  // A byte without a token (real vocabularies lack 0xC0, 0xF5..) is dropped, as llama.cpp does.
  Vocabulary missing_byte = v;
  missing_byte.tokens[65] = "AA";
  const auto no_a = MakeGpt2Tokenizer(missing_byte);
  EXPECT_EQ(no_a->Encode("BAB", false), (std::vector<TokenId>{66, 66}));
  Vocabulary bad_merge = v;
  bad_merge.merges = {"ab"};
  EXPECT_THROW(MakeGpt2Tokenizer(bad_merge), LoadError);
  Vocabulary unknown_merge = v;
  unknown_merge.merges = {"a b"};  // "ab" is no token: the rule is skipped
  EXPECT_NO_THROW(MakeGpt2Tokenizer(unknown_merge));
  Vocabulary bad_types = v;
  bad_types.token_types = {1, 1};
  EXPECT_THROW(MakeGpt2Tokenizer(bad_types), LoadError);
  Vocabulary bad_bos = v;
  bad_bos.bos_id = 256;
  EXPECT_THROW(MakeGpt2Tokenizer(bad_bos), LoadError);
}

// ---- Synthetic vocabulary ---------------------------------------------------------------------

TEST(SyntheticVocabularyTest, ExactSizeUniqueAndRoundTrips) {
  for (const int size : {259, 260, 512, 4096, 49152}) {
    const Vocabulary v = MakeSyntheticVocabulary(size);
    ASSERT_EQ(v.tokens.size(), static_cast<std::size_t>(size));
    ASSERT_EQ(v.scores.size(), v.tokens.size());
    ASSERT_EQ(v.token_types.size(), v.tokens.size());
    EXPECT_EQ(std::set<std::string>(v.tokens.begin(), v.tokens.end()).size(), v.tokens.size());
    EXPECT_EQ(v.tokens[0], "<unk>");
    EXPECT_EQ(v.tokens[1], "<s>");
    EXPECT_EQ(v.tokens[2], "</s>");
    EXPECT_EQ(v.tokens[3], "<0x00>");
    EXPECT_EQ(v.tokens[3 + 0xAB], "<0xAB>");
    EXPECT_EQ(v.token_types[3 + 0xAB], 6);
    EXPECT_EQ(v.bos_id, 1);
    EXPECT_EQ(v.eos_id, 2);
    EXPECT_EQ(v.unk_id, 0);
    for (std::size_t i = 260; i < v.scores.size(); ++i) ASSERT_LT(v.scores[i], v.scores[i - 1]);
    const auto tok = MakeSentencePieceTokenizer(v);
    EXPECT_EQ(tok->vocab_size(), size);
    for (const auto& text : SampleTexts()) {
      EXPECT_EQ(tok->Decode(tok->Encode(text, true)), text) << size << ": " << text;
    }
  }
  EXPECT_EQ(MakeSyntheticVocabulary(4096).tokens, MakeSyntheticVocabulary(4096).tokens);
}

TEST(SyntheticVocabularyTest, EnglishMergesIntoWords) {
  const auto tok = MakeSentencePieceTokenizer(MakeSyntheticVocabulary(4096));
  const std::string text = "Once upon a time the little dog was very happy";
  const auto ids = tok->Encode(text, false);
  EXPECT_LE(ids.size(), 12u);  // about one piece per word
  EXPECT_EQ(tok->DecodeToken(-1, ids[1]), " upon");
  const auto small = MakeSentencePieceTokenizer(MakeSyntheticVocabulary(512));
  EXPECT_LT(small->Encode(text, false).size(), text.size() * 2 / 3);
}

TEST(SyntheticVocabularyTest, RejectsBadSizes) {
  EXPECT_THROW(MakeSyntheticVocabulary(258), ConfigError);
  EXPECT_THROW(MakeSyntheticVocabulary(0), ConfigError);
  EXPECT_THROW(MakeSyntheticVocabulary(-5), ConfigError);
  EXPECT_THROW(MakeSyntheticVocabulary(1 << 30), ConfigError);
}

// ---- llama2.c tokenizer file validation -------------------------------------------------------

std::string MinimalTokenizerFile(int extra_tokens) {
  std::string f;
  AppendI32(f, 7);
  const auto add = [&f](float score, std::string_view text) {
    AppendF32(f, score);
    AppendI32(f, static_cast<std::int32_t>(text.size()));
    f.append(text);
  };
  add(0, "<unk>");
  add(0, "\n<s>\n");
  add(0, "\n</s>\n");
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) add(0, std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">");
  for (int i = 0; i < extra_tokens; ++i) add(-static_cast<float>(i), std::string(1, 'a' + i));
  return f;
}

void ExpectLoadError(const std::string& path, int vocab_size, const std::string& what) {
  try {
    LoadLlama2cTokenizer(path, vocab_size);
    ADD_FAILURE() << what << ": no LoadError";
  } catch (const LoadError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos)
        << what << ": message does not name the file: " << e.what();
  }
}

TEST(Llama2cTokenizerFileTest, AcceptsMinimalFile) {
  const std::string path = TempPath("minimal.bin");
  WriteFile(path, MinimalTokenizerFile(3));
  const auto tok = LoadLlama2cTokenizer(path, 262);
  EXPECT_EQ(tok->vocab_size(), 262);
  // ' ' has no piece here, so the dummy prefix falls back to <0x20>.
  EXPECT_EQ(tok->Encode("ab", true), (std::vector<TokenId>{1, 3 + ' ', 259, 260}));
  EXPECT_EQ(tok->Decode(tok->Encode("ab", true)), "ab");
}

TEST(Llama2cTokenizerFileTest, RejectsBrokenFiles) {
  const std::string good = MinimalTokenizerFile(3);
  const std::string path = TempPath("broken.bin");
  ExpectLoadError(TempPath("does_not_exist.bin"), 262, "missing file");

  for (std::size_t cut : {std::size_t{0}, std::size_t{2}, std::size_t{4}, std::size_t{10},
                          std::size_t{100}, good.size() - 1}) {
    WriteFile(path, good.substr(0, cut));
    ExpectLoadError(path, 262, "truncated at " + std::to_string(cut));
  }
  WriteFile(path, good);
  ExpectLoadError(path, 0, "zero vocab_size");
  ExpectLoadError(path, -1, "negative vocab_size");
  ExpectLoadError(path, 263, "vocab_size beyond the file");
  ExpectLoadError(path, 1 << 30, "absurd vocab_size");
  ExpectLoadError(path, 261, "trailing token");

  const auto patched = [&](std::size_t offset, std::int32_t value) {
    std::string f = good;
    std::memcpy(f.data() + offset, &value, 4);
    return f;
  };
  WriteFile(path, patched(0, 0));
  ExpectLoadError(path, 262, "zero max_token_length");
  WriteFile(path, patched(0, -3));
  ExpectLoadError(path, 262, "negative max_token_length");
  WriteFile(path, patched(0, 0x7FFFFFFF));
  ExpectLoadError(path, 262, "absurd max_token_length");
  // Token 0: score at 4, length at 8.
  WriteFile(path, patched(8, -1));
  ExpectLoadError(path, 262, "negative length");
  WriteFile(path, patched(8, 8));
  ExpectLoadError(path, 262, "length above max_token_length");
  WriteFile(path, patched(8, 0x7FFFFFFF));
  ExpectLoadError(path, 262, "absurd length");
  WriteFile(path, patched(4, 0x7FC00000));  // NaN score
  ExpectLoadError(path, 262, "NaN score");
}

TEST(Llama2cTokenizerFileTest, RealFileNeedsItsVocabSize) {
  const std::string path = SharedModelPath("tok512.bin");
  if (path.empty()) GTEST_SKIP() << "tok512.bin not available";
  ExpectLoadError(path, 513, "vocab_size larger than the file");
  ExpectLoadError(path, 32000, "llama2 vocab_size");
}

TEST(TokenizerConventionTest, BosFollowsTheFileElseTheFamily) {
  EXPECT_TRUE(MakeSentencePieceTokenizer(MakeSyntheticVocabulary(300))->adds_bos());
  Vocabulary no_bos_flag = MakeSyntheticVocabulary(300);
  no_bos_flag.add_bos = false;  // GGUF tokenizer.ggml.add_bos_token = false
  EXPECT_FALSE(MakeSentencePieceTokenizer(no_bos_flag)->adds_bos());
  Vocabulary without_bos = MakeSyntheticVocabulary(300);
  without_bos.bos_id = -1;
  EXPECT_FALSE(MakeSentencePieceTokenizer(without_bos)->adds_bos());
}

TEST(TokenizerConventionTest, PiecesAndSpecialIdsAreTheVocabularys) {
  Vocabulary v = MakeSyntheticVocabulary(300);
  v.pad_id = 299;
  const std::string pad_piece = v.tokens[299];
  const auto t = MakeSentencePieceTokenizer(v);
  EXPECT_EQ(t->kind(), "sentencepiece");
  EXPECT_EQ(t->Piece(1), "<s>");
  EXPECT_EQ(t->Piece(2), "</s>");
  EXPECT_EQ(t->Piece(t->unk_id()), "<unk>");
  EXPECT_EQ(t->pad_id(), 299);
  EXPECT_EQ(t->Piece(299), pad_piece);
  EXPECT_EQ(t->Piece(300), "");
  EXPECT_EQ(t->Piece(-1), "");
  v.pad_id = 300;
  EXPECT_THROW((void)MakeSentencePieceTokenizer(v), LoadError);
}

// ---- pre-tokenizers -------------------------------------------------------------------------
// Expected words read off llama.cpp's pattern lists for each name (llama-vocab.cpp, by hand, not
// by running it): llama-bpe and qwen2 share the GPT-4 pattern (digits in ones to threes resp. one,
// contractions in any case, a lone space before a non-letter kept on its own, newline runs
// together); gpt-2 glues one space to the run that follows, contractions lower-case only, and
// gives each newline of a run before text its own word; smollm isolates every digit first; the
// default isolates punctuation runs, then applies gpt-2, then cuts digit runs out and into threes.

using Words = std::vector<std::string>;

TEST(PreTokenizerTest, EachFamilySplitsDigitsContractionsAndWhitespaceItsOwnWay) {
  const std::string text = "I'RE 12345 abc  def\n\nx";
  using internal::PreTokenizeWords;
  EXPECT_EQ(PreTokenizeWords(text, PreTokenizer::kLlama3),
            (Words{"I", "'RE", " ", "123", "45", " abc", " ", " def", "\n\n", "x"}));
  EXPECT_EQ(PreTokenizeWords(text, PreTokenizer::kQwen2),
            (Words{"I", "'RE", " ", "1", "2", "3", "4", "5", " abc", " ", " def", "\n\n", "x"}));
  EXPECT_EQ(PreTokenizeWords(text, PreTokenizer::kGpt2),
            (Words{"I", "'", "RE", " 12345", " abc", " ", " def", "\n", "\n", "x"}));
  EXPECT_EQ(
      PreTokenizeWords(text, PreTokenizer::kSmollm),
      (Words{"I", "'", "RE", " ", "1", "2", "3", "4", "5", " abc", " ", " def", "\n", "\n", "x"}));
  EXPECT_EQ(PreTokenizeWords(text, PreTokenizer::kDefault),
            (Words{"I", "'", "RE", " ", "123", "45", " abc", " ", " def", "\n", "\n", "x"}));
}

TEST(PreTokenizerTest, UnicodeLettersAndDigitsUseTheirCategories) {
  const std::string text = "h\xC3\xA9llo w\xC3\xB6rld \xE6\x97\xA5\xE6\x9C\xAC \xD9\xA3\xD9\xA4";
  using internal::PreTokenizeWords;
  EXPECT_EQ(PreTokenizeWords(text, PreTokenizer::kLlama3),
            (Words{"h\xC3\xA9llo", " w\xC3\xB6rld", " \xE6\x97\xA5\xE6\x9C\xAC", " ",
                   "\xD9\xA3\xD9\xA4"}));
  EXPECT_EQ(PreTokenizeWords(text, PreTokenizer::kQwen2),
            (Words{"h\xC3\xA9llo", " w\xC3\xB6rld", " \xE6\x97\xA5\xE6\x9C\xAC", " ", "\xD9\xA3",
                   "\xD9\xA4"}));
  EXPECT_EQ(
      PreTokenizeWords(text, PreTokenizer::kGpt2),
      (Words{"h\xC3\xA9llo", " w\xC3\xB6rld", " \xE6\x97\xA5\xE6\x9C\xAC", " \xD9\xA3\xD9\xA4"}));
}

TEST(PreTokenizerTest, WordsAlwaysConcatenateToTheText) {
  std::mt19937 rng(11);
  const std::string alphabet[] = {"a",
                                  "Z",
                                  "7",
                                  " ",
                                  "  ",
                                  "\n",
                                  "\r\n",
                                  "\t",
                                  "'",
                                  "'s",
                                  "!",
                                  "$",
                                  "\xC3\xA9",
                                  "\xE2\x80\x94",
                                  "\xF0\x9F\x98\x80",
                                  "\xFF"};
  for (int trial = 0; trial < 300; ++trial) {
    std::string text;
    for (int k = static_cast<int>(rng() % 30); k > 0; --k)
      text += alphabet[rng() % std::size(alphabet)];
    for (const PreTokenizer pre :
         {PreTokenizer::kDefault, PreTokenizer::kGpt2, PreTokenizer::kLlama3, PreTokenizer::kQwen2,
          PreTokenizer::kSmollm}) {
      std::string joined;
      for (const std::string& w : internal::PreTokenizeWords(text, pre)) {
        EXPECT_FALSE(w.empty());
        joined += w;
      }
      EXPECT_EQ(joined, text);
    }
  }
}

TEST(PreTokenizerTest, NamesAreLlamaCppsAndUnknownOnesAreRefused) {
  EXPECT_EQ(ParsePreTokenizer(""), PreTokenizer::kDefault);
  EXPECT_EQ(ParsePreTokenizer("default"), PreTokenizer::kDefault);
  EXPECT_EQ(ParsePreTokenizer("gpt-2"), PreTokenizer::kGpt2);
  EXPECT_EQ(ParsePreTokenizer("llama-bpe"), PreTokenizer::kLlama3);
  EXPECT_EQ(ParsePreTokenizer("qwen2"), PreTokenizer::kQwen2);
  EXPECT_EQ(ParsePreTokenizer("smollm"), PreTokenizer::kSmollm);
  EXPECT_EQ(ParsePreTokenizer("deepseek-llm"), std::nullopt);
  EXPECT_EQ(PreTokenizerName(PreTokenizer::kLlama3), "llama-bpe");
}

}  // namespace
}  // namespace metronome::model
