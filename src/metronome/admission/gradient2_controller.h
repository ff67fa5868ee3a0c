// `gradient2`: a peer baseline after Netflix concurrency-limits' Gradient2Limit, adapted to
// sessions. Per control window (closed like AIMD's: on enough frames, or at window_s) the short-run
// signal is the window's mean latency / deadline; the long-run signal an exponential average of it
// over long_window windows (a plain mean over the first warmup_windows). Then
//   gradient = clamp(tolerance * long / short, 0.5, 1)
//   estimate <- (1 - smoothing) * estimate + smoothing * (gradient * estimate + queue_size)
// and, when long / short > 2 (load fell away), long *= 0.95 so the baseline can come down. It has
// no deadline anchor: where latency rises slowly it keeps growing (the baseline drifts up with it),
// the failure the deadline-anchored AIMD avoids. Like Netflix it does not move while the limit is
// not binding (peak active < limit / 2). Optional KV look-ahead guard as AIMD's. Thread-safety: not
// thread-safe; owned by the engine thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "metronome/admission/windowed_controller.h"

namespace metronome::admission {

// Invariants: min_limit <= limit() <= max_limit; limit() == floor(estimate), the estimate moving
// only when a window with at least min_samples frames closes; with the guard, never admits at or
// above the pool's bound.
class Gradient2Controller final : public WindowedController {
 public:
  // Both option structs must pass Validate (MTR_CHECK otherwise; MakeController validates first).
  Gradient2Controller(const Gradient2Options& options, const MemoryOptions& memory);

  // Decide (WindowedController's) refuses with "limit" when active >= limit, or "kv_guard" as
  // AimdController. Retry-after: the time to the next decision or session end, whichever is
  // expected first (RetryHint).
  using AdmissionController::OnFrame;
  void OnFrame(const FrameSample& frame) noexcept override;
  [[nodiscard]] std::string Describe() const override;

  [[nodiscard]] double long_signal() const { return long_signal_; }
  [[nodiscard]] double estimate() const { return estimate_; }

 private:
  void Evaluate(const ClosedWindow& closed, double now_s, std::int64_t active) override;

  Gradient2Options options_;
  double estimate_;
  double signal_sum_ = 0.0;  // sum of latency / deadline over the window's frames

  std::int64_t num_windows_ = 0;  // evaluated windows, for the warm-up mean
  double long_signal_ = 0.0;
};

}  // namespace metronome::admission
