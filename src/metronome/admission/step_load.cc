#include "metronome/admission/step_load.h"

#include <algorithm>
#include <cmath>

namespace metronome::admission {

void StepCostFit::Regression::Add(double decay, double x, double y) noexcept {
  w = w * decay + 1.0;
  sx = sx * decay + x;
  sy = sy * decay + y;
  sxx = sxx * decay + x * x;
  sxy = sxy * decay + x * y;
}

void StepCostFit::OnStep(double now_s, double step_s, std::int64_t batch_tokens) noexcept {
  if (batch_tokens <= 0) return;
  step_s = std::max(0.0, step_s);
  const auto x = static_cast<double>(batch_tokens);
  const double dt = any_ && now_s > last_s_ ? now_s - last_s_ : 0.0;
  if (!any_) first_s_ = now_s;
  any_ = true;
  last_s_ = std::max(last_s_, now_s);
  fit_.Add(std::exp(-dt / kFitTauS), x, step_s);
  speed_.Add(std::exp(-dt / kSpeedTauS), x, step_s);
  estimate_ = fit_.Line();
  if (!estimate_.valid) return;
  // Forget towards the long fit's cost; then the phase's reading, once speed_ rests on enough.
  const double per_token_s = estimate_.per_token_s;
  if (slowest_per_token_s_ > per_token_s) {
    slowest_per_token_s_ =
        per_token_s + (slowest_per_token_s_ - per_token_s) * std::exp(-dt / kSlowestTauS);
  }
  if (last_s_ - first_s_ >= kFitTauS) {
    const StepCost phase = speed_.Line();
    if (phase.valid) slowest_per_token_s_ = std::max(slowest_per_token_s_, phase.per_token_s);
  }
  estimate_.slowest_per_token_s = std::max(per_token_s, slowest_per_token_s_);
}

StepCost StepCostFit::Regression::Line() const noexcept {
  StepCost c;
  if (!(w > 0 && sx > 0)) return c;
  const double mean_x = sx / w;
  const double var_x = std::max(0.0, sxx / w - mean_x * mean_x);
  if (var_x < kMinBatchCv * kMinBatchCv * mean_x * mean_x) return c;
  const double mean_y = sy / w;
  const double cov_xy = sxy / w - mean_x * mean_y;
  double per_token = cov_xy / var_x;
  double fixed = mean_y - per_token * mean_x;
  if (per_token < 0) {  // steps no dearer with more tokens: all fixed cost
    per_token = 0;
    fixed = mean_y;
  } else if (fixed < 0) {  // no fixed part: all of the time is per-token work
    fixed = 0;
    per_token = sy / sx;
  }
  c.valid = true;
  c.fixed_s = fixed;
  c.per_token_s = per_token;
  return c;
}

void StepLoad::OnStep(double step_s, std::int64_t batch_tokens) noexcept {
  ++window_steps_;
  window_busy_s_ += std::max(0.0, step_s);
  if (batch_tokens > 0) window_tokens_ += static_cast<double>(batch_tokens);
}

StepLoadWindow StepLoad::Close(double duration_s, const StepCost& cost) noexcept {
  StepLoadWindow r;
  r.steps = window_steps_;
  if (duration_s > 0) r.busy_fraction = window_busy_s_ / duration_s;
  r.cost = cost;
  if (cost.valid && r.steps > 0) {
    r.valid = true;
    // Per-token work is part of the busy time: the fit (over a longer span than the window) may
    // attribute more to this window's tokens than its steps took.
    if (duration_s > 0) {
      r.utilization = std::min(cost.per_token_s * window_tokens_ / duration_s, r.busy_fraction);
      r.utilization_at_slowest =
          cost.per_token_s > 0
              ? r.utilization * std::max(1.0, cost.slowest_per_token_s / cost.per_token_s)
              : 0.0;
    }
  }
  window_steps_ = 0;
  window_busy_s_ = 0;
  window_tokens_ = 0;
  return r;
}

}  // namespace metronome::admission
