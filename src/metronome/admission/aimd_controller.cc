#include "metronome/admission/aimd_controller.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
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

// splitmix64: a tiny, well-mixed generator; the fixed seed makes a run reproducible.
std::uint64_t NextRandom(std::uint64_t& state) noexcept {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
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
    : options_(options), memory_(memory), limit_(options.initial_limit) {
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
  Advance(now_s, state.active_sessions);
}

Decision AimdController::Decide(const SessionRequest& request, const SystemState& state,
                                double now_s) {
  const std::int64_t active = state.active_sessions;
  Advance(now_s, active);
  const double retry_ms = std::max(request.period_ms, (WindowEnd() - now_s) * 1000.0);
  if (active >= limit_) {
    ++num_limit_rejections_;
    return {.admit = false,
            .reason = "limit",
            .detail = Format("active %lld >= limit %lld", static_cast<long long>(active),
                             static_cast<long long>(limit_)),
            .retry_after_ms = retry_ms};
  }
  if (options_.kv_guard) {
    const std::int64_t fit = SessionsThatFit(request, state, memory_);
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
              .retry_after_ms = request.period_ms};
    }
  }
  peak_active_ = std::max(peak_active_, active + 1);
  return {.admit = true};
}

std::vector<LimitChange> AimdController::TakeLimitChanges() { return std::exchange(changes_, {}); }

void AimdController::Advance(double now_s, std::int64_t active) {
  if (!started_) {
    started_ = true;
    window_start_s_ = now_s;
  }
  if (now_s >= WindowEnd()) {
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
  if (w.signal < options_.low_target && w.binding) {
    const std::int64_t to = std::min(options_.max_limit, limit_ + options_.increase_step);
    if (to <= limit_) return;
    SetLimit(now_s, to,
             Format("increase: p%g/D=%.3f < %g over %lld frames, binding (peak active %lld, "
                    "%lld limit rejections)",
                    p, w.signal, options_.low_target, static_cast<long long>(w.num_frames),
                    static_cast<long long>(w.peak_active),
                    static_cast<long long>(w.num_limit_rejections)));
  }
}

void AimdController::SetLimit(double now_s, std::int64_t to, std::string reason) {
  changes_.push_back({.t_s = now_s, .from = limit_, .to = to, .reason = std::move(reason)});
  limit_ = to;
}

std::string AimdController::Describe() const {
  return Format(
             "aimd(window_s=%g, percentile=%g, low_target=%gD, high_target=%gD, "
             "miss_ratio_threshold=%g, increase_step=%lld, beta=%g, cooldown=%s, ",
             options_.window_s, options_.percentile, options_.low_target, options_.high_target,
             options_.miss_ratio_threshold, static_cast<long long>(options_.increase_step),
             options_.beta,
             options_.cooldown_mode == CooldownMode::kDrain
                 ? "drain"
                 : Format("fixed %gs", options_.cooldown_s).c_str()) +
         Format(
             "initial_limit=%lld, min_limit=%lld, max_limit=%lld, min_samples=%lld, "
             "max_samples=%lld, kv_guard=%s",
             static_cast<long long>(options_.initial_limit),
             static_cast<long long>(options_.min_limit), static_cast<long long>(options_.max_limit),
             static_cast<long long>(options_.min_samples),
             static_cast<long long>(options_.max_samples), options_.kv_guard ? "on" : "off") +
         (options_.kv_guard ? Format(", full_mode_session_s=%g, headroom_fraction=%g)",
                                     memory_.full_mode_session_s, memory_.headroom_fraction)
                            : std::string(")"));
}

}  // namespace metronome::admission
