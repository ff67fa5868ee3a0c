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
  // metadata cannot give one (e.g. an architecture other than llama / qwen2).
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

// The tokenizer of `spec` (LoadModel's, or the llama2.c file `tokenizer_path` when given) without
// loading GGUF weights; null when the source has none. Throws like LoadModel.
std::unique_ptr<Tokenizer> LoadTokenizer(const std::string& spec,
                                         const std::string& tokenizer_path = "");

}  // namespace metronome::model
