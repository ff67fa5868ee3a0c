// Private to the model library (and its tests): the one list of the tensors a model of a
// configuration has in a GGUF file (llama.cpp's names, ggml shapes, which part of ModelWeights each
// one is). The GGUF loader checks a file against it, the exporter writes it, `metronome info`
// describes it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "metronome/model/model_config.h"

namespace metronome::model::internal {

// Which part of the weights a tensor holds; the blk.* ones belong to TensorSpec::layer.
enum class TensorPart : std::uint8_t {
  kTokenEmbedding,
  kOutputNorm,
  kOutput,  // only without tied_embeddings
  kAttnNorm,
  kAttnQ,
  kAttnK,
  kAttnV,
  kAttnQBias,  // the three biases only with has_qkv_bias
  kAttnKBias,
  kAttnVBias,
  kAttnQNorm,  // the two per-head norms only with has_qk_norm
  kAttnKNorm,
  kAttnOutput,
  kFfnNorm,
  kFfnGate,  // gate, up, down: the dense FFN (not is_moe)
  kFfnUp,
  kFfnDown,
  kFfnRouter,    // ffn_gate_inp: [dim] -> [num_experts] (is_moe)
  kFfnGateExps,  // the experts' gate, up, down, all experts in one 3-D tensor each (is_moe)
  kFfnUpExps,
  kFfnDownExps,
};

// A tensor the runtime needs: its llama.cpp name, its ggml shape ([in, out] for a matrix over our
// row-major [out, in] storage; [in, out, n_expert] for the experts' matrices, expert e's rows
// being [e out, (e + 1) out) of the [n_expert out, in] rows; [n] for a vector), and whether it is
// a weight matrix (kept in its stored type) or a vector (norms, biases: fp32 at run time).
struct TensorSpec {
  std::string name;
  std::vector<std::uint64_t> shape;
  bool matrix = true;
  TensorPart part = TensorPart::kTokenEmbedding;
  int layer = -1;  // -1 for the tensors outside the blocks
};

// Every tensor of `c`, in the order the runtime's layout lists them (and the exporter writes
// them): token_embd, output_norm, output, then per block attn_norm, attn_q/k/v, their biases,
// attn_q_norm, attn_k_norm, attn_output, ffn_norm, then ffn_gate, ffn_up, ffn_down (dense) or
// ffn_gate_inp, ffn_gate_exps, ffn_up_exps, ffn_down_exps (mixture of experts).
[[nodiscard]] std::vector<TensorSpec> RequiredTensors(const ModelConfig& c);

}  // namespace metronome::model::internal
