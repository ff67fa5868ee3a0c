#include "metronome/base/step_status.h"

#include <array>

#include "metronome/base/enum_names.h"

namespace metronome {

const char* ToString(StepStatus s) {
  static constexpr std::array<EnumName<StepStatus>, 6> kNames = {
      {{StepStatus::kOk, "ok"},
       {StepStatus::kPoolExhausted, "pool_exhausted"},
       {StepStatus::kContextFull, "context_full"},
       {StepStatus::kUnknownSession, "unknown_session"},
       {StepStatus::kInvalidRequest, "invalid_request"},
       {StepStatus::kNonFiniteLogits, "nonfinite_logits"}}};
  return NameOf(kNames, s, "?");
}

}  // namespace metronome
