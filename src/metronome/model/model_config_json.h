// ModelConfig's plain fields as JSON, named as in the struct (`metronome info --json`'s
// "config"). Kept out of model_config.h so that the runtime's includes stay free of nlohmann.
#pragma once

#include <nlohmann/json.hpp>

#include "metronome/model/model_config.h"

namespace metronome::model {

// to_json (and, by the macro, from_json) over the hyper-parameters that are plain numbers and
// flags. Not listed: name and architecture (a tool prints them beside the config), rope_dim (0
// means head_dim: a reader wants rotary_dim()), rope_style and has_qkv_bias (their JSON spellings
// are the caller's).
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ModelConfig, dim, num_layers, num_heads, num_kv_heads, head_dim,
                                   ffn_dim, vocab_size, context_length, rms_eps, rope_theta,
                                   tied_embeddings, has_qk_norm, num_experts, num_experts_used,
                                   expert_ffn_dim)

}  // namespace metronome::model
