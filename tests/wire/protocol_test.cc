#include "metronome/wire/protocol.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace metronome::wire {
namespace {

using Json = nlohmann::json;

std::string Describe(const std::variant<ClientMessage, ProtocolError>& r) {
  if (const auto* e = std::get_if<ProtocolError>(&r)) {
    return std::string(ToString(e->code)) + ": " + e->message;
  }
  return "a message";
}

template <typename T>
T ParseOk(std::string_view text, const ServerCaps& caps = {}) {
  const auto r = ParseClientMessage(text, caps);
  const auto* m = std::get_if<ClientMessage>(&r);
  if (m == nullptr || !std::holds_alternative<T>(*m)) {
    ADD_FAILURE() << "expected a parsed message from " << text << ", got " << Describe(r);
    return T{};
  }
  return std::get<T>(*m);
}

ProtocolError ParseError(std::string_view text, const ServerCaps& caps = {}) {
  const auto r = ParseClientMessage(text, caps);
  const auto* e = std::get_if<ProtocolError>(&r);
  if (e == nullptr) {
    ADD_FAILURE() << "expected an error from " << text;
    return {};
  }
  return *e;
}

TEST(ProtocolParseTest, SessionStartWithEveryField) {
  const auto req = ParseOk<StartRequest>(R"({
      "type": "session.start", "period_ms": 80, "deadline_ms": 120.5, "tokens_per_frame": 13,
      "output_tokens_per_frame": 2,
      "kv": {"policy": "window", "window": 1000, "sinks": 4, "positions": "rolling"},
      "prompt": {"ids": [1, 2, 3]}, "client_ref": "call-7"})");
  EXPECT_EQ(req.period_ms, 80.0);
  EXPECT_EQ(req.deadline_ms, 120.5);
  EXPECT_EQ(req.tokens_per_frame, 13);
  EXPECT_EQ(req.output_tokens_per_frame, 2);
  EXPECT_EQ(req.kv.policy, KvPolicyKind::kWindow);
  EXPECT_EQ(req.kv.window, 1000);
  EXPECT_EQ(req.kv.sinks, 4);
  EXPECT_EQ(req.kv.positions, KvPositions::kRolling);
  ASSERT_TRUE(req.prompt.has_value());
  EXPECT_EQ(std::get<TokenIds>(*req.prompt), (TokenIds{1, 2, 3}));
  EXPECT_EQ(req.client_ref, "call-7");
}

TEST(ProtocolParseTest, SessionStartDefaults) {
  const auto req =
      ParseOk<StartRequest>(R"({"type":"session.start","period_ms":80,"tokens_per_frame":1})");
  EXPECT_EQ(req.period_ms, 80.0);
  EXPECT_FALSE(req.deadline_ms.has_value());  // not given: ResolveSession makes it the period
  EXPECT_EQ(req.tokens_per_frame, 1);
  EXPECT_EQ(req.output_tokens_per_frame, 1);
  EXPECT_FALSE(req.kv.policy.has_value());  // the server's defaults apply
  EXPECT_FALSE(req.kv.window.has_value());
  EXPECT_FALSE(req.kv.sinks.has_value());
  EXPECT_FALSE(req.kv.positions.has_value());
  EXPECT_FALSE(req.prompt.has_value());
  EXPECT_FALSE(req.client_ref.has_value());

  // A kv object with only some fields leaves the others to the server.
  const auto partial = ParseOk<StartRequest>(
      R"({"type":"session.start","period_ms":80,"tokens_per_frame":1,"kv":{"window":256}})");
  EXPECT_FALSE(partial.kv.policy.has_value());
  EXPECT_EQ(partial.kv.window, 256);
  EXPECT_FALSE(partial.kv.sinks.has_value());
}

TEST(ProtocolParseTest, SessionStartFullKvTextPromptAndZeroOutputs) {
  const auto req = ParseOk<StartRequest>(
      R"({"type":"session.start","period_ms":2000,"tokens_per_frame":50,
          "output_tokens_per_frame":0,"kv":{"policy":"full","positions":"absolute"},
          "prompt":{"text":"You are a helpful assistant. ü"}})");
  EXPECT_EQ(req.output_tokens_per_frame, 0);
  EXPECT_EQ(req.kv.policy, KvPolicyKind::kFull);
  EXPECT_EQ(req.kv.positions, KvPositions::kAbsolute);
  ASSERT_TRUE(req.prompt.has_value());
  EXPECT_EQ(std::get<std::string>(*req.prompt), "You are a helpful assistant. ü");
  // An empty prompt means none.
  const auto empty = ParseOk<StartRequest>(
      R"({"type":"session.start","period_ms":80,"tokens_per_frame":1,"prompt":{"ids":[]}})");
  ASSERT_TRUE(empty.prompt.has_value());
  EXPECT_TRUE(std::get<TokenIds>(*empty.prompt).empty());
}

TEST(ProtocolParseTest, SessionStartChatMessagesPrompt) {
  const auto req = ParseOk<StartRequest>(
      R"({"type":"session.start","period_ms":80,"tokens_per_frame":1,
          "prompt":{"messages":[{"role":"system","content":"Be brief."},
                                {"role":"user","content":""}]}})");
  EXPECT_FALSE(req.prompt.has_value());
  ASSERT_TRUE(req.prompt_messages.has_value());
  ASSERT_EQ(req.prompt_messages->size(), 2U);
  EXPECT_EQ((*req.prompt_messages)[0].role, "system");
  EXPECT_EQ((*req.prompt_messages)[0].content, "Be brief.");
  EXPECT_EQ((*req.prompt_messages)[1].content, "");  // an empty content is a message too

  const auto start = [](const std::string& prompt) {
    return R"({"type":"session.start","period_ms":80,"tokens_per_frame":1,"prompt":)" + prompt +
           "}";
  };
  const ProtocolError both = ParseError(start(R"({"messages":[],"text":"x"})"));
  EXPECT_EQ(both.code, ErrorCode::kBadField);
  EXPECT_NE(both.message.find("exclusive"), std::string::npos) << both.message;
  const ProtocolError empty = ParseError(start(R"({"messages":[]})"));
  EXPECT_NE(empty.message.find("prompt.messages"), std::string::npos) << empty.message;
  const ProtocolError no_role = ParseError(start(R"({"messages":[{"content":"hi"}]})"));
  EXPECT_EQ(no_role.code, ErrorCode::kMissingField);
  EXPECT_NE(no_role.message.find("prompt.messages[0].role"), std::string::npos);
  const ProtocolError blank_role =
      ParseError(start(R"({"messages":[{"role":"","content":"hi"}]})"));
  EXPECT_NE(blank_role.message.find("prompt.messages[0].role"), std::string::npos);
  const ProtocolError extra =
      ParseError(start(R"({"messages":[{"role":"user","content":"hi","name":"bob"}]})"));
  EXPECT_EQ(extra.code, ErrorCode::kUnknownField);
  EXPECT_NE(extra.message.find("prompt.messages[0].name"), std::string::npos) << extra.message;
  ServerCaps small;
  small.max_text_bytes = 4;
  const ProtocolError big = ParseError(
      start(R"({"messages":[{"role":"user","content":"abc"},{"role":"user","content":"de"}]})"),
      small);
  EXPECT_EQ(big.code, ErrorCode::kOverCap);
}

