#include "metronome/admission/gradient2_controller.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>

#include "metronome/base/check.h"

namespace metronome::admission {
namespace {

std::string Format(const char* fmt, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, fmt, args...);
  return buf;
}

}  // namespace

Gradient2Controller::Gradient2Controller(const Gradient2Options& options,
                                         const MemoryOptions& memory)
    : options_(options),
      memory_(memory),
      estimate_(static_cast<double>(options.initial_limit)),
      limit_(options.initial_limit) {
  MTR_CHECK(options.min_limit >= 0 && options.min_limit <= options.initial_limit &&
                options.initial_limit <= options.max_limit && options.window_s > 0 &&
                options.smoothing > 0 && options.smoothing <= 1 && options.long_window >= 1 &&
                options.warmup_windows >= 1,
            "Gradient2Options must pass Validate");
}

void Gradient2Controller::OnFrame(double now_s, double latency_ms, double deadline_ms,
                                  bool /*missed*/) noexcept {
  MTR_DCHECK(deadline_ms > 0, "deadline_ms must be > 0");
  if (!started_) {
    started_ = true;
    window_start_s_ = now_s;
  }
  signal_sum_ += latency_ms / deadline_ms;
  ++num_frames_;
}

void Gradient2Controller::OnTick(double now_s, const SystemState& state) {
  retry_.Observe(now_s, state.active_sessions);
  Advance(now_s, state.active_sessions);
}

Decision Gradient2Controller::Decide(const SessionRequest& request, const SystemState& state,
                                     double now_s) {
  const std::int64_t active = state.active_sessions;
  retry_.Observe(now_s, active);
  Advance(now_s, active);
  if (active >= limit_) {
    ++num_limit_rejections_;
    double next_s = window_start_s_ + options_.window_s;
    if (options_.window_frames > 0 && last_frames_per_s_ > 0) {
      const double left =
          static_cast<double>(std::max<std::int64_t>(0, options_.window_frames - num_frames_));
      next_s = std::min(next_s, std::max(window_start_s_ + options_.min_window_s,
                                         now_s + left / last_frames_per_s_));
    }
    return {.admit = false,
            .reason = "limit",
            .detail = Format("active %lld >= limit %lld", static_cast<long long>(active),
                             static_cast<long long>(limit_)),
            .retry_after_ms = retry_.Ms(now_s, request.period_ms, std::max(0.0, next_s - now_s))};
  }
  if (options_.kv_guard) {
    const std::int64_t fit = SessionsThatFit(request, state, memory_);
    if (active >= fit) {
      return {.admit = false,
              .reason = "kv_guard",
              .detail = Format("active %lld >= N_mem %lld", static_cast<long long>(active),
                               static_cast<long long>(fit)),
              .retry_after_ms =
                  retry_.Ms(now_s, request.period_ms, std::numeric_limits<double>::infinity())};
    }
  }
  peak_active_ = std::max(peak_active_, active + 1);
  retry_.OnAdmit();
  return {.admit = true};
}

std::vector<LimitChange> Gradient2Controller::TakeLimitChanges() {
  return std::exchange(changes_, {});
}

void Gradient2Controller::Advance(double now_s, std::int64_t active) {
  if (!started_) {
    started_ = true;
    window_start_s_ = now_s;
  }
  const double elapsed_s = now_s - window_start_s_;
  const bool enough_frames = options_.window_frames > 0 && num_frames_ >= options_.window_frames &&
                             elapsed_s >= options_.min_window_s;
  if (elapsed_s >= options_.window_s || enough_frames) {
    Evaluate(now_s, active);
  } else {
    peak_active_ = std::max(peak_active_, active);
  }
}

void Gradient2Controller::Evaluate(double now_s, std::int64_t active) {
  const std::int64_t frames = num_frames_;
  const double elapsed_s = now_s - window_start_s_;
  const double short_signal = frames > 0 ? signal_sum_ / static_cast<double>(frames) : 0.0;
  const std::int64_t peak = std::max(peak_active_, active);
  if (elapsed_s > 0) last_frames_per_s_ = static_cast<double>(frames) / elapsed_s;
  window_start_s_ = now_s;
  signal_sum_ = 0.0;
  num_frames_ = 0;
  peak_active_ = active;
  num_limit_rejections_ = 0;
  if (frames < options_.min_samples || short_signal <= 0.0) return;

  ++num_windows_;
  if (num_windows_ <= options_.warmup_windows) {
    long_signal_ += (short_signal - long_signal_) / static_cast<double>(num_windows_);
  } else {
    const double alpha = 2.0 / (static_cast<double>(options_.long_window) + 1.0);
    long_signal_ += alpha * (short_signal - long_signal_);
  }
  // Load fell away: let the baseline come down faster than the average would.
  if (long_signal_ / short_signal > 2.0) long_signal_ *= 0.95;
  // Not binding: the limit says nothing about capacity (Netflix's inflight < limit / 2).
  if (2 * peak < limit_) return;

  const double gradient = std::clamp(options_.tolerance * long_signal_ / short_signal, 0.5, 1.0);
  const double target = gradient * estimate_ + static_cast<double>(options_.queue_size);
  estimate_ = (1.0 - options_.smoothing) * estimate_ + options_.smoothing * target;
  estimate_ = std::clamp(estimate_, static_cast<double>(options_.min_limit),
                         static_cast<double>(options_.max_limit));
  const auto to = static_cast<std::int64_t>(std::floor(estimate_));
  if (to == limit_) return;
  changes_.push_back(
      {.t_s = now_s,
       .from = limit_,
       .to = to,
       .reason =
           Format("%s: gradient %.3f = clamp(%g x long %.3f / short %.3f, 0.5, 1) over "
                  "%lld frames, peak active %lld",
                  to > limit_ ? "increase" : "cut", gradient, options_.tolerance, long_signal_,
                  short_signal, static_cast<long long>(frames), static_cast<long long>(peak))});
  limit_ = to;
}

std::string Gradient2Controller::Describe() const {
  return Format(
      "gradient2(window_s=%g, window_frames=%lld, min_window_s=%g, min_samples=%lld, "
      "tolerance=%g, smoothing=%g, queue_size=%lld, long_window=%lld, warmup_windows=%lld, "
      "initial_limit=%lld, min_limit=%lld, max_limit=%lld, kv_guard=%s)",
      options_.window_s, static_cast<long long>(options_.window_frames), options_.min_window_s,
      static_cast<long long>(options_.min_samples), options_.tolerance, options_.smoothing,
      static_cast<long long>(options_.queue_size), static_cast<long long>(options_.long_window),
      static_cast<long long>(options_.warmup_windows),
      static_cast<long long>(options_.initial_limit), static_cast<long long>(options_.min_limit),
      static_cast<long long>(options_.max_limit), options_.kv_guard ? "on" : "off");
}

}  // namespace metronome::admission
