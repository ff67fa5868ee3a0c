// Private to the model library (and its tests and fuzzer): the GGUF model loader over bytes that
// are already in memory, so that the fuzzer can exercise it without touching the file system.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "metronome/model/model.h"

namespace metronome::model::internal {

// Builds a model from a GGUF image. `source` names it in error messages and becomes the model's
// name (its final path component). With a `backing` (the owner of `bytes`, e.g. the mapped file)
// the weight matrices are views into `bytes` where aligned, and the model keeps `backing` alive;
// without one every tensor is copied, so `bytes` need not outlive the result. Throws LoadError
// naming `source`, the tensor and the problem.
Model LoadGgufModelFromBytes(std::span<const std::uint8_t> bytes, const std::string& source,
                             std::shared_ptr<const void> backing = nullptr);

// The pieces of that loader `metronome info` reuses without loading weights: the configuration
// from the metadata and the tokenizer (null for a weights-only file). The tensors a configuration
// has are RequiredTensors (gguf_tensors.h).
ModelConfig ReadGgufConfig(const GgufFile& g);
std::unique_ptr<Tokenizer> ReadGgufTokenizer(const GgufFile& g, const ModelConfig& c);

}  // namespace metronome::model::internal
