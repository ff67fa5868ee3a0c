#include "metronome/realtime/frame_summary.h"

namespace metronome::realtime {

void FrameSummary::SetCounts(const FrameCounts& c) {
  frames = c.frames;
  ok_frames = c.ok;
  late_frames = c.late;
  starved_frames = c.starved;
  short_frames = c.short_frames;
  deadline_misses = c.late;
  mute_alarms = c.mute_alarms;
}

nlohmann::json FrameSummary::ToJson() const {
  nlohmann::json j;
  j["frames"] = frames;
  j["ok_frames"] = ok_frames;
  j["late_frames"] = late_frames;
  j["starved_frames"] = starved_frames;
  j["short_frames"] = short_frames;
  j["deadline_misses"] = deadline_misses;
  j["mute_alarms"] = mute_alarms;
  j["first_starved_at_s"] = NullIfNan(first_starved_at_s);
  j["admitted"] = admitted;
  j["rejected"] = rejected;
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
