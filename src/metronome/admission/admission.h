// Admission: pluggable controllers that decide whether a new real-time session may join the engine.
// They are pure control laws (numbers in, decisions and limits out): no clock reads, no engine or
// pool dependency; the caller passes time as `now_s` and the pool state as a SystemState. Admission
// is irreversible for a session's lifetime, so no controller ever evicts an admitted session: a
// limit below the active count only blocks new sessions.
// Thread-safety: a controller is not thread-safe; one thread (the engine's) owns and calls it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "metronome/admission/step_load.h"

namespace metronome::admission {

// What a new session asks for.
struct SessionRequest {
  double period_ms = 80.0;    // frame period; > 0
  double deadline_ms = 80.0;  // per-frame deadline D, measured from frame arrival; > 0
  // KV blocks the session will hold at most: its window bound (KvPolicy::MaxResidentBlocks) in
  // window mode, or a projection at MemoryOptions::full_mode_session_s in full mode
  // (ProjectFullModeBlocks). >= 0.
  std::int64_t projected_blocks = 0;
  // The session's price in units of work: its share of the engine per second (PriceSession) over
  // that of the driver's reference session, so one session of the reference shape is 1.0 and the
  // controllers' limits are budgets in "sessions of the reference shape". 1 when no cost model
  // prices sessions (every session counts as one). > 0.
  double work = 1.0;
};

// The engine's view of itself when a decision is made. Includes every session admitted by earlier
// Decide calls, even if it has not run a frame yet.
struct SystemState {
  std::int64_t active_sessions = 0;
  std::int64_t free_blocks = 0;
  std::int64_t total_blocks = 0;
  // Blocks promised but not yet used: sum over admitted sessions of
  // max(0, projected_blocks - blocks held now).
  std::int64_t reserved_blocks = 0;
  // Sum of the admitted sessions' SessionRequest::work; < 0: not given, each session counts as one
  // (Work() is then active_sessions).
  double active_work = -1.0;

