#include "metronome/admission/aimd_controller.h"

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

// Nearest-rank percentile: the ceil(p/100 * n)-th smallest sample. Reorders `v`.
double Percentile(std::vector<double>& v, double p) {
  const auto n = static_cast<std::int64_t>(v.size());
  auto rank = static_cast<std::int64_t>(std::ceil(p * static_cast<double>(n) / 100.0)) - 1;
  rank = std::clamp<std::int64_t>(rank, 0, n - 1);
  std::nth_element(v.begin(), v.begin() + rank, v.end());
  return v[static_cast<std::size_t>(rank)];
}

}  // namespace

AimdController::AimdController(const AimdOptions& options, const MemoryOptions& memory)
    : options_(options),
      memory_(memory),
      limit_(options.initial_limit),
      slow_start_(options.slow_start_factor > 1.0) {
  MTR_CHECK(options.min_limit >= 0 && options.min_limit <= options.initial_limit &&
                options.initial_limit <= options.max_limit && options.max_samples >= 1 &&
                options.window_s > 0 && options.beta > 0 && options.beta < 1,
            "AimdOptions must pass Validate");
  samples_.reserve(static_cast<std::size_t>(options.max_samples));
}

void AimdController::OnFrame(double now_s, double latency_ms, double deadline_ms,
                             bool missed) noexcept {
  MTR_DCHECK(deadline_ms > 0, "deadline_ms must be > 0");
  if (!started_) {
    started_ = true;
    window_start_s_ = now_s;
  }
  const double sample = latency_ms / deadline_ms;
  ++num_frames_;
  if (missed) ++num_misses_;
  if (std::cmp_less(samples_.size(), options_.max_samples)) {
    samples_.push_back(sample);  // within the reserved capacity: no allocation
    return;
  }
  // Reservoir sampling (Algorithm R): every frame of the window is kept with equal probability.
  const std::uint64_t j = NextRandom(rng_state_) % static_cast<std::uint64_t>(num_frames_);
  if (j < samples_.size()) samples_[j] = sample;
}

void AimdController::OnTick(double now_s, const SystemState& state) {
  retry_.Observe(now_s, state.active_sessions);
  Advance(now_s, state.active_sessions);
}

Decision AimdController::Decide(const SessionRequest& request, const SystemState& state,
                                double now_s) {
  const std::int64_t active = state.active_sessions;
  retry_.Observe(now_s, active);
  const std::int64_t fit = options_.kv_guard ? SessionsThatFit(request, state, memory_) : kNoLimit;
  // The pool's bound for this session's window: caps growth, ends slow start, seeds the limit.
  if (options_.kv_guard && fit != std::numeric_limits<std::int64_t>::max()) pool_bound_ = fit;
  // How full the admitted sessions' promised KV is: windows that are still filling make every
  // frame cheaper than it will be once they are full.
  if (state.total_blocks > 0) {
    const std::int64_t used = state.total_blocks - state.free_blocks;
    if (used + state.reserved_blocks > 0) {
      kv_fill_ =
          std::clamp(static_cast<double>(used) / static_cast<double>(used + state.reserved_blocks),
                     kMinKvFill, 1.0);
    }
  }
  if (!seeded_) Seed(now_s);
  Advance(now_s, active);
  if (active >= limit_) {
    ++num_limit_rejections_;
    // A growing controller may lift the limit at its next decision; a holding one frees a place
    // only when a session ends.
    const double decision_in_s =
        growing_ ? NextDecisionS(now_s) - now_s : std::numeric_limits<double>::infinity();
    return {.admit = false,
            .reason = "limit",
            .detail = Format("active %lld >= limit %lld", static_cast<long long>(active),
                             static_cast<long long>(limit_)),
            .retry_after_ms = retry_.Ms(now_s, request.period_ms, decision_in_s)};
  }
  if (options_.kv_guard) {
    if (active >= fit) {
      return {.admit = false,
              .reason = "kv_guard",
              .detail = Format("active %lld >= N_mem %lld (needs %lld blocks; free %lld, "
                               "promised %lld of %lld)",
                               static_cast<long long>(active), static_cast<long long>(fit),
                               static_cast<long long>(request.projected_blocks),
                               static_cast<long long>(state.free_blocks),
                               static_cast<long long>(state.reserved_blocks),
                               static_cast<long long>(state.total_blocks)),
              .retry_after_ms =
                  retry_.Ms(now_s, request.period_ms, std::numeric_limits<double>::infinity())};
    }
  }
  peak_active_ = std::max(peak_active_, active + 1);
  retry_.OnAdmit();
  return {.admit = true};
}

