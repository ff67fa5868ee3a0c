#include "metronome/admission/windowed_controller.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

namespace metronome::admission {

bool ControlWindow::Due(double now_s, std::int64_t active, std::int64_t frames_needed) {
  Open(now_s);
  const bool enough_frames = options_.window_frames > 0 && num_frames_ >= frames_needed &&
                             now_s - open_s_ >= options_.min_window_s;
  if (now_s >= open_s_ + options_.window_s || enough_frames) return true;
  active_.Note(active);
  return false;
}

double ControlWindow::NextCloseS(double now_s, std::int64_t frames_needed) const {
  double end_s = open_s_ + options_.window_s;
  if (options_.window_frames > 0 && last_frames_per_s_ > 0) {
    const double left = static_cast<double>(std::max<std::int64_t>(0, frames_needed - num_frames_));
    end_s = std::min(end_s,
                     std::max(open_s_ + options_.min_window_s, now_s + left / last_frames_per_s_));
  }
  return std::max(end_s, now_s);
}

ClosedWindow ControlWindow::Close(double now_s, std::int64_t active) {
  active_.Note(active);  // the count at the close belongs to the window too
  const ClosedWindow w{.duration_s = now_s - open_s_,
                       .num_frames = num_frames_,
                       .peak_active = active_.peak,
                       .least_active = active_.least,
                       .num_limit_rejections = num_limit_rejections_,
                       .load = steps_.Close(now_s - open_s_, cost_)};
  last_frames_per_s_ =
      w.num_frames > 0 && w.duration_s > 0 ? static_cast<double>(w.num_frames) / w.duration_s : 0.0;
  opened_ = true;
  open_s_ = now_s;
  num_frames_ = 0;
  active_ = {.peak = active, .least = active};
  num_limit_rejections_ = 0;
  return w;
}

WindowedController::WindowedController(const WindowOptions& window, const MemoryOptions& memory,
                                       std::int64_t initial_limit)
    : window_(window), memory_(memory), limit_(initial_limit) {}

Decision WindowedController::Decide(const SessionRequest& request, const SystemState& state,
                                    double now_s) {
  // The limit is a work budget (units of the reference session); the KV guard counts sessions
  // of the request's size (memory is its own resource).
  const std::int64_t active = state.active_sessions;
  const std::int64_t load = state.WorkUnits();
  retry_.Observe(now_s, active);
  const bool kv_guard = window_.options().kv_guard;
  const std::int64_t fit = kv_guard ? SessionsThatFit(request, state, memory_) : kNoLimit;
  OnDecide(request, state, fit, now_s);
  Advance(now_s, load);
  if (!FitsBudget(request, state, limit_) && !RaiseForLoneSession(request, state, fit, now_s)) {
    window_.NoteLimitRejection();
    return {.admit = false,
            .reason = "limit",
            .detail = BudgetDetail(request, state, limit_),
            .retry_after_ms = retry_.Ms(now_s, request.period_ms, DecisionInS(now_s))};
  }
  if (kv_guard && active >= fit) {
    return {.admit = false,
            .reason = "kv_guard",
            .detail = "active " + std::to_string(active) + " >= N_mem " + std::to_string(fit) +
                      " (needs " + std::to_string(request.projected_blocks) + " blocks; free " +
                      std::to_string(state.free_blocks) + ", promised " +
                      std::to_string(state.reserved_blocks) + " of " +
                      std::to_string(state.total_blocks) + ")",
            .retry_after_ms =
                retry_.Ms(now_s, request.period_ms, std::numeric_limits<double>::infinity())};
  }
  window_.NoteAdmitted(WholeUnits(state.Work() + request.work));
  retry_.OnAdmit();
  return {.admit = true};
}

bool WindowedController::RaiseForLoneSession(const SessionRequest& request,
                                             const SystemState& state, std::int64_t fit,
                                             double now_s) {
  // A budget below one session's price refuses it even into an empty engine; with no session
  // admitted no frame comes, no window measures anything and the budget never moves: a deadlock.
  // An engine with nothing to do can run one session (the door's price cap, not this budget,
  // refuses one no engine can serve), so the budget follows the lone session's price, within
  // max_limit, the operator's bound.
  const std::int64_t price = WholeUnits(request.work);
  if (state.active_sessions != 0 || state.Work() > 0.0 || price > window_.options().max_limit ||
      (window_.options().kv_guard && fit < 1)) {
    return false;
  }
  SetLimit(now_s, price,
           Format("raised to a lone session's price: %.2f units over budget %lld, which would "
                  "admit nobody into an empty engine, and with no frames no window moves it",
                  request.work, static_cast<long long>(limit_)));
  return true;
}

void WindowedController::OnTick(double now_s, const SystemState& state) {
  retry_.Observe(now_s, state.active_sessions);
  Advance(now_s, state.WorkUnits());
}

void WindowedController::Advance(double now_s, std::int64_t active) {
  if (window_.Due(now_s, active, FramesNeeded()))
    Evaluate(window_.Close(now_s, active), now_s, active);
}

std::vector<LimitChange> WindowedController::TakeLimitChanges() {
  return std::exchange(changes_, {});
}

void WindowedController::SetLimit(double now_s, std::int64_t to, std::string reason) {
  changes_.push_back({.t_s = now_s, .from = limit_, .to = to, .reason = std::move(reason)});
  limit_ = to;
}

}  // namespace metronome::admission
