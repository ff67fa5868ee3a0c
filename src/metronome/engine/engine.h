// The engine core: one model, one KV block pool, many sessions, and a batched forward step.
//
// One Step() takes a ragged batch: for each participating session a chunk of new tokens (a prefill
// chunk of any length or one decode token). All weight projections run once over all tokens of the
// step (one GEMM per projection); attention runs per session over its own paged KV with its own
// window/sink policy; logits come back for the rows asked for. A session whose chunk cannot get
// KV blocks is left out of the step with kPoolExhausted (an ordinary result the caller acts on);
// the others proceed.
//
// Thread-safety: an Engine is driven by one thread. Step() uses all threads of the engine's own
// pool inside (EngineOptions::num_threads; the kernels run on the pool they are passed), so
// engines in one process never resize or share each other's threads.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "metronome/base/step_status.h"
#include "metronome/base/types.h"
#include "metronome/kernels/rope.h"
#include "metronome/kv/block_pool.h"
#include "metronome/kv/kv_policy.h"
#include "metronome/kv/session_kv.h"
#include "metronome/model/model.h"

namespace metronome::base {
class ThreadPool;
}

namespace metronome::engine {

enum class SessionId : std::uint32_t {};

struct EngineOptions {
  int block_tokens = 16;             // B, tokens per KV block
  std::int64_t kv_blocks = 0;        // pool size in blocks; when 0, derived from kv_pool_mb
  double kv_pool_mb = 256.0;         // pool size in MiB (used when kv_blocks == 0)
  int num_threads = 0;               // the engine's own pool, caller included; 0: DetectedCpuCount
  bool poison_freed_blocks = false;  // NaN-fill freed blocks (tests, debugging)
  // Element type of the KV pool: bf16 (half the memory per token and half the attention memory
  // traffic; K/V rounded once when written), or fp32 (exact).
  kv::KvDtype kv_dtype = kv::kDefaultKvDtype;

