#include "metronome/admission/admission.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <system_error>

#include "metronome/admission/aimd_controller.h"
#include "metronome/admission/gradient2_controller.h"
#include "metronome/admission/memory_controller.h"
#include "metronome/admission/static_controller.h"
#include "metronome/base/check.h"
#include "metronome/base/errors.h"

namespace metronome::admission {

std::int64_t WholeUnits(double work) {
  return static_cast<std::int64_t>(std::ceil(std::max(0.0, work) - 1e-9));
}

std::int64_t SystemState::WorkUnits() const { return WholeUnits(Work()); }

bool FitsBudget(const SessionRequest& request, const SystemState& state, std::int64_t limit) {
  return state.Work() + request.work <= static_cast<double>(limit) + 1e-9;
}

std::string BudgetDetail(const SessionRequest& request, const SystemState& state,
                         std::int64_t limit) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "work %.2f + %.2f > budget %lld (%lld sessions active)",
                state.Work(), request.work, static_cast<long long>(limit),
                static_cast<long long>(state.active_sessions));
  return buf;
}
namespace {

[[noreturn]] void Bad(const std::string& field, const std::string& rule, const std::string& got) {
  throw ConfigError("admission: " + field + " must be " + rule + ", got " + got);
}

void CheckRange(const std::string& field, double v, double lo, double hi, bool lo_open,
                bool hi_open, const std::string& rule) {
  const bool ok = std::isfinite(v) && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  if (!ok) Bad(field, rule, FormatValue(v));
}

}  // namespace