TEST(ProtocolParseTest, IntegralFloatsCountAsIntegers) {
  // Python's json.dumps writes 5.0; JSON also allows 1e3.
  const auto req = ParseOk<StartRequest>(
      R"({"type":"session.start","period_ms":1e2,"tokens_per_frame":4.0,
          "kv":{"window":1e3}})");
  EXPECT_EQ(req.period_ms, 100.0);
  EXPECT_EQ(req.tokens_per_frame, 4);
  EXPECT_EQ(req.kv.window, 1000);
}

TEST(ProtocolParseTest, FrameWithIdsTextAndDefaults) {
  const auto ids = ParseOk<FrameRequest>(R"({"type":"frame","session":7,"index":3,"ids":[5,0,9]})");
  EXPECT_EQ(ids.session, 7u);
  EXPECT_EQ(ids.index, 3);
  EXPECT_EQ(std::get<TokenIds>(ids.input), (TokenIds{5, 0, 9}));

  const auto text = ParseOk<FrameRequest>(R"({"type":"frame","session":8,"text":"hello"})");
  EXPECT_EQ(text.session, 8u);
  EXPECT_FALSE(text.index.has_value());
  EXPECT_EQ(std::get<std::string>(text.input), "hello");

  // Session ids use the whole uint64 range.
  const auto big =
      ParseOk<FrameRequest>(R"({"type":"frame","session":18446744073709551615,"ids":[1]})");
  EXPECT_EQ(big.session, std::numeric_limits<std::uint64_t>::max());
}

TEST(ProtocolParseTest, Resume) {
  const auto r = ParseOk<ResumeRequest>(
      R"({"type":"session.resume","resume_token":"mtr1.abc.1.00.m-1","client_ref":"x"})");
  EXPECT_EQ(r.resume_token, "mtr1.abc.1.00.m-1");
  EXPECT_EQ(r.client_ref, "x");
  EXPECT_FALSE(
      ParseOk<ResumeRequest>(R"({"type":"session.resume","resume_token":"t"})").client_ref);
}

TEST(ProtocolParseTest, EndAndPing) {
  EXPECT_EQ(ParseOk<EndRequest>(R"({"type":"session.end","session":12})").session, 12u);
  EXPECT_EQ(ParseOk<PingRequest>(R"({"type":"ping","nonce":1712345678901})").nonce,
            1712345678901.0);
  EXPECT_EQ(ParseOk<PingRequest>(R"({"type":"ping","nonce":0.25})").nonce, 0.25);
  EXPECT_FALSE(ParseOk<PingRequest>(R"({"type":"ping"})").nonce.has_value());
}

TEST(ProtocolParseTest, VocabularyCheck) {
  ServerCaps caps;
  caps.vocab_size = 100;
  EXPECT_EQ(std::get<TokenIds>(
                ParseOk<FrameRequest>(R"({"type":"frame","session":1,"ids":[0,99]})", caps).input),
            (TokenIds{0, 99}));
  const ProtocolError e = ParseError(R"({"type":"frame","session":1,"ids":[0,100]})", caps);
  EXPECT_EQ(e.code, ErrorCode::kTokenOutOfRange);
  EXPECT_EQ(e.message, "frame: ids[1] = 100 must be in [0, 100)");
  // Without a vocabulary only the sign is checked.
  EXPECT_EQ(std::get<TokenIds>(
                ParseOk<FrameRequest>(R"({"type":"frame","session":1,"ids":[100]})").input),
            (TokenIds{100}));
}

// One bad input and what must come back: the code, and pieces the message must contain (the
// field and the value).
struct BadInput {
  std::string name;
  std::string text;
  ErrorCode code;
  std::vector<std::string> contains;
  ServerCaps caps = {};
};

ServerCaps With(void (*edit)(ServerCaps&)) {
  ServerCaps caps;
  edit(caps);
  return caps;
}

std::string Start(const std::string& extra) {
  return R"({"type":"session.start","period_ms":80,"tokens_per_frame":1)" +
         (extra.empty() ? std::string() : "," + extra) + "}";
}

std::string Frame(const std::string& extra) {
  return R"({"type":"frame","session":5,)" + extra + "}";
}

