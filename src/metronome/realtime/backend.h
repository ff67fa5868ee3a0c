// What the real-time loop runs a step on. Two implementations share one contract: EngineBackend
// (the real model runtime, timed on the real clock) and CostModelBackend (a simulator: the same KV
// pool and session bookkeeping, with the step's duration from a cost model instead of a forward
// pass). The scheduler, admission and telemetry code above is identical for both.
//
// Thread-safety: driven by the loop thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "metronome/base/types.h"
#include "metronome/engine/engine.h"
#include "metronome/engine/sampler.h"
#include "metronome/kv/block_pool.h"
#include "metronome/kv/kv_policy.h"
#include "metronome/kv/session_kv.h"

namespace metronome::realtime {

using BackendSessionId = std::uint64_t;

struct BackendItem {
  BackendSessionId session = 0;
  std::span<const TokenId> tokens;  // prefill chunk or one decode token
  bool want_next_token = true;      // sample a token after the last input
};

struct BackendItemResult {
  engine::StepStatus status = engine::StepStatus::kOk;
  TokenId next_token = -1;  // when status is kOk and it was asked for
};

class Backend {
 public:
  virtual ~Backend() = default;
  // Throws ConfigError for an invalid policy. `max_context` (full KV only): tokens the session may
  // hold before Step answers kContextFull, below full_kv_context_limit() (0: that limit).
  virtual BackendSessionId Open(const kv::KvPolicy& policy, TokenPos max_context = 0) = 0;
  virtual void Close(BackendSessionId id) = 0;
  // Runs one batched step; returns its duration in seconds (measured or modelled).
  virtual double Step(std::span<const BackendItem> items, std::vector<BackendItemResult>* out) = 0;
  [[nodiscard]] virtual kv::PoolStats pool() const = 0;
  [[nodiscard]] virtual std::int64_t resident_blocks(BackendSessionId id) const = 0;
  [[nodiscard]] virtual int vocab_size() const = 0;
  [[nodiscard]] virtual int block_tokens() const = 0;
  // Most tokens a full-KV session can hold before it ends with kContextFull; 0: unlimited.
  [[nodiscard]] virtual TokenPos full_kv_context_limit() const { return 0; }
};

// Iteration time model: t = c0 + c1 * batch_tokens + c2 * visible_kv_tokens (seconds), where
// visible_kv_tokens sums, over every query token of the step, the keys it attends to.
struct CostModel {
  double c0_s = 0.004;
  double c1_s_per_token = 0.0;
  double c2_s_per_kv_token = 0.0;
  [[nodiscard]] double StepSeconds(double batch_tokens, double visible_kv_tokens) const {
    return c0_s + c1_s_per_token * batch_tokens + c2_s_per_kv_token * visible_kv_tokens;
  }
};

// The simulator's backend: real BlockPool/SessionKv accounting over a pool of `num_blocks` blocks
// of `block_tokens` tokens (storage of one scalar per token, never read), modelled step time, and a
// deterministic output token per decode.
class CostModelBackend final : public Backend {
 public:
  CostModelBackend(const CostModel& cost, std::int64_t num_blocks, int block_tokens);
  BackendSessionId Open(const kv::KvPolicy& policy, TokenPos max_context = 0) override;
  void Close(BackendSessionId id) override;
  double Step(std::span<const BackendItem> items, std::vector<BackendItemResult>* out) override;
  [[nodiscard]] kv::PoolStats pool() const override;
  [[nodiscard]] std::int64_t resident_blocks(BackendSessionId id) const override;
  [[nodiscard]] int vocab_size() const override { return 1 << 16; }
  [[nodiscard]] int block_tokens() const override { return pool_.layout().block_tokens; }

 private:
  CostModel cost_;
  kv::BlockPool pool_;
  std::unordered_map<BackendSessionId, std::unique_ptr<kv::SessionKv>> sessions_;
  BackendSessionId next_id_ = 1;
};

// The real model runtime on its engine (borrowed), greedy or sampled next tokens.
class EngineBackend final : public Backend {
 public:
  // max_context: context limit in tokens of full-KV sessions (0: the model's trained context).
  EngineBackend(engine::Engine* engine, const engine::SamplerOptions& sampling,
                TokenPos max_context = 0);
  BackendSessionId Open(const kv::KvPolicy& policy, TokenPos max_context = 0) override;
  void Close(BackendSessionId id) override;
  double Step(std::span<const BackendItem> items, std::vector<BackendItemResult>* out) override;
  [[nodiscard]] kv::PoolStats pool() const override { return engine_->pool_stats(); }
  [[nodiscard]] std::int64_t resident_blocks(BackendSessionId id) const override;
  [[nodiscard]] int vocab_size() const override { return engine_->config().vocab_size; }
  [[nodiscard]] int block_tokens() const override { return engine_->kv_layout().block_tokens; }
  [[nodiscard]] TokenPos full_kv_context_limit() const override {
    return max_context_ > 0 ? max_context_ : engine_->config().context_length;
  }

 private:
  engine::Engine* engine_;
  engine::Sampler sampler_;
  TokenPos max_context_;
  std::vector<engine::StepItem> items_;
  std::vector<engine::StepItemResult> results_;
};

}  // namespace metronome::realtime
