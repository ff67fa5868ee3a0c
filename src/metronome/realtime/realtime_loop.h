// The real-time loop: sessions are periodic tasks. Every period a session's frame arrives (a input
// tokens), must produce o output tokens (each appended to its KV), and is due at its deadline
// (counted from arrival). Each iteration batches all ready work of all sessions into one backend
// step (continuous batching), then completes frames and classifies them:
//   ok      - completed by the deadline
//   late    - completed after the deadline (compute overload)
//   starved - delivered at the deadline with no output: the session could not get a KV block
//   short   - delivered at the deadline with fewer than o outputs, same reason
// Starved and short frames are what today's engines hand back silently; here they are counted, and
// k consecutive starved frames of a session raise a `mute` alarm. Admitted sessions are never
// preempted or recomputed. Time comes from a Clock (real or virtual), work goes to a Backend (the
// engine or a cost model): the loop is the same code in the server, `drive` and the simulator.
//
// Thread-safety: single-threaded; owned by the loop thread.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <queue>
#include <string>
#include <vector>

#include "metronome/base/clock.h"
#include "metronome/kv/kv_policy.h"
#include "metronome/realtime/backend.h"
#include "metronome/realtime/session_observer.h"

namespace metronome::realtime {

struct SessionState;  // session_state.h

// A resolved session: every field is what the session runs with (built by ResolveSession,
// realtime/session_resolve.h, from what a client asked for; nothing downstream fills in defaults).
struct SessionSpec {
  double period_ms = 80.0;
  double deadline_ms = 0.0;         // from each frame's arrival, > 0 (0 is unresolved: invalid)
  int input_tokens_per_frame = 1;   // a: appended as one prefill chunk when the frame arrives
  int output_tokens_per_frame = 1;  // o: decoded one after another, each appended to the KV
  kv::KvPolicy policy;
  std::vector<TokenId> prompt;  // fed with the first frame's input (e.g. a system prompt)
  // The first frame arrives this long after the session opens, in [0, period): the session's
  // phase relative to others. Frames then follow every period from there.
  double phase_ms = 0.0;
  // Frames come from outside (a network client) through SubmitFrame, each with its own input
  // tokens (at most input_tokens_per_frame of them), instead of arriving every period with
  // stand-in tokens. The period then bounds how fast a client may send (LoopOptions::pacing), and
  // SubmitFrame refuses a frame while max_pending_frames are waiting.
  bool external_frames = false;
  int max_pending_frames = 2;
  // Tokens a full-KV session may append before it ends with kContextFull, below the backend's own
  // context limit (0: only the backend's). The Supervisor sets it to what admission reserved.
  TokenPos max_context_tokens = 0;

  void Validate() const;  // ConfigError naming the field and value
};

// The declared-rate rule for external frames, in one place: a session that declared period P may
// send frames at 1/P on average, with a burst allowance against network jitter. It is a generic
// cell-rate algorithm (virtual scheduling) on the frames' arrival stamps: each session keeps a
// theoretical arrival time TAT (initially -inf); a frame arriving at t conforms iff
// TAT - t <= tolerance, and then TAT = max(TAT, t) + P. Hence an idle client may send
// 1 + tolerance / P frames back to back, then one per period, and over any interval of length T a
// session gets at most T / P + 1 + tolerance / P frames accepted: its KV grows at the declared rate
// whatever it sends. A frame that does not conform is refused (SubmitResult::kTooFast) and changes
// nothing.
struct FramePacing {
  // tolerance = max((burst_frames - 1) * P, jitter_ms): burst_frames frames back to back at any
  // period, and jitter_ms of bunching (a stalled network or client thread) at short periods.
  int burst_frames = 4;      // >= 1
  double jitter_ms = 100.0;  // >= 0, ms