std::vector<BadInput> BadInputs() {
  const std::string long_ref(65, 'r');
  return {
      // bad_json
      {"not_json", "{", ErrorCode::kBadJson, {"not JSON", "column"}},
      {"empty", "", ErrorCode::kBadJson, {"not JSON"}},
      {"trailing", R"({"type":"ping"} x)", ErrorCode::kBadJson, {"not JSON"}},
      // nlohmann's lexer reads a NUL as the end of the input: without the check these three
      // parse as {"type":"ping"}.
      {"nul_then_garbage",
       std::string("{\"type\":\"ping\"}\0garbage", 23),
       ErrorCode::kBadJson,
       {"NUL byte at byte 15"}},
      {"trailing_nul",
       std::string("{\"type\":\"ping\"}\0", 16),
       ErrorCode::kBadJson,
       {"NUL byte at byte 15"}},
      {"nul_before_value",
       std::string("\0{\"type\":\"ping\"}", 16),
       ErrorCode::kBadJson,
       {"NUL byte at byte 0"}},
      {"raw_nul_in_string",
       std::string("{\"type\":\"ping\",\"x\":\"a\0b\"}", 25),
       ErrorCode::kBadJson,
       {"NUL byte at byte 21"}},
      {"trailing_second_value",
       R"({"type":"ping"}{"type":"ping"})",
       ErrorCode::kBadJson,
       {"not JSON"}},
      {"array", "[1,2]", ErrorCode::kBadJson, {"must be a JSON object", "an array of 2"}},
      {"string", R"("ping")", ErrorCode::kBadJson, {"must be a JSON object", R"("ping")"}},
      {"bad_utf8",
       "{\"type\":\"frame\",\"session\":1,\"text\":\"a\xff\"}",
       ErrorCode::kBadJson,
       {"not valid UTF-8", "byte 37"}},
      {"overlong_utf8",
       "{\"type\":\"frame\",\"session\":1,\"text\":\"\xc0\xaf\"}",
       ErrorCode::kBadJson,
       {"not valid UTF-8"}},
      {"surrogate_utf8",
       "{\"type\":\"frame\",\"session\":1,\"text\":\"\xed\xa0\x80\"}",
       ErrorCode::kBadJson,
       {"not valid UTF-8"}},
      {"lone_surrogate_escape",
       R"({"type":"frame","session":1,"text":"\ud800"})",
       ErrorCode::kBadJson,
       {"not JSON", "surrogate"}},
      {"number_overflow",
       R"({"type":"ping","nonce":1e999})",
       ErrorCode::kBadJson,
       {"not JSON", "1e999"}},
      {"duplicate_key",
       R"({"type":"ping","type":"frame"})",
       ErrorCode::kBadJson,
       {"duplicate key \"type\""}},
      {"duplicate_nested_key",
       Start(R"("kv":{"window":8,"window":9})"),
       ErrorCode::kBadJson,
       {"duplicate key \"window\""}},
      {"too_deep",
       R"({"type":"ping","x":)" + std::string(16, '[') + std::string(16, ']') + "}",
       ErrorCode::kBadJson,
       {"nesting deeper than 16"}},
      // too_large
      {"too_large",
       R"({"type":"ping"})",
       ErrorCode::kTooLarge,
       {"15 bytes", "max_message_bytes = 10"},
       With([](ServerCaps& c) { c.max_message_bytes = 10; })},
      // unknown_type
      {"unknown_type",
       R"({"type":"sesion.start"})",
       ErrorCode::kUnknownType,
       {"type = \"sesion.start\"", "session.start, frame"}},
      // unknown_field
      {"unknown_top_field",
       Start(R"("token_per_frame":1)"),
       ErrorCode::kUnknownField,
       {"session.start: unknown field \"token_per_frame\"", "tokens_per_frame"}},
      {"unknown_kv_field",
       Start(R"("kv":{"windw":8})"),
       ErrorCode::kUnknownField,
       {"unknown field \"kv.windw\"", "(fields: policy, window, sinks, positions)"}},
      {"unknown_prompt_field",
       Start(R"("prompt":{"tokens":[1]})"),
       ErrorCode::kUnknownField,
       {"unknown field \"prompt.tokens\""}},
      {"unknown_frame_field",
       Frame(R"("idx":1,"ids":[1])"),
       ErrorCode::kUnknownField,
       {"frame: unknown field \"idx\""}},
      {"unknown_end_field",
       R"({"type":"session.end","session":1,"why":"bye"})",
       ErrorCode::kUnknownField,
       {"session.end: unknown field \"why\""}},
      {"unknown_resume_field",
       R"({"type":"session.resume","resume_token":"t","session":1})",
       ErrorCode::kUnknownField,
       {"session.resume: unknown field \"session\""}},
      {"resume_no_token",
       R"({"type":"session.resume"})",
       ErrorCode::kMissingField,
       {"session.resume: resume_token is required"}},
      {"resume_empty_token",
       R"({"type":"session.resume","resume_token":""})",
       ErrorCode::kBadField,
       {"session.resume: resume_token = \"\" must have 1 to 1024 bytes"}},
      {"resume_token_not_string",
       R"({"type":"session.resume","resume_token":5})",
       ErrorCode::kBadField,
       {"session.resume: resume_token = 5 must be a string"}},
      {"unknown_ping_field",
       R"({"type":"ping","id":1})",
       ErrorCode::kUnknownField,
       {"ping: unknown field \"id\""}},
      // missing_field
      {"no_type", R"({"session":1})", ErrorCode::kMissingField, {"type is required"}},
      {"no_period",
       R"({"type":"session.start","tokens_per_frame":1})",
       ErrorCode::kMissingField,
       {"session.start: period_ms is required"}},
      {"no_tokens",
       R"({"type":"session.start","period_ms":80})",
       ErrorCode::kMissingField,
       {"session.start: tokens_per_frame is required"}},
      {"prompt_empty_object",
       Start(R"("prompt":{})"),
       ErrorCode::kMissingField,
       {"prompt.ids or prompt.text is required"}},
      {"frame_no_session",
       R"({"type":"frame","ids":[1]})",
       ErrorCode::kMissingField,
       {"frame: session is required"}},
      {"frame_no_input",
       R"({"type":"frame","session":5})",
       ErrorCode::kMissingField,
       {"frame: ids or text is required"}},
      {"end_no_session",
       R"({"type":"session.end"})",
       ErrorCode::kMissingField,
       {"session.end: session is required"}},
      // bad_field
      {"type_not_string", R"({"type":5})", ErrorCode::kBadField, {"type = 5 must be a string"}},
      {"period_string",
       R"({"type":"session.start","period_ms":"80","tokens_per_frame":1})",
       ErrorCode::kBadField,
       {"period_ms = \"80\" must be a number"}},
      {"period_zero",
       R"({"type":"session.start","period_ms":0,"tokens_per_frame":1})",
       ErrorCode::kBadField,
       {"period_ms = 0 must be > 0"}},
      {"period_negative",
       R"({"type":"session.start","period_ms":-80,"tokens_per_frame":1})",
       ErrorCode::kBadField,
       {"period_ms = -80 must be > 0"}},
      {"deadline_zero",
       Start(R"("deadline_ms":0)"),
       ErrorCode::kBadField,
       {"deadline_ms = 0 must be > 0"}},
      {"deadline_bool",
       Start(R"("deadline_ms":true)"),
       ErrorCode::kBadField,
       {"deadline_ms = true must be a number"}},
      {"tokens_fraction",
       R"({"type":"session.start","period_ms":80,"tokens_per_frame":1.5})",
       ErrorCode::kBadField,
       {"tokens_per_frame = 1.5 must be an integer"}},
      {"tokens_zero",
       R"({"type":"session.start","period_ms":80,"tokens_per_frame":0})",
       ErrorCode::kBadField,
       {"tokens_per_frame = 0 must be in [1, 4096]"}},
      {"tokens_int32_range",
       R"({"type":"session.start","period_ms":80,"tokens_per_frame":3000000000})",
       ErrorCode::kBadField,
       {"tokens_per_frame = 3000000000 is outside the int32 range"}},
      {"tokens_huge_float",
       R"({"type":"session.start","period_ms":80,"tokens_per_frame":1e300})",
       ErrorCode::kBadField,
       {"tokens_per_frame = 1e+300 is not an exact integer"}},
      {"tokens_null",
       R"({"type":"session.start","period_ms":80,"tokens_per_frame":null})",
       ErrorCode::kBadField,
       {"tokens_per_frame = null must be an integer"}},
      {"outputs_negative",
       Start(R"("output_tokens_per_frame":-1)"),
       ErrorCode::kBadField,
       {"output_tokens_per_frame = -1 must be in [0, 256]"}},
      {"kv_not_object",
       Start(R"("kv":"window")"),
       ErrorCode::kBadField,
       {"kv = \"window\" must be an object"}},
      {"kv_policy",
       Start(R"("kv":{"policy":"fulll"})"),
       ErrorCode::kBadField,
       {"kv.policy = \"fulll\" must be \"full\" or \"window\""}},
      {"kv_window_zero",
       Start(R"("kv":{"window":0})"),
       ErrorCode::kBadField,
       {"session.start: kv.window = 0 must be in [1, 65536]"}},
      {"kv_sinks_negative",
       Start(R"("kv":{"sinks":-4})"),
       ErrorCode::kBadField,
       {"kv.sinks = -4 must be in [0, 1024]"}},
      {"kv_positions",
       Start(R"("kv":{"positions":"relative"})"),
       ErrorCode::kBadField,
       {"kv.positions = \"relative\" must be \"absolute\" or \"rolling\""}},
      {"kv_window_with_full",
       Start(R"("kv":{"policy":"full","window":8})"),
       ErrorCode::kBadField,
       {"kv.window needs kv.policy \"window\""}},
      {"kv_sinks_with_full",
       Start(R"("kv":{"policy":"full","sinks":4})"),
       ErrorCode::kBadField,
       {"kv.sinks needs kv.policy \"window\""}},
      {"kv_rolling_with_full",
       Start(R"("kv":{"policy":"full","positions":"rolling"})"),
       ErrorCode::kBadField,
       {"kv.positions = \"rolling\" needs kv.policy \"window\""}},
      {"client_ref_long",
       Start(R"("client_ref":")" + long_ref + R"(")"),
       ErrorCode::kBadField,
       {"client_ref = \"rrrr", "(65 bytes) must have at most 64 bytes"}},
      {"client_ref_number",
       Start(R"("client_ref":7)"),
       ErrorCode::kBadField,
       {"client_ref = 7 must be a string"}},
      {"prompt_not_object",
       Start(R"("prompt":[1,2])"),
       ErrorCode::kBadField,
       {"prompt = an array of 2 must be an object"}},
      {"prompt_both",
       Start(R"("prompt":{"ids":[1],"text":"a"})"),
       ErrorCode::kBadField,
       {"prompt.ids and prompt.text are exclusive"}},
      {"frame_both",
       Frame(R"("ids":[1],"text":"a")"),
       ErrorCode::kBadField,
       {"frame: ids and text are exclusive"}},
      {"session_negative",
       R"({"type":"frame","session":-1,"ids":[1]})",
       ErrorCode::kBadField,
       {"session = -1 must be >= 0"}},
      {"session_string",
       R"({"type":"session.end","session":"1"})",
       ErrorCode::kBadField,
       {"session = \"1\" must be an integer"}},
      {"session_fraction",
       R"({"type":"session.end","session":1.5})",
       ErrorCode::kBadField,
       {"session = 1.5 must be an integer"}},
      {"session_above_uint64",
       R"({"type":"session.end","session":18446744073709551616})",
       ErrorCode::kBadField,
       {"session = 1.8446744073709552e+19 is not an exact integer"}},
      {"index_negative",
       Frame(R"("index":-1,"ids":[1])"),
       ErrorCode::kBadField,
       {"frame: index = -1 must be >= 0"}},
      {"index_above_int64",
       Frame(R"("index":9223372036854775808,"ids":[1])"),
       ErrorCode::kBadField,
       {"index = 9223372036854775808 is outside the int64 range"}},
      {"ids_empty",
       Frame(R"("ids":[])"),
       ErrorCode::kBadField,
       {"frame: ids has 0 entries, must have 1 to 4096"}},
      {"ids_not_array",
       Frame(R"("ids":7)"),
       ErrorCode::kBadField,
       {"ids = 7 must be an array of ids"}},
      {"ids_fraction",
       Frame(R"("ids":[1,2.5])"),
       ErrorCode::kBadField,
       {"ids[1] = 2.5 must be an integer"}},
      {"ids_int32_range",
       Frame(R"("ids":[2147483648])"),
       ErrorCode::kBadField,
       {"ids[0] = 2147483648 is outside the int32 range"}},
      {"ids_nested",
       Frame(R"("ids":[[1]])"),
       ErrorCode::kBadField,
       {"ids[0] = an array of 1 must be an integer"}},
      {"text_empty",
       Frame(R"("text":"")"),
       ErrorCode::kBadField,
       {"frame: text = \"\" must not be empty"}},
      {"text_number", Frame(R"("text":5)"), ErrorCode::kBadField, {"text = 5 must be a string"}},
      {"nonce_string",
       R"({"type":"ping","nonce":"abc"})",
       ErrorCode::kBadField,
       {"ping: nonce = \"abc\" must be a number"}},
      // over_cap
      {"period_below_cap",
       R"({"type":"session.start","period_ms":5,"tokens_per_frame":1})",
       ErrorCode::kOverCap,
       {"period_ms = 5 must be in [10, 10000]", "min_period_ms"}},
      {"period_above_cap",
       R"({"type":"session.start","period_ms":20000,"tokens_per_frame":1})",
       ErrorCode::kOverCap,
       {"period_ms = 20000 must be in [10, 10000]", "max_period_ms"}},
      {"deadline_above_cap",
       Start(R"("deadline_ms":10000.5)"),
       ErrorCode::kOverCap,
       {"deadline_ms = 10000.5 must be in (0, 10000]", "max_period_ms"}},
      {"tokens_above_cap",
       R"({"type":"session.start","period_ms":80,"tokens_per_frame":4097})",
       ErrorCode::kOverCap,
       {"tokens_per_frame = 4097 must be in [1, 4096]", "max_tokens_per_frame"}},
      {"outputs_above_cap",
       Start(R"("output_tokens_per_frame":300)"),
       ErrorCode::kOverCap,
       {"output_tokens_per_frame = 300 must be in [0, 256]", "max_output_tokens_per_frame"}},
      {"window_above_cap",
       Start(R"("kv":{"window":65537})"),
       ErrorCode::kOverCap,
       {"kv.window = 65537 must be in [1, 65536]", "max_window"}},
      {"window_above_small_cap",
       Start(R"("kv":{"window":9000})"),
       ErrorCode::kOverCap,
       {"session.start: kv.window = 9000 must be in [1, 8192] (server cap max_window)"},
       With([](ServerCaps& c) { c.max_window = 8192; })},
      {"sinks_above_cap",
       Start(R"("kv":{"sinks":2000})"),
       ErrorCode::kOverCap,
       {"kv.sinks = 2000 must be in [0, 1024]", "max_sinks"}},
      {"full_kv_disallowed",
       Start(R"("kv":{"policy":"full"})"),
       ErrorCode::kOverCap,
       {"kv.policy = \"full\" is disabled", "allow_full_kv"},
       With([](ServerCaps& c) { c.allow_full_kv = false; })},
      {"prompt_ids_above_cap",
       Start(R"("prompt":{"ids":[1,2,3,4]})"),
       ErrorCode::kOverCap,
       {"prompt.ids has 4 entries, must have 0 to 3", "max_prompt_tokens"},
       With([](ServerCaps& c) { c.max_prompt_tokens = 3; })},
      {"prompt_text_above_cap",
       Start(R"("prompt":{"text":"abcdef"})"),
       ErrorCode::kOverCap,
       {"prompt.text has 6 bytes, must have at most 5", "max_text_bytes"},
       With([](ServerCaps& c) { c.max_text_bytes = 5; })},
      {"frame_ids_above_cap",
       Frame(R"("ids":[1,2,3])"),
       ErrorCode::kOverCap,
       {"frame: ids has 3 entries, must have 1 to 2", "max_tokens_per_frame"},
       With([](ServerCaps& c) { c.max_tokens_per_frame = 2; })},
      {"frame_text_above_cap",
       Frame(R"("text":"abcdef")"),
       ErrorCode::kOverCap,
       {"frame: text has 6 bytes, must have at most 5"},
       With([](ServerCaps& c) { c.max_text_bytes = 5; })},
      // token_out_of_range
      {"negative_id",
       Frame(R"("ids":[3,-1])"),
       ErrorCode::kTokenOutOfRange,
       {"frame: ids[1] = -1 must be >= 0"}},
      {"prompt_id_above_vocab",
       Start(R"("prompt":{"ids":[1,32000]})"),
       ErrorCode::kTokenOutOfRange,
       {"prompt.ids[1] = 32000 must be in [0, 32000)"},
       With([](ServerCaps& c) { c.vocab_size = 32000; })},
  };
}

