#include "metronome/server/agent_check.h"

#include <algorithm>

namespace metronome::server {

std::int64_t ReplicaState::headroom() const {
  if (limit < 0) return -1;
  return std::max<std::int64_t>(0, limit - active);
}

std::int64_t ReplicaState::max_connections() const {
  if (limit < 0) return -1;
  return sessions + headroom();
}

std::string AgentResponse(const ReplicaState& state) {
  const std::int64_t room = state.headroom();
  std::string line = "up";
  if (state.draining || room == 0) {
    line += " drain";
  } else {
    // ceil(100 room / limit): any room at all is at least 1% (0% would be a drain).
    const std::int64_t percent =
        room < 0 ? 100
                 : std::clamp<std::int64_t>((100 * room + state.limit - 1) / state.limit, 1, 100);
    line += " ready " + std::to_string(percent) + "%";
  }
  if (state.max_connections() > 0) line += " maxconn:" + std::to_string(state.max_connections());
  line += '\n';
  return line;
}

}  // namespace metronome::server
