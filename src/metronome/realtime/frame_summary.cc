#include "metronome/realtime/frame_summary.h"

namespace metronome::realtime {

void FrameCounts::AddOutcomesTo(nlohmann::json& j) const {
  j["frames"] = frames;
  for (int i = 0; i < telemetry::kNumFrameOutcomes; ++i) {
    const auto outcome = static_cast<FrameOutcome>(i);
    j[std::string(telemetry::ToString(outcome)) + "_frames"] = of(outcome);
  }
}

nlohmann::json FrameSummary::ToJson() const {
  nlohmann::json j;
  AddOutcomesTo(j);
  j["deadline_misses"] = deadline_misses();
  j["mute_alarms"] = mute_alarms;
  j["first_starved_at_s"] = NullIfNan(first_starved_at_s);
  j["admitted"] = admitted;
  j["arrivals"] = arrivals;
  j["rejected"] = rejected;
  j["rejections_per_arrival"] = NullIfNan(rejections_per_arrival());
  j["abandoned"] = abandoned;
  j["ended_by_error"] = ended_by_error;
  j["active_peak"] = active_peak;
  j["p50_frame_latency_ms"] = NullIfNan(p50_frame_latency_ms);
  j["p99_frame_latency_ms"] = NullIfNan(p99_frame_latency_ms);
  j["deadline_ms"] = deadline_ms;
  j["duration_s"] = duration_s;
  j["kv_policy"] = kv_policy;
  return j;
}

}  // namespace metronome::realtime