  void Validate() const;  // ConfigError naming the field
};

// The KV pool's layout (and so its bytes per block) an engine of `config` with `options` gets:
// for sizing a pool in bytes before the engine exists. Validates `options`.
[[nodiscard]] kv::KvLayout KvLayoutFor(const model::ModelConfig& config,
                                       const EngineOptions& options);

struct SessionOptions {
  kv::KvPolicy policy;
  // Context limit in tokens. 0: the model's trained context in full mode (unlimited if unknown),
  // unlimited in window mode.
  TokenPos max_context = 0;
};

enum class LogitsMode : std::uint8_t { kNone, kLast, kAll };

struct StepItem {
  SessionId session{};
  std::span<const TokenId> tokens;  // >= 1 token
  LogitsMode logits = LogitsMode::kLast;
};

// A request's outcome (base/step_status.h: the realtime backends answer in the same words).
using metronome::StepStatus;
using metronome::ToString;

struct StepItemResult {
  StepStatus status = StepStatus::kOk;
  int first_logits_row = -1;  // rows [first, first + num) of logits(), when status == kOk
  int num_logits_rows = 0;
};

// The weight products of a forward step, in the order a layer runs them (then the logits). A
// mixture of experts' router (an fp32 matrix) is a product of its own; its experts' products are
// gate_up and down.
enum class Product : int { kQkv, kAttentionOut, kRouter, kGateUp, kDown, kLogits };
inline constexpr int kNumProducts = 6;
// "qkv", "attn_out", "router", "gate_up", "down", "logits".
[[nodiscard]] std::string_view Name(Product product) noexcept;
// Bytes of `product`'s matrices over all layers: what a decode step of a dense model streams for
// it. A mixture of experts counts every expert, the most a step can read; what a step did read is
// StepStats::product_bytes.
[[nodiscard]] double ProductWeightBytes(const model::ModelWeights& weights,
                                        Product product) noexcept;

struct StepStats {
  int num_tokens = 0;    // tokens forwarded
  int num_sessions = 0;  // sessions that took part
  double flops = 0.0;    // arithmetic of the step (projections, attention, logits)
  double seconds = 0.0;
  // Where the step's time went (wall seconds): weight GEMMs incl. logits, attention (K/V writes
  // and the paged kernel), everything else (norms, RoPE, SwiGLU, planning).
  double gemm_seconds = 0.0;
  double attention_seconds = 0.0;
  // gemm_seconds by product (indexed by Product), summed over the layers; they add up to it.
  std::array<double, kNumProducts> product_seconds{};
  // Weight bytes each product read (indexed by Product): the matrices of every call, once per
  // call; of a mixture of experts only the experts with rows routed to them. The numerator of a
  // product's read rate.
  std::array<double, kNumProducts> product_bytes{};
};

class Engine {
 public:
  // Borrows `model` (must outlive the engine). Throws ConfigError for invalid options.
  Engine(const model::Model& model, const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Throws ConfigError for an invalid policy. Opening takes no blocks.
  SessionId OpenSession(const SessionOptions& options);
  // Returns the session's blocks to the pool at once. False if the id is unknown.
  bool CloseSession(SessionId id);
  // The session's KV as bytes (SessionKvSnapshot), between steps; nullopt if the id is unknown.
  [[nodiscard]] std::optional<kv::SessionKvSnapshot> ExportSession(SessionId id) const;
  // Opens a session holding `snapshot` (another engine's ExportSession of the same model and KV
  // layout): later steps continue it exactly. kPoolExhausted or kInvalid (with *error) leave
  // nothing behind. Throws ConfigError for an invalid policy, as OpenSession.
  [[nodiscard]] kv::RestoreResult ImportSession(const SessionOptions& options,
                                                const kv::SessionKvSnapshot& snapshot,
                                                SessionId* id, std::string* error);

  // A few throw-away steps on a temporary session (a prefill chunk of up to `chunk_tokens`
  // tokens, then single-token decodes), closed again: one-time costs (oneDNN's JIT-generated
  // kernels, first touch of activation buffers; ~70 ms on synthetic:tiny) are paid before the
  // first real frame instead of by it. The pool is left as it was. Returns the seconds it took.
  double WarmUp(int chunk_tokens = 256);

  // One batched forward step; results[i] is the outcome of items[i]. Logits rows stay valid until
  // the next Step().
  void Step(std::span<const StepItem> items, std::vector<StepItemResult>* results);
  [[nodiscard]] std::span<const float> logits(int row) const;
  // Whether logits row `row` of the last step can be sampled: the final-normed hidden state it was
  // computed from and the row itself are all finite (AllFinite). The hidden state is checked too
  // because a quantised output product drops a NaN activation (its block scale ignores it) and
  // answers finite zeros; one pass over dim + vocab floats.
  [[nodiscard]] bool logits_finite(int row) const;

  [[nodiscard]] const kv::SessionKv* session_kv(SessionId id) const;
  [[nodiscard]] kv::PoolStats pool_stats() const;
  [[nodiscard]] const StepStats& last_step() const { return last_step_; }
  [[nodiscard]] const model::ModelConfig& config() const { return model_.config; }
  [[nodiscard]] const model::Model& model() const { return model_; }
  [[nodiscard]] const kv::KvLayout& kv_layout() const { return pool_.layout(); }
  // The pool every step runs on (its job counters are bench-decode's split/inline figures; a
  // measurement between steps may run on it, from the thread that drives the engine).
  [[nodiscard]] base::ThreadPool& thread_pool() const { return *threads_; }
  [[nodiscard]] int num_threads() const;

 private:
  struct Batch;
  // The stages of one step's forward pass, in the order Forward runs them.
  void Forward(Batch& batch);
  void SizeActivations(Batch& batch) const;
  void EmbedAndRotate(Batch& batch) const;
  void PlanAttention(Batch& batch) const;
  void SplitAttentionOverKeys(Batch& batch, std::int64_t target_units) const;
  void SizeAttentionScratch(Batch& batch) const;
  void AttentionLayer(Batch& batch, int layer);
  void RunAttention(Batch& batch, int layer, const float* qkv, float* att) const;
  void NormRows(Batch& batch, const float* weight) const;
  void FfnLayer(Batch& batch, const model::LayerWeights& weights);
  void MoeFfnLayer(Batch& batch, const model::LayerWeights& weights);
  void RouteRows(Batch& batch, const model::LayerWeights& weights, const float* xb, int rows);
  void Logits(Batch& batch);
  [[nodiscard]] double StepFlops(const Batch& batch) const;

  const model::Model& model_;
  EngineOptions options_;
  kernels::Rope rope_;
  kv::BlockPool pool_;
  std::unique_ptr<base::ThreadPool> threads_;  // the pool every step runs on
  std::unordered_map<std::uint32_t, std::unique_ptr<kv::SessionKv>> sessions_;
  std::uint32_t next_session_id_ = 1;
  std::unique_ptr<Batch> batch_;  // step buffers, reused (grow-only) across steps
  std::vector<float> logits_;     // [rows, vocab]
  StepStats last_step_;
};

}  // namespace metronome::engine
