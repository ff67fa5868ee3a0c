#include "metronome/server/session_start.h"

#include <string>
#include <utility>

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
  realtime::SessionResolution r = realtime::ResolveSession(ShapeOf(request), defaults, tokenizer);
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
