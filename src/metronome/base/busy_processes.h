// Co-tenants on demand: N child processes that spin on a CPU each, for measuring how the engine
// holds up when it does not own the machine (bench-decode --cotenant, the thread pool's collapse
// test). Linux only (fork).
#pragma once

#include <sys/types.h>

#include <vector>

namespace metronome::base {

class BusyProcesses {
 public:
  // Forks `count` children that busy-loop until killed; each also ends itself after
  // `max_seconds` (SIGALRM), so none outlives a crashed parent for long. The children only spin:
  // forking from a multi-threaded process is safe for that.
  BusyProcesses(int count, unsigned max_seconds);
  ~BusyProcesses();  // SIGKILL and reap every child
  BusyProcesses(const BusyProcesses&) = delete;
  BusyProcesses& operator=(const BusyProcesses&) = delete;

  [[nodiscard]] int started() const noexcept { return static_cast<int>(pids_.size()); }

 private:
  std::vector<pid_t> pids_;
};

}  // namespace metronome::base
