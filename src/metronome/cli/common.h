// Flags shared by several subcommands (model, KV policy, engine pool) and helpers to turn them into
// engine options. Internal to the cli module.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "metronome/base/types.h"
#include "metronome/engine/engine.h"
#include "metronome/kv/block_pool.h"
#include "metronome/kv/kv_policy.h"
#include "metronome/model/model.h"

namespace metronome::cli {

struct ModelFlags {
  std::string model = "synthetic:tiny";
  std::string tokenizer;
  void Register(CLI::App* app, bool required);
  [[nodiscard]] model::Model Load() const;
};

struct KvFlags {
  std::string kv = "full";
  std::int64_t window = 512;
  std::int64_t sinks = 4;
  std::string positions = "absolute";
  std::int64_t max_context = 0;
  void Register(CLI::App* app);
  [[nodiscard]] kv::KvPolicy Policy() const;  // ConfigError naming the flag on bad values
};

struct EngineFlags {
  int block_tokens = 16;
  double kv_pool_mb = 0.0;  // 0: sized for the run
  std::int64_t kv_blocks = 0;
  int threads = 0;
  std::string kv_dtype = kv::ToString(kv::kDefaultKvDtype);
  void Register(CLI::App* app);
  // `needed_tokens_per_session` x `sessions` (plus slack) sizes the pool when neither
  // --kv-pool-mb nor --kv-blocks is given.
  [[nodiscard]] engine::EngineOptions Options(const model::ModelConfig& config,
                                              const kv::KvPolicy& policy, std::int64_t sessions,
                                              std::int64_t needed_tokens_per_session,
                                              int chunk_tokens) const;
};

// Parses "1 2 3" (spaces, commas or newlines) into ids; ConfigError naming `flag` on junk or ids
// outside [0, vocab).
std::vector<TokenId> ParseIds(const std::string& text, int vocab, const std::string& flag);
std::string ReadFile(const std::string& path, const std::string& flag);
std::string HumanBytes(double bytes);

}  // namespace metronome::cli
