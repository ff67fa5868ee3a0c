// ResolveStart with prompt.messages: formatted by model::EncodeChat with the model's template,
// then resolved as prompt ids; every way it cannot be formatted is a bad_field naming the field.
#include "metronome/server/session_start.h"

#include <gtest/gtest.h>

#include <string>
#include <variant>
#include <vector>

#include "metronome/model/chat_template.h"
#include "metronome/model/tokenizer.h"

namespace metronome::server {
namespace {

// Byte symbols for printable ASCII only (enough for these texts), plus ChatML's markers.
std::unique_ptr<model::Tokenizer> ChatMlTokenizer(const std::string& chat_template) {
  model::Vocabulary v;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    std::string s;
    if (printable && b < 0x80) {
      s.push_back(static_cast<char>(b));
    } else {
      s = "<byte " + std::to_string(b) + ">";  // never produced by these ASCII texts' letters
    }
    v.tokens.push_back(s);
  }
  v.tokens[' '] = "\xC4\xA0";   // GPT-2's symbol for the space byte (U+0120)
  v.tokens['\n'] = "\xC4\x8A";  // and for the newline (U+010A)
  v.tokens.push_back("<|im_start|>");
  v.tokens.push_back("<|im_end|>");
  v.token_types.assign(v.tokens.size(), 1);
  v.token_types[256] = v.token_types[257] = 3;
  v.chat_template = chat_template;
  return model::MakeGpt2Tokenizer(std::move(v));
}

wire::StartRequest StartWith(std::vector<wire::PromptMessage> messages) {
  wire::StartRequest r;
  r.period_ms = 80.0;
  r.tokens_per_frame = 1;
  r.prompt_messages = std::move(messages);
  r.client_ref = "c1";
  return r;
}

std::variant<realtime::SessionSpec, wire::ProtocolError> Resolve(const wire::StartRequest& r,
                                                                 const model::Tokenizer* t,
                                                                 int max_prompt_tokens = 8192) {
  wire::ServerCaps caps;
  caps.max_prompt_tokens = max_prompt_tokens;
  return ResolveStart(r, ServerSessionDefaults(64, 4, wire::KvPositions::kAbsolute), caps, t);
}

TEST(SessionStartTest, MessagesBecomeTheTemplatesTokens) {
  const auto t = ChatMlTokenizer("{{ '<|im_start|>' + role }}");
  const auto r = Resolve(StartWith({{"user", "Hi there"}}), t.get());
  ASSERT_TRUE(std::holds_alternative<realtime::SessionSpec>(r))
      << std::get<wire::ProtocolError>(r).message;
  const std::vector<model::ChatMessage> same = {{"user", "Hi there"}};
  const model::ChatEncoding want = model::EncodeChat(*t, same);
  ASSERT_EQ(want.error, "");
  EXPECT_EQ(std::get<realtime::SessionSpec>(r).prompt, want.ids);
  EXPECT_EQ(want.ids.front(), 256);  // <|im_start|>
}

TEST(SessionStartTest, RefusalsNameTheFieldAndCarryTheClientRef) {
  const auto expect_error = [](const std::variant<realtime::SessionSpec, wire::ProtocolError>& r,
                               wire::ErrorCode code, const std::string& needle) {
    ASSERT_TRUE(std::holds_alternative<wire::ProtocolError>(r)) << needle;
    const auto& e = std::get<wire::ProtocolError>(r);
    EXPECT_EQ(e.code, code) << e.message;
    EXPECT_NE(e.message.find("prompt.messages"), std::string::npos) << e.message;
    EXPECT_NE(e.message.find(needle), std::string::npos) << e.message;
    EXPECT_EQ(e.client_ref, "c1");
  };
  const auto req = StartWith({{"user", "Hi"}});
  expect_error(Resolve(req, nullptr), wire::ErrorCode::kBadField, "no tokenizer");
  const auto unknown = ChatMlTokenizer("[INST] {{ content }} [/INST]");
  expect_error(Resolve(req, unknown.get()), wire::ErrorCode::kBadField, "not a format this engine");
  const auto none = ChatMlTokenizer("");
  expect_error(Resolve(req, none.get()), wire::ErrorCode::kBadField, "no chat template");
  const auto chatml = ChatMlTokenizer("<|im_start|>");
  expect_error(Resolve(req, chatml.get(), 3), wire::ErrorCode::kOverCap, "max_prompt_tokens = 3");
}

}  // namespace
}  // namespace metronome::server