  void Validate() const;  // ConfigError naming the field and value
  [[nodiscard]] Nanos Tolerance(Nanos period) const;
};

// How much of a step a prompt's prefill may take, in time: the step budget bounds tokens, but a
// prompt's tokens attend to the whole prompt before them, so 256 of them deep into an 8k prompt
// cost far more than 256 decode tokens. With the step-cost model's per-token and per-key
// coefficients (CostModel's c1 and c2; both 0: no pacing, the token budget alone), a prompt's
// chunks in a step are the most tokens whose predicted work c1 x k + c2 x the keys they attend to
// stays, over all prompts of the step, within deadline_fraction of the tightest deadline of the
// live sessions past their prompt (at least one token a step, so prompts always progress). Their
// frames then wait for at most that much prompt work per step.
struct PromptPacing {
  double c1_s_per_token = 0.0;      // >= 0
  double c2_s_per_kv_token = 0.0;   // >= 0
  double deadline_fraction = 0.05;  // in (0, 1]

  [[nodiscard]] bool enabled() const { return c1_s_per_token > 0.0 || c2_s_per_kv_token > 0.0; }
  void Validate() const;  // ConfigError naming the field and value
};

struct LoopOptions {
  int mute_after_starved = 3;  // k: consecutive starved frames that raise a mute alarm
  FramePacing pacing;          // external frames only
  // Tokens one step may carry (0: no limit). When the ready work holds more, the step takes the
  // frames earliest-deadline-first (a frame's next item: its input, or one decode token), and the
  // input that does not fit is split: the step carries as much of it as the budget leaves and the
  // rest follows in the next steps (chunked prefill; the frame's output is sampled after its last
  // piece). Why: an engine whose cost per token grows with the step (activations that leave the
  // cache) is slower in a backlog, where every session's work lands in one step, than in steady
  // state, so a transient backlog need not drain. The budget keeps a backlog's steps the size of
  // steady-state ones, and EDF serves the oldest frames first. It removes the step-size part of
  // the CPU engine's backlog penalty, not all of it (docs/realtime.md, "Step budget"). A prompt's
  // prefill goes last, after every other ready frame, in the budget they leave, paced in time by
  // `prompt`.
  int max_step_tokens = 0;
  PromptPacing prompt;  // with a step budget

  void Validate() const;
};

// The loop's bookkeeping: what it holds for sessions (tests check every ended session's state is
// freed).
struct LoopFootprint {
  std::int64_t sessions = 0;  // live sessions
  std::int64_t retired = 0;   // ended sessions still waiting for their arrivals_ entry to pop
  std::int64_t arrivals = 0;  // entries of the arrivals heap
  std::int64_t ready = 0;     // sessions listed as having arrived frames
};

struct LoopStats : FrameCounts {
  std::int64_t context_full_sessions = 0;  // full-mode sessions ended at their context limit
  std::int64_t error_sessions = 0;         // sessions ended by any other refusal of the backend
  std::int64_t iterations = 0;
  double first_starved_at_s = std::numeric_limits<double>::quiet_NaN();  // s since the origin
};

class RealtimeLoop {
 public:
  // Borrows backend and clock (must outlive the loop).
  RealtimeLoop(Backend* backend, Clock* clock, const LoopOptions& options = {});

  // Time zero of every time the loop takes or reports in seconds (FrameRecord, stats, RunUntil,
  // RunOnce, NextEventSeconds, the observer's reports); default: the clock's zero.
  void SetOrigin(Nanos origin) { origin_ = origin; }
  [[nodiscard]] double Now() const;  // s since the origin
  // Where delivered frames, mute alarms and the sessions the loop ends itself are reported
  // (borrowed; null: nowhere).
  void set_observer(SessionObserver* observer) { observer_ = observer; }

  // Opens a session whose first frame arrives now. Throws ConfigError for a bad spec.
  RealtimeSessionId AddSession(const SessionSpec& spec);
  // Ends a session at once (pending frames are dropped, its blocks return to the pool).
  void EndSession(RealtimeSessionId id);

