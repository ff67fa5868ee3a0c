#include "metronome/cli/common.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <variant>

#include "metronome/base/errors.h"
#include "metronome/base/number_list.h"
#include "metronome/base/process_memory.h"
#include "metronome/base/thread_pool.h"
#include "metronome/kernels/quant_matmul.h"
#include "metronome/kv/block_pool.h"

namespace metronome::cli {

void ModelFlags::Register(CLI::App* app, bool required) {
  auto* opt = app->add_option("--model", model,
                              "Model: synthetic:<preset> (" + model::SyntheticPresetNames() +
                                  "), a GGUF file, or a llama2.c checkpoint (.bin)");
  if (required) opt->required();
  app->add_option("--tokenizer", tokenizer, "llama2.c tokenizer file (e.g. tok512.bin)");
}

model::Model ModelFlags::Load() const {
  model::Model m = model::LoadModel(model, tokenizer);
  // Every command computes with the weights in the layout this CPU's kernels read fastest.
  (void)m.weights->PlaceForKernels(kernels::PreferredRowLayout);
  // On stderr, so that a command's stdout (generated text, JSON) stays what it was.
  std::fprintf(stderr, "weights: %s\n", m.weights->Summary().c_str());
  return m;
}

void KvFlags::Register(CLI::App* app) {
  app->add_option("--kv", kv, "KV policy per session: full | window")
      ->check(CLI::IsMember({"full", "window"}));
  app->add_option("--window", window, "W: most recent tokens kept (window mode)");
  app->add_option("--sinks", sinks, "S: first tokens pinned as attention sinks (window mode)");
  app->add_option("--positions", positions, "RoPE positions: absolute | rolling")
      ->check(CLI::IsMember({"absolute", "rolling"}));
  app->add_option("--max-context", max_context,
                  "Per-session context limit in tokens (0: model's trained context in full mode, "
                  "unlimited in window mode)");
}

kv::KvPolicy KvFlags::Policy() const {
  // CLI11 admits only the parser's spellings.
  if (kv::ParseKvMode(kv) == kv::KvMode::kFull) return kv::KvPolicy::Full();
  if (window < 1) throw ConfigError("--window = " + std::to_string(window) + " must be >= 1");
  if (sinks < 0) throw ConfigError("--sinks = " + std::to_string(sinks) + " must be >= 0");
  kv::KvPolicy p = kv::KvPolicy::Window(
      window, sinks, kv::ParsePositionMode(positions).value_or(kv::PositionMode::kAbsolute));
  p.Validate();
  return p;
}

void EngineFlags::Register(CLI::App* app) {
  app->add_option("--block-tokens", block_tokens, "Tokens per KV block (B)")
      ->check(CLI::Range(1, 1024));
  app->add_option("--kv-pool-mb", kv_pool_mb, "KV pool size in MiB (default: sized for the run)")
      ->check(CLI::Range(0.0, 1e7));
  app->add_option("--kv-blocks", kv_blocks, "KV pool size in blocks (overrides --kv-pool-mb)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 30));
  // Default: the CPUs this process may use (affinity, cgroup CPU quota). More than a few times
  // that only adds threads that wait for a core, so the range stops at 4x.
  const int detected = base::DetectedCpuCount();
  threads = detected;
  app->add_option("--threads", threads,
                  "Threads of the engine's pool (default: the CPUs this process may use, from "
                  "its affinity and cgroup CPU quota)")
      ->capture_default_str()
      ->check(CLI::Range(1, kMaxThreadsPerDetectedCpu * detected));
  app->add_option("--kv-dtype", kv_dtype,
                  "KV element type: bf16 (half the memory and attention traffic) | f32 (exact)")
      ->capture_default_str()
      ->check(CLI::IsMember(std::vector<std::string>{kv::ToString(kv::KvDtype::kBF16),
                                                     kv::ToString(kv::KvDtype::kF32)}));
}

std::string EngineFlags::ThreadsLine() const {
  return "threads " + std::to_string(threads) + " (detected CPUs " +
         std::to_string(base::DetectedCpuCount()) + ")";
}

engine::EngineOptions EngineFlags::Options(const model::ModelConfig& config,
                                           const kv::KvPolicy& policy, std::int64_t sessions,
                                           std::int64_t needed_tokens_per_session,
                                           int chunk_tokens) const {
  engine::EngineOptions o;
  o.block_tokens = block_tokens;
  o.num_threads = threads;
  const std::optional<kv::KvDtype> dtype = kv::ParseKvDtype(kv_dtype);
  if (!dtype) throw ConfigError("--kv-dtype: expected f32 or bf16, got '" + kv_dtype + "'");
  o.kv_dtype = *dtype;
  if (kv_blocks > 0) {
    o.kv_blocks = kv_blocks;
  } else if (kv_pool_mb > 0.0) {
    o.kv_pool_mb = kv_pool_mb;
  } else {
    const std::int64_t bound = policy.MaxResidentBlocks(block_tokens, chunk_tokens);
    const std::int64_t full_blocks =
        (needed_tokens_per_session + block_tokens - 1) / block_tokens + 1;
    const std::int64_t per_session = bound >= 0 ? std::min(bound, full_blocks) : full_blocks;
    o.kv_blocks = std::max<std::int64_t>(1, per_session * sessions);
  }
  (void)config;
  return o;
}

MachinePool PoolFromMachine(const model::Model& model, const engine::EngineOptions& options,
                            double fraction, std::int64_t max_blocks) {
  const std::optional<std::int64_t> available = base::ReadAvailableMemoryBytes();
  if (!available) {
    throw ConfigError(
        "cannot read the available memory (/proc/meminfo) to size the KV pool: give --kv-pool-mb "
        "or --kv-blocks");
  }
  MachinePool pool;
  const auto weights = static_cast<std::int64_t>(model.weights->WeightBytes());
  pool.available_bytes = std::max<std::int64_t>(0, *available - weights);
  const auto bytes_per_block =
      static_cast<double>(engine::KvLayoutFor(model.config, options).bytes_per_block());
  const auto blocks = static_cast<std::int64_t>(
      std::floor(fraction * static_cast<double>(pool.available_bytes) / bytes_per_block));
  pool.capped = blocks > max_blocks;
  pool.blocks = std::min(blocks, max_blocks);
  if (pool.blocks < 1) {
    throw ConfigError("--kv-pool-fraction = " + FormatValue(fraction) + " of the " +
                      HumanBytes(static_cast<double>(pool.available_bytes)) +
                      " available after the weights holds no KV block: give --kv-pool-mb or "
                      "--kv-blocks");
  }
  return pool;
}

void RequireFiniteNumbers(CLI::App* app) {
  const CLI::Validator finite(
      [](std::string& text) -> std::string {
        const char* begin = text.c_str();
        char* end = nullptr;
        const double v = std::strtod(begin, &end);
        // Not a number at all: CLI11's own conversion names the flag and the expected type.
        if (end == begin) return {};
        if (!std::isfinite(v)) return "'" + text + "' is not a finite number";
        return {};
      },
      /*validator_desc=*/"", "finite");
  for (CLI::Option* opt : app->get_options()) {
    // "FLOAT", or "FLOAT:<the descriptions of its validators>".
    if (opt->get_type_name().starts_with("FLOAT")) opt->check(finite);
  }
  for (CLI::App* sub : app->get_subcommands([](CLI::App*) { return true; })) {
    RequireFiniteNumbers(sub);
  }
}

std::vector<TokenId> ParseIds(const std::string& text, int vocab, const std::string& flag) {
  const auto words = base::SplitIntegers(text);
  if (const auto* bad = std::get_if<std::string>(&words)) {
    std::string msg = flag;
    msg += ": '" + *bad + "' is not a token id";
    throw ConfigError(msg);
  }
  std::vector<TokenId> ids;
  for (const base::IntegerWord& w : std::get<std::vector<base::IntegerWord>>(words)) {
    if (w.value < 0 || w.value >= vocab) {
      std::string msg = flag;
      msg +=
          ": token id " + w.word + " is outside the vocabulary [0, " + std::to_string(vocab) + ")";
      throw ConfigError(msg);
    }
    ids.push_back(static_cast<TokenId>(w.value));
  }
  return ids;
}

std::string ReadFile(const std::string& path, const std::string& flag) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw ConfigError(flag + ": cannot read '" + path + "'");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string DescribeStepFailure(engine::StepStatus status) {
  std::string s = engine::ToString(status);
  if (status == engine::StepStatus::kNonFiniteLogits) {
    s += " (the model's logits hold NaN or infinite values, so no token can be chosen; "
         "`metronome info --check-weights` lists the weights that hold them)";
  }
  return s;
}

std::string HumanBytes(double bytes) {
  char buf[64];
  if (bytes >= 1024.0 * 1024.0 * 1024.0) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  } else if (bytes >= 1024.0 * 1024.0) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / (1024.0 * 1024.0));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f KiB", bytes / 1024.0);
  }
  return buf;
}

}  // namespace metronome::cli
