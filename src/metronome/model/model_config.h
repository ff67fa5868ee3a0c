// Shape and hyper-parameters of a Llama-family decoder. Filled by the loaders (GGUF metadata,
// llama2.c header, synthetic presets); read by the runtime. Immutable once loaded.
#pragma once

#include <cstdint>
#include <string>

namespace metronome::model {

enum class Architecture : std::uint8_t { kLlama, kQwen2 };

// How RoPE pairs the dimensions of a head.
enum class RopeStyle : std::uint8_t {
  kInterleaved,  // pairs (2i, 2i+1): llama2.c and GGUF `llama` (llama.cpp ROPE_TYPE_NORM)
  kNeox,         // pairs (i, i + head_dim/2): GGUF `qwen2` (llama.cpp ROPE_TYPE_NEOX)
};

struct ModelConfig {
  Architecture architecture = Architecture::kLlama;
  std::string name;  // free text for logs, e.g. "stories260K.bin" or "synthetic:tiny"
  int dim = 0;       // residual width
  int num_layers = 0;
  int num_heads = 0;     // query heads
  int num_kv_heads = 0;  // key/value heads; num_heads % num_kv_heads == 0 (GQA)
  int head_dim = 0;      // usually dim / num_heads
  int ffn_dim = 0;       // hidden width of the SwiGLU feed-forward
  int vocab_size = 0;
  int context_length = 0;  // trained context; informational (the KV policy bounds a session)
  float rms_eps = 1e-5f;
  double rope_theta = 10000.0;
  int rope_dim = 0;  // rotated dims per head (<= head_dim); 0 means head_dim
  RopeStyle rope_style = RopeStyle::kInterleaved;
  bool has_qkv_bias = false;     // qwen2
  bool tied_embeddings = false;  // output projection shares token_embedding

  [[nodiscard]] int q_dim() const { return num_heads * head_dim; }
  [[nodiscard]] int kv_dim() const { return num_kv_heads * head_dim; }
  [[nodiscard]] int qkv_dim() const { return q_dim() + 2 * kv_dim(); }
  [[nodiscard]] int rotary_dim() const { return rope_dim > 0 ? rope_dim : head_dim; }

  // Throws ConfigError naming the first field that is out of range or inconsistent (e.g. heads not
  // dividing, sizes <= 0 or absurdly large). `source` names the file for the message.
  void Validate(const std::string& source) const;
};

}  // namespace metronome::model