  // Moving a session (session_state.h). Its state, when it has no frame waiting or in progress
  // (false then, and for an unknown or clocked session: only external-frame sessions move); the
  // session itself stays, for the caller to end. state->frames is left as it was (the driver's).
  bool ExportSession(RealtimeSessionId id, SessionState* state) const;
  // Opens an external-frames session that continues `state` (another loop's ExportSession, of a
  // backend with the same model identity): its next frame takes index state.next_frame and its
  // outputs are what the exported session's would have been. On a refusal (the backend's: a
  // pool without room, bytes it cannot take) nothing is opened. Throws ConfigError for a bad spec.
  BackendImport ImportSession(const SessionState& state, RealtimeSessionId* id);
  // Whether the session has a frame waiting or in progress (false for an unknown one).
  [[nodiscard]] bool HasFrames(RealtimeSessionId id) const;
  // A live session's spec (null for an unknown one), and the index its next frame takes (0).
  [[nodiscard]] const SessionSpec* session_spec(RealtimeSessionId id) const;
  [[nodiscard]] std::int64_t next_frame(RealtimeSessionId id) const;

  enum class SubmitResult : std::uint8_t {
    kOk,
    kUnknownSession,
    kNotExternal,
    kTooEarly,  // max_pending_frames of the session are still waiting
    kTooFast,   // ahead of the session's declared rate (FramePacing)
    kEmpty,     // no tokens
    kTooMany,   // more tokens than the session's input_tokens_per_frame
    // Never from the loop: a driver's refusal while it hands the session to another replica
    // (server::EngineService during a drain), in the same vocabulary.
    kMoving,
  };
  // A frame of an external_frames session with these input tokens (1 to input_tokens_per_frame of
  // them: what admission sized the session for; ids must be valid for the backend's vocabulary:
  // the caller checks), arriving at `arrival` on the loop's clock (default: now; a server passes
  // the time its network thread received the frame, so time spent queued for the loop's thread
  // counts against the frame). Its deadline is arrival + deadline_ms. Checked in the order of
  // SubmitResult; a refused frame changes nothing.
  SubmitResult SubmitFrame(RealtimeSessionId id, std::vector<TokenId> tokens,
                           std::optional<Nanos> arrival = std::nullopt);

  // Runs iterations until the loop's time (s since the origin) reaches t_end_s. With nothing to do
  // it sleeps until the next frame arrival or deadline.
  void RunUntil(double t_end_s);
  // One iteration; returns false if there was no work (the caller may sleep).
  bool RunIteration();
  // One iteration, or, when there is no work, a sleep until the next frame arrival or deadline
  // but no later than t_limit_s. Drivers that interleave their own events (session arrivals,
  // admission ticks) call this in a loop.
  void RunOnce(double t_limit_s);
  // Time (s since the origin) of the next frame arrival or blocked frame's deadline; +inf with no
  // sessions.
  [[nodiscard]] double NextEventSeconds() const;

  [[nodiscard]] const LoopStats& stats() const { return stats_; }
  [[nodiscard]] std::int64_t active_sessions() const {
    return static_cast<std::int64_t>(sessions_.size());
  }
  [[nodiscard]] std::vector<RealtimeSessionId> session_ids() const;
  [[nodiscard]] LoopFootprint footprint() const;
  [[nodiscard]] std::int64_t resident_blocks(RealtimeSessionId id) const;
  [[nodiscard]] Backend& backend() { return *backend_; }

  // Iteration time (s) and batch tokens of each step (may be empty).
  std::function<void(double, int)> on_iteration;

 private:
  // Times are integer nanoseconds of the clock, so arrivals are exact (index * period from the
  // session's start, drift-free) and comparisons never suffer from rounding.
  struct Frame {
    std::int64_t index = 0;
    Nanos arrival{0};
    Nanos deadline{0};
    bool input_fed = false;
    int input_offset = 0;        // tokens of the frame's input already fed (chunked by the budget)
    bool blocked = false;        // the last attempt found the pool exhausted
    std::vector<TokenId> input;  // external frames: the client's tokens
    std::vector<TokenId> outputs;
  };
  struct Session {
    SessionSpec spec;
    BackendSessionId backend_id = 0;
    Nanos start{0};
    Nanos next_arrival{0};
    std::int64_t next_index = 0;
    std::deque<Frame> frames;
    bool prompt_fed = false;
    // When the prompt went into the KV: Nanos::min() without one, Nanos::max() until it has.
    Nanos prompt_in = Nanos::min();
    TokenId pending_output = -1;  // last output of the previous frame, appended next
    int consecutive_starved = 0;
    Nanos rate_tat = Nanos::min();  // FramePacing's theoretical arrival time (external frames)
    bool ready = false;             // listed in ready_
    bool ended = false;             // retired: waiting for its arrivals_ entry to pop
    std::vector<TokenId> chunk;     // tokens of this iteration's item (kept alive for the step)
  };

