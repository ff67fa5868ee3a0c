// Built-in simulator presets: one full-duplex model served on one H200-class GPU (141 GB HBM,
// 4.8 TB/s), or, for the `-cpu` presets, on the CPU whose cost `metronome calibrate` fitted on a
// real-size file of the model's backbone. Each gives the session shape (frame period, tokens per
// frame), the KV footprint, the pool, a default window and the cost model of one batched iteration.
// Sources and assumptions are in presets.cc next to each number (from docs/workloads.md's research
// note); every number that is a modelling assumption rather than a published figure is listed in
// `assumed`, and `metronome sim --list-presets` prints them.
//
// Thread-safety: immutable data.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "metronome/realtime/backend.h"
#include "metronome/realtime/cost_model.h"

namespace metronome::realtime {

struct SimPreset {
  std::string name;
  std::string description;
  double period_ms = 80.0;
  double deadline_ms = 0.0;  // 0: the period
  int tokens_per_frame = 1;  // a: input tokens appended per frame
  int output_tokens_per_frame = 1;
  double kv_bytes_per_token = 0.0;  // all layers, K and V, bf16
  double pool_bytes = 0.0;          // KV pool of the GPU (of the host for -cpu)
  int block_tokens = 16;
  CostModel cost;
  std::int64_t window_tokens = 0;    // default W for --kv window
  std::int64_t sinks = 4;            // default S
  std::vector<std::string> assumed;  // which of the numbers above are assumptions, and why

  // Whole blocks of block_tokens tokens in the pool.
  [[nodiscard]] std::int64_t PoolBlocks() const;
};

// to_json (and, by the macro, from_json) over the fields `sim --list-presets --json` writes under
// their own names; it adds window (window_tokens), pool_blocks, cost and what the CLI derives.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(SimPreset, name, description, period_ms, deadline_ms,
                                   tokens_per_frame, output_tokens_per_frame, kv_bytes_per_token,
                                   pool_bytes, block_tokens, sinks, assumed)

[[nodiscard]] const std::vector<SimPreset>& BuiltinPresets();
// Throws ConfigError naming --preset, the bad value and the valid names.
[[nodiscard]] const SimPreset& FindPreset(const std::string& name);

}  // namespace metronome::realtime
