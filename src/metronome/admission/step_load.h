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
};

// The fit itself, one per engine: every reader of the engine's load (the admission controller's
// control windows, the supervisor's samples) closes its windows against the same fit.
// Invariants: the estimate's coefficients are never negative (a negative per-token cost makes every
// step fixed cost, a negative fixed cost makes it all per-token work: per_token_s = time / tokens).
class StepCostFit {
 public:
  static constexpr double kFitTauS = 10.0;  // time constant of the fit's forgetting, s
  // Least spread of batch tokens (standard deviation / mean, over the fit's weighted steps) that
  // tells the fixed part from the per-token part.
  static constexpr double kMinBatchCv = 0.05;

  // One engine step that ended at now_s, took step_s seconds (>= 0) and carried batch_tokens
  // tokens; steps with none are idle bookkeeping and do not enter the fit. No allocation.
  void OnStep(double now_s, double step_s, std::int64_t batch_tokens) noexcept;
  [[nodiscard]] StepCost Estimate() const noexcept;

 private:
  // Exponentially weighted sums (weight exp(-(last_s - t) / kFitTauS)), x = tokens, y = step
  // seconds, as of the last step's time.
  double w_ = 0, sx_ = 0, sy_ = 0, sxx_ = 0, sxy_ = 0;
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
