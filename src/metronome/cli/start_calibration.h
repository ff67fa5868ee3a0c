// The start-up calibration of a serving engine (serve, drive), before the first client: it fits
// the step-cost model that prices every session in units of work (SupervisorOptions::cost_model)
// and seeds the AIMD limit with the N* it predicts, so a quiet server admits a normal burst at
// once. Internal to the cli module.
#pragma once

#include "metronome/engine/engine.h"
#include "metronome/realtime/realtime_loop.h"
#include "metronome/realtime/supervisor.h"

namespace metronome::cli {

// Runs the start-up calibration of `engine` (serving::CalibrateForSession) at `reference`, the
// driver's default session, and sets sup->cost_model and sup->reference_session from it. With
// aimd admission it also sets sup->aimd.predicted_limit to the N* predicted at the AIMD low
// target, capped at the max limit, unless --aimd-predicted-limit is given (predicted_limit > 0)
// or --aimd-initial is (`initial_given`: a chosen start, e.g. an experiment's convergence from
// 1); the controller caps the seed by the pool's bound with the KV guard and its limit log says
// which seeded it. When not one reference session is predicted to fit, the limit starts at its
// minimum (initial_limit = min_limit) instead. Prints one line saying what it did. A failed
// calibration leaves the options as they are (sessions are counted, not priced; the initial limit
// seeds), with the reason on that line.
void CalibrateAtStart(engine::Engine* engine, const realtime::SessionSpec& reference,
                      bool initial_given, realtime::SupervisorOptions* sup);

}  // namespace metronome::cli
