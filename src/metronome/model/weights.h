// The model's parameters in the runtime's layout: every tensor fp32, row-major [out, in], with the
// Q/K/V projections fused into one matrix and gate/up fused into another so that one GEMM per
// group serves the whole batch. Loaders (GGUF, llama2.c, synthetic) convert into this layout;
// F16/BF16/Q8_0 files are dequantised at load time.
//
// Thread-safety: immutable after loading; shared read-only by all engine threads.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "metronome/model/model_config.h"

namespace metronome::model {

struct LayerWeights {
  float* attn_norm = nullptr;  // [dim]
  // [qkv_dim, dim]: rows [0, q_dim) = Wq, [q_dim, q_dim+kv_dim) = Wk, then Wv. Q/K rows use the
  // pair layout of ModelConfig::rope_style (no permutation is applied by the runtime).
  float* wqkv = nullptr;
  float* bqkv = nullptr;      // [qkv_dim], only when config.has_qkv_bias; else nullptr
  float* wo = nullptr;        // [dim, q_dim]
  float* ffn_norm = nullptr;  // [dim]
  // [2 * ffn_dim, dim]: rows [0, ffn_dim) = gate (w1), rows [ffn_dim, 2 ffn_dim) = up (w3)
  float* w_gate_up = nullptr;
  float* w_down = nullptr;  // [dim, ffn_dim] (w2)
};

class ModelWeights {
 public:
  // Allocates zeroed, 64-byte-aligned storage for every tensor of `config` and points the fields
  // at it. With config.tied_embeddings, `output` aliases `token_embedding`.
  explicit ModelWeights(const ModelConfig& config);

  float* token_embedding = nullptr;  // [vocab, dim]
  std::vector<LayerWeights> layers;
  float* final_norm = nullptr;  // [dim]
  float* output = nullptr;      // [vocab, dim]

  [[nodiscard]] std::size_t num_floats() const { return num_floats_; }

 private:
  struct FreeDeleter {
    void operator()(float* p) const;
  };
  std::unique_ptr<float, FreeDeleter> storage_;
  std::size_t num_floats_ = 0;
};

}  // namespace metronome::model
