#include "metronome/admission/step_load.h"

#include <algorithm>
#include <cmath>

namespace metronome::admission {

void StepCostFit::OnStep(double now_s, double step_s, std::int64_t batch_tokens) noexcept {
  if (batch_tokens <= 0) return;
  step_s = std::max(0.0, step_s);
  const auto x = static_cast<double>(batch_tokens);
  if (any_ && now_s > last_s_) {
    const double decay = std::exp(-(now_s - last_s_) / kFitTauS);
    w_ *= decay;
    sx_ *= decay;
    sy_ *= decay;
    sxx_ *= decay;
    sxy_ *= decay;
  }
  any_ = true;
  last_s_ = std::max(last_s_, now_s);
  w_ += 1.0;
  sx_ += x;
  sy_ += step_s;
  sxx_ += x * x;
  sxy_ += x * step_s;
}

StepCost StepCostFit::Estimate() const noexcept {
  StepCost c;
  if (!(w_ > 0 && sx_ > 0)) return c;
  const double mean_x = sx_ / w_;
  const double var_x = std::max(0.0, sxx_ / w_ - mean_x * mean_x);
  if (var_x < kMinBatchCv * kMinBatchCv * mean_x * mean_x) return c;
  const double mean_y = sy_ / w_;
  const double cov_xy = sxy_ / w_ - mean_x * mean_y;
  double per_token = cov_xy / var_x;
  double fixed = mean_y - per_token * mean_x;
  if (per_token < 0) {  // steps no dearer with more tokens: all fixed cost
    per_token = 0;
    fixed = mean_y;
  } else if (fixed < 0) {  // no fixed part: all of the time is per-token work
    fixed = 0;
    per_token = sy_ / sx_;
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
    }
  }
  window_steps_ = 0;
  window_busy_s_ = 0;
  window_tokens_ = 0;
  return r;
}

}  // namespace metronome::admission
