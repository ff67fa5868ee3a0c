// Private to the model library (and its tests): the one table of what the GGUF loader understands.
// Every metadata key and tensor name of a file is looked up here: keys the engine reads, keys it
// knows to be harmless (names, licences, ids it never uses), and nothing else in the namespaces
// that shape the computation (`<arch>.*`, `tokenizer.*`): an unknown key there, a known key with
// a value the engine does not implement, or a tensor the architecture does not have makes the file
// unsupported, so that no file is ever computed differently from what it says.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "metronome/model/gguf.h"
#include "metronome/model/model_config.h"

namespace metronome::model::internal {

enum class KeyUse : std::uint8_t {
  kRead,     // the loader reads it (values it does not implement are refused)
  kIgnored,  // harmless for the computation; not read
};

// The check of a key's value: "" when the engine computes what the value says, else why not.
using KeyCheck = std::string (*)(const GgufFile& g, const std::string& key);

struct GgufKeyRule {
  // The key; a leading "{arch}." stands for the file's general.architecture, a trailing ".*" for
  // every key below that prefix.
  std::string_view key;
  KeyUse use;
  std::string_view meaning;  // one line for docs and messages
  KeyCheck check = nullptr;  // null: every value of the right type is fine
};

// The table (docs/models.md lists it in prose).
[[nodiscard]] std::span<const GgufKeyRule> GgufKeyRules();

// Every reason `g` cannot be computed as it says, one line each naming the key or tensor and the
// value: unknown keys in `<arch>.*` / `tokenizer.*`, refused values, tensors that are neither
// RequiredTensors(*c) nor an optional tensor the architecture has. Tensors are only checked with
// a configuration (`c` non-null). Empty for a supported file.
[[nodiscard]] std::vector<std::string> UnsupportedInGguf(const GgufFile& g, const ModelConfig* c);

// Throws LoadError naming the source and every UnsupportedInGguf line.
void RequireSupportedGguf(const GgufFile& g, const ModelConfig& c);

// GGUF rope.scaling.type values: "none", "linear", "yarn"; nullopt for others ("longrope", ...).
[[nodiscard]] std::optional<RopeScaling> ParseRopeScaling(std::string_view name);
inline constexpr std::string_view kRopeScalingNames = "none, linear, yarn";  // for messages

// llama.cpp's defaults for the YaRN keys it does not read for llama / qwen2 (a file may carry
// them only with these values).
inline constexpr double kYarnBetaFast = 32.0;
inline constexpr double kYarnBetaSlow = 1.0;

// The optional tensor holding Llama 3.1+ per-pair frequency divisors.
inline constexpr std::string_view kRopeFreqsTensor = "rope_freqs.weight";

}  // namespace metronome::model::internal
