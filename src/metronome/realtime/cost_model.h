// The simulator's iteration-time model, in one place: the model (CostModel), the backend that runs
// the real KV bookkeeping with modelled step times (CostModelBackend), its fit to the engine's
// timed steps, and its JSON form (the file `metronome calibrate --out` writes and the simulator
// loads).
//
// The fit is least squares of the relative error (each point weighted 1/t^2, so small decode steps
// count as much as large prefills) on t = c0 + c1 * batch_tokens + c2 * visible_kv_tokens with
// every coefficient constrained to be >= 0 (a negative per-token cost is unphysical and would make
// the simulator predict negative step times for some batches).
//
// Thread-safety: the fit and the JSON functions are pure; a CostModelBackend is driven by the loop
// thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "metronome/kv/block_pool.h"
#include "metronome/kv/kv_policy.h"
#include "metronome/kv/session_kv.h"
#include "metronome/realtime/backend.h"
#include "metronome/realtime/realtime_loop.h"

namespace metronome::realtime {

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
  // A simulated session moves as its KV bookkeeping (kv::EncodeSnapshot), between simulators of
  // the same cost model.
  [[nodiscard]] std::vector<std::byte> ExportSession(BackendSessionId id) const override;
  BackendImport ImportSession(const kv::KvPolicy& policy, TokenPos max_context,
                              std::span<const std::byte> state) override;
  [[nodiscard]] std::string model_identity() const override;
  [[nodiscard]] kv::PoolStats pool() const override;
  [[nodiscard]] std::int64_t resident_blocks(BackendSessionId id) const override;
  [[nodiscard]] int vocab_size() const override { return 1 << 16; }
  [[nodiscard]] int block_tokens() const override { return pool_.layout().block_tokens; }

 private:
  [[nodiscard]] std::unique_ptr<kv::SessionKv> NewSession(const kv::KvPolicy& policy,
                                                          TokenPos max_context);

  CostModel cost_;
  kv::BlockPool pool_;
  std::unordered_map<BackendSessionId, std::unique_ptr<kv::SessionKv>> sessions_;
  BackendSessionId next_id_ = 1;
};

// One timed engine step (or the median of several at one operating point).
struct StepObservation {
  double batch_tokens = 0.0;       // query tokens in the step, all sessions; >= 0
  double visible_kv_tokens = 0.0;  // sum over those query tokens of the keys each attends to; >= 0
  double seconds = 0.0;            // the step's wall-clock duration; > 0
};

struct CostModelFit {
  CostModel model;  // every coefficient >= 0
  double r2 = 0.0;  // 1 - SSE / SST of the seconds (1 when SST is 0 and the fit is exact)
  // |model - observed| / observed over the points (dimensionless; 0.05 is 5 %).
  double median_abs_rel_error = 0.0;
  double max_abs_rel_error = 0.0;
  std::int64_t num_points = 0;
};

// Least squares with coefficients >= 0: among the fits on every subset of the three terms (the
// weighted least-squares solution of the 3x3, 2x2 or 1x1 normal equations, columns scaled to unit
// RMS for conditioning) the feasible one with the smallest weighted squared error, which is exactly
// what an active-set loop dropping negative terms converges to. Throws ConfigError with fewer than
// 3 points, a non-finite / negative field (naming the point and field), or a degenerate design (a
// term that is all zero or a linear combination of the others over these points, e.g. every point
// with the same batch size and context).
[[nodiscard]] CostModelFit FitCostModel(std::span<const StepObservation> points);

// {"c0_s": .., "c1_s_per_token": .., "c2_s_per_kv_token": ..}
[[nodiscard]] nlohmann::json CostModelToJson(const CostModel& model);

// Reads the three fields of an object (other fields are ignored, so a `calibrate --out` file loads
// as is). Throws ConfigError naming `source` (e.g. "cost model file 'x.json'") and the field: not
// an object, missing, not a number, non-finite or negative.
[[nodiscard]] CostModel CostModelFromJson(const nlohmann::json& j, const std::string& source);

// CostModelFromJson of a file's contents. Throws ConfigError naming the path for an unreadable file
// or invalid JSON, and the path and field for a bad value.
[[nodiscard]] CostModel LoadCostModelFile(const std::string& path);

// What one session costs the engine as `model` prices it: the one rule that admission's work
// budget, the deadline floor, the start-up prediction and the reports share. A session's frame, in
// the steady state (window and sinks full; a full-KV session at `full_kv_context_tokens`), takes
// max(1, o) iterations of the real-time loop: the first feeds the carried-over output and the a
// input tokens as one chunk, each further one decodes one token.
struct SessionPrice {
  // Marginal compute of one frame: c1 x its tokens + c2 x the keys they attend to, s. The fixed
  // cost c0 of a step is shared by the whole batch and not charged to a session.
  double frame_work_s = 0.0;
  // The frame alone on the engine, s: max(1, o) x c0 + frame_work_s. No deadline under it can be
  // met whatever admission does.
  double lone_frame_s = 0.0;
  // Share of the engine the session takes per second: frame_work_s / period (1 = all of it).
  double work_share = 0.0;
  // Marginal compute of the session's prompt, once, at its start: c1 x its tokens + c2 x the keys
  // they attend to (the window's rule), s. Prompt prefill is work too: reports add it to the
  // steady share to say how much of the engine a mix took.
  double prompt_work_s = 0.0;
};
// `session` must be resolved (period > 0); `full_kv_context_tokens` >= 0 is where a full-KV
// session is priced (its projected size; ignored in window mode).
[[nodiscard]] SessionPrice PriceSession(const CostModel& model, const SessionSpec& session,
                                        TokenPos full_kv_context_tokens = 0);

// Iterations of the real-time loop a frame of `session` takes: max(1, o), the first feeding the
// carried-over output and the a input tokens as one chunk, each further one decoding one token.
[[nodiscard]] int FrameIterations(const SessionSpec& session);

// `model` with c2 raised, where needed, so that it predicts the steps of `frame` (one frame's
// iterations, timed) no faster in sum than they ran: c2 + max(0, sum(t - model's t)) / sum(keys).
// c0 and c1 stay and c2 never drops. The start-up calibration times one session's frame at its
// window, the steady state every price extrapolates to, and anchors the fit there: a fit of a
// dozen short points misjudges it by noise (a co-tenant's burst fitted c2 to 0) and by the
// model's shape (a MoE's per-token cost falls as a batch's tokens share experts, which a
// straight line in the tokens pays for out of c2). A frame with no keys returns `model`.
[[nodiscard]] CostModel AnchorKvCost(const CostModel& model,
                                     std::span<const StepObservation> frame);

// N* as `model` predicts it for sessions of `session`'s shape: the most sessions whose frame
// latency stays within latency_fraction x deadline when every session's frame runs in the same
// iterations (the worst phase alignment; random phases only spread the work). A frame takes
// max(1, o) iterations of the real-time loop: the first feeds the carried-over output and the a
// input tokens as one chunk, each further one decodes one token; the window is full (the steady
// state). Latency of N sessions: max(1, o) c0 + N (c1 tokens + c2 visible keys of one session's
// iterations). 0 for a full-KV session (its cost grows without a steady state) and when not even
// one session fits. `latency_fraction` in (0, 1]; the session must be resolved (deadline > 0).
[[nodiscard]] std::int64_t PredictedSessionLimit(const CostModel& model, const SessionSpec& session,
                                                 double latency_fraction);

}  // namespace metronome::realtime