  // The admitted work in units of the reference session.
  [[nodiscard]] double Work() const {
    return active_work < 0.0 ? static_cast<double>(active_sessions) : active_work;
  }
  // Work() rounded up to whole units (a small tolerance absorbs the sum's rounding): the load the
  // controllers' integer budgets compare with. Equals active_sessions when every session is 1.
  [[nodiscard]] std::int64_t WorkUnits() const;
};

// Whole units of `work` (ceil, with a 1e-9 tolerance for floating-point sums).
[[nodiscard]] std::int64_t WholeUnits(double work);

// The budget rule of every limit-based controller, in one place: the request fits when the admitted
// work plus its own stays within `limit` units (for sessions of one unit: active < limit).
[[nodiscard]] bool FitsBudget(const SessionRequest& request, const SystemState& state,
                              std::int64_t limit);
// The refusal's detail: "work 12.40 + 1.30 > budget 13 (9 sessions active)".
[[nodiscard]] std::string BudgetDetail(const SessionRequest& request, const SystemState& state,
                                       std::int64_t limit);

struct Decision {
  bool admit = false;
  // Empty when admitted; otherwise a short code ("limit", "kv_guard", "pool") a client can switch
  // on.
  std::string reason{};
  std::string detail{};         // human-readable, with the numbers behind the rejection
  double retry_after_ms = 0.0;  // hint for the client; 0 when admitted
};

// One change of a controller's session limit.
struct LimitChange {
  double t_s = 0.0;  // the caller's time of the window close that made the change
  std::int64_t from = 0;
  std::int64_t to = 0;
  std::string reason{};  // e.g. "increase: p99/D=0.52 < 0.65, binding (peak active 30, limit 31)"
};

// limit() of controllers that do not cap the session count (memory).
inline constexpr std::int64_t kNoLimit = -1;

// Options of the memory controller and of the AIMD controller's KV look-ahead guard.
struct MemoryOptions {
  // Assumed session length for the full-mode projection (ProjectFullModeBlocks), seconds. Longer is
  // safer against the pool running dry mid-session but admits fewer sessions. Default 300 s.
  double full_mode_session_s = 300.0;
  // Fraction of the pool never promised to sessions, in [0, 1): slack for projection error.
  // Default 0 (the projection is trusted).
  double headroom_fraction = 0.0;
};

// How the AIMD controller limits itself to one cut per congestion episode.
enum class CooldownMode : std::uint8_t {
  // After a cut, hold until one full control window has run with active <= limit throughout (the
  // first window that measures the load the cut allows), then act on that window. A cut cannot
  // take effect before admitted sessions end, so a fixed timer either waits too long or lets the
  // limit collapse while latency is still high from sessions admitted before the cut. The hold also
  // ends on a window whose signal is back under the low target with no more misses than the
  // threshold while it still carries the load admitted before the cut (or on three such windows in
  // the dead band): what caused the crossing has passed (a co-tenant that left, a stall the
  // confirmation could not tell from load), and with sessions that never end, waiting for the drain
  // would hold the limit below that load for good. The limit then follows the load it read,
  // and grows again only after a session has left (growth admits for good, while a cut sheds
  // nothing until someone leaves).
  kDrain,
  // After a cut, hold for AimdOptions::cooldown_s.
  kFixed,
};

// The control window and the limit bounds of the windowed controllers (aimd, gradient2): one
// notion of a window, so the two compare on the same evidence. Validated by Validate(options,
// prefix), which names each field under the controller's prefix ("aimd.window_s").
struct WindowOptions {
  // Control window over which frame latencies are collected, s: the longest a window lasts. It
  // closes earlier once it holds window_frames frames and has lasted min_window_s. > 0.
  double window_s = 2.0;
  // Frames that close a window early (0: windows last window_s). A decision rests on enough
  // samples, not on a fixed number of periods: 200 sessions of a 2 s period fill 400 frames in
  // 4 s. In AIMD's slow start min_samples frames suffice. >= 0.
  std::int64_t window_frames = 400;
  // Shortest window, s: a session admitted at a window's start must show its load in the window
  // (window_s still ends every window). >= 0.
  double min_window_s = 0.5;
  std::int64_t min_samples = 20;  // frames; windows with fewer frames hold. >= 1
  // The limits of the budget, in units of work (SessionRequest::work; one unit is one session of
  // the reference shape).
  std::int64_t min_limit = 1;     // units; >= 0
  std::int64_t max_limit = 1024;  // units; >= min_limit
  // KV look-ahead guard: also require active < N_mem (SessionsThatFit), so a latency signal that
  // stays flat until the pool runs dry cannot over-admit. Uses MemoryOptions.
  bool kv_guard = false;
};

struct AimdOptions {
  WindowOptions window{};
  double percentile = 99.0;   // signal = this percentile of latency/deadline, in (0, 100]
  double low_target = 0.65;   // grow only while the signal is below low_target * D
  double high_target = 0.85;  // cut when the signal exceeds high_target * D; > low_target
  // Cut when the window's deadline-miss ratio exceeds this, in [0, 1). Default 0.1%.
  double miss_ratio_threshold = 0.001;
  std::int64_t increase_step = 1;  // least sessions added per window when growing; >= 1
  // Slow start: until the first congestion signal (a cut, or a window at or above
  // slow_start_exit * low_target) or the KV guard's bound, a growing window multiplies the limit
  // by up to slow_start_factor, never past the projected low-target crossing (below). 1: no slow
  // start. In [1, 16].
  double slow_start_factor = 2.0;
  double slow_start_exit = 0.8;  // in (0, 1]
  // Growth scaled to the headroom: a growing window moves the limit this fraction of the way to
  // the projected low-target crossing peak_active * low_target / signal (latency extrapolated in
  // proportion to the active count, which over-estimates it when a frame has a fixed cost, so the
  // projection undershoots), at least increase_step. 0: always increase_step. In [0, 1].
  double headroom_gain = 0.5;
  // Growth also needs the percentile of every frame of the last growth_horizon_s seconds (the
  // windows closed in it, pooled) under the low target, not only the last window's: growth admits
  // for good while a cut sheds nobody until sessions leave, so it rests on more evidence than a
  // cut. Near capacity a real engine's latency comes in episodes (a stall's backlog amplified by
  // the queue) with calm windows between them, and one calm window read as room to grow ratcheted
  // the CPU engine to 1.17 N_true. Cuts still act on one window. 0: the last window alone. >= 0.
  double growth_horizon_s = 10.0;
  // Work-utilization cap: growth stops where the engine's work utilization (StepLoad: the share of
  // real time its steps spend on per-token work, from the engine's own step times, projected to
  // the limit in proportion to the sessions, at the slowest per-token cost of the last minutes:
  // StepCost::slowest_per_token_s) would pass this. Above
  // it a backlog drains at under 1 - max_utilization of real time, so disturbances become episodes
  // of late frames that the calm windows between them do not show. Not a cut: only growth obeys
  // it. 1: no cap. In (0, 1].
  double max_utilization = 0.9;
  // Sessions late by themselves leave the signal: at each window's close the frames of the
  // session with the largest share of late frames (over the high target, or missed) are left out
  // of the window's signal, misses and bursts, then those of the next worst while the work left
  // out stays within this fraction of the work that sent frames. A load that is too much makes
  // most sessions late, and what is left still shows it; one session that is late because of
  // itself (a deadline its own frame cannot meet, more work than it declared) moves neither cuts
  // nor growth: the budget moves by at most its share. 0: every frame counts. In [0, 0.5].
  double self_late_work_fraction = 0.05;
  double beta = 0.9;  // cut to floor(beta * active); in (0, 1)
  CooldownMode cooldown_mode = CooldownMode::kDrain;
  double cooldown_s = 4.0;  // only for kFixed; >= 0
  // Warm start (e.g. the limit of a previous run), units of work; in [window.min_limit,
  // window.max_limit].
  std::int64_t initial_limit = 4;
  // N* predicted before the first frame by a calibrated cost model (0: none). When set, the first
  // decision seeds the limit with it (capped by the KV guard's bound when the guard is on) instead
  // of initial_limit, with no slow start, and growth past it is paced: the least step, at most
  // once per growth_horizon_s. The limit log says which. >= 0.
  std::int64_t predicted_limit = 0;
  // Frame latencies kept per window (reservoir sampling beyond it, so the percentile is exact up to
  // this many frames and an unbiased estimate above). 8 bytes each, allocated once.
  std::int64_t max_samples = 4096;
};

// Options of the `gradient2` controller, a peer baseline after Netflix concurrency-limits'
// Gradient2Limit: per window, gradient = clamp(tolerance * long / short, 0.5, 1) where short is the
// window's mean latency / deadline and long an exponential average of it over long_window windows;
// limit <- (1 - smoothing) * limit + smoothing * (gradient * limit + queue_size). It has no
// deadline anchor: it holds where short-run latency is within `tolerance` of the long-run one.
struct Gradient2Options {
  WindowOptions window{};
  double tolerance = 1.5;            // short may exceed long by this factor before a cut; >= 1
  double smoothing = 0.2;            // weight of the new estimate; in (0, 1]
  std::int64_t queue_size = 4;       // sessions added per window at gradient 1; >= 0
  std::int64_t long_window = 600;    // windows in the long-run average; >= 1
  std::int64_t warmup_windows = 10;  // the long-run value is a plain mean over these; >= 1
  std::int64_t initial_limit = 4;    // units of work; in [window.min_limit, window.max_limit]
};

// Retry-after hints drawn from a controller's state: the expected time until its answer can
// change (its next decision, or the next session end), jittered so that clients refused together
// do not come back together. Ends are counted from the active counts the controller is shown: a
// count below what admissions predicted means sessions ended.
//
// A crowd is spread over the ends to come: each refusal that waits for an end is given the next
// end not yet promised to a client refused before it (a virtual queue: `queue_until_s`, one
// expected end gap further per refusal, drained by time), so with k clients waiting the hint is
// about k end gaps, not one, and each end sees about one retry instead of the whole crowd. With
// no crowd the queue is empty and the hint is one end gap. A client that gave up keeps its place
// only until its turn passes. Deterministic: a fixed-seed generator, so a simulated run is
// reproducible.
class RetryHint {
 public:
  static constexpr double kJitterFraction = 0.5;  // one end gap x U[0, kJitterFraction) is added
  static constexpr double kEndRateTauS = 60.0;    // time constant of the end-rate average, s
  static constexpr double kMaxHintMs = 30'000.0;  // no hint exceeds this, ms (nor the queue)

