#include "metronome/admission/static_controller.h"

#include <limits>
#include <string>

#include "metronome/base/check.h"

namespace metronome::admission {

StaticController::StaticController(std::int64_t limit) : limit_(limit) {
  MTR_CHECK(limit >= 0, "static limit must be >= 0");
}

Decision StaticController::Decide(const SessionRequest& request, const SystemState& state,
                                  double now_s) {
  retry_.Observe(now_s, state.active_sessions);
  // A count the operator chose, whatever the sessions' shapes (aimd and gradient2 govern work).
  if (state.active_sessions < limit_) {
    retry_.OnAdmit();
    return {.admit = true};
  }
  // The limit never moves, so only a session end helps: retry after the expected gap between
  // ends (one frame period, the earliest an end can be observed, until one has been seen).
  return {.admit = false,
          .reason = "limit",
          .detail = "active " + std::to_string(state.active_sessions) + " >= static limit " +
                    std::to_string(limit_),
          .retry_after_ms =
              retry_.Ms(now_s, request.period_ms, std::numeric_limits<double>::infinity())};
}

void StaticController::OnTick(double now_s, const SystemState& state) {
  retry_.Observe(now_s, state.active_sessions);
}

std::string StaticController::Describe() const {
  return "static(limit=" + std::to_string(limit_) + ")";
}

}  // namespace metronome::admission
