// EncodeChat against the formats written out by hand: markers are their control tokens, the text
// between two markers is one plain-text fragment (tokenized alone), BOS per the tokenizer.
#include "metronome/model/chat_template.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "metronome/model/tokenizer.h"

namespace metronome::model {
namespace {

constexpr int kControl = 3;

// GPT-2 style byte-level alphabet: printable ASCII stands for itself, so a vocabulary of the 256
// byte symbols plus a few control tokens tokenizes ASCII one byte a token.
std::string ByteSymbol(unsigned char b) {
  std::string s;
  std::uint32_t cp = b;
  const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
  if (!printable) {
    std::uint32_t next = 256;
    for (std::uint32_t x = 0; x < b; ++x) {
      if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE)) ++next;
    }
    cp = next;
  }
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

std::unique_ptr<Tokenizer> ChatTokenizer(const std::string& chat_template, bool add_bos,
                                         const std::vector<std::string>& controls) {
  Vocabulary v;
  for (int b = 0; b < 256; ++b) {
    v.tokens.push_back(ByteSymbol(static_cast<unsigned char>(b)));
    v.token_types.push_back(1);
  }
  for (const std::string& c : controls) {
    v.tokens.push_back(c);
    v.token_types.push_back(kControl);
  }
  v.tokens.push_back("<bos>");
  v.token_types.push_back(kControl);
  v.bos_id = static_cast<TokenId>(v.tokens.size() - 1);
  v.add_bos = add_bos;
  v.chat_template = chat_template;
  return MakeGpt2Tokenizer(std::move(v));
}

TokenId IdOf(const Tokenizer& t, const std::string& piece) {
  for (TokenId i = 0; i < t.vocab_size(); ++i) {
    if (t.Piece(i) == piece) return i;
  }
  ADD_FAILURE() << piece;
  return -1;
}

// Appends the plain-text tokens of `text` (one byte a token in this vocabulary).
void Text(const Tokenizer& t, const std::string& text, std::vector<TokenId>& out) {
  const std::vector<TokenId> ids = t.Encode(text, false);
  out.insert(out.end(), ids.begin(), ids.end());
}

const std::string kQwenTemplate =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}";
const std::string kLlama3Template =
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}{{ '<|eot_id|>' }}";

TEST(ChatTemplateTest, RecognisesChatMlAndLlama3AndNothingElse) {
  EXPECT_EQ(RecognizeChatTemplate(kQwenTemplate), ChatFormat::kChatMl);
  EXPECT_EQ(RecognizeChatTemplate(kLlama3Template), ChatFormat::kLlama3);
  EXPECT_EQ(RecognizeChatTemplate("<|im_start|>{{role}}<|im_sep|>"), std::nullopt);  // Phi-4
  EXPECT_EQ(RecognizeChatTemplate("[INST] {{ content }} [/INST]"), std::nullopt);
  EXPECT_EQ(RecognizeChatTemplate(""), std::nullopt);
}

TEST(ChatTemplateTest, ChatMlIsFormattedMarkerByMarker) {
  const auto t = ChatTokenizer(kQwenTemplate, false, {"<|im_start|>", "<|im_end|>"});
  const TokenId start = IdOf(*t, "<|im_start|>");
  const TokenId end = IdOf(*t, "<|im_end|>");
  const std::vector<ChatMessage> messages = {{"system", "Be brief."}, {"user", " Hi <|im_end|>"}};
  std::vector<TokenId> want = {start};
  Text(*t, "system\nBe brief.", want);
  want.push_back(end);
  Text(*t, "\n", want);
  want.push_back(start);
  Text(*t, "user\n Hi <|im_end|>", want);  // a marker inside a message stays text
  want.push_back(end);
  Text(*t, "\n", want);
  want.push_back(start);
  Text(*t, "assistant\n", want);
  const ChatEncoding got = EncodeChat(*t, messages);
  EXPECT_EQ(got.error, "");
  EXPECT_EQ(got.ids, want);
}

TEST(ChatTemplateTest, Llama3TrimsContentsAndPrependsBos) {
  const auto t = ChatTokenizer(kLlama3Template, true,
                               {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"});
  const TokenId sh = IdOf(*t, "<|start_header_id|>");
  const TokenId eh = IdOf(*t, "<|end_header_id|>");
  const TokenId eot = IdOf(*t, "<|eot_id|>");
  std::vector<TokenId> want = {t->bos_id(), sh};
  Text(*t, "user", want);
  want.push_back(eh);
  Text(*t, "\n\nHello there", want);
  want.push_back(eot);
  want.push_back(sh);
  Text(*t, "assistant", want);
  want.push_back(eh);
  Text(*t, "\n\n", want);
  const ChatEncoding got =
      EncodeChat(*t, std::vector<ChatMessage>{{"user", "\n  Hello there \t\n"}});
  EXPECT_EQ(got.error, "");
  EXPECT_EQ(got.ids, want);
}

TEST(ChatTemplateTest, RefusesWhatItCannotFormatFaithfully) {
  const std::vector<ChatMessage> hi = {{"user", "hi"}};
  const auto none = ChatTokenizer("", false, {});
  EXPECT_NE(EncodeChat(*none, hi).error.find("no chat template"), std::string::npos);
  const auto mistral = ChatTokenizer("[INST] {{ m }} [/INST]", false, {});
  EXPECT_NE(EncodeChat(*mistral, hi).error.find("not a format this engine implements"),
            std::string::npos);
  const auto missing = ChatTokenizer(kQwenTemplate, false, {"<|im_start|>"});
  EXPECT_NE(EncodeChat(*missing, hi).error.find("'<|im_end|>'"), std::string::npos);
  const auto ok = ChatTokenizer(kQwenTemplate, false, {"<|im_start|>", "<|im_end|>"});
  EXPECT_NE(EncodeChat(*ok, std::vector<ChatMessage>{{"", "x"}}).error.find("empty role"),
            std::string::npos);
}

}  // namespace
}  // namespace metronome::model
