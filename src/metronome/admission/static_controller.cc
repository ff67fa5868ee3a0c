#include "metronome/admission/static_controller.h"

#include <string>

#include "metronome/base/check.h"

namespace metronome::admission {

StaticController::StaticController(std::int64_t limit) : limit_(limit) {
  MTR_CHECK(limit >= 0, "static limit must be >= 0");
}

Decision StaticController::Decide(const SessionRequest& request, const SystemState& state,
                                  double /*now_s*/) {
  if (state.active_sessions < limit_) return {.admit = true};
  // The limit never moves, so only a session end helps; one frame period is the earliest that can
  // be observed.
  return {.admit = false,
          .reason = "limit",
          .detail = "active " + std::to_string(state.active_sessions) + " >= static limit " +
                    std::to_string(limit_),
          .retry_after_ms = request.period_ms};
}

std::string StaticController::Describe() const {
  return "static(limit=" + std::to_string(limit_) + ")";
}

}  // namespace metronome::admission
