#include "metronome/base/clock.h"

#include <thread>

namespace metronome {

Nanos SteadyClock::Now() const {
  return std::chrono::duration_cast<Nanos>(std::chrono::steady_clock::now().time_since_epoch());
}

void SteadyClock::SleepUntil(Nanos t) {
  std::this_thread::sleep_until(std::chrono::steady_clock::time_point(
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(t)));
}

void ManualClock::SleepUntil(Nanos t) {
  // Never moves backwards: a sleep into the past returns at once.
  std::int64_t cur = now_ns_.load(std::memory_order_acquire);
  while (cur < t.count() &&
         !now_ns_.compare_exchange_weak(cur, t.count(), std::memory_order_acq_rel)) {
  }
}

}  // namespace metronome
