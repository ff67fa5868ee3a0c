// `aimd`: a deadline-anchored AIMD limit on the number of sessions. Per control window the signal
// is a percentile of per-frame latency / deadline (latency counted from frame arrival, so queueing
// counts) plus the deadline-miss ratio. A window closes on enough frames or at window_s. Grow only
// when the limit binds and the signal is below the low target: multiplicatively in slow start,
// then by a step scaled to the headroom left to the target, never jumping past where a queue model
// projects the low target when frames cost a sliver of the deadline, and only additively above the
// limit of the last miss-triggered cut; cut to floor(beta * active) when it
// exceeds the high target or misses pass a threshold, once confirmed (bursts of late frames
// unlikely at the observed stall rate), at most once per cooldown; hold in between
// (the dead band gives a fixed point instead of a sawtooth). Growth also needs the pooled
// percentile of the last growth_horizon_s under the low target, and stops where the engine's
// work utilization (StepLoad, from OnStep) at its slowest recent speed would pass
// max_utilization. Optional KV look-ahead guard: admit only while active < min(limit, N_mem).
// Thread-safety: not thread-safe; owned by the engine thread.
#pragma once

#include <cstdint>
#include <deque>
#include <limits>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "metronome/admission/windowed_controller.h"

namespace metronome::admission {

// What the controller saw in its last evaluated window.
struct AimdWindow {
  double end_s = 0.0;           // time of the evaluation
  std::int64_t num_frames = 0;  // frames reported in the window (not only the sampled ones)
  std::int64_t num_misses = 0;
  // Bursts of late frames (over the high target or missed, all within two deadlines of the first).
  std::int64_t num_over_bursts = 0;
  double signal = 0.0;           // percentile of latency / deadline over the sampled frames
  double miss_ratio = 0.0;       // num_misses / num_frames
  std::int64_t peak_active = 0;  // largest active count seen by Decide/OnTick in the window
  std::int64_t num_limit_rejections = 0;
  double utilization = 0.0;  // the engine's work utilization (StepLoad; 0: not known)
  bool binding = false;
  // Sessions whose frames were left out as late by themselves (AimdOptions::
  // self_late_work_fraction), their frames, and their work.
  std::int64_t self_late_sessions = 0;
  std::int64_t self_late_frames = 0;
  double self_late_work = 0.0;
};

// Invariants: min_limit <= limit() <= max_limit; the sample buffer never holds more than
// max_samples entries; limit changes happen only when a window is evaluated, at most one per
// window, besides the seed at the first Decide; with the KV guard, growth never takes the limit
// above the pool's bound for the session's window; growth never takes it past the window's
// work-utilization bound (max_utilization / utilization at the slowest recent speed per session)
// when that is known; slow start, once ended, never resumes.
class AimdController final : public WindowedController {
 public:
  // Both option structs must pass Validate (MTR_CHECK otherwise; MakeController validates first).
  AimdController(const AimdOptions& options, const MemoryOptions& memory);

  // Decide (WindowedController's order of checks) refuses with "limit" when active >= limit, or
  // "kv_guard" when the guard is on and active >= SessionsThatFit. Retry-after (RetryHint): while
  // the limit is growing, the time to the next decision or to the next session end, whichever is
  // expected first; otherwise (holding, or a kv_guard refusal) the time to the next session end.
  // The first call seeds the limit (AimdOptions::predicted_limit, the pool's bound with the guard).
  using AdmissionController::OnFrame;
  void OnFrame(const FrameSample& frame) noexcept override;
  void OnSessionEnded(std::uint64_t session) override { sessions_.erase(session); }
  [[nodiscard]] std::string Describe() const override;

  [[nodiscard]] const AimdWindow& last_window() const { return last_window_; }
  [[nodiscard]] bool cooling_down() const { return phase_ == Phase::kCoolingDown; }

 private:
  // Where the controller is in its cycle. Slow start (multiplicative growth) ends for good at the
  // first congestion signal, near the target or the utilization cap, or at the pool's bound; then
  // growth is additive or by headroom. A cut cools down (drain or fixed) and returns to the phase
  // it came from, or, when the load admitted before the cut reads healthy while nobody leaves,
  // recovers to that load and holds growth until a session has left.
  enum class Phase { kSlowStart, kGrowing, kCoolingDown, kHeldUntilDeparture };
  // What a closed window decides, applied in one place (Apply): hold, or set the limit to `to`
  // for `why` (the limit log's reason).
  struct LimitDecision {
    enum class Kind { kHold, kCut, kGrow, kRecover };
    Kind kind = Kind::kHold;
    std::int64_t to = 0;
    std::string why;
  };
  // A closed window as the handlers read it.
  struct Reading {
    AimdWindow w;
    const ClosedWindow& closed;
    double now_s = 0.0;
    std::int64_t active = 0;
    bool has_samples = false;  // w.signal was measured
  };
  // The growth inputs of a window with enough frames.
  struct GrowthInputs {
    double kv_growth = 1.0;      // the signal's factor to full KV
    double growth_signal = 0.0;  // the signal projected to full KV
    bool utilization_capped = false;
    double utilization_bound = 0.0;  // sessions at max_utilization (infinity: not capped)
  };

