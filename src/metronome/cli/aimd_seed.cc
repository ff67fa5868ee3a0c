#include "metronome/cli/aimd_seed.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <variant>

#include "metronome/base/errors.h"
#include "metronome/serving/engine_calibration.h"

namespace metronome::cli {

void SeedAimdLimit(engine::Engine* engine, const realtime::SessionSpec& reference,
                   bool initial_given, admission::AimdOptions* aimd) {
  if (aimd->predicted_limit > 0) {
    std::printf("aimd seed: --aimd-predicted-limit %lld (no start-up calibration)\n",
                static_cast<long long>(aimd->predicted_limit));
    return;
  }
  if (initial_given) {
    std::printf("aimd seed: --aimd-initial %lld (no start-up calibration)\n",
                static_cast<long long>(aimd->initial_limit));
    return;
  }
  const std::string shape = FormatValue(reference.period_ms) +
                            " ms period, a=" + std::to_string(reference.input_tokens_per_frame) +
                            " o=" + std::to_string(reference.output_tokens_per_frame) + ", " +
                            reference.policy.ToString();
  const auto calibrated = serving::CalibrateForSession(*engine, reference, aimd->low_target);
  if (const auto* error = std::get_if<std::string>(&calibrated)) {
    std::printf("aimd seed: start-up calibration failed (%s); the initial limit %lld seeds\n",
                error->c_str(), static_cast<long long>(aimd->initial_limit));
    return;
  }
  const auto& c = std::get<serving::SessionCalibration>(calibrated);
  if (c.predicted_limit <= 0) {
    std::printf(
        "aimd seed: the start-up calibration predicts no session within %g D at %s; the "
        "initial limit %lld seeds\n",
        aimd->low_target, shape.c_str(), static_cast<long long>(aimd->initial_limit));
    return;
  }
  aimd->predicted_limit = std::min(c.predicted_limit, aimd->window.max_limit);
  std::printf(
      "aimd seed: N* %lld predicted at %g D for the reference session (%s) by a start-up "
      "calibration (%.2f s: c0 %.3g ms, c1 %.3g us/token, c2 %.3g ns/kv-token, r2 %.3f)%s\n",
      static_cast<long long>(aimd->predicted_limit), aimd->low_target, shape.c_str(), c.seconds,
      c.fit.model.c0_s * 1e3, c.fit.model.c1_s_per_token * 1e6, c.fit.model.c2_s_per_kv_token * 1e9,
      c.fit.r2, c.predicted_limit > aimd->window.max_limit ? " (capped at --aimd-max)" : "");
}

}  // namespace metronome::cli
