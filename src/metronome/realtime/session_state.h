// A session on the move: what RealtimeLoop::ExportSession takes out of one loop and ImportSession
// puts into another (the same process after a dropped connection is not a move: the session
// stays where it is). The one binary form of a moved session, versioned and checksummed:
//
//   offset 0   8 bytes  magic "MTRSESS\0"
//   offset 8   u32      version (kSessionStateVersion)
//   offset 12  u32      payload bytes n
//   offset 16  n bytes  payload (below)
//   offset 16+n u32     CRC-32 of bytes [0, 16 + n)
//
// Payload, little-endian (base/byte_io.h): the model identity (string: Backend::model_identity),
// the spec (period_ms, deadline_ms f64; tokens in, out per frame i32; kv mode, positions u8;
// window, sinks, max_context_tokens i64; max_pending_frames i32; the unfed prompt: u32 count, i32
// ids), the loop's state (next_frame i64, prompt_fed u8, pending_output i32, consecutive_starved
// i32), the session's frame counts (frames, ok, late, starved, short, mute alarms, missed: i64),
// then the backend's bytes (u64 count, bytes: Backend::ExportSession).
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "metronome/base/types.h"
#include "metronome/realtime/frame_summary.h"
#include "metronome/realtime/realtime_loop.h"

namespace metronome::realtime {

inline constexpr std::uint32_t kSessionStateVersion = 1;

struct SessionState {
  SessionSpec spec;                // as resolved; its prompt only while not yet fed
  std::int64_t next_frame = 0;     // index of the next frame the session takes
  bool prompt_fed = false;         // the prompt went in with the first frame
  TokenId pending_output = -1;     // the previous frame's last output, appended with the next frame
  int consecutive_starved = 0;     // toward the mute alarm
  FrameCounts frames;              // the session's frames so far, by outcome (the driver's counts)
  std::vector<std::byte> backend;  // Backend::ExportSession
};

[[nodiscard]] std::vector<std::byte> EncodeSessionState(const SessionState& state,
                                                        std::string_view model_identity);
// DecodeSessionState's refusal: which check failed, and the message naming it.
struct SessionStateError {
  enum class Kind : std::uint8_t {
    kCorrupt,       // not this format, cut short, or the checksum disagrees
    kVersion,       // another version of the format
    kForeignModel,  // exported under another model identity
    kInvalid,       // well-formed bytes whose values no session has (a bad spec)
  };
  Kind kind = Kind::kCorrupt;
  std::string message;
};
// The state, or why these bytes cannot be it: checked in the order of the layout (magic, version,
// length, checksum, model identity, then each field; the spec is validated as a new session's).
// Never throws.
[[nodiscard]] std::variant<SessionState, SessionStateError> DecodeSessionState(
    std::span<const std::byte> bytes, std::string_view model_identity);

}  // namespace metronome::realtime
