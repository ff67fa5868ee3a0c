// Private to the model library (and its tests and fuzzer): the GGUF model loader over bytes that
// are already in memory, so that the fuzzer can exercise it without touching the file system.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "metronome/model/model.h"

namespace metronome::model::internal {

// Builds a model from a GGUF image. `source` names it in error messages and becomes the model's
// name (its final path component). The weights are copied out, so `bytes` need not outlive the
// result. Throws LoadError naming `source` and the problem.
Model LoadGgufModelFromBytes(std::span<const std::uint8_t> bytes, const std::string& source);

}  // namespace metronome::model::internal
