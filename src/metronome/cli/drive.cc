// metronome drive: real-time sessions on the real engine and the real clock, in-process (no
// network). Same workload flags, scheduler, admission and telemetry as `metronome sim`.
#include <algorithm>
#include <cstdio>
#include <string>

#include "metronome/base/errors.h"
#include "metronome/cli/commands.h"
#include "metronome/cli/common.h"
#include "metronome/cli/start_calibration.h"
#include "metronome/cli/workload_flags.h"
#include "metronome/engine/engine.h"
#include "metronome/engine/sampler.h"
#include "metronome/serving/engine_backend.h"

namespace metronome::cli {
namespace {

struct DriveFlags {
  ModelFlags model;
  EngineFlags engine;
  WorkloadFlags workload;
  float temperature = 0.0f;
  std::int64_t max_context = 0;
  std::int64_t max_window = realtime::kDefaultMaxWindowTokens;
  DriveFlags() { workload.admission = ServingAdmissionFlags(); }
  void Register(CLI::App* sub);
};

void DriveFlags::Register(CLI::App* sub) {
  model.Register(sub, /*required=*/false);
  engine.Register(sub);
  sub->add_option("--temperature", temperature, "Sampling temperature (0: greedy)");
  sub->add_option("--max-context", max_context,
                  "Context limit of full-KV sessions in tokens (0: the model's trained context); a "
                  "session reaching it ends with an error");
  workload.Register(sub);
  sub->add_option("--max-window", max_window,
                  "Cap on the default --window when it comes from the model's trained context, "
                  "tokens")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 24));
}

int RunDrive(const DriveFlags& f) {
  model::Model m = f.model.Load();
  realtime::WorkloadOptions probe = f.workload.Options(
      realtime::ServingSessionDefaults(m.config.context_length, f.max_window), m.config.vocab_size);
  // Without --kv-blocks/--kv-pool-mb the pool holds every session's whole run, so only compute
  // can fail; give a small pool to see the KV wall.
  const double frames = probe.population.duration_s * 1000.0 / probe.session.period_ms + 1.0;
  const auto tokens = static_cast<std::int64_t>(
      static_cast<double>(probe.session.prompt.size()) +
      frames * (probe.session.input_tokens_per_frame + probe.session.output_tokens_per_frame + 1));
  const std::int64_t population = probe.population.sessions > 0 ? probe.population.sessions : 16;
  // Window KV: at least the window's bound per session, which is what the KV guard (on by
  // default) projects for a session; a pool of the run's tokens alone would admit none.
  const kv::KvPolicy& policy = probe.session.policy;
  const std::int64_t needed_tokens =
      policy.mode == kv::KvMode::kWindow
          ? std::max<std::int64_t>(tokens, policy.window + policy.sinks +
                                               probe.session.input_tokens_per_frame + 1 +
                                               f.engine.block_tokens)
          : tokens;
  const engine::EngineOptions eo = f.engine.Options(
      m.config, probe.session.policy, population, needed_tokens,
      static_cast<int>(probe.session.prompt.size()) + probe.session.input_tokens_per_frame + 1);
  engine::Engine eng(m, eo);
  eng.WarmUp();  // before the first client: its frames must not pay for JIT and first touch
  CalibrateAtStart(&eng, probe.session, f.workload.admission.aimd_initial_given(),
                   &probe.supervisor);
  engine::SamplerOptions so;
  so.temperature = f.temperature;
  so.Validate();
  if (f.max_context < 0) {
    throw ConfigError("--max-context = " + std::to_string(f.max_context) + " must be >= 0");
  }
  serving::EngineBackend backend(&eng, so, f.max_context);
  SteadyClock clock;
  const kv::PoolStats pool = eng.pool_stats();

  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "metronome drive --model %s: real engine, real clock\n"
                "  KV pool %lld blocks x %lld tokens (%s); %s\n",
                f.model.model.c_str(), static_cast<long long>(pool.num_blocks),
                static_cast<long long>(pool.block_tokens),
                HumanBytes(static_cast<double>(pool.num_blocks * pool.bytes_per_block)).c_str(),
                probe.session.policy.mode == kv::KvMode::kFull
                    ? "KV full"
                    : ("KV window W=" + std::to_string(probe.session.policy.window) +
                       " S=" + std::to_string(probe.session.policy.sinks))
                          .c_str());
  return RunWorkload(&backend, &clock, f.workload, probe, buf);
}

}  // namespace

const AddCommandFlags kAddDriveFlags = &AddFlagsAndRun<DriveFlags, RunDrive>;

}  // namespace metronome::cli
