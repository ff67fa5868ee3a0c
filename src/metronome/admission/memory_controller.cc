#include "metronome/admission/memory_controller.h"

#include <cstdio>
#include <limits>
#include <string>

namespace metronome::admission {

MemoryController::MemoryController(const MemoryOptions& options) : options_(options) {}

Decision MemoryController::Decide(const SessionRequest& request, const SystemState& state,
                                  double now_s) {
  retry_.Observe(now_s, state.active_sessions);
  const std::int64_t fit = SessionsThatFit(request, state, options_);
  if (fit > state.active_sessions) {
    retry_.OnAdmit();
    return {.admit = true};
  }
  return {.admit = false,
          .reason = "pool",
          .detail = "needs " + std::to_string(request.projected_blocks) + " blocks; free " +
                    std::to_string(state.free_blocks) + ", promised " +
                    std::to_string(state.reserved_blocks) + " of " +
                    std::to_string(state.total_blocks),
          .retry_after_ms =
              retry_.Ms(now_s, request.period_ms, std::numeric_limits<double>::infinity())};
}

void MemoryController::OnTick(double now_s, const SystemState& state) {
  retry_.Observe(now_s, state.active_sessions);
}

std::string MemoryController::Describe() const {
  char buf[128];
  std::snprintf(buf, sizeof buf, "memory(full_mode_session_s=%g, headroom_fraction=%g)",
                options_.full_mode_session_s, options_.headroom_fraction);
  return buf;
}

}  // namespace metronome::admission
