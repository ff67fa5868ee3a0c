// The real-time loop's backend on the real model runtime: realtime::Backend over an
// engine::Engine, timed on the real clock. Its own module above engine and realtime, so that
// realtime (and server, loadgen and the simulator above it) do not link the engine, its kernels
// or oneDNN; only what runs a model (serve, drive and their tests) does.
//
// Thread-safety: driven by the loop thread only.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "metronome/base/types.h"
#include "metronome/engine/engine.h"
#include "metronome/engine/sampler.h"
#include "metronome/kv/kv_policy.h"
#include "metronome/realtime/backend.h"

namespace metronome::serving {

using realtime::BackendItem;
using realtime::BackendItemResult;
using realtime::BackendSessionId;

// The step budget (realtime::LoopOptions::max_step_tokens) serving the engine defaults to. The CPU
// engine's cost per token grows with the step: synthetic:tiny on one thread, 80 sessions of 64 + 4
// tokens per 40 ms, costs 5.3-5.5 us a token in steps of 10-300 tokens and 6.8-7.2 us in the
// 300-3000-token steps of a backlog, so without a budget a transient backlog ran at 0.9-0.98 busy
// and, in one of two runs, never drained (p50 1.06 s, 91% of frames late); with 256 the same runs
// held 5.3-5.5 us a token (docs/realtime.md, "Step budget"). Steps of 256 tokens still amortise a
// weight-bound model's fixed step cost (smol-135m Q8_0: ~7 ms a step against ~0.8 ms a token).
inline constexpr int kEngineStepTokens = 256;

// The real model runtime on its engine (borrowed), greedy or sampled next tokens.
class EngineBackend final : public realtime::Backend {
 public:
  // max_context: context limit in tokens of full-KV sessions (0: the model's trained context).
  EngineBackend(engine::Engine* engine, const engine::SamplerOptions& sampling,
                TokenPos max_context = 0);
  BackendSessionId Open(const kv::KvPolicy& policy, TokenPos max_context = 0) override;
  void Close(BackendSessionId id) override;
  double Step(std::span<const BackendItem> items, std::vector<BackendItemResult>* out) override;
  [[nodiscard]] std::vector<std::byte> ExportSession(BackendSessionId id) const override;
  realtime::BackendImport ImportSession(const kv::KvPolicy& policy, TokenPos max_context,
                                        std::span<const std::byte> state) override;
  [[nodiscard]] std::string model_identity() const override { return model_identity_; }
  [[nodiscard]] kv::PoolStats pool() const override { return engine_->pool_stats(); }
  [[nodiscard]] std::int64_t resident_blocks(BackendSessionId id) const override;
  [[nodiscard]] int vocab_size() const override { return engine_->config().vocab_size; }
  [[nodiscard]] int block_tokens() const override { return engine_->kv_layout().block_tokens; }
  [[nodiscard]] TokenPos full_kv_context_limit() const override {
    return max_context_ > 0 ? max_context_ : engine_->config().context_length;
  }

 private:
  [[nodiscard]] engine::SessionOptions SessionOptionsFor(const kv::KvPolicy& policy,
                                                         TokenPos max_context) const;

  engine::Engine* engine_;
  engine::SamplerOptions sampling_;
  // One sampler per session, each seeded with sampling_.seed: a session's draws depend on its
  // own tokens only (not on who shares its steps), so a moved session samples what it would have.
  std::unordered_map<BackendSessionId, engine::Sampler> samplers_;
  std::string model_identity_;
  TokenPos max_context_;
  std::vector<engine::StepItem> items_;
  std::vector<engine::StepItemResult> results_;
};

}  // namespace metronome::serving
