// The frame counters (FrameCounts) and the frame and session counts every run summary shares
// (FrameSummary), whoever observed the frames.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "metronome/telemetry/engine_metrics.h"

namespace metronome::realtime {

// A summary value as JSON: a number, or null when it is NaN or infinite (no sample: never a fake
// 0).
inline nlohmann::json NullIfNan(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

// One vocabulary for frame outcomes: the loop classifies, telemetry labels (ToString there).
using FrameOutcome = telemetry::FrameOutcome;

// The frame counters, in one place: the loop's, a run's samples, a client's (loadgen) and a
// session's (/v1/stats) all count frames by outcome with this.
struct FrameCounts {
  std::int64_t frames = 0;
  std::int64_t ok = 0;
  std::int64_t late = 0;
  std::int64_t starved = 0;
  std::int64_t short_frames = 0;
  std::int64_t missed = 0;  // FrameOutcome::kMissed: due while the client was away or moving
  std::int64_t mute_alarms = 0;

  void Count(FrameOutcome outcome) {
    ++frames;
    if (const auto counter = CounterOf(outcome)) ++(this->*counter);
  }
  [[nodiscard]] std::int64_t of(FrameOutcome outcome) const {
    const auto counter = CounterOf(outcome);
    return counter ? this->*counter : 0;
  }
  // Adds the counts of frames by outcome under the keys every summary uses: "frames" and
  // "<outcome>_frames" (ok_frames, late_frames, starved_frames, short_frames). The one spelling of
  // these keys; experiment scripts read them.
  void AddOutcomesTo(nlohmann::json& j) const;

 private:
  // The counter of each outcome, in one table (FrameOutcome's order); null for a value outside
  // the enum.
  static std::int64_t FrameCounts::*CounterOf(FrameOutcome outcome) {
    static constexpr std::array<std::int64_t FrameCounts::*, telemetry::kNumFrameOutcomes>
        kCounters = {&FrameCounts::ok, &FrameCounts::late, &FrameCounts::starved,
                     &FrameCounts::short_frames, &FrameCounts::missed};
    const auto i = static_cast<std::size_t>(outcome);
    return i < kCounters.size() ? kCounters[i] : nullptr;
  }
};

// What a run's summary reports about its frames and sessions, whoever observed them: the engine
// (sim, drive: RunSummary) or a client over the network (loadgen: LoadGenSummary). The same keys
// with the same meaning, so experiment scripts read either. The frame counts (FrameCounts: frames
// by outcome, mute alarms), and:
struct FrameSummary : FrameCounts {
  double first_starved_at_s = std::numeric_limits<double>::quiet_NaN();
  std::int64_t admitted = 0;
  // Clients that asked for a session: each arriving client once, and each client of a fixed
  // population once, however often it retried (a reconnect after a refusal is the same client).
  std::int64_t arrivals = 0;
  std::int64_t rejected = 0;   // rejection decisions (a retrying client counts once per try)
  std::int64_t abandoned = 0;  // arriving clients that gave up after patience_s
  std::int64_t ended_by_error = 0;
  std::int64_t active_peak = 0;
  double p50_frame_latency_ms = std::numeric_limits<double>::quiet_NaN();
  double p99_frame_latency_ms = std::numeric_limits<double>::quiet_NaN();
  double deadline_ms = 0.0;
  double duration_s = 0.0;
  std::string kv_policy;

  // Frames whose output missed the deadline: the late ones. Starved and short frames are handed
  // back on time, which is exactly why a deadline metric alone looks healthy while sessions are
  // mute; they are counted separately.
  [[nodiscard]] std::int64_t deadline_misses() const { return late; }
  // Refusals a client met on average before it was admitted or gave up (rejected / arrivals): the
  // retry storm's measure (a client that polls every period while the server is full makes tens).
  // NaN before any arrival.
  [[nodiscard]] double rejections_per_arrival() const {
    return arrivals > 0 ? static_cast<double>(rejected) / static_cast<double>(arrivals)
                        : std::numeric_limits<double>::quiet_NaN();
  }
  [[nodiscard]] nlohmann::json ToJson() const;
};

}  // namespace metronome::realtime
