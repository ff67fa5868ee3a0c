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

// --threads accepts 1 .. this many times the detected CPU count.
inline constexpr int kMaxThreadsPerDetectedCpu = 4;

struct EngineFlags {
  int block_tokens = 16;
  double kv_pool_mb = 0.0;  // 0: sized for the run
  std::int64_t kv_blocks = 0;
  int threads = 0;  // set by Register to the detected CPU count, the default
  std::string kv_dtype = kv::ToString(kv::kDefaultKvDtype);
  void Register(CLI::App* app);
  // The thread count, for the start-up line of a subcommand: "threads N (detected D)".
  [[nodiscard]] std::string ThreadsLine() const;
  // `needed_tokens_per_session` x `sessions` (plus slack) sizes the pool when neither
  // --kv-pool-mb nor --kv-blocks is given.
  [[nodiscard]] engine::EngineOptions Options(const model::ModelConfig& config,
                                              const kv::KvPolicy& policy, std::int64_t sessions,
                                              std::int64_t needed_tokens_per_session,
                                              int chunk_tokens) const;
  // --kv-blocks or --kv-pool-mb was given (a pool size the user chose).
  [[nodiscard]] bool pool_given() const { return kv_blocks > 0 || kv_pool_mb > 0.0; }
};

// A server's KV pool when neither --kv-blocks nor --kv-pool-mb is given: `fraction` of the memory
// available to this process (base::ReadAvailableMemoryBytes, read after the model loaded) less the
// model's weight bytes (so memory-mapped weights still in the page cache, which MemAvailable counts
// as available, are not promised to the KV; conservative where they are already resident), in
// whole blocks of `options`' layout, at most `max_blocks`. ConfigError where the memory cannot be
// read or not one block fits.
struct MachinePool {
  std::int64_t available_bytes = 0;  // to this process, after the weights
  std::int64_t blocks = 0;
  bool capped = false;  // max_blocks cut it
};
[[nodiscard]] MachinePool PoolFromMachine(const model::Model& model,
                                          const engine::EngineOptions& options, double fraction,
                                          std::int64_t max_blocks);

// Every floating-point flag of `app` and of its subcommands (recursively) must be a finite number:
// CLI::Range lets NaN through (every comparison with NaN is false) and no flag means anything at
// infinity. One validator attached to all of them, so a flag added later is covered too. Call
// once, after every subcommand registered its flags.
void RequireFiniteNumbers(CLI::App* app);

// Parses "1 2 3" (spaces, commas or newlines) into ids; ConfigError naming `flag` on junk or ids
// outside [0, vocab).
std::vector<TokenId> ParseIds(const std::string& text, int vocab, const std::string& flag);
std::string ReadFile(const std::string& path, const std::string& flag);
std::string HumanBytes(double bytes);

// A failed step as the single-session commands (generate, score) report it: the status's name,
// and for kNonFiniteLogits what it means and how to find the tensors at fault.
std::string DescribeStepFailure(engine::StepStatus status);

}  // namespace metronome::cli
