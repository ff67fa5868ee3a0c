#include "metronome/server/agent_check.h"

#include <algorithm>

namespace metronome::server {

std::int64_t ReplicaState::headroom() const {
  if (limit < 0) return -1;
  return std::max<std::int64_t>(0, limit - active);
}

std::int64_t ReplicaState::capacity() const {
  std::int64_t c = limit < 0 ? -1 : sessions + headroom();
  const auto cap = [&c](std::int64_t bound) { c = c < 0 ? bound : std::min(c, bound); };
  if (max_sessions > 0) cap(max_sessions);
  if (free_connection_slots >= 0) cap(sessions + free_connection_slots);
  return c;
}

std::int64_t ReplicaState::room() const {
  const std::int64_t c = capacity();
  if (c < 0) return -1;
  return std::max<std::int64_t>(0, c - sessions);
}

std::string AgentResponse(const ReplicaState& state) {
  const std::int64_t capacity = state.capacity();
  const std::int64_t room = state.room();
  std::string line = "up";
  if (state.draining || room == 0) {
    line += " drain";
  } else {
    // ceil(100 room / capacity): any room at all is at least 1% (0% would be a drain).
    const std::int64_t percent =
        room < 0 ? 100 : std::clamp<std::int64_t>((100 * room + capacity - 1) / capacity, 1, 100);
    line += " ready " + std::to_string(percent) + "%";
  }
  if (capacity > 0) line += " maxconn:" + std::to_string(capacity);
  line += '\n';
  return line;
}

Readiness ReadinessOf(const ReplicaState& state) {
  if (state.draining) return {.ready = false, .reason = "draining"};
  if (state.headroom() == 0) return {.ready = false, .reason = "admission_full"};
  if (state.room() == 0) return {.ready = false, .reason = "no_free_connection_slots"};
  return {};
}

}  // namespace metronome::server
