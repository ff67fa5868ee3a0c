// The one way results come back up: what the real-time loop reports about its sessions (a
// delivered frame, a mute alarm, a session it ended itself) and what the Supervisor hands its
// driver (the server's EngineService, WorkloadRunner). Both speak this interface, so a frame's
// result climbs loop -> Supervisor -> driver with no relay in between, and a session's end is one
// telemetry::EndReason from the loop to the wire.
//
// Times: `*_s` fields are seconds on the loop's clock since its origin (RealtimeLoop::SetOrigin;
// the Supervisor sets it at Start, so they are run seconds everywhere above the loop).
// Thread-safety: observers are called on the loop's thread, inside an iteration or a driver call;
// they must not add or end sessions.
#pragma once

#include <cstdint>
#include <vector>

#include "metronome/base/non_copyable.h"
#include "metronome/base/step_status.h"
#include "metronome/base/types.h"
#include "metronome/realtime/frame_summary.h"
#include "metronome/telemetry/engine_metrics.h"

namespace metronome::realtime {

using RealtimeSessionId = std::uint64_t;

// One vocabulary for session ends, from the loop to the wire (ToString there).
using EndReason = telemetry::EndReason;

struct FrameRecord {
  RealtimeSessionId session = 0;
  std::int64_t index = 0;  // frame number within the session
  double arrival_s = 0.0;  // s since the loop's origin
  double delivered_s = 0.0;
  double latency_ms = 0.0;   // delivered - arrival
  double deadline_ms = 0.0;  // the session's deadline, from arrival
  FrameOutcome outcome = FrameOutcome::kOk;
  std::vector<TokenId> tokens;       // the outputs (fewer than o for short, none for starved)
  std::int64_t resident_blocks = 0;  // KV blocks the session holds at delivery
  // It arrived before the session's own prompt was in the KV (the prompt's frame too): its wait
  // is the session's own doing, not the load's (admission leaves it out of its signal).
  bool behind_own_prompt = false;
};

// k consecutive starved frames of a session (LoopOptions::mute_after_starved).
struct MuteAlarm {
  RealtimeSessionId session = 0;
  double t_s = 0.0;
  int consecutive_starved = 0;     // k
  std::int64_t alarms_so_far = 0;  // this one included, over every session of the loop
  std::int64_t used_blocks = 0;    // the KV pool when it was raised (the reason: no block)
  std::int64_t total_blocks = 0;
};

// A session ended. The loop ends a session itself with kContextFull (its context limit),
// kNonFiniteLogits (its sampled logits held a NaN or an infinity) or kError (any other refusal of
// the backend: `status` says which); drivers end sessions with the other
// reasons through the Supervisor. The session is gone when this is reported.
struct SessionEnded {
  RealtimeSessionId session = 0;
  double t_s = 0.0;
  EndReason reason = EndReason::kClient;
  StepStatus status = StepStatus::kOk;  // the backend's, when the loop ended it
  [[nodiscard]] bool by_loop() const { return status != StepStatus::kOk; }
};

class SessionObserver : NonCopyableNonMovable {
 public:
  virtual ~SessionObserver() = default;

  virtual void OnFrame(const FrameRecord& frame) = 0;  // every delivered frame, in order
  virtual void OnMuteAlarm(const MuteAlarm& alarm) = 0;
  virtual void OnSessionEnded(const SessionEnded& ended) = 0;  // once per session, last
};

}  // namespace metronome::realtime
