#include "metronome/server/session_start.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "metronome/model/chat_template.h"

namespace metronome::server {

realtime::SessionDefaults ServerSessionDefaults(std::int64_t window, std::int64_t sinks,
                                                wire::KvPositions positions) {
  realtime::SessionDefaults d;
  d.kv_mode = kv::KvMode::kWindow;
  d.window = window;
  d.sinks = sinks;
  d.positions = positions;
  return d;
}

realtime::SessionShape ShapeOf(const wire::StartRequest& request) {
  realtime::SessionShape shape;
  shape.period_ms = request.period_ms;
  shape.deadline_ms = request.deadline_ms;
  shape.tokens_per_frame = request.tokens_per_frame;
  shape.output_tokens_per_frame = request.output_tokens_per_frame;
  shape.kv_mode = request.kv.policy;
  shape.window = request.kv.window;
  shape.sinks = request.kv.sinks;
  shape.positions = request.kv.positions;
  if (request.prompt) {
    if (const auto* ids = std::get_if<wire::TokenIds>(&*request.prompt)) {
      shape.prompt = *ids;
    } else {
      shape.prompt = std::get<std::string>(*request.prompt);
    }
  }
  return shape;
}

std::variant<realtime::SessionSpec, wire::ProtocolError> ResolveStart(
    const wire::StartRequest& request, realtime::SessionDefaults defaults,
    const wire::ServerCaps& caps, const model::Tokenizer* tokenizer) {
  defaults.max_prompt_tokens = caps.max_prompt_tokens;
  realtime::SessionShape shape = ShapeOf(request);
  if (request.prompt_messages) {
    // Formatted here with the model's chat template (model/chat_template.h), then resolved as
    // prompt ids.
    const auto fail = [&](wire::ErrorCode code, const std::string& why) {
      wire::ProtocolError error;
      error.code = code;
      error.message = "session.start: prompt.messages: " + why;
      error.client_ref = request.client_ref;
      return error;
    };
    if (tokenizer == nullptr) {
      return fail(wire::ErrorCode::kBadField, "the model has no tokenizer (send prompt.ids)");
    }
    std::vector<model::ChatMessage> messages;
    messages.reserve(request.prompt_messages->size());
    for (const wire::PromptMessage& m : *request.prompt_messages) {
      messages.push_back({m.role, m.content});
    }
    model::ChatEncoding chat = model::EncodeChat(*tokenizer, messages);
    if (!chat.error.empty()) {
      return fail(wire::ErrorCode::kBadField,
                  chat.error + " (send prompt.ids or prompt.text formatted by the client)");
    }
    if (caps.max_prompt_tokens > 0 &&
        static_cast<std::int64_t>(chat.ids.size()) > caps.max_prompt_tokens) {
      return fail(wire::ErrorCode::kOverCap, "formats to " + std::to_string(chat.ids.size()) +
                                                 " tokens, more than max_prompt_tokens = " +
                                                 std::to_string(caps.max_prompt_tokens));
    }
    shape.prompt = std::move(chat.ids);
  }
  realtime::SessionResolution r = realtime::ResolveSession(shape, defaults, tokenizer);
  if (auto* spec = std::get_if<realtime::SessionSpec>(&r)) return std::move(*spec);
  const auto& e = std::get<realtime::SessionError>(r);
  wire::ProtocolError error;
  error.code = e.code == realtime::SessionErrorCode::kOverCap ? wire::ErrorCode::kOverCap
                                                              : wire::ErrorCode::kBadField;
  error.message = "session.start: " + e.message;
  error.client_ref = request.client_ref;
  return error;
}

wire::KvSettings KvSettingsOf(const realtime::SessionSpec& spec) {
  wire::KvSettings kv;
  kv.policy = spec.policy.mode;
  kv.positions = spec.policy.positions;
  if (spec.policy.mode == kv::KvMode::kWindow) {
    kv.window = spec.policy.window;
    kv.sinks = spec.policy.sinks;
  }
  return kv;
}

}  // namespace metronome::server
