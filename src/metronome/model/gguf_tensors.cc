#include "metronome/model/internal/gguf_tensors.h"

#include <cstdint>
#include <string>
#include <vector>

namespace metronome::model::internal {

std::vector<TensorSpec> RequiredTensors(const ModelConfig& c) {
  const auto dim = static_cast<std::uint64_t>(c.dim);
  const auto q = static_cast<std::uint64_t>(c.q_dim());
  const auto kv = static_cast<std::uint64_t>(c.kv_dim());
  const auto ffn = static_cast<std::uint64_t>(c.ffn_dim);
  const auto vocab = static_cast<std::uint64_t>(c.vocab_size);
  const auto head = static_cast<std::uint64_t>(c.head_dim);
  const auto experts = static_cast<std::uint64_t>(c.num_experts);
  const auto ffn_exp = static_cast<std::uint64_t>(c.expert_ffn_dim);
  using P = TensorPart;
  std::vector<TensorSpec> t;
  t.push_back({"token_embd.weight", {dim, vocab}, true, P::kTokenEmbedding});
  t.push_back({"output_norm.weight", {dim}, false, P::kOutputNorm});
  if (!c.tied_embeddings) t.push_back({"output.weight", {dim, vocab}, true, P::kOutput});
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    t.push_back({p + "attn_norm.weight", {dim}, false, P::kAttnNorm, l});
    t.push_back({p + "attn_q.weight", {dim, q}, true, P::kAttnQ, l});
    t.push_back({p + "attn_k.weight", {dim, kv}, true, P::kAttnK, l});
    t.push_back({p + "attn_v.weight", {dim, kv}, true, P::kAttnV, l});
    if (c.has_qkv_bias) {
      t.push_back({p + "attn_q.bias", {q}, false, P::kAttnQBias, l});
      t.push_back({p + "attn_k.bias", {kv}, false, P::kAttnKBias, l});
      t.push_back({p + "attn_v.bias", {kv}, false, P::kAttnVBias, l});
    }
    if (c.has_qk_norm) {
      t.push_back({p + "attn_q_norm.weight", {head}, false, P::kAttnQNorm, l});
      t.push_back({p + "attn_k_norm.weight", {head}, false, P::kAttnKNorm, l});
    }
    t.push_back({p + "attn_output.weight", {q, dim}, true, P::kAttnOutput, l});
    t.push_back({p + "ffn_norm.weight", {dim}, false, P::kFfnNorm, l});
    if (c.is_moe()) {
      t.push_back({p + "ffn_gate_inp.weight", {dim, experts}, true, P::kFfnRouter, l});
      t.push_back({p + "ffn_gate_exps.weight", {dim, ffn_exp, experts}, true, P::kFfnGateExps, l});
      t.push_back({p + "ffn_up_exps.weight", {dim, ffn_exp, experts}, true, P::kFfnUpExps, l});
      t.push_back({p + "ffn_down_exps.weight", {ffn_exp, dim, experts}, true, P::kFfnDownExps, l});
      continue;
    }
    t.push_back({p + "ffn_gate.weight", {dim, ffn}, true, P::kFfnGate, l});
    t.push_back({p + "ffn_up.weight", {dim, ffn}, true, P::kFfnUp, l});
    t.push_back({p + "ffn_down.weight", {ffn, dim}, true, P::kFfnDown, l});
  }
  return t;
}

}  // namespace metronome::model::internal
