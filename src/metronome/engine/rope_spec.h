// The one translation from a model's rope settings (model::ModelConfig, as the loaders read them)
// to the rope kernel's plain description (kernels::RopeSpec), so that kernels/ knows nothing of
// model files.
#pragma once

#include "metronome/kernels/rope.h"
#include "metronome/model/model_config.h"

namespace metronome::engine {

// `c` must have passed ModelConfig::Validate.
[[nodiscard]] kernels::RopeSpec RopeSpecFor(const model::ModelConfig& c);

}  // namespace metronome::engine
