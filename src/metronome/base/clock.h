// Time as a dependency. Everything that schedules or measures (the frame loop, admission windows,
// telemetry timestamps) reads time through a Clock, so the same code runs on the real clock or on a
// virtual one (simulator, deterministic tests that never sleep).
//
// Thread-safety: SteadyClock is stateless; ManualClock is safe to read from any thread while one
// thread advances it.
#pragma once

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>

namespace metronome {

using Nanos = std::chrono::nanoseconds;

// A duration in milliseconds (period_ms, deadline_ms, ...) as Nanos, rounded to the nearest
// nanosecond: the one conversion every scheduler (the frame loop, the load generator) uses.
[[nodiscard]] inline Nanos FromMs(double ms) { return Nanos(std::llround(ms * 1e6)); }

class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic time since an arbitrary, fixed origin.
  [[nodiscard]] virtual Nanos Now() const = 0;
  // Blocks (real clock) or jumps (virtual clock) until Now() >= t.
  virtual void SleepUntil(Nanos t) = 0;

  [[nodiscard]] double NowSeconds() const { return std::chrono::duration<double>(Now()).count(); }
};

// std::chrono::steady_clock.
class SteadyClock final : public Clock {
 public:
  [[nodiscard]] Nanos Now() const override;
  void SleepUntil(Nanos t) override;
};

// A virtual clock that only moves when told to: Advance() by the caller, or SleepUntil() jumping
// straight to the target (so a simulated hour takes no wall time).
class ManualClock final : public Clock {
 public:
  explicit ManualClock(Nanos start = Nanos{0}) : now_ns_(start.count()) {}
  [[nodiscard]] Nanos Now() const override {
    return Nanos{now_ns_.load(std::memory_order_acquire)};
  }
  void SleepUntil(Nanos t) override;
  void Advance(Nanos d) { now_ns_.fetch_add(d.count(), std::memory_order_acq_rel); }

 private:
  std::atomic<std::int64_t> now_ns_;
};

}  // namespace metronome
