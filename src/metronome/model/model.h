// A loaded model: shape, weights and (when the source has one) its tokenizer. LoadModel is the one
// entry point for every source the command line accepts.
//
// Thread-safety: immutable after loading.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

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
//   <path>.gguf          GGUF v3, architectures llama / qwen2 / qwen3 / qwen3moe, tensor
//                        types F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K
//                        (mixed per tensor)
//   <path>.bin (other)   llama2.c checkpoint
// `tokenizer_path` (may be empty) is a llama2.c tokenizer file; for GGUF it overrides the embedded
// vocabulary only if given. Throws LoadError / ConfigError naming the file and the problem.
Model LoadModel(const std::string& spec, const std::string& tokenizer_path = "");

// Who computes the same thing: "m-" and 16 hex digits of a hash of the configuration (every
// hyper-parameter, the rope recipe) and of sampled weights (dequantised, so the same file on
// machines with other row layouts agrees), not of the file's name or path. Two replicas serving
// the same model agree; a moved session's state is refused by a replica whose identity differs.
// Reads a few rows per layer: cheap at start-up.
[[nodiscard]] std::string ModelIdentity(const Model& model);

// Which loader a spec goes to (LoadModel's dispatch): the "synthetic:" prefix, else a ".gguf"
// name or the GGUF magic, else llama2.c.
enum class ModelFormat : std::uint8_t { kSynthetic, kGguf, kLlama2c };
[[nodiscard]] ModelFormat DetectModelFormat(const std::string& spec);
[[nodiscard]] const char* ToString(ModelFormat format);

// Individual loaders (LoadModel dispatches to these).
Model LoadGgufModel(const std::string& path);
Model LoadLlama2cModel(const std::string& path, const std::string& tokenizer_path);
// Synthetic models: deterministic weights from `seed`, scaled so activations stay O(1) through
// the layers, and a MakeSyntheticVocabulary tokenizer, the weights filled by a pool of
// `num_threads` threads for the call (0: base::DetectedCpuCount(); the weights are the same for
// any count). Throws ConfigError for an unknown preset.
Model MakeSyntheticModel(const std::string& preset, std::uint64_t seed = 1234, int num_threads = 0);
ModelConfig SyntheticPresetConfig(const std::string& preset);
std::string SyntheticPresetNames();  // "tiny, smol-135m, ..." for --help and error messages

// The tensor types of an exported file: `matrices` for every weight matrix, `high` for the ones
// llama.cpp's _M mixes give more bits (attn_v, ffn_down, output: Q6_K in q4_k_m and q5_k_m; it
// gives them to some layers only, we to all). Norms are always F32. A matrix whose rows are not
// whole blocks of its type falls back to a 32-element type of about the same bits (Q4_K -> Q5_0,
// Q5_K -> Q5_1, Q6_K -> Q8_0), or to F16 when rows are not whole 32-blocks either.
struct ExportTypes {
  GgmlType matrices = GgmlType::kF32;
  GgmlType high = GgmlType::kF32;
  std::uint32_t file_type = 0;  // llama.cpp's llama_ftype, for general.file_type
};
// "f32", "f16", "bf16", "q8_0", "q4_0", "q4_k_m", "q5_k_m", "q6_k"; nullopt for anything else.
std::optional<ExportTypes> ParseExportTypes(std::string_view name);
std::string ExportTypeNames();  // "f32|f16|..." for --help and errors

// What was written for one tensor, and why its type differs from the mix's (empty if it does not).
struct ExportedTensor {
  std::string name;
  std::vector<std::uint64_t> shape;  // ggml order
  GgmlType type = GgmlType::kF32;
  std::uint64_t bytes = 0;
  std::string reason;
};
// The type `types` gives the matrix `name` with rows of `cols` elements.
ExportedTensor ChooseTensorType(const ExportTypes& types, const std::string& name,
                                std::uint64_t cols);

// Llama 3.1's rope recipe (HF rope_type "llama3") as the per-pair frequency divisors llama.cpp's
// converter stores in rope_freqs.weight: pairs whose wavelength is below
// original_context / high_freq_factor keep their frequency, those above
// original_context / low_freq_factor are divided by `factor`, the ones between blend smoothly.
// Llama 3.1/3.2 use factor 8, low 1, high 4, original context 8192.
std::vector<float> Llama3RopeFreqFactors(double theta, int rotary_dim, double factor,
                                         double low_freq_factor, double high_freq_factor,
                                         double original_context);

// Writes `model` as a GGUF v3 file with architecture `llama` and its vocabulary (the loaded
// tokenizer's, or a synthetic model's), matrices encoded per `types` (from the loaded weights, in
// whatever type they are), in the tensor naming and layout llama.cpp expects. Returns the table
// of tensors written. The rope settings are written as llama.cpp reads them (rope.scaling.*,
// rope_freqs.weight). Throws ConfigError for a model it cannot write, LoadError on I/O errors.
std::vector<ExportedTensor> ExportGguf(const Model& model, const std::string& path,
                                       const ExportTypes& types);
// Writes the synthetic model `preset` made with `seed` (the weights MakeSyntheticModel gives) as
// ExportGguf writes it, without making the model: each tensor is generated and quantised a chunk
// of rows at a time on a pool of `num_threads` threads (0: the detected CPU count), so memory is
// bounded by one tensor's encoded bytes, and a shape too large to hold in fp32 can be written.
// Throws as MakeSyntheticModel and ExportGguf do.
std::vector<ExportedTensor> WriteSyntheticGguf(const std::string& preset, std::uint64_t seed,
                                               const std::string& path, const ExportTypes& types,
                                               int num_threads = 0);
// Every matrix in `type` (F32 or F16 file types).
void ExportGguf(const Model& model, const std::string& path, GgmlType type);

}  // namespace metronome::model
