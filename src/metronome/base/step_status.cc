#include "metronome/base/step_status.h"

namespace metronome {

const char* ToString(StepStatus s) {
  switch (s) {
    case StepStatus::kOk:
      return "ok";
    case StepStatus::kPoolExhausted:
      return "pool_exhausted";
    case StepStatus::kContextFull:
      return "context_full";
    case StepStatus::kUnknownSession:
      return "unknown_session";
    case StepStatus::kInvalidRequest:
      return "invalid_request";
  }
  return "?";
}

}  // namespace metronome
