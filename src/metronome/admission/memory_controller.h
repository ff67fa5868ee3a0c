// `memory`: admit while the KV pool can hold the new session's projected footprint on top of what
// admitted sessions already hold or were promised (the policy of KV-pool engines). Exact in window
// mode (the projection is the session's bound); a bet on session length in full mode.
// Thread-safety: not thread-safe; owned by the engine thread.
#pragma once

#include <cstdint>
#include <string>

#include "metronome/admission/admission.h"

namespace metronome::admission {

class MemoryController final : public AdmissionController {
 public:
  explicit MemoryController(const MemoryOptions& options);  // options must pass Validate

  // Admits iff SessionsThatFit(request, state) > active, i.e. the unpromised pool covers
  // request.projected_blocks. Rejections: "pool", retry after the expected time to the next
  // session end (RetryHint): promised blocks come back when sessions end.
  Decision Decide(const SessionRequest& request, const SystemState& state, double now_s) override;
  void OnTick(double now_s, const SystemState& state) override;  // counts session ends
  [[nodiscard]] std::int64_t limit() const override { return kNoLimit; }
  [[nodiscard]] bool reserves_kv() const override { return true; }
  [[nodiscard]] std::string Describe() const override;

 private:
  MemoryOptions options_;
  RetryHint retry_;
};

}  // namespace metronome::admission
