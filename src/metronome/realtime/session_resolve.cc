#include "metronome/realtime/session_resolve.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <string>
#include <utility>

#include "metronome/base/check.h"
#include "metronome/base/errors.h"

namespace metronome::realtime {
namespace {

// The domain of a session's numbers (SessionSpec::Validate checks the same bounds on specs built
// without this function).
constexpr double kMaxPeriodMs = 3.6e6;
constexpr int kMaxTokensPerFrame = 65536;

SessionError Bad(std::string field, std::string value, const std::string& rule,
                 SessionErrorCode code = SessionErrorCode::kBadValue) {
  std::string message = field + " = " + value + " " + rule;
  return {.code = code,
          .field = std::move(field),
          .value = std::move(value),
          .message = std::move(message)};
}

// The KV policy of the given fields (window and sinks checked in window mode), or the error.
std::optional<SessionError> ResolvePolicy(const SessionDefaults& given, kv::KvPolicy* policy) {
  // Full mode keeps everything: window, sinks and positions do not apply to it.
  if (given.kv_mode == kv::KvMode::kWindow) {
    const TokenPos window = given.window;
    if (window < 1 || window > kv::kMaxWindowTokens) {
      return Bad("window", std::to_string(window),
                 "must be in [1, " + std::to_string(kv::kMaxWindowTokens) + "]");
    }
    const TokenPos sinks = given.sinks;
    if (sinks < 0 || sinks > kv::kMaxSinkTokens) {
      return Bad("sinks", std::to_string(sinks),
                 "must be in [0, " + std::to_string(kv::kMaxSinkTokens) + "]");
    }
    *policy = kv::KvPolicy::Window(window, sinks, given.positions);
  } else {
    *policy = kv::KvPolicy::Full();
  }
  return std::nullopt;
}

// The prompt of the shape (token ids, text through the tokenizer, or synthetic ids), within
// max_prompt_tokens, or the error.
std::optional<SessionError> ResolvePrompt(const SessionShape& shape,
                                          const SessionDefaults& defaults,
                                          const model::Tokenizer* tokenizer,
                                          std::vector<TokenId>* prompt) {
  std::string prompt_field = "prompt.ids";
  if (const auto* ids = std::get_if<std::vector<TokenId>>(&shape.prompt)) {
    *prompt = *ids;
  } else if (const auto* text = std::get_if<std::string>(&shape.prompt)) {
    prompt_field = "prompt.text";
    if (!text->empty()) {
      if (tokenizer == nullptr) {
        return SessionError{.code = SessionErrorCode::kNeedsTokenizer,
                            .field = prompt_field,
                            .value = std::to_string(text->size()) + " bytes",
                            .message =
                                "prompt.text needs a tokenizer and there is none (send "
                                "token ids)"};
      }
      // The file says whether a prompt starts with BOS (add_bos_token, or its family's rule).
      *prompt = tokenizer->Encode(*text, tokenizer->adds_bos());
    }
  } else if (const auto* synthetic = std::get_if<SyntheticPrompt>(&shape.prompt)) {
    prompt_field = "prompt_tokens";
    if (synthetic->tokens < 0) {
      return Bad(prompt_field, std::to_string(synthetic->tokens), "must be >= 0");
    }
    if (synthetic->tokens > 0 && defaults.vocab_size < 1) {
      return Bad("vocab_size", std::to_string(defaults.vocab_size),
                 "must be >= 1 for a synthetic prompt");
    }
    prompt->resize(static_cast<std::size_t>(synthetic->tokens));
    for (int i = 0; i < synthetic->tokens; ++i) {
      (*prompt)[static_cast<std::size_t>(i)] = (i * 31 + 7) % defaults.vocab_size;
    }
  }
  if (defaults.max_prompt_tokens > 0 &&
      static_cast<std::int64_t>(prompt->size()) > defaults.max_prompt_tokens) {
    return SessionError{.code = SessionErrorCode::kOverCap,
                        .field = prompt_field,
                        .value = std::to_string(prompt->size()) + " tokens",
                        .message = prompt_field + " has " + std::to_string(prompt->size()) +
                                   " tokens, more than max_prompt_tokens = " +
                                   std::to_string(defaults.max_prompt_tokens)};
  }
  return std::nullopt;
}

}  // namespace

SessionDefaults ServingSessionDefaults(TokenPos trained_context, TokenPos max_window) {
  MTR_CHECK(max_window >= 1, "max_window must be >= 1");
  SessionDefaults d;
  d.kv_mode = kv::KvMode::kWindow;
  d.window = trained_context > 0 ? std::min(trained_context, max_window) : max_window;
  d.sinks = kDefaultSinkTokens;
  d.positions = kv::PositionMode::kRolling;
  return d;
}

SessionDefaults WithOverrides(SessionDefaults defaults, const SessionShape& overrides) {
  defaults.period_ms = overrides.period_ms.value_or(defaults.period_ms);
  defaults.deadline_ms = overrides.deadline_ms.value_or(defaults.deadline_ms);
  defaults.tokens_per_frame = overrides.tokens_per_frame.value_or(defaults.tokens_per_frame);
  defaults.output_tokens_per_frame =
      overrides.output_tokens_per_frame.value_or(defaults.output_tokens_per_frame);
  defaults.kv_mode = overrides.kv_mode.value_or(defaults.kv_mode);
  defaults.window = overrides.window.value_or(defaults.window);
  defaults.sinks = overrides.sinks.value_or(defaults.sinks);
  defaults.positions = overrides.positions.value_or(defaults.positions);
  return defaults;
}

std::string_view ToString(SessionErrorCode code) {
  // In the order of the enum.
  constexpr std::array<std::string_view, 3> kNames = {"bad_value", "over_cap", "needs_tokenizer"};
  return kNames.at(static_cast<std::size_t>(code));
}

SessionResolution ResolveSession(const SessionShape& shape, const SessionDefaults& defaults,
                                 const model::Tokenizer* tokenizer) {
  // The shape's given fields over the defaults: the one overlay rule (WithOverrides).
  const SessionDefaults given = WithOverrides(defaults, shape);
  SessionSpec spec;
  spec.period_ms = given.period_ms;
  if (!(spec.period_ms > 0.0 && spec.period_ms <= kMaxPeriodMs)) {
    return Bad("period_ms", FormatValue(spec.period_ms), "must be in (0, 3600000]");
  }
  const double deadline_ms = given.deadline_ms;
  if (!(deadline_ms >= 0.0 && deadline_ms <= kMaxPeriodMs)) {
    return Bad("deadline_ms", FormatValue(deadline_ms), "must be in [0, 3600000] (0: the period)");
  }
  // The one place where "deadline 0" means the period.
  spec.deadline_ms = deadline_ms > 0.0 ? deadline_ms : spec.period_ms;

  spec.input_tokens_per_frame = given.tokens_per_frame;
  if (spec.input_tokens_per_frame < 1 || spec.input_tokens_per_frame > kMaxTokensPerFrame) {
    return Bad("tokens_per_frame", std::to_string(spec.input_tokens_per_frame),
               "must be in [1, 65536]");
  }
  spec.output_tokens_per_frame = given.output_tokens_per_frame;
  if (spec.output_tokens_per_frame < 0 || spec.output_tokens_per_frame > kMaxTokensPerFrame) {
    return Bad("output_tokens_per_frame", std::to_string(spec.output_tokens_per_frame),
               "must be in [0, 65536]");
  }

  if (std::optional<SessionError> e = ResolvePolicy(given, &spec.policy)) return std::move(*e);
  if (std::optional<SessionError> e = ResolvePrompt(shape, defaults, tokenizer, &spec.prompt)) {
    return std::move(*e);
  }
  return spec;
}

SessionSpec ResolveSessionOrThrow(const SessionShape& shape, const SessionDefaults& defaults,
                                  const model::Tokenizer* tokenizer) {
  SessionResolution r = ResolveSession(shape, defaults, tokenizer);
  if (auto* e = std::get_if<SessionError>(&r)) throw ConfigError(e->message);
  return std::get<SessionSpec>(std::move(r));
}

}  // namespace metronome::realtime