TEST(ProtocolParseTest, EveryBadInputGetsItsCodeAndAMessageNamingFieldAndValue) {
  std::set<ErrorCode> produced;
  for (const BadInput& bad : BadInputs()) {
    SCOPED_TRACE(bad.name);
    const ProtocolError e = ParseError(bad.text, bad.caps);
    EXPECT_EQ(ToString(e.code), ToString(bad.code)) << e.message;
    for (const std::string& piece : bad.contains) {
      EXPECT_NE(e.message.find(piece), std::string::npos)
          << "message: " << e.message << "\nmissing: " << piece;
    }
    produced.insert(e.code);
  }
  // Every code the parser can know about has an input above that produces it.
  for (const ErrorCode code :
       {ErrorCode::kBadJson, ErrorCode::kTooLarge, ErrorCode::kUnknownType,
        ErrorCode::kUnknownField, ErrorCode::kMissingField, ErrorCode::kBadField,
        ErrorCode::kOverCap, ErrorCode::kTokenOutOfRange}) {
    EXPECT_TRUE(produced.count(code) == 1) << ToString(code);
  }
}

TEST(ProtocolParseTest, ErrorsCarryTheSessionFrameAndClientRefReadBeforeThem) {
  const ProtocolError frame = ParseError(Frame(R"("index":41,"ids":[1,-2])"));
  EXPECT_EQ(frame.session, 5u);
  EXPECT_EQ(frame.frame, 41);
  EXPECT_FALSE(frame.client_ref.has_value());

  const ProtocolError start = ParseError(Start(R"("client_ref":"abc","kv":{"window":0})"));
  EXPECT_EQ(start.client_ref, "abc");
  EXPECT_FALSE(start.session.has_value());

  const ProtocolError end = ParseError(R"({"type":"session.end","session":9,"x":1})");
  EXPECT_FALSE(end.session.has_value());  // unknown fields are checked first
  const ProtocolError syntax = ParseError("{");
  EXPECT_FALSE(syntax.session.has_value());
}

