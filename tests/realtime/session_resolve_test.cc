#include "metronome/realtime/session_resolve.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "metronome/base/errors.h"

namespace metronome::realtime {
namespace {

// 259 ids: <unk>, BOS = 1, EOS = 2, then the bytes.
model::Vocabulary ByteVocabulary() {
  model::Vocabulary v;
  v.tokens.resize(259);
  v.bos_id = 1;
  v.eos_id = 2;
  return v;
}

// Encodes one id per byte after BOS = 1: the prompt's length is the text's plus one.
class ByteTokenizer : public model::Tokenizer {
 public:
  ByteTokenizer()
      : Tokenizer(ByteVocabulary(),
                  {.kind = "sentencepiece", .ggml_model = "llama", .adds_bos_by_default = true}) {}
  [[nodiscard]] std::vector<TokenId> Encode(std::string_view text, bool add_bos) const override {
    std::vector<TokenId> ids;
    if (add_bos) ids.push_back(1);
    for (const char c : text) ids.push_back(static_cast<unsigned char>(c) + 3);
    return ids;
  }
  [[nodiscard]] std::string DecodeToken(TokenId /*prev*/, TokenId /*id*/) const override {
    return "";
  }
};

SessionDefaults Defaults() {
  SessionDefaults d;
  d.period_ms = 80.0;
  d.tokens_per_frame = 2;
  d.output_tokens_per_frame = 3;
  d.kv_mode = kv::KvMode::kWindow;
  d.window = 256;
  d.sinks = 8;
  d.positions = kv::PositionMode::kRolling;
  d.max_prompt_tokens = 16;
  d.vocab_size = 50;
  return d;
}

SessionSpec Resolve(const SessionShape& shape, const SessionDefaults& d = Defaults(),
                    const model::Tokenizer* tokenizer = nullptr) {
  SessionResolution r = ResolveSession(shape, d, tokenizer);
  if (const auto* e = std::get_if<SessionError>(&r)) {
    ADD_FAILURE() << "unexpected error: " << e->message;
    return {};
  }
  return std::get<SessionSpec>(r);
}

// Every default: an empty shape takes each field from the defaults, and the result is valid.
TEST(SessionResolveTest, AnEmptyShapeTakesEveryDefault) {
  const SessionSpec s = Resolve({});
  EXPECT_EQ(s.period_ms, 80.0);
  EXPECT_EQ(s.deadline_ms, 80.0);  // deadline 0 (the default's): the period
  EXPECT_EQ(s.input_tokens_per_frame, 2);
  EXPECT_EQ(s.output_tokens_per_frame, 3);
  EXPECT_EQ(s.policy.mode, kv::KvMode::kWindow);
  EXPECT_EQ(s.policy.window, 256);
  EXPECT_EQ(s.policy.sinks, 8);
  EXPECT_EQ(s.policy.positions, kv::PositionMode::kRolling);
  EXPECT_TRUE(s.prompt.empty());
  EXPECT_FALSE(s.external_frames);
  EXPECT_NO_THROW(s.Validate());
}

// The serving defaults: the model's trained context capped by the server's max window, 4 sinks,
// rolling positions; an unknown trained context takes the cap.
TEST(SessionResolveTest, ServingDefaultsTakeTheWindowFromTheModelCappedByTheServer) {
  struct Case {
    TokenPos trained_context, max_window, window;
  };
  for (const Case& c : {Case{2048, 4096, 2048}, Case{32768, 4096, 4096}, Case{4096, 4096, 4096},
                        Case{0, 1024, 1024}, Case{512, 64, 64}}) {
    SCOPED_TRACE(std::to_string(c.trained_context) + " capped at " + std::to_string(c.max_window));
    const SessionDefaults d = ServingSessionDefaults(c.trained_context, c.max_window);
    const SessionSpec s = ResolveSessionOrThrow({}, d);
    EXPECT_EQ(s.policy.mode, kv::KvMode::kWindow);
    EXPECT_EQ(s.policy.window, c.window);
    EXPECT_EQ(s.policy.sinks, kDefaultSinkTokens);
    EXPECT_EQ(s.policy.positions, kv::PositionMode::kRolling);
    // The rest of the shape is SessionDefaults'.
    EXPECT_EQ(s.period_ms, SessionDefaults{}.period_ms);
    EXPECT_EQ(s.input_tokens_per_frame, SessionDefaults{}.tokens_per_frame);
  }
  // An explicit request still wins: full KV is one field away.
  SessionShape full;
  full.kv_mode = kv::KvMode::kFull;
  EXPECT_EQ(ResolveSessionOrThrow(full, ServingSessionDefaults(4096, 4096)).policy.mode,
            kv::KvMode::kFull);
  SessionShape narrow;
  narrow.window = 100;
  EXPECT_EQ(ResolveSessionOrThrow(narrow, ServingSessionDefaults(4096, 4096)).policy.window, 100);
}

// Overriding a tool's defaults with a shape is resolving that shape against them: each field the
// shape sets wins, the others keep the defaults' values (the same fields, so the same spec).
TEST(SessionResolveTest, OverridingTheDefaultsWithAShapeIsResolvingTheShape) {
  const auto shape = [](const std::function<void(SessionShape&)>& set) {
    SessionShape s;
    set(s);
    return s;
  };
  const std::vector<SessionShape> shapes = {
      {},
      shape([](SessionShape& s) { s.period_ms = 40.0; }),
      shape([](SessionShape& s) { s.deadline_ms = 120.5; }),
      shape([](SessionShape& s) { s.deadline_ms = 0.0; }),
      shape([](SessionShape& s) { s.tokens_per_frame = 7; }),
      shape([](SessionShape& s) { s.output_tokens_per_frame = 0; }),
      shape([](SessionShape& s) { s.kv_mode = kv::KvMode::kFull; }),
      shape([](SessionShape& s) {
        s.window = 64;
        s.sinks = 0;
      }),
      shape([](SessionShape& s) { s.positions = kv::PositionMode::kAbsolute; }),
      shape([](SessionShape& s) {
        s.period_ms = 20.0;
        s.deadline_ms = 15.0;
        s.tokens_per_frame = 3;
        s.output_tokens_per_frame = 4;
        s.kv_mode = kv::KvMode::kWindow;
        s.window = 1000;
        s.sinks = 2;
        s.positions = kv::PositionMode::kAbsolute;
      }),
  };
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    SCOPED_TRACE("shape " + std::to_string(i));
    const SessionSpec want = Resolve(shapes[i]);
    const SessionDefaults overridden = WithOverrides(Defaults(), shapes[i]);
    const SessionSpec got = Resolve({}, overridden);
    EXPECT_EQ(got.period_ms, want.period_ms);
    EXPECT_EQ(got.deadline_ms, want.deadline_ms);
    EXPECT_EQ(got.input_tokens_per_frame, want.input_tokens_per_frame);
    EXPECT_EQ(got.output_tokens_per_frame, want.output_tokens_per_frame);
    EXPECT_EQ(got.policy.ToString(), want.policy.ToString());
    // What a shape cannot set stays the defaults'.
    EXPECT_EQ(overridden.max_prompt_tokens, Defaults().max_prompt_tokens);
    EXPECT_EQ(overridden.vocab_size, Defaults().vocab_size);
  }
  // An unset field leaves its default alone, even one the resolved spec does not show (full mode
  // hides the window).
  const SessionDefaults full = WithOverrides(Defaults(), shapes[6]);
  EXPECT_EQ(full.kv_mode, kv::KvMode::kFull);
  EXPECT_EQ(full.window, Defaults().window);
  EXPECT_EQ(full.sinks, Defaults().sinks);
  // A prompt is not a default: it is ignored.
  const SessionDefaults with_prompt =
      WithOverrides(Defaults(), shape([](SessionShape& s) { s.prompt = SyntheticPrompt{3}; }));
  EXPECT_TRUE(Resolve({}, with_prompt).prompt.empty());
}

// A given field wins over its default, one field at a time.
TEST(SessionResolveTest, AGivenFieldWinsOverItsDefault) {
  struct Case {
    const char* name;
    std::function<void(SessionShape&)> set;
    std::function<void(const SessionSpec&)> check;
  };
  const std::vector<Case> cases = {
      {"period, deadline follows it", [](SessionShape& s) { s.period_ms = 40.0; },
       [](const SessionSpec& r) {
         EXPECT_EQ(r.period_ms, 40.0);
         EXPECT_EQ(r.deadline_ms, 40.0);
       }},
      {"deadline", [](SessionShape& s) { s.deadline_ms = 120.5; },
       [](const SessionSpec& r) { EXPECT_EQ(r.deadline_ms, 120.5); }},
      {"deadline 0 is the period", [](SessionShape& s) { s.deadline_ms = 0.0; },
       [](const SessionSpec& r) { EXPECT_EQ(r.deadline_ms, 80.0); }},
      {"a", [](SessionShape& s) { s.tokens_per_frame = 7; },
       [](const SessionSpec& r) { EXPECT_EQ(r.input_tokens_per_frame, 7); }},
      {"o = 0", [](SessionShape& s) { s.output_tokens_per_frame = 0; },
       [](const SessionSpec& r) { EXPECT_EQ(r.output_tokens_per_frame, 0); }},
      {"full KV ignores window, sinks and positions",
       [](SessionShape& s) {
         s.kv_mode = kv::KvMode::kFull;
         s.window = 0;  // out of range, but not a full-mode field
       },
       [](const SessionSpec& r) { EXPECT_EQ(r.policy.mode, kv::KvMode::kFull); }},
      {"window and sinks",
       [](SessionShape& s) {
         s.window = 64;
         s.sinks = 0;
         s.positions = kv::PositionMode::kAbsolute;
       },
       [](const SessionSpec& r) {
         EXPECT_EQ(r.policy.window, 64);
         EXPECT_EQ(r.policy.sinks, 0);
         EXPECT_EQ(r.policy.positions, kv::PositionMode::kAbsolute);
       }},
      {"prompt ids",
       [](SessionShape& s) {
         s.prompt = std::vector<TokenId>{5, 6, 7};
       },
       [](const SessionSpec& r) {
         EXPECT_EQ(r.prompt, (std::vector<TokenId>{5, 6, 7}));
       }},
      {"synthetic prompt: (i * 31 + 7) % vocab",
       [](SessionShape& s) { s.prompt = SyntheticPrompt{.tokens = 3}; },
       [](const SessionSpec& r) {
         EXPECT_EQ(r.prompt, (std::vector<TokenId>{7, 38, 19}));
       }},
      {"empty text is no prompt", [](SessionShape& s) { s.prompt = std::string(); },
       [](const SessionSpec& r) { EXPECT_TRUE(r.prompt.empty()); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    SessionShape shape;
    c.set(shape);
    const SessionSpec spec = Resolve(shape);
    c.check(spec);
    EXPECT_NO_THROW(spec.Validate());
  }
}

TEST(SessionResolveTest, ATextPromptIsTokenisedWithBos) {
  const ByteTokenizer tokenizer;
  SessionShape shape;
  shape.prompt = std::string("ab");
  EXPECT_EQ(Resolve(shape, Defaults(), &tokenizer).prompt,
            (std::vector<TokenId>{1, 'a' + 3, 'b' + 3}));
}

// Every typed error: its code, the field and the value it names.
TEST(SessionResolveTest, EveryErrorNamesItsFieldAndValue) {
  struct Case {
    std::function<void(SessionShape&)> set;
    SessionErrorCode code;
    std::string field;
    std::string value;
  };
  const std::vector<Case> cases = {
      {[](SessionShape& s) { s.period_ms = 0.0; }, SessionErrorCode::kBadValue, "period_ms", "0"},
      {[](SessionShape& s) { s.period_ms = -5.0; }, SessionErrorCode::kBadValue, "period_ms", "-5"},
      {[](SessionShape& s) { s.period_ms = 4e6; }, SessionErrorCode::kBadValue, "period_ms",
       "4e+06"},
      {[](SessionShape& s) { s.deadline_ms = -1.0; }, SessionErrorCode::kBadValue, "deadline_ms",
       "-1"},
      {[](SessionShape& s) { s.deadline_ms = 4e6; }, SessionErrorCode::kBadValue, "deadline_ms",
       "4e+06"},
      {[](SessionShape& s) { s.tokens_per_frame = 0; }, SessionErrorCode::kBadValue,
       "tokens_per_frame", "0"},
      {[](SessionShape& s) { s.tokens_per_frame = 65537; }, SessionErrorCode::kBadValue,
       "tokens_per_frame", "65537"},
      {[](SessionShape& s) { s.output_tokens_per_frame = -1; }, SessionErrorCode::kBadValue,
       "output_tokens_per_frame", "-1"},
      {[](SessionShape& s) { s.window = 0; }, SessionErrorCode::kBadValue, "window", "0"},
      {[](SessionShape& s) { s.sinks = -1; }, SessionErrorCode::kBadValue, "sinks", "-1"},
      {[](SessionShape& s) { s.prompt = std::vector<TokenId>(17, 3); }, SessionErrorCode::kOverCap,
       "prompt.ids", "17 tokens"},
      {[](SessionShape& s) { s.prompt = std::string("abc"); }, SessionErrorCode::kNeedsTokenizer,
       "prompt.text", "3 bytes"},
      {[](SessionShape& s) { s.prompt = SyntheticPrompt{.tokens = -2}; },
       SessionErrorCode::kBadValue, "prompt_tokens", "-2"},
      {[](SessionShape& s) { s.prompt = SyntheticPrompt{.tokens = 17}; },
       SessionErrorCode::kOverCap, "prompt_tokens", "17 tokens"},
  };
  for (const Case& c : cases) {
    SessionShape shape;
    c.set(shape);
    const SessionResolution r = ResolveSession(shape, Defaults());
    const auto* e = std::get_if<SessionError>(&r);
    ASSERT_NE(e, nullptr) << c.field << " = " << c.value << " was accepted";
    SCOPED_TRACE(e->message);
    EXPECT_EQ(e->code, c.code) << ToString(e->code);
    EXPECT_EQ(e->field, c.field);
    EXPECT_EQ(e->value, c.value);
    EXPECT_EQ(e->message.rfind(c.field, 0), 0U);  // the message starts with the field
    EXPECT_THROW((void)ResolveSessionOrThrow(shape, Defaults()), ConfigError);
  }
  // A text prompt over the cap once tokenised; a synthetic prompt without a vocabulary.
  const ByteTokenizer tokenizer;
  SessionShape text;
  text.prompt = std::string(16, 'x');  // 17 tokens with BOS
  const SessionResolution over = ResolveSession(text, Defaults(), &tokenizer);
  ASSERT_TRUE(std::holds_alternative<SessionError>(over));
  EXPECT_EQ(std::get<SessionError>(over).code, SessionErrorCode::kOverCap);
  EXPECT_EQ(std::get<SessionError>(over).field, "prompt.text");
  SessionDefaults no_vocab = Defaults();
  no_vocab.vocab_size = 0;
  SessionShape synthetic;
  synthetic.prompt = SyntheticPrompt{.tokens = 1};
  const SessionResolution none = ResolveSession(synthetic, no_vocab);
  ASSERT_TRUE(std::holds_alternative<SessionError>(none));
  EXPECT_EQ(std::get<SessionError>(none).field, "vocab_size");
}

// A spec that skipped the resolver (deadline left 0) is refused downstream, not re-derived.
TEST(SessionResolveTest, AnUnresolvedDeadlineIsInvalid) {
  SessionSpec unresolved;
  unresolved.period_ms = 40.0;
  EXPECT_THROW(unresolved.Validate(), ConfigError);
}

// The one KV-mode parser and its spelling round-trip; anything else is refused.
TEST(SessionResolveTest, KvModeParserRoundTrips) {
  for (const kv::KvMode m : {kv::KvMode::kFull, kv::KvMode::kWindow}) {
    EXPECT_EQ(kv::ParseKvMode(kv::ToString(m)), m);
  }
  for (const kv::PositionMode p : {kv::PositionMode::kAbsolute, kv::PositionMode::kRolling}) {
    EXPECT_EQ(kv::ParsePositionMode(kv::ToString(p)), p);
  }
  EXPECT_FALSE(kv::ParseKvMode("paged"));
  EXPECT_FALSE(kv::ParseKvMode("Full"));
  EXPECT_FALSE(kv::ParsePositionMode(""));
}

}  // namespace
}  // namespace metronome::realtime