  void ReleaseArrivals(Nanos now);
  void DeliverExpired();
  void Deliver(RealtimeSessionId id, Session& s, Nanos when, FrameOutcome outcome);
  [[nodiscard]] Nanos NextEventTime() const;
  void CompactReady();                          // drops ended sessions and those with no frame left
  [[nodiscard]] double Seconds(Nanos t) const;  // s since the origin

  Backend* backend_;
  Clock* clock_;
  LoopOptions options_;
  Nanos origin_{0};
  SessionObserver* observer_ = nullptr;
  // Per-iteration work is O(sessions with work), not O(sessions), and never searches the map:
  // every live session has exactly one entry in the arrivals_ min-heap (its next frame arrival,
  // with its address), and ready_ lists the sessions with arrived, undelivered frames by id.
  struct Arrival {
    Nanos t;
    RealtimeSessionId id;
    Session* session;
    bool operator>(const Arrival& o) const { return t != o.t ? t > o.t : id > o.id; }
  };
  // Retires a session: closes it in the backend and frees it, or, when it still has an arrivals_
  // entry (clocked frames), moves its emptied node (same address) to ended_ until that entry pops.
  // External-frame sessions have no arrivals_ entry, so nothing of them stays behind. Not while
  // iterating ready_ (RunIteration nulls its entry instead).
  using SessionMap = std::map<RealtimeSessionId, Session>;
  void Retire(SessionMap::iterator it);

  // Node-based: Session addresses are stable, so the heap, ready_ and the step's items point at
  // them.
  SessionMap sessions_;
  std::map<RealtimeSessionId, SessionMap::node_type> ended_;
  std::priority_queue<Arrival, std::vector<Arrival>, std::greater<>> arrivals_;
  std::vector<std::pair<RealtimeSessionId, Session*>> ready_;
  RealtimeSessionId next_id_ = 1;
  LoopStats stats_;
  std::vector<BackendItem> items_;
  // The step's plan: items_[i] is the frame of ready_[planned_[i].ready_index].
  struct Planned {
    Nanos deadline{0};
    std::size_t ready_index = 0;
    int tokens =
        0;  // the frame's next item: all its tokens in candidates_, this step's in planned_
    bool completes_input = true;  // the item is the whole rest of the frame's input (or a decode)
    // The item carries the session's prompt: with a step budget it takes only what every other
    // ready frame leaves, so a prompt delays its own session's start and no one else's frame.
    bool prompt = false;
  };
  // The smallest deadline_ms of the live sessions whose prompt is fed (+inf: none): whom a
  // prompt's prefill must not delay.
  [[nodiscard]] double TightestDeadlineMs() const;
  // Tokens of a prompt chunk at position `pos` that PromptPacing allows, of `wanted`: the most
  // whose predicted work fits *budget_s (at least `least`), whose work it then takes from it.
  [[nodiscard]] int PromptChunkTokens(const kv::KvPolicy& policy, TokenPos pos, int wanted,
                                      int least, double* budget_s) const;
  std::vector<Planned> candidates_;
  std::vector<Planned> planned_;
  // RunIteration's stages. The candidates (candidates_): one per session with an arrived,
  // unfinished frame; returns their tokens.
  std::int64_t CollectCandidates();
  // The step's items (items_, planned_) from the candidates, within the step budget.
  void PlanStep(std::int64_t ready_tokens);
  // A step's good result for session `s`'s front frame: the input fed (or its next part), the
  // output appended, the frame delivered once complete (at `done`).
  void AdvanceFrame(RealtimeSessionId id, Session& s, const Planned& p,
                    const BackendItemResult& result, Nanos done);
  std::vector<BackendItemResult> results_;
};

}  // namespace metronome::realtime