TEST(ProtocolParseTest, NestingUpToTheLimitIsNotABadJsonError) {
  // 16 levels including the message object: accepted by the JSON layer, then rejected as an
  // unknown field.
  const std::string deep =
      R"({"type":"ping","x":)" + std::string(15, '[') + std::string(15, ']') + "}";
  EXPECT_EQ(ParseError(deep).code, ErrorCode::kUnknownField);
}

TEST(ProtocolParseTest, LongValuesAreCutInErrorMessages) {
  const ProtocolError e = ParseError(Frame(R"("ids":")" + std::string(100000, 'b') + R"(")"));
  EXPECT_EQ(e.code, ErrorCode::kBadField);
  EXPECT_LT(e.message.size(), 200u) << e.message;
  EXPECT_NE(e.message.find("(100000 bytes)"), std::string::npos) << e.message;
  // A cut never splits a UTF-8 character (the message stays valid UTF-8).
  std::string multibyte;
  for (int i = 0; i < 30; ++i) multibyte += "\xc3\xbc";  // ü
  const ProtocolError u = ParseError(Frame(R"("ids":")" + multibyte + R"(")"));
  std::string dumped;
  EXPECT_NO_THROW(dumped = Json(u.message).dump()) << u.message;  // strict: throws on bad UTF-8
  EXPECT_EQ(Json::parse(ErrorMessage{u}.Serialize())["message"], u.message);
}