  explicit RetryHint(std::uint64_t seed = 0x243f6a8885a308d3ULL) : rng_state_(seed) {}

  // The active count at a decision or tick (before any admission it leads to).
  void Observe(double now_s, std::int64_t active);
  void OnAdmit() { ++expected_active_; }
  // Expected seconds until the next session ends (1 / the decaying end rate); +inf before any end.
  [[nodiscard]] double ExpectedEndGapS(double now_s) const;
  // Seconds until the last end promised to a refused client (0: no one is waiting for one).
  [[nodiscard]] double QueuedS(double now_s) const { return std::max(0.0, queue_until_s_ - now_s); }
  // Hint for a refusal that a decision due in `decision_in_s` could reverse (+inf: only a session
  // end can). With the end gap g known and the decision no sooner than the next unpromised end,
  // the refusal takes that end: wait = QueuedS + g, hint = max(period_ms, 1000 x wait) + 1000 x g
  // x U[0, kJitterFraction). Otherwise max(period_ms, 1000 x decision_in_s) (one period when
  // neither is known) x U[1, 1 + kJitterFraction). At most kMaxHintMs.
  [[nodiscard]] double Ms(double now_s, double period_ms, double decision_in_s);

 private:
  std::uint64_t rng_state_;
  bool started_ = false;
  double start_s_ = 0.0;
  double last_end_s_ = 0.0;
  double decayed_ends_ = 0.0;  // sum of ends weighted exp(-(now - t) / tau), as of last_end_s_
  std::int64_t expected_active_ = 0;
  double queue_until_s_ = 0.0;  // the last end promised to a refused client, s
};

// How a client spaces its retries: after the n-th refusal in a row (n >= 1) it waits
// min(max(cap_ms, hint_ms), hint_ms * 2^(n-1)): exponential backoff from the server's hint, capped
// (never below the hint itself), so a crowd that keeps being refused thins out instead of storming.
[[nodiscard]] double RetryBackoffMs(double hint_ms, std::int64_t refusals, double cap_ms);
// The cap the project's clients (loadgen, sim and drive's) use, ms: half the default patience, so
// a refused client still asks a few times before it gives up.
inline constexpr double kRetryBackoffCapMs = 5000.0;

// splitmix64: a small, well-mixed generator; controllers seed it with a constant so a run is
// reproducible.
[[nodiscard]] std::uint64_t NextRandom(std::uint64_t& state) noexcept;

// One emitted frame of an admitted session, as the controllers see it.
struct FrameSample {
  double now_s = 0.0;
  double latency_ms = 0.0;   // from the frame's arrival to its output
  double deadline_ms = 0.0;  // the session's own deadline, > 0
  bool missed = false;       // delivered after its deadline
  // The session it belongs to (0: unknown) and its price (SessionRequest::work): AIMD judges each
  // session's lateness as its own, so that one session late by itself cannot move the budget
  // (AimdOptions::self_late_work_fraction).
  std::uint64_t session = 0;
  double work = 1.0;
};

class AdmissionController {
 public:
  virtual ~AdmissionController() = default;