void AimdController::Seed(double now_s) {
  seeded_ = true;
  std::int64_t to = limit_;
  std::string why;
  if (options_.predicted_limit > 0) {
    to = options_.predicted_limit;
    why = Format("seed: the cost model's predicted N* %lld",
                 static_cast<long long>(options_.predicted_limit));
  } else {
    why = Format("seed: initial limit %lld (no calibrated cost model)",
                 static_cast<long long>(limit_));
  }
  if (pool_bound_ >= 0 && to > pool_bound_) {
    to = pool_bound_;
    why += Format(", capped by the pool's bound %lld for the session's window",
                  static_cast<long long>(pool_bound_));
  } else if (pool_bound_ >= 0) {
    why += Format(" (pool bound %lld)", static_cast<long long>(pool_bound_));
  }
  to = std::clamp(to, options_.min_limit, options_.max_limit);
  if (to != limit_) SetLimit(now_s, to, std::move(why));
  if (pool_bound_ >= 0 && limit_ >= pool_bound_) slow_start_ = false;
}

double AimdController::NextDecisionS(double now_s) const {
  double end_s = WindowEnd();
  if (options_.window_frames > 0 && last_window_.num_frames > 0 && last_window_duration_s_ > 0) {
    const double frames_per_s =
        static_cast<double>(last_window_.num_frames) / last_window_duration_s_;
    const std::int64_t needed = slow_start_ ? std::min(options_.window_frames, options_.min_samples)
                                            : options_.window_frames;
    const double left = static_cast<double>(std::max<std::int64_t>(0, needed - num_frames_));
    end_s = std::min(
        end_s, std::max(window_start_s_ + options_.min_window_s, now_s + left / frames_per_s));
  }
  return std::max(end_s, now_s);
}

std::vector<LimitChange> AimdController::TakeLimitChanges() { return std::exchange(changes_, {}); }

void AimdController::Advance(double now_s, std::int64_t active) {
  if (!started_) {
    started_ = true;
    window_start_s_ = now_s;
  }
  // Far below the target (slow start) a few frames say as much as many: min_samples suffice, so
  // a lone session of a 2 s period does not wait window_frames periods for its first doubling.
  const std::int64_t frames_needed =
      slow_start_ ? std::min(options_.window_frames, options_.min_samples) : options_.window_frames;
  const bool enough_frames = options_.window_frames > 0 && num_frames_ >= frames_needed &&
                             now_s - window_start_s_ >= options_.min_window_s;
  if (now_s >= WindowEnd() || enough_frames) {
    Evaluate(now_s, active);
  } else {
    peak_active_ = std::max(peak_active_, active);
  }
}

