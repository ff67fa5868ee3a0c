#include "metronome/engine/rope_spec.h"

namespace metronome::engine {

kernels::RopeSpec RopeSpecFor(const model::ModelConfig& c) {
  kernels::RopeSpec s;
  s.head_dim = c.head_dim;
  s.rotary_dim = c.rotary_dim();
  s.theta = c.rope_theta;
  s.pairing = c.rope_style == model::RopeStyle::kNeox ? kernels::RopePairing::kNeox
                                                      : kernels::RopePairing::kInterleaved;
  s.freq_factors = c.rope_freq_factors;
  // llama.cpp never scales with type "none", whatever factor the file also carries; Validate
  // has refused that combination anyway.
  s.freq_scale = c.rope_scaling == model::RopeScaling::kNone ? 1.0 : 1.0 / c.rope_scaling_factor;
  s.yarn = c.rope_scaling == model::RopeScaling::kYarn;
  if (s.yarn) {
    s.yarn_params.original_context = c.yarn_original_context();
    s.yarn_params.beta_fast = c.yarn_beta_fast;
    s.yarn_params.beta_slow = c.yarn_beta_slow;
  }
  s.attn_factor = c.rope_attn_factor;
  return s;
}

}  // namespace metronome::engine
