// Private to the model library (and its tests): the values of a synthetic model's tensors, one
// row range at a time, so that a GGUF of a synthetic shape can be written without the model ever
// being in memory (WriteSyntheticGguf). MakeSyntheticModel fills its weights from the same
// streams, so both give the same numbers.
#pragma once

#include <cstdint>

#include "metronome/model/internal/gguf_tensors.h"
#include "metronome/model/model_config.h"

namespace metronome::model::internal {

// Rows [row0, row0 + num_rows) of tensor `t` of the synthetic model of configuration `c` made
// with `seed`, as fp32 into `out` (num_rows * t.shape[0] values). A tensor's rows are its ggml
// rows: shape[0] elements each, the other dimensions flattened (for the experts' 3-D tensors,
// expert e's rows come after expert e - 1's). Throws ConfigError for a tensor a synthetic model
// does not have (biases).
void SyntheticTensorRows(const ModelConfig& c, std::uint64_t seed, const TensorSpec& t,
                         std::uint64_t row0, std::uint64_t num_rows, float* out);

}  // namespace metronome::model::internal
