#include "metronome/model/internal/gguf_tensors.h"

#include <cstdint>
#include <string>
#include <vector>

namespace metronome::model::internal {

std::vector<TensorSpec> RequiredTensors(const ModelConfig& c) {
  const ModelConfig::Extents e = c.extents();
  using P = TensorPart;
  std::vector<TensorSpec> t;
  t.push_back({"token_embd.weight", {e.dim, e.vocab}, true, P::kTokenEmbedding});
  t.push_back({"output_norm.weight", {e.dim}, false, P::kOutputNorm});
  if (!c.tied_embeddings) t.push_back({"output.weight", {e.dim, e.vocab}, true, P::kOutput});
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    t.push_back({p + "attn_norm.weight", {e.dim}, false, P::kAttnNorm, l});
    t.push_back({p + "attn_q.weight", {e.dim, e.q}, true, P::kAttnQ, l});
    t.push_back({p + "attn_k.weight", {e.dim, e.kv}, true, P::kAttnK, l});
    t.push_back({p + "attn_v.weight", {e.dim, e.kv}, true, P::kAttnV, l});
    if (c.has_qkv_bias) {
      t.push_back({p + "attn_q.bias", {e.q}, false, P::kAttnQBias, l});
      t.push_back({p + "attn_k.bias", {e.kv}, false, P::kAttnKBias, l});
      t.push_back({p + "attn_v.bias", {e.kv}, false, P::kAttnVBias, l});
    }
    if (c.has_qk_norm) {
      t.push_back({p + "attn_q_norm.weight", {e.head}, false, P::kAttnQNorm, l});
      t.push_back({p + "attn_k_norm.weight", {e.head}, false, P::kAttnKNorm, l});
    }
    t.push_back({p + "attn_output.weight", {e.q, e.dim}, true, P::kAttnOutput, l});
    t.push_back({p + "ffn_norm.weight", {e.dim}, false, P::kFfnNorm, l});
    if (c.is_moe()) {
      t.push_back({p + "ffn_gate_inp.weight", {e.dim, e.experts}, true, P::kFfnRouter, l});
      t.push_back(
          {p + "ffn_gate_exps.weight", {e.dim, e.expert_ffn, e.experts}, true, P::kFfnGateExps, l});
      t.push_back(
          {p + "ffn_up_exps.weight", {e.dim, e.expert_ffn, e.experts}, true, P::kFfnUpExps, l});
      t.push_back(
          {p + "ffn_down_exps.weight", {e.expert_ffn, e.dim, e.experts}, true, P::kFfnDownExps, l});
      continue;
    }
    t.push_back({p + "ffn_gate.weight", {e.dim, e.ffn}, true, P::kFfnGate, l});
    t.push_back({p + "ffn_up.weight", {e.dim, e.ffn}, true, P::kFfnUp, l});
    t.push_back({p + "ffn_down.weight", {e.ffn, e.dim}, true, P::kFfnDown, l});
  }
  return t;
}

}  // namespace metronome::model::internal