void AimdController::Evaluate(double now_s, std::int64_t active) {
  AimdWindow w;
  w.end_s = now_s;
  w.num_frames = num_frames_;
  w.num_misses = num_misses_;
  w.peak_active = std::max(peak_active_, active);
  w.num_limit_rejections = num_limit_rejections_;
  w.binding = w.peak_active >= limit_ - 1 || num_limit_rejections_ > 0;
  if (num_frames_ > 0) {
    w.miss_ratio = static_cast<double>(num_misses_) / static_cast<double>(num_frames_);
  }
  if (!samples_.empty()) w.signal = Percentile(samples_, options_.percentile);
  last_window_ = w;
  last_window_duration_s_ = now_s - window_start_s_;
  growing_ = false;

  // The next window starts now, with the load in place now.
  window_start_s_ = now_s;
  samples_.clear();
  num_frames_ = 0;
  num_misses_ = 0;
  peak_active_ = active;
  num_limit_rejections_ = 0;

  if (cooling_) {
    const bool done = options_.cooldown_mode == CooldownMode::kDrain
                          ? w.peak_active <= limit_
                          : now_s - last_cut_s_ >= options_.cooldown_s;
    if (!done) return;  // the window still measured load admitted before the cut: hold
    cooling_ = false;   // a clean window: act on it below
  }
  if (w.num_frames < options_.min_samples) return;  // too little evidence: hold

  const double p = options_.percentile;
  if (w.signal > options_.high_target || w.miss_ratio > options_.miss_ratio_threshold) {
    const auto cut =
        static_cast<std::int64_t>(std::floor(options_.beta * static_cast<double>(active)));
    const std::int64_t to = std::min(limit_, std::max(options_.min_limit, cut));
    slow_start_ = false;  // the first congestion signal ends slow start for good
    if (to >= limit_) return;
    const std::string why =
        w.signal > options_.high_target
            ? Format("p%g/D=%.3f > %g", p, w.signal, options_.high_target)
            : Format("miss ratio %.4f > %g", w.miss_ratio, options_.miss_ratio_threshold);
    SetLimit(now_s, to,
             Format("cut: %s over %lld frames; floor(%g * active %lld) = %lld", why.c_str(),
                    static_cast<long long>(w.num_frames), options_.beta,
                    static_cast<long long>(active), static_cast<long long>(cut)));
    cooling_ = true;
    last_cut_s_ = now_s;
    return;
  }
  // Growth looks ahead to the load already admitted: windows still filling make every frame
  // cheaper than it will be, so the signal is projected to full KV, as if the KV-dependent share of
  // latency (kKvLatencyShare) grew in proportion to the KV held. Cuts, and the end of slow start
  // (a congestion signal), act on the signal measured.
  const double growth_signal = w.signal * (1.0 + kKvLatencyShare * (1.0 / kv_fill_ - 1.0));
  if (slow_start_ && w.signal >= options_.slow_start_exit * options_.low_target) {
    slow_start_ = false;  // close to the target: no longer far below it
  }
  if (!(growth_signal < options_.low_target && w.binding)) return;
  // Projected low-target crossing: latency extrapolated in proportion to the active count.
  const double crossing =
      growth_signal > 0.0 ? static_cast<double>(w.peak_active) * options_.low_target / growth_signal
                          : static_cast<double>(options_.max_limit);
  std::int64_t to = limit_ + options_.increase_step;
  const char* phase = "additive";
  if (slow_start_) {
    const double grown =
        std::min(static_cast<double>(limit_) * options_.slow_start_factor, crossing);
    to = std::max(to, static_cast<std::int64_t>(std::floor(grown)));
    phase = "slow start";
  } else if (options_.headroom_gain > 0.0) {
    const double step = options_.headroom_gain * (crossing - static_cast<double>(limit_));
    to = std::max(to, limit_ + static_cast<std::int64_t>(std::floor(step)));
    phase = "headroom";
  }
  to = std::min(options_.max_limit, to);
  if (pool_bound_ >= 0 && to >= pool_bound_) {
    to = std::max(limit_, pool_bound_);
    slow_start_ = false;  // the KV guard's memory bound ends slow start too
  }
  if (to <= limit_) return;
  growing_ = true;
  SetLimit(
      now_s, to,
      Format(
          "increase (%s): p%g/D=%.3f%s < %g over %lld frames, binding (peak active %lld, "
          "%lld limit rejections); projected low-target crossing %.0f%s",
          phase, p, w.signal,
          kv_fill_ < 1.0
              ? Format(" (%.3f at full KV: %.0f%% filled)", growth_signal, 100.0 * kv_fill_).c_str()
              : "",
          options_.low_target, static_cast<long long>(w.num_frames),
          static_cast<long long>(w.peak_active), static_cast<long long>(w.num_limit_rejections),
          crossing,
          pool_bound_ >= 0
              ? Format(", pool bound %lld", static_cast<long long>(pool_bound_)).c_str()
              : ""));
}

void AimdController::SetLimit(double now_s, std::int64_t to, std::string reason) {
  changes_.push_back({.t_s = now_s, .from = limit_, .to = to, .reason = std::move(reason)});
  limit_ = to;
}

std::string AimdController::Describe() const {
  return Format(
             "aimd(window_s=%g, percentile=%g, low_target=%gD, high_target=%gD, "
             "miss_ratio_threshold=%g, increase_step=%lld, slow_start_factor=%g, "
             "slow_start_exit=%g, headroom_gain=%g, beta=%g, cooldown=%s, ",
             options_.window_s, options_.percentile, options_.low_target, options_.high_target,
             options_.miss_ratio_threshold, static_cast<long long>(options_.increase_step),
             options_.slow_start_factor, options_.slow_start_exit, options_.headroom_gain,
             options_.beta,
             options_.cooldown_mode == CooldownMode::kDrain
                 ? "drain"
                 : Format("fixed %gs", options_.cooldown_s).c_str()) +
         Format(
             "window_frames=%lld, min_window_s=%g, initial_limit=%lld, predicted_limit=%lld, "
             "min_limit=%lld, max_limit=%lld, min_samples=%lld, max_samples=%lld, kv_guard=%s",
             static_cast<long long>(options_.window_frames), options_.min_window_s,
             static_cast<long long>(options_.initial_limit),
             static_cast<long long>(options_.predicted_limit),
             static_cast<long long>(options_.min_limit), static_cast<long long>(options_.max_limit),
             static_cast<long long>(options_.min_samples),
             static_cast<long long>(options_.max_samples), options_.kv_guard ? "on" : "off") +
         (options_.kv_guard ? Format(", full_mode_session_s=%g, headroom_fraction=%g)",
                                     memory_.full_mode_session_s, memory_.headroom_fraction)
                            : std::string(")"));
}

}  // namespace metronome::admission