  // Whether the session described by `request` may join now. Never evicts anyone.
  virtual Decision Decide(const SessionRequest& request, const SystemState& state,
                          double now_s) = 0;
  // One emitted frame of an admitted session. Cheap: no allocation, except once per session that
  // a controller tracks on its own (AIMD).
  virtual void OnFrame(const FrameSample& /*frame*/) noexcept {}
  // A frame of an unknown session of one unit.
  void OnFrame(double now_s, double latency_ms, double deadline_ms, bool missed) noexcept {
    OnFrame(FrameSample{
        .now_s = now_s, .latency_ms = latency_ms, .deadline_ms = deadline_ms, .missed = missed});
  }
  // A session ended (it sends no more frames): controllers that track sessions forget it.
  virtual void OnSessionEnded(std::uint64_t /*session*/) {}
  // One engine step: its duration and the tokens it carried, and the engine's step cost as the
  // caller's one StepCostFit estimates it after that step (the controller's windows read their
  // work utilization against it). Cheap: no allocation.
  virtual void OnStep(double /*step_s*/, std::int64_t /*batch_tokens*/,
                      const StepCost& /*cost*/) noexcept {}
  // Called once per engine tick; controllers with control windows close them here (and in Decide).
  virtual void OnTick(double /*now_s*/, const SystemState& /*state*/) {}

