// What the windowed controllers (aimd, gradient2) share: the control window (the frames counted
// since it opened, the peak active count, the limit rejections, and the one rule that closes it:
// at window_s, or once it holds enough frames and has lasted min_window_s) and the controller
// around it (Decide's order of checks, the limit refusal, the KV guard, retry hints, the limit
// log). What a controller measures per frame (AIMD's latency samples, gradient2's mean) and
// decides when a window closes stays with the controller. Thread-safety: not thread-safe; owned by
// the engine thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "metronome/admission/admission.h"
#include "metronome/admission/step_load.h"

namespace metronome::admission {

// printf into a string (at most 511 characters): the limit log's reasons and refusal details.
template <class... Args>
[[nodiscard]] std::string Format(const char* fmt, Args... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, fmt, args...);
  return buf;
}

// What a window held when it closed. Its "active" counts are the admitted load in whole units of
// work (SystemState::WorkUnits): sessions, when every session is priced at one unit.
struct ClosedWindow {
  double duration_s = 0.0;  // close time - open time, s
  std::int64_t num_frames = 0;
  std::int64_t peak_active = 0;  // largest active count noted in the window, and at its close
  // Smallest active count noted in the window (at its open, and at its close): the load it carried
  // throughout.
  std::int64_t least_active = 0;
  std::int64_t num_limit_rejections = 0;
  StepLoadWindow load;  // the engine's steps in the window (StepLoad): busy time, utilization
};

// Invariants: the first call that gives a time opens the first window; every Close opens the next
// at the close time, with the active count then as its peak; last_frames_per_s() is the frame rate
// of the last closed window (0 before any close, or when that window had no frames or no
// duration).
class ControlWindow {
 public:
  explicit ControlWindow(const WindowOptions& options) : options_(options) {}

  // One frame reported at now_s (opens the first window). No allocation.
  void OnFrame(double now_s) noexcept {
    Open(now_s);
    ++num_frames_;
  }
  // One engine step (StepLoad::OnStep) and the fit's estimate after it, which the window's close
  // reads. No allocation.
  void OnStep(double step_s, std::int64_t batch_tokens, const StepCost& cost) noexcept {
    steps_.OnStep(step_s, batch_tokens);
    cost_ = cost;
  }
  // Whether the window is due to close at now_s: at open + window_s, or once it holds
  // `frames_needed` frames (when window_frames > 0) and has lasted min_window_s. When not due,
  // `active` counts towards the window's peak and least.
  [[nodiscard]] bool Due(double now_s, std::int64_t active, std::int64_t frames_needed);
  // When the window is expected to close: open + window_s, or earlier at the last window's frame
  // rate once `frames_needed` frames are in (never before open + min_window_s); never before now_s.
  [[nodiscard]] double NextCloseS(double now_s, std::int64_t frames_needed) const;
  // Closes the window at now_s with `active` sessions in place and opens the next one.
  ClosedWindow Close(double now_s, std::int64_t active);

  // An admission that took the load to `units_after` (whole units of work).
  void NoteAdmitted(std::int64_t units_after) {
    active_.peak = std::max(active_.peak, units_after);
  }
  void NoteLimitRejection() { ++num_limit_rejections_; }

  [[nodiscard]] std::int64_t num_frames() const { return num_frames_; }
  [[nodiscard]] double last_frames_per_s() const { return last_frames_per_s_; }
  [[nodiscard]] const WindowOptions& options() const { return options_; }

 private:
  void Open(double now_s) {
    if (opened_) return;
    opened_ = true;
    open_s_ = now_s;
  }

  WindowOptions options_;
  bool opened_ = false;
  double open_s_ = 0.0;
  std::int64_t num_frames_ = 0;
  // The active counts noted in the window: the largest and the smallest.
  struct ActiveRange {
    std::int64_t peak = 0;
    std::int64_t least = 0;
    void Note(std::int64_t active) {
      peak = std::max(peak, active);
      least = std::min(least, active);
    }
  } active_;
  std::int64_t num_limit_rejections_ = 0;
  double last_frames_per_s_ = 0.0;
  StepLoad steps_;
  StepCost cost_;  // the latest estimate of the engine's step cost
};

// A controller whose limit moves only when a control window closes. Decide: observe the active
// count (retry hints), OnDecide (the subclass's look at the request and pool), close the window if
// due, then refuse with "limit" when the request does not fit the budget (FitsBudget: the admitted
// work plus the request's over the limit; retry after DecisionInS or a session end,
// whichever is expected first), or "kv_guard" when the guard is on and active >= SessionsThatFit
// (retry after a session end); otherwise admit. A session over the budget by itself is admitted
// into an empty engine, the budget raised to its price (RaiseForLoneSession): a budget that
// admits nobody gets no frames to move it.
// Invariants: limit() changes only through SetLimit, every change logged; min_limit <= limit() <=
// max_limit when the subclass clamps what it sets (both do).
class WindowedController : public AdmissionController {
 public:
  Decision Decide(const SessionRequest& request, const SystemState& state, double now_s) final;
  // Closes and evaluates the window if due; the next window starts at now_s.
  void OnTick(double now_s, const SystemState& state) final;
  void OnStep(double step_s, std::int64_t batch_tokens, const StepCost& cost) noexcept final {
    window_.OnStep(step_s, batch_tokens, cost);
  }
  [[nodiscard]] std::int64_t limit() const final { return limit_; }
  [[nodiscard]] bool budgets_work() const final { return true; }
  [[nodiscard]] bool reserves_kv() const final { return window_.options().kv_guard; }
  std::vector<LimitChange> TakeLimitChanges() final;

 protected:
  WindowedController(const WindowOptions& window, const MemoryOptions& memory,
                     std::int64_t initial_limit);

  // Called by Decide before the window may close; `fit` is the KV guard's SessionsThatFit for
  // `request` (kNoLimit without the guard).
  virtual void OnDecide(const SessionRequest& /*request*/, const SystemState& /*state*/,
                        std::int64_t /*fit*/, double /*now_s*/) {}
  // Frames that close a window early.
  [[nodiscard]] virtual std::int64_t FramesNeeded() const {
    return window_.options().window_frames;
  }
  // Seconds until a decision could lift the limit (+inf: only a session end frees a place).
  [[nodiscard]] virtual double DecisionInS(double now_s) const {
    return window_.NextCloseS(now_s, FramesNeeded()) - now_s;
  }
  // The window that closed at now_s with `active` sessions in place (the next one is open).
  virtual void Evaluate(const ClosedWindow& closed, double now_s, std::int64_t active) = 0;

  void SetLimit(double now_s, std::int64_t to, std::string reason);
  [[nodiscard]] const MemoryOptions& memory() const { return memory_; }

  ControlWindow window_;

 private:
  void Advance(double now_s, std::int64_t active);
  // When `request` alone is over the budget and the engine is empty: raises the limit to its
  // price (logged) and returns true, unless the price is over max_limit or the KV guard holds no
  // session (`fit` < 1).
  bool RaiseForLoneSession(const SessionRequest& request, const SystemState& state,
                           std::int64_t fit, double now_s);

  MemoryOptions memory_;
  std::int64_t limit_;
  std::vector<LimitChange> changes_;
  RetryHint retry_;
};

}  // namespace metronome::admission
