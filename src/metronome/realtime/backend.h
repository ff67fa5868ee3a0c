// What the real-time loop runs a step on. Two implementations share one contract: EngineBackend
// (serving/engine_backend.h: the real model runtime, timed on the real clock) and CostModelBackend
// (cost_model.h: a simulator, the same KV
// pool and session bookkeeping, with the step's duration from a cost model instead of a forward
// pass). The scheduler, admission and telemetry code above is identical for both.
//
// Thread-safety: driven by the loop thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "metronome/base/step_status.h"
#include "metronome/base/types.h"
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
  StepStatus status = StepStatus::kOk;
  TokenId next_token = -1;  // when status is kOk and it was asked for
};

// What ImportSession made of a moved session's bytes.
struct BackendImport {
  BackendSessionId id = 0;      // the opened session, when ok()
  bool pool_exhausted = false;  // too few free KV blocks: nothing was taken
  std::string error;            // the bytes are not a session of this backend: what differs
  [[nodiscard]] bool ok() const { return !pool_exhausted && error.empty(); }
};

// The one reading of a KV restore as an import's answer (id: the session opened when kOk).
[[nodiscard]] inline BackendImport ImportOf(kv::RestoreResult restored, BackendSessionId id,
                                            const std::string& error) {
  BackendImport out;
  if (restored == kv::RestoreResult::kOk) {
    out.id = id;
  } else if (restored == kv::RestoreResult::kPoolExhausted) {
    out.pool_exhausted = true;
  } else {
    out.error = "kv: " + error;
  }
  return out;
}

class Backend {
 public:
  virtual ~Backend() = default;
  // Throws ConfigError for an invalid policy. `max_context` (full KV only): tokens the session may
  // hold before Step answers kContextFull, below full_kv_context_limit() (0: that limit).
  virtual BackendSessionId Open(const kv::KvPolicy& policy, TokenPos max_context = 0) = 0;
  virtual void Close(BackendSessionId id) = 0;
  // Runs one batched step; returns its duration in seconds (timed on the clock or modelled).
  virtual double Step(std::span<const BackendItem> items, std::vector<BackendItemResult>* out) = 0;
  // A session's state in the backend (its KV, its sampler), as bytes another backend of the same
  // model identity imports, between steps; empty for an unknown id. The one exporter and importer
  // of a moved session's state are RealtimeLoop's (realtime/session_state.h frames the bytes).
  [[nodiscard]] virtual std::vector<std::byte> ExportSession(BackendSessionId id) const = 0;
  // Opens a session holding ExportSession's `state`: its later steps give what the exported
  // session's would have. Never throws for bad bytes (BackendImport::error names the field).
  virtual BackendImport ImportSession(const kv::KvPolicy& policy, TokenPos max_context,
                                      std::span<const std::byte> state) = 0;
  // Who may import this backend's sessions: the same model computed the same way (another model,
  // or the simulator, cannot continue them).
  [[nodiscard]] virtual std::string model_identity() const = 0;
  [[nodiscard]] virtual kv::PoolStats pool() const = 0;
  [[nodiscard]] virtual std::int64_t resident_blocks(BackendSessionId id) const = 0;
  [[nodiscard]] virtual int vocab_size() const = 0;
  [[nodiscard]] virtual int block_tokens() const = 0;
  // Most tokens a full-KV session can hold before it ends with kContextFull; 0: unlimited.
  [[nodiscard]] virtual TokenPos full_kv_context_limit() const { return 0; }
};

}  // namespace metronome::realtime
