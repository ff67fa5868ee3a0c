// A loaded model: shape, weights and (when the source has one) its tokenizer. LoadModel is the one
// entry point for every source the command line accepts.
//
// Thread-safety: immutable after loading.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "metronome/model/gguf.h"
#include "metronome/model/model_config.h"
#include "metronome/model/tokenizer.h"
#include "metronome/model/weights.h"

namespace metronome::model {

struct Model {
  ModelConfig config;
  std::unique_ptr<ModelWeights> weights;
  std::unique_ptr<Tokenizer> tokenizer;  // may be null (a llama2.c checkpoint without --tokenizer)
};

// `spec` is one of:
//   synthetic:<preset>   seeded random weights of a preset shape (see SyntheticPresetNames())
//   <path>.gguf          GGUF v3, architectures llama / qwen2, tensor types F32/F16/BF16/Q8_0
//   <path>.bin (other)   llama2.c checkpoint
// `tokenizer_path` (may be empty) is a llama2.c tokenizer file; for GGUF it overrides the embedded
// vocabulary only if given. Throws LoadError / ConfigError naming the file and the problem.
Model LoadModel(const std::string& spec, const std::string& tokenizer_path = "");

// Which loader a spec goes to (LoadModel's dispatch): the "synthetic:" prefix, else a ".gguf"
// name or the GGUF magic, else llama2.c.
enum class ModelFormat : std::uint8_t { kSynthetic, kGguf, kLlama2c };
[[nodiscard]] ModelFormat DetectModelFormat(const std::string& spec);
[[nodiscard]] const char* ToString(ModelFormat format);

// Individual loaders (LoadModel dispatches to these).
Model LoadGgufModel(const std::string& path);
Model LoadLlama2cModel(const std::string& path, const std::string& tokenizer_path);
// Synthetic models: deterministic weights from `seed`, scaled so activations stay O(1) through
// the layers, and a MakeSyntheticVocabulary tokenizer. Throws ConfigError for an unknown preset.
Model MakeSyntheticModel(const std::string& preset, std::uint64_t seed = 1234);
ModelConfig SyntheticPresetConfig(const std::string& preset);
std::string SyntheticPresetNames();  // "tiny, smol-135m, ..." for --help and error messages

// Writes `model` as a GGUF v3 file with architecture `llama` and its vocabulary, tensors in `type`
// (kF32 or kF16), in the tensor naming and layout llama.cpp expects. Throws on I/O errors.
void ExportGguf(const Model& model, const std::string& path, GgmlType type);

}  // namespace metronome::model