TEST(ProtocolParseTest, MutatedMessagesNeverCrash) {
  // A cheap, deterministic stand-in for the fuzzer in every test run.
  const std::vector<std::string> seeds = {
      Start(R"("deadline_ms":100,"kv":{"policy":"window","window":64,"sinks":4,)"
            R"("positions":"rolling"},"prompt":{"ids":[1,2]},"client_ref":"x")"),
      Frame(R"("index":1,"ids":[1,2,3])"), Frame(R"("text":"hi")"),
      R"({"type":"session.end","session":5})", R"({"type":"ping","nonce":1})"};
  ServerCaps caps;
  caps.vocab_size = 50;
  std::mt19937 rng(7);
  int parsed = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string text = seeds[rng() % seeds.size()];
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < edits && !text.empty(); ++k) {
      const std::size_t at = rng() % text.size();
      switch (rng() % 3) {
        case 0:
          text[at] = static_cast<char>(rng() % 256);
          break;
        case 1:
          text.erase(at, 1 + rng() % 8);
          break;
        default:
          text.insert(at, 1, "{}[]\",:0-9e.\\"[rng() % 14]);
          break;
      }
    }
    const auto r = ParseClientMessage(text, caps);
    if (std::holds_alternative<ClientMessage>(r)) ++parsed;
  }
  EXPECT_GT(parsed, 0);
}

// ---------------------------------------------------------------------------------------------
// Binary frames

std::vector<std::byte> Bytes(std::initializer_list<int> values) {
  std::vector<std::byte> out;
  for (const int v : values) out.push_back(static_cast<std::byte>(v));
  return out;
}

ProtocolError BinaryError(const std::vector<std::byte>& bytes, const ServerCaps& caps = {}) {
  const auto r = ParseBinaryFrame(bytes, caps);
  const auto* e = std::get_if<ProtocolError>(&r);
  if (e == nullptr) {
    ADD_FAILURE() << "expected an error";
    return {};
  }
  return *e;
}

FrameRequest IdsFrame(std::uint64_t session, std::optional<std::int64_t> index, TokenIds ids) {
  FrameRequest f;
  f.session = session;
  f.index = index;
  f.input = std::move(ids);
  return f;
}

TEST(ProtocolBinaryTest, LayoutIsTheDocumentedLittleEndianOne) {
  const auto bytes = EncodeBinaryFrame(IdsFrame(0x0102030405060708ULL, 3, {1, 0x7fffffff}));
  const auto expected = Bytes({'M',  1,    0,    0,                               // magic, version
                               0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,    // session
                               3,    0,    0,    0,    0,    0,    0,    0,       // index
                               2,    0,    0,    0,                               // count
                               1,    0,    0,    0,    0xff, 0xff, 0xff, 0x7f});  // ids
  EXPECT_EQ(bytes, expected);
  EXPECT_EQ(bytes.size(), kBinaryFrameHeaderBytes + 8);
  // No index: -1.
  const auto none = EncodeBinaryFrame(IdsFrame(1, std::nullopt, {5}));
  for (std::size_t i = 12; i < 20; ++i) EXPECT_EQ(none[i], std::byte{0xff});
}

TEST(ProtocolBinaryTest, RoundTripMatchesTheJsonFrame) {
  ServerCaps caps;
  caps.vocab_size = 1 << 20;
  for (const auto& index :
       {std::optional<std::int64_t>(), std::optional<std::int64_t>(0),
        std::optional<std::int64_t>(std::numeric_limits<std::int64_t>::max())}) {
    const FrameRequest in =
        IdsFrame(std::numeric_limits<std::uint64_t>::max(), index, {0, 1, 2, (1 << 20) - 1});
    const auto r = ParseBinaryFrame(EncodeBinaryFrame(in), caps);
    ASSERT_TRUE(std::holds_alternative<FrameRequest>(r)) << std::get<ProtocolError>(r).message;
    const auto& out = std::get<FrameRequest>(r);
    EXPECT_EQ(out.session, in.session);
    EXPECT_EQ(out.index, in.index);
    EXPECT_EQ(std::get<TokenIds>(out.input), std::get<TokenIds>(in.input));
  }
  const auto json = ParseOk<FrameRequest>(R"({"type":"frame","session":9,"index":4,"ids":[7,8]})");
  const auto binary = ParseBinaryFrame(EncodeBinaryFrame(IdsFrame(9, 4, {7, 8})), caps);
  const auto& b = std::get<FrameRequest>(binary);
  EXPECT_EQ(b.session, json.session);
  EXPECT_EQ(b.index, json.index);
  EXPECT_EQ(std::get<TokenIds>(b.input), std::get<TokenIds>(json.input));
}

