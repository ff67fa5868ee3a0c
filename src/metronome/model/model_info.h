// What a model source holds, read without running it: the facts `metronome info` prints and the
// tokenizer `metronome tokenize` uses. A GGUF file is described from its header alone, so files
// whose tensor types the engine cannot compute with yet (Q4_K, IQ*, ...) or whose architecture
// it does not run are still listed; llama2.c checkpoints and synthetic presets are loaded (they
// are fp32 and small) and described as the engine holds them.
//
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "metronome/base/types.h"
#include "metronome/model/model.h"
#include "metronome/quant/ggml_type.h"

namespace metronome::model {

struct TensorSummary {
  std::string name;  // llama.cpp naming ("blk.0.attn_q.weight")
  quant::GgmlType type = quant::GgmlType::kF32;
  std::vector<std::uint64_t> shape;  // ggml order: shape[0] is the innermost (contiguous) dim
  std::uint64_t bytes = 0;
  // GGUF: where the tensor's data starts in the file, in bytes from its beginning (for tools that
  // read or patch it); 0 for the other sources, whose tensors are the engine's.
  std::uint64_t file_offset = 0;
};

struct SpecialToken {
  std::string role;   // "bos", "eos", "unk", "pad"
  TokenId id = -1;    // -1: the vocabulary has none
  std::string piece;  // its spelling in the vocabulary
};

struct ModelInfo {
  ModelFormat format = ModelFormat::kSynthetic;
  std::string architecture;  // GGUF general.architecture (may be one the engine cannot run)
  // The engine's configuration of the model; nullopt with `config_error` when the file's
  // metadata cannot give one (e.g. an architecture the engine does not run).
  std::optional<ModelConfig> config;
  std::string config_error;
  // GGUF: why the engine would refuse to compute the file (internal::UnsupportedInGguf: each line
  // names a key or tensor); empty when it computes it as the file says.
  std::vector<std::string> unsupported;
  std::uint32_t gguf_version = 0;      // 0 unless GGUF
  std::uint64_t metadata_entries = 0;  // GGUF key/value pairs
  // GGUF: the file's tensors in file order, each in its stored type. llama2.c and synthetic: the
  // tensors the engine holds, in llama.cpp naming, fp32.
  std::vector<TensorSummary> tensors;
  std::uint64_t tensor_bytes = 0;  // sum over `tensors`
  // Tokenizer: "sentencepiece", "gpt2", or "none" (weights-only file, llama2.c without
  // --tokenizer, or unreadable metadata: see config_error).
  std::string tokenizer_kind = "none";
  int vocab_size = 0;
  bool adds_bos = false;      // Tokenizer::adds_bos
  bool adds_eos = false;      // Tokenizer::adds_eos
  std::string pre_tokenizer;  // gpt2: PreTokenizerName; "" otherwise
  // tokenizer.chat_template as prompt.messages sees it: "chatml", "llama3", "unrecognised" or
  // "none".
  std::string chat_format = "none";
  std::vector<SpecialToken> special_tokens;  // bos, eos, unk, pad (always four entries)
};

// Throws LoadError / ConfigError as LoadModel does for a file that cannot be read at all.
ModelInfo DescribeModel(const std::string& spec, const std::string& tokenizer_path = "");

// A tensor holding values that are not finite (NaN or +-infinity) once decoded.
struct NonFiniteTensor {
  std::string name;
  std::uint64_t count = 0;        // non-finite elements
  std::uint64_t first_index = 0;  // flat element index of the first, in storage order
};

// What CheckWeights found: every element of every tensor it could decode, decoded.
struct WeightCheck {
  std::uint64_t tensors_checked = 0;
  std::uint64_t elements_checked = 0;
  // Tensors of a type this build cannot decode (integer types, the IQ and other types without a
  // codec here), "name (TYPE)": not checked.
  std::vector<std::string> unchecked;
  std::vector<NonFiniteTensor> non_finite;  // in file (or engine) order; empty: all finite
};

// Decodes every weight of `spec` and counts the elements that are not finite. A GGUF file is read
// tensor by tensor in its stored type, a few blocks at a time (never a whole fp32 copy of a
// tensor, let alone of the model), without building the engine's weights, so files the engine
// would refuse are still checked; llama2.c checkpoints and synthetic presets are loaded and their
// fp32 weights checked as the engine holds them (llama.cpp-like names; fused groups by the fused
// name, e.g. "blk.0.attn_qkv"). Throws as DescribeModel for a file that cannot be read.
WeightCheck CheckWeights(const std::string& spec, const std::string& tokenizer_path = "");

// The tokenizer of `spec` (LoadModel's, or the llama2.c file `tokenizer_path` when given) without
// loading GGUF weights; null when the source has none. Throws like LoadModel.
std::unique_ptr<Tokenizer> LoadTokenizer(const std::string& spec,
                                         const std::string& tokenizer_path = "");

}  // namespace metronome::model
