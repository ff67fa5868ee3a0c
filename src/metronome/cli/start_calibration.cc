#include "metronome/cli/start_calibration.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <variant>

#include "metronome/base/errors.h"
#include "metronome/serving/engine_calibration.h"

namespace metronome::cli {

void CalibrateAtStart(engine::Engine* engine, const realtime::SessionSpec& reference,
                      bool initial_given, realtime::SupervisorOptions* sup) {
  admission::AimdOptions& aimd = sup->aimd;
  const bool seed = sup->admission == "aimd" && aimd.predicted_limit <= 0 && !initial_given;
  const std::string shape = FormatValue(reference.period_ms) +
                            " ms period, a=" + std::to_string(reference.input_tokens_per_frame) +
                            " o=" + std::to_string(reference.output_tokens_per_frame) + ", " +
                            reference.policy.ToString();
  const auto calibrated = serving::CalibrateForSession(*engine, reference, aimd.low_target);
  if (const auto* error = std::get_if<std::string>(&calibrated)) {
    std::printf(
        "calibration failed (%s): sessions are counted, not priced; the initial limit "
        "%lld seeds\n",
        error->c_str(), static_cast<long long>(aimd.initial_limit));
    return;
  }
  const auto& c = std::get<serving::SessionCalibration>(calibrated);
  sup->cost_model = c.fit.model;
  sup->reference_session = reference;
  const realtime::SessionPrice price = realtime::PriceSession(c.fit.model, reference);
  const double c2_ns = c.fit.model.c2_s_per_kv_token * 1e9;
  const double fitted_c2_ns = c.fitted_c2_s_per_kv_token * 1e9;
  char anchored[80] = "";
  if (c2_ns > fitted_c2_ns) {
    std::snprintf(anchored, sizeof anchored, " (the fit's %.3g, raised to the window's frame)",
                  fitted_c2_ns);
  }
  std::printf(
      "calibration (%.2f s, %s: c0 %.3g ms, c1 %.3g us/token, c2 %.3g ns/kv-token%s, r2 %.3f): "
      "one unit of work = the reference session (%s) = %.4f of the engine per second\n",
      c.seconds, c.GridSummary().c_str(), c.fit.model.c0_s * 1e3, c.fit.model.c1_s_per_token * 1e6,
      c2_ns, anchored, c.fit.r2, shape.c_str(), price.work_share);
  if (sup->admission != "aimd") return;
  if (aimd.predicted_limit > 0) {
    std::printf("aimd seed: --aimd-predicted-limit %lld\n",
                static_cast<long long>(aimd.predicted_limit));
  } else if (initial_given) {
    std::printf("aimd seed: --aimd-initial %lld\n", static_cast<long long>(aimd.initial_limit));
  } else if (c.predicted_limit <= 0) {
    // Not one reference session fits: start at the floor and let the latencies it sees grow it, not
    // at a default that would take several engines' worth of smaller sessions at once.
    aimd.initial_limit = aimd.window.min_limit;
    std::printf(
        "aimd seed: no session predicted within %g D; the limit starts at --aimd-min %lld\n",
        aimd.low_target, static_cast<long long>(aimd.initial_limit));
  } else if (seed) {
    aimd.predicted_limit = std::min(c.predicted_limit, aimd.window.max_limit);
    std::printf("aimd seed: N* %lld units predicted at %g D%s\n",
                static_cast<long long>(aimd.predicted_limit), aimd.low_target,
                c.predicted_limit > aimd.window.max_limit ? " (capped at --aimd-max)" : "");
  }
}

}  // namespace metronome::cli
