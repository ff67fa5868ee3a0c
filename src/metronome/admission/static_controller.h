// `static:N`: admit while fewer than N sessions are active. The baseline every adaptive controller
// is compared with (N from a fixed-N sweep, or the memory-fit count).
// Thread-safety: not thread-safe; owned by the engine thread.
#pragma once

#include <cstdint>
#include <string>

#include "metronome/admission/admission.h"

namespace metronome::admission {

class StaticController final : public AdmissionController {
 public:
  explicit StaticController(std::int64_t limit);  // limit >= 0 (MTR_CHECK)

  // Rejections: "limit", retry after the expected time to the next session end (RetryHint).
  Decision Decide(const SessionRequest& request, const SystemState& state, double now_s) override;
  void OnTick(double now_s, const SystemState& state) override;  // counts session ends
  [[nodiscard]] std::int64_t limit() const override { return limit_; }
  [[nodiscard]] std::string Describe() const override;

 private:
  std::int64_t limit_;
  RetryHint retry_;
};

}  // namespace metronome::admission
