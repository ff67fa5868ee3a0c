// The engine's work utilization, read from its steps. A continuously batching engine's step costs
// a fixed part (the weights read once, launches) plus a part per token of the batch:
// step_s = fixed_s + per_token_s x batch_tokens. A least-squares fit of that line over the recent
// steps (exponentially forgotten, time constant StepCostFit::kFitTauS) splits a window's busy time
// into the two, and the window's work utilization is per_token_s x (tokens stepped in it) / its
// duration: the load rho of the queue the frames wait in. Why it matters besides latency: a backlog
// (an engine stall, a burst of arrivals) drains at 1 - rho of real time, so near rho = 1 every
// disturbance turns into an episode of late frames about 1 / (1 - rho) times its length, while the
// windows between episodes read calm. Latency alone then says "room to grow" until the episodes
// dominate; the utilization says how close the engine is all along (the CPU engine near capacity:
// calm windows at p99 0.25-0.4 D up to 1.2 N_true, episodes of p50 50-370 ms in between). Pure:
// times come from the caller. Thread-safety: not thread-safe; one thread owns it.
#pragma once

#include <cstdint>

namespace metronome::admission {

// The fitted cost of a step: what StepCostFit says now.
struct StepCost {
  // Whether the fit has seen batch sizes varied enough to tell the fixed part from the per-token
  // part (coefficient of variation of the batch tokens >= StepCostFit::kMinBatchCv); otherwise
  // the coefficients are 0 and mean "unknown".
  bool valid = false;
  double fixed_s = 0;      // fitted fixed cost of a step, s, >= 0
  double per_token_s = 0;  // fitted cost of one batch token, s, >= 0
  // The dearest per-token cost of the recent past (>= per_token_s): the highest reading of a
  // short fit (time constant StepCostFit::kSpeedTauS), forgotten towards per_token_s with time
  // constant StepCostFit::kSlowestTauS. The speed a machine whose cores are shared falls back to.
  // Shared cores run the same steps a fraction slower in phases lasting seconds, and a calibration
  // may fall in either: admitting at the slowest recent speed means sessions admitted in a fast
  // phase are not shed in a slow one.
  double slowest_per_token_s = 0;
};

// The fit itself, one per engine: every reader of the engine's load (the admission controller's
// control windows, the supervisor's samples) closes its windows against the same fit.
// Invariants: the estimate's coefficients are never negative (a negative per-token cost makes every
// step fixed cost, a negative fixed cost makes it all per-token work: per_token_s = time / tokens);
// slowest_per_token_s >= per_token_s.
class StepCostFit {
 public:
  static constexpr double kFitTauS = 10.0;  // time constant of the fit's forgetting, s
  // Least spread of batch tokens (standard deviation / mean, over the fit's weighted steps) that
  // tells the fixed part from the per-token part.
  static constexpr double kMinBatchCv = 0.05;
  // The short fit that reads the machine's speed phase by phase, s: a phase of 4 s moves it 86% of
  // the way (the 10 s fit: 33%).
  static constexpr double kSpeedTauS = 2.0;
  // Forgetting of the slowest per-token cost, s: minutes, so that a slow phase a minute ago still
  // counts while a machine that has grown quieter is believed within a few minutes.
  static constexpr double kSlowestTauS = 300.0;

  // One engine step that ended at now_s, took step_s seconds (>= 0) and carried batch_tokens
  // tokens; steps with none are idle bookkeeping and do not enter the fit. No allocation.
  void OnStep(double now_s, double step_s, std::int64_t batch_tokens) noexcept;
  // The fit as of the last step (computed there: every reader asks after each step).
  [[nodiscard]] StepCost Estimate() const noexcept { return estimate_; }

 private:
  // An exponentially forgotten least-squares line step_s = fixed_s + per_token_s x tokens:
  // weighted sums (weight exp(-(last step's time - t) / tau)), x = tokens, y = step seconds.
  struct Regression {
    double w = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
    void Add(double decay, double x, double y) noexcept;
    [[nodiscard]] StepCost Line() const noexcept;  // slowest_per_token_s left 0
  };

  Regression fit_;    // kFitTauS
  Regression speed_;  // kSpeedTauS
  // The slowest reading of speed_, as of last_s_; it enters once speed_ has seen kFitTauS of
  // steps (before that a starting load's few steps).
  double slowest_per_token_s_ = 0;
  StepCost estimate_;  // fit_'s line and the slowest reading, as of the last step
  double first_s_ = 0;
  double last_s_ = 0;
  bool any_ = false;
};

// One window's load, read against the fit.
struct StepLoadWindow {
  // The fit was valid and the window had steps. Otherwise utilization is 0 and means "unknown".
  bool valid = false;
  std::int64_t steps = 0;    // steps in the window
  double busy_fraction = 0;  // sum of the window's step times / its duration, >= 0
  // cost.per_token_s x the window's batch tokens / its duration, in [0, busy_fraction].
  double utilization = 0;
  // The same tokens at cost.slowest_per_token_s: the utilization this window's load would be at
  // the slowest recent speed, >= utilization (a projection: it may pass 1).
  double utilization_at_slowest = 0;

  StepCost cost;  // the fit's estimate the window was read against
};

// A window's sums of the engine's steps. Invariants: utilization <= busy_fraction; the sums
// restart at Close.
class StepLoad {
 public:
  // One engine step: its seconds (>= 0; negative counts as 0) and batch tokens. No allocation.
  void OnStep(double step_s, std::int64_t batch_tokens) noexcept;
  // The window that lasted duration_s (> 0 for a utilization; 0 gives zeros), read against
  // `cost`, and restart its sums.
  StepLoadWindow Close(double duration_s, const StepCost& cost) noexcept;

 private:
  std::int64_t window_steps_ = 0;
  double window_busy_s_ = 0;
  double window_tokens_ = 0;
};

}  // namespace metronome::admission