  // Whether limit() is a budget of work (SessionRequest::work; aimd, gradient2) rather than a
  // count of sessions (static, memory).
  [[nodiscard]] virtual bool budgets_work() const { return false; }
  // Current limit (a budget of work, or a session count: budgets_work), or kNoLimit.
  [[nodiscard]] virtual std::int64_t limit() const = 0;
  // Whether admission promises KV: it admits a session only when the pool, less what earlier
  // sessions were promised, covers its request.projected_blocks (memory; aimd with kv_guard). Then
  // the promise is a per-session budget the caller may hold sessions to.
  [[nodiscard]] virtual bool reserves_kv() const { return false; }
  // Limit changes since the previous call, oldest first.
  virtual std::vector<LimitChange> TakeLimitChanges() { return {}; }
  // The controller and every parameter, e.g. "static(limit=8)".
  [[nodiscard]] virtual std::string Describe() const = 0;
};

// Sessions the pool can hold if each new one needs `request.projected_blocks`:
// active + floor(available / projected), available = free - reserved - ceil(headroom * total)
// (not below 0). Returns INT64_MAX when projected_blocks == 0.
[[nodiscard]] std::int64_t SessionsThatFit(const SessionRequest& request, const SystemState& state,
                                           const MemoryOptions& options);

// Blocks a full-mode session holds after `options.full_mode_session_s` of frames:
// ceil((prompt_tokens + frames * tokens_per_frame) / block_tokens), frames = session_s / period.
[[nodiscard]] std::int64_t ProjectFullModeBlocks(const MemoryOptions& options, double period_ms,
                                                 std::int64_t tokens_per_frame,
                                                 std::int64_t prompt_tokens,
                                                 std::int64_t block_tokens);

// Throw ConfigError naming the field and the bad value ("admission: aimd.beta must be in (0, 1),
// got 1.5").
void Validate(const AimdOptions& options);
void Validate(const MemoryOptions& options);
void Validate(const Gradient2Options& options);
// The window's fields and `initial_limit` in [min_limit, max_limit], each named under `prefix`
// ("aimd": "admission: aimd.window_s must be > 0, got -2"). The two above call it.
void Validate(const WindowOptions& window, std::int64_t initial_limit, const std::string& prefix);

// Builds a controller from a spec: "static:N" (N >= 0), "memory", "aimd" or "gradient2".
// Validates the options the controller uses. Throws ConfigError naming the bad spec or value.
[[nodiscard]] std::unique_ptr<AdmissionController> MakeController(
    const std::string& spec, const AimdOptions& aimd, const MemoryOptions& memory,
    const Gradient2Options& gradient2 = {});

}  // namespace metronome::admission