TEST(ProtocolBinaryTest, EveryTruncationIsAnError) {
  const auto full = EncodeBinaryFrame(IdsFrame(3, 1, {1, 2, 3, 4, 5}));
  for (std::size_t n = 0; n < full.size(); ++n) {
    SCOPED_TRACE(n);
    const std::vector<std::byte> cut(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
    const ProtocolError e = BinaryError(cut);
    EXPECT_EQ(e.code, ErrorCode::kBadField);
    if (n < kBinaryFrameHeaderBytes) {
      EXPECT_NE(e.message.find("shorter than the 24-byte header"), std::string::npos) << e.message;
    } else {
      EXPECT_NE(e.message.find("count = 5 needs 20 bytes of ids"), std::string::npos) << e.message;
      EXPECT_EQ(e.session, 3u);
      EXPECT_EQ(e.frame, 1);
    }
  }
  // Extra bytes after the ids are an error too.
  auto longer = full;
  longer.push_back(std::byte{0});
  EXPECT_NE(BinaryError(longer).message.find("count = 5 needs 20 bytes of ids, 21 present"),
            std::string::npos);
}

TEST(ProtocolBinaryTest, HeaderFieldsAreChecked) {
  const auto good = EncodeBinaryFrame(IdsFrame(3, 1, {1, 2}));
  auto magic = good;
  magic[0] = std::byte{'N'};
  EXPECT_EQ(BinaryError(magic).message, "binary frame: magic = 0x4e must be 0x4d ('M')");
  auto version = good;
  version[1] = std::byte{2};
  EXPECT_EQ(BinaryError(version).message, "binary frame: version = 2 is not supported (1)");
  auto reserved = good;
  reserved[3] = std::byte{1};
  EXPECT_EQ(BinaryError(reserved).message, "binary frame: reserved = 256 must be 0");
  auto index = good;
  index[12] = std::byte{0xfe};  // -2
  for (std::size_t i = 13; i < 20; ++i) index[i] = std::byte{0xff};
  EXPECT_EQ(BinaryError(index).message, "binary frame: index = -2 must be >= 0, or -1: none");

  // A count far beyond the bytes present.
  auto count = good;
  count[20] = std::byte{0xff};
  count[21] = std::byte{0xff};
  count[22] = std::byte{0xff};
  count[23] = std::byte{0xff};
  const ProtocolError big = BinaryError(count);
  EXPECT_EQ(big.code, ErrorCode::kBadField);
  EXPECT_EQ(big.message,
            "binary frame: count = 4294967295 needs 17179869180 bytes of ids, 8 present");

  const ProtocolError zero = BinaryError(EncodeBinaryFrame(IdsFrame(3, 1, {})));
  EXPECT_EQ(zero.code, ErrorCode::kBadField);
  EXPECT_EQ(zero.message, "binary frame: count = 0 must be in [1, 4096]");

  ServerCaps caps;
  caps.max_tokens_per_frame = 1;
  const ProtocolError over = BinaryError(good, caps);
  EXPECT_EQ(over.code, ErrorCode::kOverCap);
  EXPECT_NE(over.message.find("max_tokens_per_frame"), std::string::npos);

  caps = {};
  caps.max_message_bytes = 16;
  EXPECT_EQ(BinaryError(good, caps).code, ErrorCode::kTooLarge);
}

TEST(ProtocolBinaryTest, IdsAreCheckedAgainstTheVocabulary) {
  ServerCaps caps;
  caps.vocab_size = 10;
  const ProtocolError e = BinaryError(EncodeBinaryFrame(IdsFrame(3, std::nullopt, {9, 10})), caps);
  EXPECT_EQ(e.code, ErrorCode::kTokenOutOfRange);
  EXPECT_EQ(e.message, "binary frame: ids[1] = 10 must be in [0, 10)");
  EXPECT_EQ(e.session, 3u);
  EXPECT_FALSE(e.frame.has_value());
  const ProtocolError negative = BinaryError(EncodeBinaryFrame(IdsFrame(3, 0, {-5})));
  EXPECT_EQ(negative.code, ErrorCode::kTokenOutOfRange);
  EXPECT_EQ(negative.message, "binary frame: ids[0] = -5 must be >= 0");
}

TEST(ProtocolBinaryTest, RandomBytesNeverCrash) {
  std::mt19937 rng(11);
  const auto good = EncodeBinaryFrame(IdsFrame(3, 1, {1, 2, 3}));
  for (int i = 0; i < 20000; ++i) {
    std::vector<std::byte> bytes = good;
    bytes.resize(rng() % 48);
    for (int k = 0; k < 3 && !bytes.empty(); ++k) {
      bytes[rng() % bytes.size()] = static_cast<std::byte>(rng() % 256);
    }
    (void)ParseBinaryFrame(bytes, ServerCaps{});
  }
}

// ---------------------------------------------------------------------------------------------
// Server messages

std::set<std::string> Keys(const Json& j) {
  std::set<std::string> keys;
  for (const auto& [key, value] : j.items()) keys.insert(key);
  return keys;
}

Json ParseServer(const std::string& text) {
  // "type" first, so a client can dispatch on a prefix if it wants.
  EXPECT_EQ(text.rfind(R"({"type":)", 0), 0u) << text;
  return Json::parse(text);
}

TEST(ProtocolServerMessageTest, SessionStarted) {
  SessionStarted m;
  m.session = 42;
  m.client_ref = "call-7";
  m.period_ms = 80;
  m.deadline_ms = 80;
  m.tokens_per_frame = 1;
  m.output_tokens_per_frame = 1;
  m.kv = {.policy = KvPolicyKind::kWindow,
          .window = 1000,
          .sinks = 4,
          .positions = KvPositions::kRolling};
  m.max_context = std::nullopt;
  const Json j = ParseServer(m.Serialize());
  EXPECT_EQ(Keys(j), (std::set<std::string>{"type", "session", "client_ref", "period_ms",
                                            "deadline_ms", "tokens_per_frame",
                                            "output_tokens_per_frame", "kv", "max_context"}));
  EXPECT_EQ(j["type"], "session.started");
  EXPECT_EQ(j["session"], 42);
  EXPECT_EQ(j["client_ref"], "call-7");
  EXPECT_EQ(j["period_ms"], 80.0);
  EXPECT_EQ(j["deadline_ms"], 80.0);
  EXPECT_EQ(j["tokens_per_frame"], 1);
  EXPECT_EQ(j["output_tokens_per_frame"], 1);
  EXPECT_EQ(j["kv"],
            Json::parse(R"({"policy":"window","window":1000,"sinks":4,"positions":"rolling"})"));
  EXPECT_TRUE(j["max_context"].is_null());

  m.client_ref.reset();
  m.kv = {
      .policy = KvPolicyKind::kFull, .window = 0, .sinks = 0, .positions = KvPositions::kAbsolute};
  m.max_context = 4096;
  const Json full = ParseServer(m.Serialize());
  EXPECT_FALSE(full.contains("client_ref"));
  EXPECT_EQ(full["kv"], Json::parse(R"({"policy":"full","positions":"absolute"})"));
  EXPECT_EQ(full["max_context"], 4096);
  EXPECT_FALSE(full.contains("replica"));
  m.replica = "host-a:8080";
  EXPECT_EQ(ParseServer(m.Serialize())["replica"], "host-a:8080");
}

TEST(ProtocolServerMessageTest, SessionRejected) {
  const SessionRejected m{.client_ref = "r1",
                          .reason = "limit",
                          .detail = "active 230 = limit 230",
                          .retry_after_ms = 2000};
  const Json j = ParseServer(m.Serialize());
  EXPECT_EQ(Keys(j),
            (std::set<std::string>{"type", "client_ref", "reason", "detail", "retry_after_ms"}));
  EXPECT_EQ(j["type"], "session.rejected");
  EXPECT_EQ(j["reason"], "limit");
  EXPECT_EQ(j["detail"], "active 230 = limit 230");
  EXPECT_EQ(j["retry_after_ms"], 2000.0);
  SessionRejected anonymous = m;
  anonymous.client_ref.reset();
  EXPECT_FALSE(ParseServer(anonymous.Serialize()).contains("client_ref"));
}

TEST(ProtocolServerMessageTest, FrameResult) {
  FrameResult m{.session = 42,
                .frame = 17,
                .ids = {5, 6},
                .text = std::nullopt,
                .latency_ms = 12.5,
                .outcome = FrameOutcome::kLate};
  Json j = ParseServer(m.Serialize());
  EXPECT_EQ(Keys(j),
            (std::set<std::string>{"type", "session", "frame", "ids", "latency_ms", "outcome"}));
  EXPECT_EQ(j["type"], "frame.result");
  EXPECT_EQ(j["session"], 42);
  EXPECT_EQ(j["frame"], 17);
  EXPECT_EQ(j["ids"], Json::parse("[5,6]"));
  EXPECT_EQ(j["latency_ms"], 12.5);
  EXPECT_EQ(j["outcome"], "late");

  m.ids.clear();
  m.text = "";
  m.outcome = FrameOutcome::kStarved;
  m.latency_ms = std::numeric_limits<double>::quiet_NaN();
  j = ParseServer(m.Serialize());
  EXPECT_EQ(j["ids"], Json::array());
  EXPECT_EQ(j["text"], "");
  EXPECT_EQ(j["outcome"], "starved");
  EXPECT_TRUE(j["latency_ms"].is_null());  // never invalid JSON

  // Text that is not valid UTF-8 (a character split by the tokenizer) is replaced, not thrown.
  m.text = "ok\xe2\x82";
  j = ParseServer(m.Serialize());
  EXPECT_EQ(j["text"], "ok\xef\xbf\xbd");
  EXPECT_EQ(ToString(FrameOutcome::kOk), "ok");
  EXPECT_EQ(ToString(FrameOutcome::kShort), "short");
}

TEST(ProtocolServerMessageTest, SessionEndedAlarmPong) {
  const Json ended = ParseServer(
      SessionEnded{.session = 3, .reason = EndReason::kContextFull, .frames = 99}.Serialize());
  EXPECT_EQ(Keys(ended), (std::set<std::string>{"type", "session", "reason", "frames"}));
  EXPECT_EQ(ended["type"], "session.ended");
  EXPECT_EQ(ended["reason"], "context_full");
  EXPECT_EQ(ended["frames"], 99);
  EXPECT_EQ(ToString(EndReason::kClient), "client");
  EXPECT_EQ(ToString(EndReason::kServerShutdown), "server_shutdown");
  EXPECT_EQ(ToString(EndReason::kDisconnect), "disconnect");
  EXPECT_EQ(ToString(EndReason::kError), "error");
  EXPECT_EQ(ToString(EndReason::kIdle), "idle");
  EXPECT_EQ(ToString(EndReason::kNonFiniteLogits), "nonfinite_logits");

  const Json alarm = ParseServer(
      Alarm{.session = 3, .kind = "mute", .detail = "3 starved frames in a row"}.Serialize());
  EXPECT_EQ(Keys(alarm), (std::set<std::string>{"type", "session", "kind", "detail"}));
  EXPECT_EQ(alarm["type"], "alarm");
  EXPECT_EQ(alarm["kind"], "mute");

  const std::string pong = Pong{.nonce = 1712345678901.0}.Serialize();
  EXPECT_EQ(pong, R"({"type":"pong","nonce":1712345678901})");  // an integer stays one
  EXPECT_EQ(Pong{.nonce = 0.5}.Serialize(), R"({"type":"pong","nonce":0.5})");
  EXPECT_EQ(Pong{}.Serialize(), R"({"type":"pong"})");
}

TEST(ProtocolServerMessageTest, ErrorMessage) {
  const ProtocolError e = ParseError(Frame(R"("index":2,"ids":[-1])"));
  const Json j = ParseServer(ErrorMessage{e}.Serialize());
  EXPECT_EQ(Keys(j), (std::set<std::string>{"type", "code", "message", "session", "frame"}));
  EXPECT_EQ(j["type"], "error");
  EXPECT_EQ(j["code"], "token_out_of_range");
  EXPECT_EQ(j["message"], "frame: ids[0] = -1 must be >= 0");
  EXPECT_EQ(j["session"], 5);
  EXPECT_EQ(j["frame"], 2);

  ProtocolError server;
  server.code = ErrorCode::kFrameTooEarly;
  server.message = "frame: session 5 already has 2 frames waiting";
  server.session = 5;
  const Json early = ParseServer(ErrorMessage{server}.Serialize());
  EXPECT_EQ(Keys(early), (std::set<std::string>{"type", "code", "message", "session"}));
  EXPECT_EQ(early["code"], "frame_too_early");

  const Json bare = ParseServer(ErrorMessage{ParseError("{")}.Serialize());
  EXPECT_EQ(Keys(bare), (std::set<std::string>{"type", "code", "message"}));
  const Json ref = ParseServer(ErrorMessage{
      ParseError(
          R"({"type":"session.start","client_ref":"r9","period_ms":1,"tokens_per_frame":1})")}
                                   .Serialize());
  EXPECT_EQ(ref["client_ref"], "r9");
}

TEST(ProtocolErrorCodeTest, NamesAreStableSnakeCaseAndRoundTrip) {
  const std::vector<std::string_view> expected = {
      "bad_json",           "too_large",       "unknown_type",      "unknown_field",
      "missing_field",      "bad_field",       "over_cap",          "unknown_session",
      "token_out_of_range", "frame_too_early", "too_many_sessions", "unauthorized",
      "internal",           "session_moving"};
  ASSERT_EQ(expected.size(), static_cast<std::size_t>(kNumErrorCodes));
  for (int i = 0; i < kNumErrorCodes; ++i) {
    const auto code = static_cast<ErrorCode>(i);
    EXPECT_EQ(ToString(code), expected[static_cast<std::size_t>(i)]);
    EXPECT_EQ(ErrorCodeFromString(ToString(code)), code);
  }
  EXPECT_FALSE(ErrorCodeFromString("Bad_Json").has_value());
  EXPECT_FALSE(ErrorCodeFromString("").has_value());
}

// /v1/stats publishes the caps under their field names (here the defaults, but for two); the byte
// limits max_message_bytes and max_text_bytes stay unpublished.
TEST(ServerCapsTest, JsonNamesThePublishedCapsWithTheirValues) {
  ServerCaps caps;
  caps.vocab_size = 512;
  caps.allow_full_kv = false;
  EXPECT_EQ(Json(caps).dump(),
            R"({"allow_full_kv":false,"max_output_tokens_per_frame":256,"max_period_ms":10000.0,)"
            R"("max_prompt_tokens":8192,"max_sinks":1024,"max_tokens_per_frame":4096,)"
            R"("max_window":65536,"min_period_ms":10.0,"vocab_size":512})");
}

}  // namespace
}  // namespace metronome::wire
