// metronome sim: the real scheduler, KV manager, admission and telemetry on a virtual clock, with
// the model step replaced by a cost model of one H200-class GPU (a built-in preset). An hour of
// 500 sessions runs in seconds.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>

#include "metronome/base/errors.h"
#include "metronome/cli/commands.h"
#include "metronome/cli/workload_flags.h"
#include "metronome/realtime/cost_model.h"
#include "metronome/realtime/presets.h"

namespace metronome::cli {
namespace {

struct SimFlags {
  WorkloadFlags workload;
  std::string preset = "moshi-7b";
  bool list_presets = false;
  bool json = false;  // with --list-presets: one JSON object instead of the text
  std::optional<double> kv_pool_gb;
  std::optional<int> block_tokens;
  std::optional<double> c0_ms;
  std::optional<double> c1_us_per_token;
  std::optional<double> c2_ns_per_kv_token;
  std::string cost_model_file;
  void Register(CLI::App* sub);
};

void SimFlags::Register(CLI::App* sub) {
  sub->add_option("--preset", preset,
                  "Model + GPU (or calibrated CPU) preset: moshi-7b | qwen25-omni-7b | "
                  "minicpm-o-4.5 | qwen3-omni-30b-a3b | minicpm-o-4.5-cpu | "
                  "qwen3-omni-30b-a3b-cpu (see --list-presets)");
  sub->add_flag("--list-presets", list_presets,
                "Print the presets, their numbers and which are assumptions, and exit");
  sub->add_flag("--json", json,
                "With --list-presets: print them as one JSON object (for tools; the same numbers)");
  sub->add_option("--kv-pool-gb", kv_pool_gb, "KV pool size in GB (default: the preset's)");
  sub->add_option("--block-tokens", block_tokens, "Tokens per KV block")
      ->check(CLI::Range(1, 1024));
  sub->add_option("--cost-model", cost_model_file,
                  "JSON cost model (e.g. written by `metronome calibrate --out`)");
  sub->add_option("--c0-ms", c0_ms, "Cost model: fixed time per step, ms");
  sub->add_option("--c1-us-per-token", c1_us_per_token,
                  "Cost model: time per token in the batch, us");
  sub->add_option("--c2-ns-per-kv-token", c2_ns_per_kv_token,
                  "Cost model: time per visible (query, key) pair, ns");
  workload.Register(sub);
}

void ListPresets() {
  for (const realtime::SimPreset& p : realtime::BuiltinPresets()) {
    std::printf("%s: %s\n", p.name.c_str(), p.description.c_str());
    std::printf(
        "  period %g ms, a=%d o=%d tokens/frame, KV %.0f B/token, pool %.1f GB = %lld blocks of "
        "%d tokens\n",
        p.period_ms, p.tokens_per_frame, p.output_tokens_per_frame, p.kv_bytes_per_token,
        p.pool_bytes / 1e9, static_cast<long long>(p.PoolBlocks()), p.block_tokens);
    std::printf("  step = %g ms + %g us/token + %g ns/(query,key); default window W=%lld S=%lld\n",
                p.cost.c0_s * 1e3, p.cost.c1_s_per_token * 1e6, p.cost.c2_s_per_kv_token * 1e9,
                static_cast<long long>(p.window_tokens), static_cast<long long>(p.sinks));
    for (const std::string& a : p.assumed) std::printf("  [assumed] %s\n", a.c_str());
  }
}

// The same numbers for tools: {"presets": [{name, description, period_ms, deadline_ms (0: the
// period), tokens_per_frame, output_tokens_per_frame, kv_bytes_per_token, pool_bytes, pool_blocks,
// block_tokens, cost {c0_s, c1_s_per_token, c2_s_per_kv_token}, window, sinks,
// aimd_window_s (the AIMD control window a run of this preset gets without --aimd-window-s),
// assumed [...]}]}.
void ListPresetsJson() {
  nlohmann::json presets = nlohmann::json::array();
  for (const realtime::SimPreset& p : realtime::BuiltinPresets()) {
    nlohmann::json j = p;  // the fields under their own names, then the renamed and derived ones
    j["window"] = p.window_tokens;
    j["pool_blocks"] = p.PoolBlocks();
    j["cost"] = realtime::CostModelToJson(p.cost);
    j["aimd_window_s"] = DefaultAimdWindowS(p.period_ms);
    presets.push_back(std::move(j));
  }
  std::printf("%s\n", nlohmann::json{{"presets", presets}}.dump(2).c_str());
}

int RunSim(const SimFlags& f) {
  if (f.list_presets) {
    if (f.json) {
      ListPresetsJson();
    } else {
      ListPresets();
    }
    return 0;
  }
  if (f.json)
    throw ConfigError("--json goes with --list-presets (a run's summary: --summary-json)");
  realtime::SimPreset p = ReportingFlags([&] { return realtime::FindPreset(f.preset); });
  if (f.kv_pool_gb) {
    if (!(*f.kv_pool_gb > 0.0)) {
      throw ConfigError("--kv-pool-gb = " + std::to_string(*f.kv_pool_gb) + " must be > 0");
    }
    p.pool_bytes = *f.kv_pool_gb * 1e9;
  }
  if (f.block_tokens) p.block_tokens = *f.block_tokens;
  if (!f.cost_model_file.empty()) p.cost = realtime::LoadCostModelFile(f.cost_model_file);
  if (f.c0_ms) p.cost.c0_s = *f.c0_ms * 1e-3;
  if (f.c1_us_per_token) p.cost.c1_s_per_token = *f.c1_us_per_token * 1e-6;
  if (f.c2_ns_per_kv_token) p.cost.c2_s_per_kv_token = *f.c2_ns_per_kv_token * 1e-9;
  if (!(p.cost.c0_s >= 0.0 && p.cost.c1_s_per_token >= 0.0 && p.cost.c2_s_per_kv_token >= 0.0)) {
    throw ConfigError("--c0-ms, --c1-us-per-token and --c2-ns-per-kv-token must be >= 0");
  }
  const std::int64_t blocks = p.PoolBlocks();
  if (blocks < 1 || blocks > (std::int64_t{1} << 30)) {
    throw ConfigError("--kv-pool-gb: the pool must hold between 1 and 2^30 blocks, got " +
                      std::to_string(blocks));
  }
  const SessionDefaults defaults{.period_ms = p.period_ms,
                                 .deadline_ms = p.deadline_ms,
                                 .tokens_per_frame = p.tokens_per_frame,
                                 .output_tokens_per_frame = p.output_tokens_per_frame,
                                 .window = p.window_tokens,
                                 .sinks = p.sinks};
  realtime::CostModelBackend backend(p.cost, blocks, p.block_tokens);
  realtime::WorkloadOptions o = f.workload.Options(defaults, backend.vocab_size());
  // The simulator's own cost model prices sessions, as the engine's calibration does in serve and
  // drive (and applies the door's floors); one unit is a session of the run's shape.
  o.supervisor.cost_model = p.cost;
  o.supervisor.reference_session = o.session;
  ManualClock clock;

  char buf[1024];
  std::string header;
  std::snprintf(buf, sizeof buf,
                "metronome sim --preset %s: virtual clock, the preset's cost model\n"
                "  KV pool %.1f GB = %lld blocks x %d tokens (%.0f B/token); step = %g ms + %g "
                "us/token + %g ns/(query,key)\n",
                p.name.c_str(), p.pool_bytes / 1e9, static_cast<long long>(blocks), p.block_tokens,
                p.kv_bytes_per_token, p.cost.c0_s * 1e3, p.cost.c1_s_per_token * 1e6,
                p.cost.c2_s_per_kv_token * 1e9);
  header += buf;
  const std::string who = o.population.sessions > 0
                              ? std::to_string(o.population.sessions) + " sessions"
                              : "arrivals " + o.population.arrival;
  const std::string kv_desc = o.session.policy.mode == kv::KvMode::kFull
                                  ? std::string("full")
                                  : "window W=" + std::to_string(o.session.policy.window) +
                                        " S=" + std::to_string(o.session.policy.sinks);
  std::snprintf(buf, sizeof buf,
                "  workload: %s, %g ms frames (deadline %g ms), a=%d o=%d, KV %s, admission %s, "
                "%g s\n",
                who.c_str(), o.session.period_ms, o.session.deadline_ms,
                o.session.input_tokens_per_frame, o.session.output_tokens_per_frame,
                kv_desc.c_str(), o.supervisor.admission.c_str(), o.population.duration_s);
  header += buf;
  return RunWorkload(&backend, &clock, f.workload, o, header);
}

}  // namespace

const AddCommandFlags kAddSimFlags = &AddFlagsAndRun<SimFlags, RunSim>;

}  // namespace metronome::cli
