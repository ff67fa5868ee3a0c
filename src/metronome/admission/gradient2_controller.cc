#include "metronome/admission/gradient2_controller.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "metronome/base/check.h"

namespace metronome::admission {
Gradient2Controller::Gradient2Controller(const Gradient2Options& options,
                                         const MemoryOptions& memory)
    : WindowedController(options.window, memory, options.initial_limit),
      options_(options),
      estimate_(static_cast<double>(options.initial_limit)) {
  const WindowOptions& w = options.window;
  MTR_CHECK(w.min_limit >= 0 && w.min_limit <= options.initial_limit &&
                options.initial_limit <= w.max_limit && w.window_s > 0 && options.smoothing > 0 &&
                options.smoothing <= 1 && options.long_window >= 1 && options.warmup_windows >= 1,
            "Gradient2Options must pass Validate");
}

void Gradient2Controller::OnFrame(const FrameSample& frame) noexcept {
  MTR_DCHECK(frame.deadline_ms > 0, "deadline_ms must be > 0");
  window_.OnFrame(frame.now_s);
  signal_sum_ += frame.latency_ms / frame.deadline_ms;
}

void Gradient2Controller::Evaluate(const ClosedWindow& closed, double now_s,
                                   std::int64_t /*active*/) {
  const std::int64_t frames = closed.num_frames;
  const double short_signal = frames > 0 ? signal_sum_ / static_cast<double>(frames) : 0.0;
  const std::int64_t peak = closed.peak_active;
  signal_sum_ = 0.0;
  if (frames < options_.window.min_samples || short_signal <= 0.0) return;

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
  if (2 * peak < limit()) return;

  const double gradient = std::clamp(options_.tolerance * long_signal_ / short_signal, 0.5, 1.0);
  const double target = gradient * estimate_ + static_cast<double>(options_.queue_size);
  estimate_ = (1.0 - options_.smoothing) * estimate_ + options_.smoothing * target;
  estimate_ = std::clamp(estimate_, static_cast<double>(options_.window.min_limit),
                         static_cast<double>(options_.window.max_limit));
  const auto to = static_cast<std::int64_t>(std::floor(estimate_));
  if (to == limit()) return;
  SetLimit(now_s, to,
           Format("%s: gradient %.3f = clamp(%g x long %.3f / short %.3f, 0.5, 1) over "
                  "%lld frames, peak active %lld",
                  to > limit() ? "increase" : "cut", gradient, options_.tolerance, long_signal_,
                  short_signal, static_cast<long long>(frames), static_cast<long long>(peak)));
}

std::string Gradient2Controller::Describe() const {
  return Format(
      "gradient2(window_s=%g, window_frames=%lld, min_window_s=%g, min_samples=%lld, "
      "tolerance=%g, smoothing=%g, queue_size=%lld, long_window=%lld, warmup_windows=%lld, "
      "initial_limit=%lld, min_limit=%lld, max_limit=%lld, kv_guard=%s)",
      options_.window.window_s, static_cast<long long>(options_.window.window_frames),
      options_.window.min_window_s, static_cast<long long>(options_.window.min_samples),
      options_.tolerance, options_.smoothing, static_cast<long long>(options_.queue_size),
      static_cast<long long>(options_.long_window), static_cast<long long>(options_.warmup_windows),
      static_cast<long long>(options_.initial_limit),
      static_cast<long long>(options_.window.min_limit),
      static_cast<long long>(options_.window.max_limit), options_.window.kv_guard ? "on" : "off");
}

}  // namespace metronome::admission