  // The pool's bound and KV fill at this decision; the first seeds the limit.
  void OnDecide(const SessionRequest& request, const SystemState& state, std::int64_t fit,
                double now_s) override;
  void Seed(double now_s);
  // Frames that close a window early: window_frames, or min_samples in slow start (far below the
  // target a few frames say as much as many).
  [[nodiscard]] std::int64_t FramesNeeded() const override;
  // A growing controller may lift the limit at its next decision; a holding one frees a place
  // only when a session ends.
  [[nodiscard]] double DecisionInS(double now_s) const override;
  // The window's bookkeeping, then the handler of the current phase, then Apply.
  void Evaluate(const ClosedWindow& closed, double now_s, std::int64_t active) override;
  // Builds the window's reading (self-late sessions left out, the growth horizon advanced) and
  // resets the per-window counts.
  [[nodiscard]] Reading CloseWindow(const ClosedWindow& closed, double now_s, std::int64_t active);
  [[nodiscard]] LimitDecision DecideWindow(const Reading& r);
  // The cooling-down handler: a decision, or nullopt when the cooldown is over and this window
  // acts as in the phase the cut came from.
  [[nodiscard]] std::optional<LimitDecision> OnCoolingDown(const Reading& r);
  [[nodiscard]] GrowthInputs ReadGrowthInputs(const Reading& r);
  // A crossing: cut once confirmed, hold until then (a decision); nullopt when the window is
  // under the targets.
  [[nodiscard]] std::optional<LimitDecision> OnCrossing(const Reading& r);
  [[nodiscard]] LimitDecision Cut(const Reading& r, std::int64_t evidence_bursts,
                                  double evidence_slots);
  [[nodiscard]] LimitDecision OnSlowStart(const Reading& r, const GrowthInputs& g);
  [[nodiscard]] LimitDecision OnGrowing(const Reading& r, const GrowthInputs& g);
  [[nodiscard]] LimitDecision OnHeldUntilDeparture(const Reading& r, const GrowthInputs& g);
  // Whether the window lets the limit grow: under the low target at full KV, binding, and the
  // growth horizon under the low target.
  [[nodiscard]] bool MayGrow(const Reading& r, const GrowthInputs& g) const;
  // The projected low-target crossing (sessions), and whether the saturating (queue) projection
  // gave it.
  struct Projection {
    double crossing = 0.0;
    bool saturating = false;
  };
  [[nodiscard]] Projection ProjectCrossing(const Reading& r, const GrowthInputs& g) const;
  // The growth step of the current phase, capped; hold when it does not raise the limit.
  [[nodiscard]] LimitDecision Grow(const Reading& r, const GrowthInputs& g);
  [[nodiscard]] std::string IncreaseReason(const Reading& r, const GrowthInputs& g,
                                           const char* phase, double crossing) const;
  void Apply(LimitDecision d, double now_s);
  void EndSlowStart() {
    if (phase_ == Phase::kSlowStart) phase_ = Phase::kGrowing;
  }

  AimdOptions options_;