std::uint64_t NextRandom(std::uint64_t& state) noexcept {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

void RetryHint::Observe(double now_s, std::int64_t active) {
  if (!started_) {
    started_ = true;
    start_s_ = now_s;
    last_end_s_ = now_s;
    expected_active_ = active;
    return;
  }
  if (active < expected_active_) {
    decayed_ends_ = decayed_ends_ * std::exp(-(now_s - last_end_s_) / kEndRateTauS) +
                    static_cast<double>(expected_active_ - active);
    last_end_s_ = now_s;
  }
  expected_active_ = active;
}

double RetryHint::ExpectedEndGapS(double now_s) const {
  if (decayed_ends_ <= 0.0) return std::numeric_limits<double>::infinity();
  const double ends = decayed_ends_ * std::exp(-(now_s - last_end_s_) / kEndRateTauS);
  // At a constant rate r the decayed count over a span T is r tau (1 - exp(-T / tau)).
  const double span_s = std::max(now_s - start_s_, 1e-3);
  return kEndRateTauS * -std::expm1(-span_s / kEndRateTauS) / ends;
}

double RetryHint::Ms(double now_s, double period_ms, double decision_in_s) {
  const double u = static_cast<double>(NextRandom(rng_state_) >> 11) * 0x1.0p-53;
  const double gap_s = ExpectedEndGapS(now_s);
  const double queued_wait_s = QueuedS(now_s) + gap_s;  // +inf while no end has been seen
  if (std::isfinite(queued_wait_s) && queued_wait_s <= decision_in_s) {
    // Take the next unpromised end; the queue never reaches past the longest hint.
    const double wait_s = std::min(queued_wait_s, kMaxHintMs / 1000.0);
    queue_until_s_ = now_s + wait_s;
    return std::min(kMaxHintMs,
                    std::max(period_ms, 1000.0 * wait_s) + 1000.0 * gap_s * kJitterFraction * u);
  }
  const double base_ms =
      std::isfinite(decision_in_s) ? std::max(period_ms, 1000.0 * decision_in_s) : period_ms;
  return std::min(kMaxHintMs, base_ms * (1.0 + kJitterFraction * u));
}

double RetryBackoffMs(double hint_ms, std::int64_t refusals, double cap_ms) {
  MTR_CHECK(hint_ms >= 0 && refusals >= 1 && cap_ms >= 0, "RetryBackoffMs: bad arguments");
  const double doubled =
      std::ldexp(hint_ms, static_cast<int>(std::min<std::int64_t>(refusals - 1, 60)));
  return std::min(std::max(cap_ms, hint_ms), doubled);
}

std::int64_t SessionsThatFit(const SessionRequest& request, const SystemState& state,
                             const MemoryOptions& options) {
  MTR_CHECK(request.projected_blocks >= 0, "projected_blocks must be >= 0");
  if (request.projected_blocks == 0) return std::numeric_limits<std::int64_t>::max();
  const auto headroom = static_cast<std::int64_t>(
      std::ceil(options.headroom_fraction * static_cast<double>(state.total_blocks)));
  const std::int64_t available = state.free_blocks - state.reserved_blocks - headroom;
  if (available <= 0) return state.active_sessions;
  return state.active_sessions + available / request.projected_blocks;
}

std::int64_t ProjectFullModeBlocks(const MemoryOptions& options, double period_ms,
                                   std::int64_t tokens_per_frame, std::int64_t prompt_tokens,
                                   std::int64_t block_tokens) {
  MTR_CHECK(period_ms > 0 && tokens_per_frame >= 0 && prompt_tokens >= 0 && block_tokens > 0,
            "ProjectFullModeBlocks: bad arguments");
  const auto frames =
      static_cast<std::int64_t>(std::ceil(options.full_mode_session_s * 1000.0 / period_ms));
  const std::int64_t tokens = prompt_tokens + frames * tokens_per_frame;
  return (tokens + block_tokens - 1) / block_tokens;
}

void Validate(const WindowOptions& w, std::int64_t initial_limit, const std::string& prefix) {
  const double inf = std::numeric_limits<double>::infinity();
  const auto field = [&](const char* name) { return prefix + "." + name; };
  CheckRange(field("window_s"), w.window_s, 0.0, inf, true, true, "> 0");
  if (w.window_frames < 0) Bad(field("window_frames"), ">= 0", std::to_string(w.window_frames));
  CheckRange(field("min_window_s"), w.min_window_s, 0.0, inf, false, true, ">= 0");
  if (w.min_samples < 1) Bad(field("min_samples"), ">= 1", std::to_string(w.min_samples));
  if (w.min_limit < 0) Bad(field("min_limit"), ">= 0", std::to_string(w.min_limit));
  if (w.max_limit < w.min_limit) {
    Bad(field("max_limit"), ">= " + field("min_limit") + " (" + std::to_string(w.min_limit) + ")",
        std::to_string(w.max_limit));
  }
  if (initial_limit < w.min_limit || initial_limit > w.max_limit) {
    Bad(field("initial_limit"),
        "in [" + std::to_string(w.min_limit) + ", " + std::to_string(w.max_limit) + "]",
        std::to_string(initial_limit));
  }
}

void Validate(const AimdOptions& o) {
  const double inf = std::numeric_limits<double>::infinity();
  Validate(o.window, o.initial_limit, "aimd");
  CheckRange("aimd.percentile", o.percentile, 0.0, 100.0, true, false, "in (0, 100]");
  CheckRange("aimd.low_target", o.low_target, 0.0, inf, true, true, "> 0 (a fraction of D)");
  if (!(std::isfinite(o.high_target) && o.high_target > o.low_target)) {
    Bad("aimd.high_target", "> aimd.low_target (" + FormatValue(o.low_target) + ")",
        FormatValue(o.high_target));
  }
  CheckRange("aimd.miss_ratio_threshold", o.miss_ratio_threshold, 0.0, 1.0, false, true,
             "in [0, 1)");
  CheckRange("aimd.beta", o.beta, 0.0, 1.0, true, true, "in (0, 1)");
  CheckRange("aimd.cooldown_s", o.cooldown_s, 0.0, inf, false, true, ">= 0");
  if (o.increase_step < 1) Bad("aimd.increase_step", ">= 1", std::to_string(o.increase_step));
  CheckRange("aimd.slow_start_factor", o.slow_start_factor, 1.0, 16.0, false, false, "in [1, 16]");
  CheckRange("aimd.slow_start_exit", o.slow_start_exit, 0.0, 1.0, true, false, "in (0, 1]");
  CheckRange("aimd.headroom_gain", o.headroom_gain, 0.0, 1.0, false, false, "in [0, 1]");
  CheckRange("aimd.growth_horizon_s", o.growth_horizon_s, 0.0, inf, false, true, ">= 0");
  CheckRange("aimd.max_utilization", o.max_utilization, 0.0, 1.0, true, false, "in (0, 1]");
  CheckRange("aimd.self_late_work_fraction", o.self_late_work_fraction, 0.0, 0.5, false, false,
             "in [0, 0.5]");
  if (o.predicted_limit < 0) {
    Bad("aimd.predicted_limit", ">= 0", std::to_string(o.predicted_limit));
  }
  if (o.max_samples < 1 || o.max_samples > (std::int64_t{1} << 24)) {
    Bad("aimd.max_samples", "in [1, 16777216]", std::to_string(o.max_samples));
  }
}

void Validate(const MemoryOptions& o) {
  CheckRange("memory.full_mode_session_s", o.full_mode_session_s, 0.0,
             std::numeric_limits<double>::infinity(), true, true, "> 0");
  CheckRange("memory.headroom_fraction", o.headroom_fraction, 0.0, 1.0, false, true, "in [0, 1)");
}

void Validate(const Gradient2Options& o) {
  const double inf = std::numeric_limits<double>::infinity();
  Validate(o.window, o.initial_limit, "gradient2");
  CheckRange("gradient2.tolerance", o.tolerance, 1.0, inf, false, true, ">= 1");
  CheckRange("gradient2.smoothing", o.smoothing, 0.0, 1.0, true, false, "in (0, 1]");
  if (o.queue_size < 0) Bad("gradient2.queue_size", ">= 0", std::to_string(o.queue_size));
  if (o.long_window < 1) Bad("gradient2.long_window", ">= 1", std::to_string(o.long_window));
  if (o.warmup_windows < 1) {
    Bad("gradient2.warmup_windows", ">= 1", std::to_string(o.warmup_windows));
  }
}

std::unique_ptr<AdmissionController> MakeController(const std::string& spec,
                                                    const AimdOptions& aimd,
                                                    const MemoryOptions& memory,
                                                    const Gradient2Options& gradient2) {
  static constexpr std::string_view kStatic = "static:";
  if (spec.starts_with(kStatic)) {
    const std::string value = spec.substr(kStatic.size());
    std::int64_t n = 0;
    const char* end = value.data() + value.size();
    const auto [ptr, ec] = std::from_chars(value.data(), end, n);
    if (value.empty() || ec != std::errc() || ptr != end || n < 0) {
      throw ConfigError("admission: '" + spec + "': static:N needs an integer N >= 0, got '" +
                        value + "'");
    }
    return std::make_unique<StaticController>(n);
  }
  if (spec == "memory") {
    Validate(memory);
    return std::make_unique<MemoryController>(memory);
  }
  if (spec == "aimd") {
    Validate(aimd);
    Validate(memory);
    return std::make_unique<AimdController>(aimd, memory);
  }
  if (spec == "gradient2") {
    Validate(gradient2);
    Validate(memory);
    return std::make_unique<Gradient2Controller>(gradient2, memory);
  }
  throw ConfigError("admission: unknown controller '" + spec +
                    "' (expected static:N, memory, aimd or gradient2)");
}

}  // namespace metronome::admission
