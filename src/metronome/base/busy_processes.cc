#include "metronome/base/busy_processes.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>

namespace metronome::base {

BusyProcesses::BusyProcesses(int count, unsigned max_seconds) {
  for (int i = 0; i < count; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {
      alarm(max_seconds);  // default action of SIGALRM: terminate
      volatile std::uint64_t x = 0;
      for (;;) x = x + 1;
    }
    if (pid > 0) pids_.push_back(pid);
  }
}

BusyProcesses::~BusyProcesses() {
  for (const pid_t pid : pids_) kill(pid, SIGKILL);
  for (const pid_t pid : pids_) waitpid(pid, nullptr, 0);
}

}  // namespace metronome::base