  // What AIMD measures in the current window besides the frame count (window_).
  std::vector<double> samples_;  // latency / deadline; capacity max_samples, reserved once
  std::vector<std::uint64_t> sample_sessions_;  // the session of each sample (0: unknown)
  // Each known session's frames in the window: what leaving it out takes away.
  struct SessionWindow {
    std::int64_t frames = 0;
    std::int64_t late = 0;  // over the high target or missed
    std::int64_t misses = 0;
    std::int64_t over_low = 0;
    double work = 1.0;
  };
  std::unordered_map<std::uint64_t, SessionWindow> sessions_;  // one entry per live session
  // The window's late frames (time, session, deadline s) in order, to count bursts without the
  // sessions left out; capacity max_samples (beyond it the bursts count every session).
  struct LateFrame {
    double t_s = 0.0;
    std::uint64_t session = 0;
    double deadline_s = 0.0;
  };
  std::vector<LateFrame> late_frames_;
  bool late_frames_overflow_ = false;
  // Leaves the self-late sessions' frames out of the window's samples and counts (w, and the
  // bursts and over-low frames it returns through the arguments); resets the per-session counts.
  void LeaveOutSelfLate(AimdWindow& w, std::int64_t& over_low);
  std::int64_t num_misses_ = 0;
  std::int64_t num_over_low_ = 0;  // frames of the window at or over the low target (all frames)
  // The windows of the last growth_horizon_s seconds, oldest first (with the last evaluated one):
  // growth needs their pooled percentile under the low target.
  struct HorizonWindow {
    double end_s = 0.0;
    std::int64_t frames = 0;
    std::int64_t over_low = 0;
  };
  std::deque<HorizonWindow> horizon_;
  std::int64_t horizon_frames_ = 0;  // sums over horizon_
  std::int64_t horizon_over_low_ = 0;
  // Whether the pooled percentile of horizon_ is under the low target (nearest rank: at most
  // frames - ceil(percentile / 100 x frames) of them at or over it).
  [[nodiscard]] bool HorizonUnderLowTarget() const;
  // Bursts of frames over the high target or missed in the window: such a frame more than
  // kBurstDeadlines deadlines after the current burst's first starts a new one.
  std::int64_t num_over_bursts_ = 0;
  double burst_start_s_ = 0.0;
  double deadline_s_ = 0.0;  // of the last frame
  // One engine stall (the process preempted, another process on the cores) delays every frame in
  // flight by about its length and leaves a queue that drains within about one more deadline: its
  // late frames all arrive within two deadlines, one burst however many sessions run. A latency
  // rise that tracks the load makes frames late in most periods: a burst in most slots of
  // kBurstDeadlines deadlines.
  static constexpr double kBurstDeadlines = 2.0;
  // A crossing (signal over the high target, or misses over the threshold) cuts once confirmed:
  // the bursts of the consecutive crossing windows so far are at least kMinConfirmBursts and
  // unlikely (Poisson tail under kStallFalseCut) at the stall rate, the bursts per slot of the
  // windows that did not cut. Until then the limit holds.
  static constexpr std::int64_t kMinConfirmBursts = 3;
  static constexpr double kStallFalseCut = 1e-3;
  std::int64_t crossing_bursts_ = 0;  // over the consecutive crossing windows so far
  double crossing_slots_ = 0.0;
  // Over the windows that did not cut, each weighing exp(-age / kStallRateTauS): a machine that
  // grows quieter (a co-tenant left) lowers the rate within minutes, and the bursts of episodes
  // the confirmation held do not raise it for good.
  static constexpr double kStallRateTauS = 300.0;
  double stall_bursts_ = 0.0;
  double stall_slots_ = 0.0;
  // Bursts per slot over the windows that did not cut (0 before any).
  [[nodiscard]] double StallRate() const {
    return stall_slots_ > 0.0 ? stall_bursts_ / stall_slots_ : 0.0;
  }
  std::uint64_t rng_state_ = 0x9e3779b97f4a7c15ULL;  // reservoir sampling; fixed seed: reproducible

  Phase phase_;
  // The phase a cut came from (kGrowing or kHeldUntilDeparture): where the cooldown returns to.
  Phase resume_phase_ = Phase::kGrowing;
  bool seeded_ = false;  // the first Decide seeds the limit (predicted N*, pool bound)
  bool raised_ = false;  // the last evaluated window raised the limit
  double last_increase_s_ = -std::numeric_limits<double>::infinity();  // its time
  // The KV guard's bound at the last Decide in units of work (the admitted work plus
  // SessionsThatFit's room for sessions like the request); -1: unknown.
  std::int64_t pool_bound_ = -1;
  // used / (used + promised) KV blocks at the last Decide (1: no pool, or all promises kept), not
  // below kMinKvFill; growth projects the signal to full KV with it.
  static constexpr double kMinKvFill = 0.01;
  // Share of frame latency assumed to grow with the KV a session holds (attention over its
  // window): the four presets' cost models put it at 0.05-0.2 at N_true, so 0.25 errs safe.
  static constexpr double kKvLatencyShare = 0.25;
  // The KV fill (kv_fill_) from which a window may take the limit past a calibrated prediction.
  static constexpr double kPredictionKvFill = 0.9;
  double kv_fill_ = 1.0;
  // Growth also obeys the saturating (queue) projection when the latency floor (at full KV) is
  // under kQueueModelFloor x the low target: a frame then costs a sliver of its deadline at low
  // load, so latency can reach the target only by queueing (qwen25-omni-7b: 0.02, the 1 s presets
  // 0.03-0.05). With a larger floor (moshi-7b: 0.16) latency grows with the batch's cost, which
  // the queue model built on the floor reads as saturation far too early (it held moshi's slow
  // start to +1 a window).
  static constexpr double kQueueModelFloor = 0.1;
  // Lowest signal of any evaluated window projected to full KV (the latency floor of the hyperbolic
  // projection).
  double floor_signal_ = std::numeric_limits<double>::infinity();

  // The limit set by the last cut that misses triggered while the signal was under the high
  // target (-1: none yet); growth above it is additive only.
  std::int64_t miss_ceiling_ = -1;
  double last_cut_s_ = 0.0;
  // Draining after a cut while nobody leaves: consecutive windows at or under the high target
  // (signal and misses) it takes to call the crossing passed when the signal stays in the dead
  // band (under the low target, one is enough). Three: a crossing the confirmation took for load
  // does not come back within three windows only by chance.
  static constexpr std::int64_t kRecoverWindows = 3;
  std::int64_t healthy_while_cooling_ = 0;
  AimdWindow last_window_;
};

}  // namespace metronome::admission
