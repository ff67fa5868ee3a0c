// The first AIMD limit of a serving engine (serve, drive), seeded before the first client so a
// quiet server admits a normal burst at once. Internal to the cli module.
#pragma once

#include "metronome/admission/admission.h"
#include "metronome/engine/engine.h"
#include "metronome/realtime/realtime_loop.h"

namespace metronome::cli {

// Unless --aimd-predicted-limit is given (aimd->predicted_limit > 0) or --aimd-initial is
// (`initial_given`: a chosen start, e.g. an experiment's convergence from 1), runs the start-up
// calibration
// of `engine` (realtime::CalibrateForSession) at `reference` and sets aimd->predicted_limit to the
// N* it predicts at the AIMD low target, capped at aimd->max_limit; the controller caps the seed
// by the pool's bound with the KV guard and its limit log says which seeded it. Prints one line
// saying what it did. A failed calibration leaves the options as they are (the initial limit
// seeds), with the reason on that line.
void SeedAimdLimit(engine::Engine* engine, const realtime::SessionSpec& reference,
                   bool initial_given, admission::AimdOptions* aimd);

}  // namespace metronome::cli
