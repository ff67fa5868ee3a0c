#include "metronome/realtime/session_state.h"

#include <array>
#include <cstring>
#include <exception>
#include <limits>
#include <utility>

#include "metronome/base/byte_io.h"

namespace metronome::realtime {
namespace {

constexpr std::array<char, 8> kMagic = {'M', 'T', 'R', 'S', 'E', 'S', 'S', '\0'};
constexpr std::size_t kHeaderBytes = 16;  // magic, version, payload bytes
constexpr std::size_t kMaxIdentityBytes = 256;
// A prompt longer than any server accepts is not a session's.
constexpr std::uint32_t kMaxPromptTokens = 1u << 20;

// The counters in the payload's order: FrameCounts' fields, one table for both directions.
constexpr std::array<std::int64_t FrameCounts::*, 7> kCounters = {
    &FrameCounts::frames,  &FrameCounts::ok,           &FrameCounts::late,
    &FrameCounts::starved, &FrameCounts::short_frames, &FrameCounts::mute_alarms,
    &FrameCounts::missed};

void PutSpec(const SessionSpec& spec, bool prompt_fed, base::ByteWriter* out) {
  out->Put(spec.period_ms);
  out->Put(spec.deadline_ms);
  out->Put(static_cast<std::int32_t>(spec.input_tokens_per_frame));
  out->Put(static_cast<std::int32_t>(spec.output_tokens_per_frame));
  out->Put(static_cast<std::uint8_t>(spec.policy.mode));
  out->Put(static_cast<std::uint8_t>(spec.policy.positions));
  out->Put(static_cast<std::int64_t>(spec.policy.window));
  out->Put(static_cast<std::int64_t>(spec.policy.sinks));
  out->Put(static_cast<std::int64_t>(spec.max_context_tokens));
  out->Put(static_cast<std::int32_t>(spec.max_pending_frames));
  const std::size_t prompt = prompt_fed ? 0 : spec.prompt.size();
  out->Put(static_cast<std::uint32_t>(prompt));
  for (std::size_t i = 0; i < prompt; ++i) out->Put(static_cast<std::int32_t>(spec.prompt[i]));
}

bool GetSpec(base::ByteReader* in, SessionSpec* spec) {
  std::int32_t tokens_in = 0;
  std::int32_t tokens_out = 0;
  std::uint8_t mode = 0;
  std::uint8_t positions = 0;
  std::int64_t window = 0;
  std::int64_t sinks = 0;
  std::int64_t max_context = 0;
  std::int32_t max_pending = 0;
  std::uint32_t prompt = 0;
  in->Get(&spec->period_ms);
  in->Get(&spec->deadline_ms);
  in->Get(&tokens_in);
  in->Get(&tokens_out);
  in->Get(&mode);
  in->Get(&positions);
  in->Get(&window);
  in->Get(&sinks);
  in->Get(&max_context);
  in->Get(&max_pending);
  in->Get(&prompt);
  if (!in->ok() || prompt > kMaxPromptTokens ||
      mode > static_cast<std::uint8_t>(kv::KvMode::kWindow) ||
      positions > static_cast<std::uint8_t>(kv::PositionMode::kRolling)) {
    return false;
  }
  spec->input_tokens_per_frame = tokens_in;
  spec->output_tokens_per_frame = tokens_out;
  spec->policy.mode = static_cast<kv::KvMode>(mode);
  spec->policy.positions = static_cast<kv::PositionMode>(positions);
  spec->policy.window = window;
  spec->policy.sinks = sinks;
  spec->max_context_tokens = max_context;
  spec->max_pending_frames = max_pending;
  spec->external_frames = true;
  spec->prompt.resize(prompt);
  for (TokenId& t : spec->prompt) in->Get(&t);
  return in->ok();
}

SessionStateError Error(SessionStateError::Kind kind, std::string message) {
  return {.kind = kind, .message = "session state: " + std::move(message)};
}

}  // namespace

std::vector<std::byte> EncodeSessionState(const SessionState& state,
                                          std::string_view model_identity) {
  base::ByteWriter payload;
  payload.PutString(model_identity);
  PutSpec(state.spec, state.prompt_fed, &payload);
  payload.Put(state.next_frame);
  payload.Put(static_cast<std::uint8_t>(state.prompt_fed ? 1 : 0));
  payload.Put(static_cast<std::int32_t>(state.pending_output));
  payload.Put(static_cast<std::int32_t>(state.consecutive_starved));
  for (const auto counter : kCounters) payload.Put(state.frames.*counter);
  payload.Put(static_cast<std::uint64_t>(state.backend.size()));
  payload.PutBytes(state.backend);

  base::ByteWriter out;
  out.PutBytes(std::as_bytes(std::span<const char>(kMagic)));
  out.Put(kSessionStateVersion);
  out.Put(static_cast<std::uint32_t>(payload.bytes().size()));
  out.PutBytes(payload.bytes());
  out.Put(base::Crc32(out.bytes()));
  return out.Take();
}

std::variant<SessionState, SessionStateError> DecodeSessionState(std::span<const std::byte> bytes,
                                                                 std::string_view model_identity) {
  using Kind = SessionStateError::Kind;
  if (bytes.size() < kHeaderBytes + 4 ||
      std::memcmp(bytes.data(), kMagic.data(), kMagic.size()) != 0) {
    return Error(Kind::kCorrupt, "not a moved session's state (" + std::to_string(bytes.size()) +
                                     " bytes without the MTRSESS header)");
  }
  base::ByteReader header(bytes.subspan(kMagic.size()));
  std::uint32_t version = 0;
  std::uint32_t payload_bytes = 0;
  header.Get(&version);
  header.Get(&payload_bytes);
  if (version != kSessionStateVersion) {
    return Error(Kind::kVersion, "version = " + std::to_string(version) + ", this server reads " +
                                     std::to_string(kSessionStateVersion));
  }
  if (bytes.size() != kHeaderBytes + payload_bytes + 4) {
    return Error(Kind::kCorrupt, "length = " + std::to_string(bytes.size()) +
                                     " bytes, the header says " +
                                     std::to_string(kHeaderBytes + payload_bytes + 4));
  }
  std::uint32_t stored_crc = 0;
  base::ByteReader trailer(bytes.subspan(kHeaderBytes + payload_bytes));
  trailer.Get(&stored_crc);
  const std::uint32_t crc = base::Crc32(bytes.first(kHeaderBytes + payload_bytes));
  if (crc != stored_crc) {
    return Error(Kind::kCorrupt, "checksum mismatch (the bytes were changed on the way)");
  }
  base::ByteReader in(bytes.subspan(kHeaderBytes, payload_bytes));
  std::string identity;
  if (!in.GetString(&identity, kMaxIdentityBytes)) {
    return Error(Kind::kCorrupt, "the model identity is cut short");
  }
  if (identity != model_identity) {
    return Error(Kind::kForeignModel, "exported under model " + identity + ", this server's is " +
                                          std::string(model_identity));
  }
  SessionState state;
  if (!GetSpec(&in, &state.spec)) return Error(Kind::kCorrupt, "the session's spec is cut short");
  std::uint8_t prompt_fed = 0;
  std::int32_t pending_output = 0;
  std::int32_t starved = 0;
  in.Get(&state.next_frame);
  in.Get(&prompt_fed);
  in.Get(&pending_output);
  in.Get(&starved);
  for (const auto counter : kCounters) in.Get(&(state.frames.*counter));
  std::uint64_t backend_bytes = 0;
  in.Get(&backend_bytes);
  if (!in.ok() || backend_bytes != in.remaining()) {
    return Error(Kind::kCorrupt, "the loop's state or the backend's bytes are cut short");
  }
  const auto backend = in.GetBytes(static_cast<std::size_t>(backend_bytes));
  state.backend.assign(backend.begin(), backend.end());
  state.prompt_fed = prompt_fed != 0;
  state.pending_output = pending_output;
  state.consecutive_starved = starved;
  if (state.next_frame < 0 || state.consecutive_starved < 0 || pending_output < -1 ||
      (state.prompt_fed && !state.spec.prompt.empty())) {
    return Error(Kind::kInvalid, "next_frame = " + std::to_string(state.next_frame) +
                                     ", pending_output = " + std::to_string(pending_output) +
                                     ": no session has these");
  }
  try {
    state.spec.Validate();
  } catch (const std::exception& e) {
    return Error(Kind::kInvalid, std::string("spec: ") + e.what());
  }
  return state;
}

}  // namespace metronome::realtime
