#include "metronome/engine/engine.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <string>

#include "metronome/base/check.h"
#include "metronome/base/errors.h"
#include "metronome/base/thread_pool.h"
#include "metronome/engine/rope_spec.h"
#include "metronome/engine/sampler.h"
#include "metronome/kernels/gemm.h"
#include "metronome/kernels/paged_attention.h"
#include "metronome/kernels/quant_matmul.h"
#include "metronome/kernels/vector_ops.h"
#include "metronome/quant/codec.h"
#include "metronome/quant/row_layout.h"

namespace metronome::engine {

void EngineOptions::Validate() const {
  if (block_tokens < 1 || block_tokens > 1024) {
    throw ConfigError("block_tokens = " + std::to_string(block_tokens) + " must be in [1, 1024]");
  }
  if (kv_blocks < 0 || kv_blocks > (std::int64_t{1} << 30)) {
    throw ConfigError("kv_blocks = " + std::to_string(kv_blocks) + " must be in [0, 2^30]");
  }
  if (kv_blocks == 0 && !(kv_pool_mb > 0.0 && kv_pool_mb < 1e7)) {
    throw ConfigError("kv_pool_mb = " + std::to_string(kv_pool_mb) + " must be in (0, 1e7)");
  }
  if (num_threads < 0 || num_threads > 1024) {
    throw ConfigError("num_threads = " + std::to_string(num_threads) + " must be in [0, 1024]");
  }
}

namespace {

using Clock = std::chrono::steady_clock;

// Adds the wall time of `fn` to *acc.
template <typename Fn>
void Timed(double* acc, Fn&& fn) {
  const auto t0 = Clock::now();
  fn();
  *acc += std::chrono::duration<double>(Clock::now() - t0).count();
}

// Runs a set of weight products as one (kernels::MatMul) for `product`: its wall time added to the
// step's gemm time and to the product's, the bytes of the matrices it reads to the product's.
void RunProducts(StepStats* stats, Product product, base::ThreadPool& pool,
                 std::span<const kernels::MatMulProduct> set) {
  double bytes = 0.0;
  for (const kernels::MatMulProduct& p : set) {
    if (p.m <= 0) continue;
    for (const quant::WeightMatrix& w : p.parts) bytes += static_cast<double>(w.Bytes());
  }
  double seconds = 0.0;
  Timed(&seconds, [&] { kernels::MatMul(pool, set); });
  const auto i = static_cast<std::size_t>(product);
  stats->gemm_seconds += seconds;
  stats->product_seconds[i] += seconds;
  stats->product_bytes[i] += bytes;
}

// One weight product: y[m, rows of parts] (+)= x[m, cols] W^T, as RunProducts.
void RunProduct(StepStats* stats, Product product, base::ThreadPool& pool, const float* x, int m,
                std::span<const quant::WeightMatrix> parts, float* y, bool accumulate) {
  const kernels::MatMulProduct one{x, m, parts, y, accumulate};
  RunProducts(stats, product, pool, std::span(&one, 1));
}

// The matrices one layer's `product` multiplies by (none for the logits, which are not per layer).
std::span<const quant::WeightMatrix> LayerMatrices(const model::LayerWeights& lw,
                                                   Product product) noexcept {
  switch (product) {
    case Product::kQkv:
      return lw.wqkv;
    case Product::kAttentionOut:
      return {&lw.wo, 1};
    case Product::kGateUp:
      return lw.w_gate_up;
    case Product::kDown:
      return {&lw.w_down, 1};
    case Product::kRouter:  // a dense layer's router is an empty matrix: 0 bytes
      return {&lw.router, 1};
    case Product::kLogits:
      break;
  }
  return {};
}

kv::BlockPoolOptions PoolOptionsFor(const kv::KvLayout& layout, const EngineOptions& o) {
  kv::BlockPoolOptions p;
  p.num_blocks = o.kv_blocks > 0 ? static_cast<int>(o.kv_blocks)
                                 : kv::BlockPool::BlocksForMegabytes(layout, o.kv_pool_mb);
  p.poison_on_free = o.poison_freed_blocks;
  return p;
}

// Work below this size per chunk stays on one thread: a hand-off to a pool worker costs a few
// microseconds (a futex wake when it sleeps).
constexpr std::int64_t kMinFloatsPerChunk = 16 * 1024;  // row loops: floats touched per chunk
constexpr double kMinAttentionFlopsPerChunk = 128.0 * 1024.0;
// Attention units a step aims at per pool thread: with fewer (one long session, a few kv heads),
// decode queries are split over their keys so the last unit does not leave threads idle. Kept
// small: each extra chunk is one more hand-off between threads, which costs a scheduling
// quantum when the cores are shared (bench-decode --sessions 1 --context 512 under load).
constexpr int kAttentionUnitsPerThread = 2;
// The shortest key slice worth a unit of its own (its query load and merge cost ~ a few keys).
constexpr std::int64_t kMinKeysPerSlice = 64;

// Queries of one prefill chunk per attention unit.
constexpr int kQueriesPerWork = 16;
// The FFN runs over blocks of at most kFfnRowsPerBlock rows; a block of at least
// kHiddenOverGateUpMinRows rows writes its hidden rows over its gate|up rows (Engine::FfnLayer).
// Each block of a prefill reads the FFN's weights again: once per 256 rows, against 2 x 256
// multiply-adds per weight read, the block stays compute-bound.
constexpr int kFfnRowsPerBlock = 256;
constexpr int kHiddenOverGateUpMinRows = 128;

// Elements of an [a, b] buffer, or the offset of its row a.
std::size_t Floats(int a, int b) {
  return static_cast<std::size_t>(a) * static_cast<std::size_t>(b);
}

// Floats of one FFN block of `rows` rows: its gate|up rows, plus its hidden rows when they do not
// overwrite them.
std::size_t FfnBlockFloats(int rows, int ffn) {
  return Floats(rows, (rows >= kHiddenOverGateUpMinRows ? 2 : 3) * ffn);
}

// Rows of `row_floats` floats each per chunk of a row loop.
std::int64_t MinRowsPerChunk(int row_floats) {
  return std::max<std::int64_t>(1, kMinFloatsPerChunk / std::max(1, row_floats));
}

// Row loops: fn(t) for every row t in [0, rows) on `pool`, rows of `row_floats` floats each.
template <typename Fn>
void ForRows(base::ThreadPool& pool, int rows, int row_floats, Fn&& fn) {
  pool.ParallelFor(rows, MinRowsPerChunk(row_floats), [&fn](std::int64_t t0, std::int64_t t1) {
    for (auto t = static_cast<int>(t0); t < static_cast<int>(t1); ++t) fn(t);
  });
}

// Slices a single query over `visible` keys is cut into when `base_units` attention units are too
// few: enough for `target_units`, each at least kMinKeysPerSlice keys (1: not cut).
std::int64_t SlicesFor(std::int64_t visible, std::int64_t base_units, std::int64_t target_units) {
  const std::int64_t wanted = (target_units + base_units - 1) / base_units;
  return std::max<std::int64_t>(1, std::min(wanted, visible / kMinKeysPerSlice));
}

kernels::AttentionShape AttentionShapeOf(const model::ModelConfig& c) {
  return {c.num_heads, c.num_kv_heads, c.head_dim};
}

// Grow-only resize: step buffers are reused so that steady-state steps do not allocate.
void EnsureSize(std::vector<float>& v, std::size_t n) {
  if (v.size() < n) v.resize(n);
}

}  // namespace

std::string_view Name(Product product) noexcept {
  constexpr std::array<std::string_view, kNumProducts> kNames = {"qkv",     "attn_out", "router",
                                                                 "gate_up", "down",     "logits"};
  const auto i = static_cast<std::size_t>(product);
  return i < kNames.size() ? kNames[i] : "?";
}

double ProductWeightBytes(const model::ModelWeights& weights, Product product) noexcept {
  if (product == Product::kLogits) return static_cast<double>(weights.output.Bytes());
  double bytes = 0.0;
  for (const model::LayerWeights& lw : weights.layers) {
    for (const quant::WeightMatrix& m : LayerMatrices(lw, product)) {
      bytes += static_cast<double>(m.Bytes());
    }
    if (product == Product::kGateUp) {
      for (const model::MatrixGroup& g : lw.expert_gate_up) {
        for (const quant::WeightMatrix& m : g) bytes += static_cast<double>(m.Bytes());
      }
    } else if (product == Product::kDown) {
      for (const quant::WeightMatrix& m : lw.expert_down) bytes += static_cast<double>(m.Bytes());
    }
  }
  return bytes;
}

kv::KvLayout KvLayoutFor(const model::ModelConfig& c, const EngineOptions& o) {
  o.Validate();
  return {c.num_layers, c.num_kv_heads, c.head_dim, o.block_tokens, o.kv_dtype};
}

// Per-step plan and activations. Row t of every [T, *] buffer is the t-th token of the step.
struct Engine::Batch {
  struct Item {
    kv::SessionKv* kv = nullptr;
    TokenPos pos0 = 0;  // position of the chunk's first token
    int row0 = 0;       // first row of the chunk in the step
    int n = 0;
    std::size_t result_index = 0;
    LogitsMode logits = LogitsMode::kNone;
  };
  // One unit of attention work: queries [begin, begin + n) of an item's chunk, KV heads
  // [kv_head, kv_head + kv_heads); or, when `slice` >= 0, the single query `begin` over its visible
  // keys [key_begin, key_end), into slots `slice` .. `slice + kv_heads - 1` of the slice buffers
  // (a slot holds one kv head's group; merged after the parallel loop).
  struct AttnWork {
    int item;
    int kv_head;
    int kv_heads;
    int begin;
    int n;
    int slice = -1;
    std::int64_t key_begin = 0;
    std::int64_t key_end = 0;
  };
  // A query whose keys were split over `count` slices of `kv_heads` slots each, from slot
  // `first_slice` on.
  struct SplitQuery {
    int row;
    int kv_head;
    int kv_heads;
    int first_slice;
    int count;
  };
  std::vector<Item> items;
  std::vector<AttnWork> attn_work;
  std::vector<SplitQuery> split_queries;
  std::vector<float> slice_out, slice_stats;  // [slots, group * head_dim], [slots, 2 * group]
  std::vector<TokenId> tokens;                // [T]
  std::vector<TokenPos> positions;            // [T]
  // [T]: the keys each row's query attends to, by its session's policy (kv::KvPolicy::KeysOf): what
  // the attention kernels follow.
  std::vector<base::QueryKeys> query_keys;
  std::vector<int> item_of_row;  // [T]
  int num_tokens = 0;
  std::vector<float> x, xb;  // [T, dim]: the residual stream, its normalised copy
  // A layer's two halves never hold their activations at the same time, so they share one buffer:
  // attention's [T, qkv_dim] qkv and [T, q_dim] att, then the FFN's gate|up and hidden rows of one
  // block of at most 256 rows (hidden written over gate|up for blocks of 128 rows or more, see
  // FfnLayer). At a 512-row prefill of smol-135m this is 3 MiB instead of 12.
  std::vector<float> layer_acts;
  std::vector<float> rope_cos, rope_sin;  // [T, rotary_dim/2]: PositionAngles of each row
  // [T, rotary_dim/2]: angles of S + W - 1 - p for rows with rolling positions (the rotation that
  // moves their query to the sinks' frame, applied by every layer and kv head's attention).
  std::vector<float> sink_cos, sink_sin;
  std::vector<std::vector<float>> scratch;  // per thread attention scratch
  std::vector<int> logit_rows;              // rows whose logits are wanted
  std::vector<float> final_rows;            // [R, dim]
  // The attention plan (PlanAttention): the most keys any query sees, attention flops of one
  // layer, units per chunk of the attention loop, slice slots in use.
  std::int64_t max_visible = 1;
  double attn_flops_per_layer = 0.0;
  std::int64_t min_work_per_chunk = 1;
  int num_slots = 0;
  // The mixture-of-experts stage (MoeFfnLayer), for one block of at most kFfnRowsPerBlock rows of
  // k = num_experts_used slots each; a slot is one (row, chosen expert) pair, and the slots are
  // laid out grouped by expert.
  struct Moe {
    std::vector<float> probs;   // [rows, num_experts]: router logits, then their softmax
    std::vector<int> expert;    // [rows * k]: row t's j-th choice at t k + j
    std::vector<float> weight;  // [rows * k]: its renormalised weight
    std::vector<int> first;     // [num_experts + 1]: expert e's slots are [first[e], first[e+1])
    std::vector<int> cursor;    // [num_experts]: grouping cursor
    std::vector<int> slot;      // [rows * k]: where row t's j-th choice sits in expert order
    std::vector<int> slot_row;  // [rows * k]: the row of each slot
    // [slots, dim] the slots' normalised rows, then (overwritten) the experts' outputs;
    // [slots, 2 expert_ffn_dim] gate|up; [slots, expert_ffn_dim] SwiGLU.
    std::vector<float> in, gate_up, hidden;
    // [experts with slots]: one layer's expert products, run as one set (kernels::MatMul).
    std::vector<kernels::MatMulProduct> products;
  } moe;

  [[nodiscard]] const Item& ItemOfRow(int t) const {
    return items[static_cast<std::size_t>(item_of_row[static_cast<std::size_t>(t)])];
  }
};

Engine::Engine(const model::Model& model, const EngineOptions& options)
    : model_(model),
      options_(options),
      rope_(RopeSpecFor(model.config)),
      pool_(KvLayoutFor(model.config, options),
            PoolOptionsFor(KvLayoutFor(model.config, options), options)),
      threads_(std::make_unique<base::ThreadPool>(
          base::ThreadPoolOptions{.num_threads = options.num_threads})),
      batch_(std::make_unique<Batch>()) {
  MTR_CHECK(model.weights != nullptr, "engine needs a model with weights");
}

Engine::~Engine() = default;

int Engine::num_threads() const { return threads_->num_threads(); }

SessionId Engine::OpenSession(const SessionOptions& options) {
  options.policy.Validate();
  if (options.max_context < 0) {
    throw ConfigError("max_context = " + std::to_string(options.max_context) + " must be >= 0");
  }
  TokenPos limit = options.max_context;
  if (limit == 0) {
    const bool full = options.policy.mode == kv::KvMode::kFull;
    limit = full && model_.config.context_length > 0 ? model_.config.context_length
                                                     : std::numeric_limits<TokenPos>::max() / 4;
  }
  const std::uint32_t id = next_session_id_++;
  sessions_.emplace(id, std::make_unique<kv::SessionKv>(&pool_, options.policy, limit));
  return SessionId{id};
}

bool Engine::CloseSession(SessionId id) {
  const auto it = sessions_.find(static_cast<std::uint32_t>(id));
  if (it == sessions_.end()) return false;
  sessions_.erase(it);  // ~SessionKv returns the blocks
  return true;
}

std::optional<kv::SessionKvSnapshot> Engine::ExportSession(SessionId id) const {
  const kv::SessionKv* kv = session_kv(id);
  if (kv == nullptr) return std::nullopt;
  return kv->Snapshot();
}

kv::RestoreResult Engine::ImportSession(const SessionOptions& options,
                                        const kv::SessionKvSnapshot& snapshot, SessionId* id,
                                        std::string* error) {
  const SessionId opened = OpenSession(options);
  kv::SessionKv& kv = *sessions_.at(static_cast<std::uint32_t>(opened));
  const kv::RestoreResult result = kv.Restore(snapshot, error);
  if (result != kv::RestoreResult::kOk) {
    CloseSession(opened);
    return result;
  }
  *id = opened;
  return result;
}

double Engine::WarmUp(int chunk_tokens) {
  const auto t0 = std::chrono::steady_clock::now();
  // Half the free pool at most (less one block per decode), so warming up can never fail or take
  // blocks a caller counted on.
  const kv::PoolStats pool = pool_stats();
  const std::int64_t fits = pool.free_blocks * pool.block_tokens / 2 - 4;
  const int chunk = static_cast<int>(std::min<std::int64_t>(chunk_tokens, fits));
  if (chunk < 1) return 0.0;
  SessionOptions so;
  so.policy = kv::KvPolicy::Full();
  const SessionId id = OpenSession(so);
  std::vector<TokenId> tokens(static_cast<std::size_t>(chunk));
  for (int i = 0; i < chunk; ++i) {
    tokens[static_cast<std::size_t>(i)] = static_cast<TokenId>(i % model_.config.vocab_size);
  }
  std::vector<StepItemResult> results;
  Step(std::vector<StepItem>{{id, tokens, LogitsMode::kLast}}, &results);
  for (int k = 0; k < 3; ++k) {
    Step(std::vector<StepItem>{{id, std::span<const TokenId>(tokens.data(), 1), LogitsMode::kLast}},
         &results);
  }
  CloseSession(id);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

const kv::SessionKv* Engine::session_kv(SessionId id) const {
  const auto it = sessions_.find(static_cast<std::uint32_t>(id));
  return it == sessions_.end() ? nullptr : it->second.get();
}

kv::PoolStats Engine::pool_stats() const {
  return kv::PoolStatsOf(pool_, static_cast<std::int64_t>(sessions_.size()));
}

std::span<const float> Engine::logits(int row) const {
  const auto vocab = static_cast<std::size_t>(model_.config.vocab_size);
  return {logits_.data() + static_cast<std::size_t>(row) * vocab, vocab};
}

bool Engine::logits_finite(int row) const {
  const auto dim = static_cast<std::size_t>(model_.config.dim);
  return AllFinite({batch_->final_rows.data() + static_cast<std::size_t>(row) * dim, dim}) &&
         AllFinite(logits(row));
}

void Engine::Step(std::span<const StepItem> items, std::vector<StepItemResult>* results) {
  const auto t0 = std::chrono::steady_clock::now();
  Batch& b = *batch_;
  b.items.clear();
  b.tokens.clear();
  b.positions.clear();
  b.query_keys.clear();
  b.item_of_row.clear();
  results->assign(items.size(), StepItemResult{});

  const int vocab = model_.config.vocab_size;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const StepItem& it = items[i];
    StepItemResult& res = (*results)[i];
    const auto found = sessions_.find(static_cast<std::uint32_t>(it.session));
    if (found == sessions_.end()) {
      res.status = StepStatus::kUnknownSession;
      continue;
    }
    kv::SessionKv* kv = found->second.get();
    const bool duplicate = std::any_of(b.items.begin(), b.items.end(),
                                       [kv](const Batch::Item& x) { return x.kv == kv; });
    const bool bad_token = std::any_of(it.tokens.begin(), it.tokens.end(),
                                       [vocab](TokenId t) { return t < 0 || t >= vocab; });
    if (it.tokens.empty() || duplicate || bad_token ||
        it.tokens.size() > static_cast<std::size_t>(std::numeric_limits<int>::max() / 2)) {
      res.status = StepStatus::kInvalidRequest;
      continue;
    }
    const int n = static_cast<int>(it.tokens.size());
    switch (kv->Reserve(n)) {
      case kv::ReserveResult::kOk:
        break;
      case kv::ReserveResult::kPoolExhausted:
        res.status = StepStatus::kPoolExhausted;
        continue;
      case kv::ReserveResult::kContextFull:
        res.status = StepStatus::kContextFull;
        continue;
    }
    Batch::Item bi;
    bi.kv = kv;
    bi.pos0 = kv->length();
    bi.row0 = static_cast<int>(b.tokens.size());
    bi.n = n;
    bi.result_index = i;
    bi.logits = it.logits;
    for (int t = 0; t < n; ++t) {
      b.tokens.push_back(it.tokens[static_cast<std::size_t>(t)]);
      b.positions.push_back(bi.pos0 + t);
      b.query_keys.push_back(kv->policy().KeysOf(bi.pos0 + t));
      b.item_of_row.push_back(static_cast<int>(b.items.size()));
    }
    b.items.push_back(bi);
  }
  b.num_tokens = static_cast<int>(b.tokens.size());

  // Logits rows, in item order.
  b.logit_rows.clear();
  for (const Batch::Item& bi : b.items) {
    StepItemResult& res = (*results)[bi.result_index];
    if (bi.logits == LogitsMode::kNone) continue;
    res.first_logits_row = static_cast<int>(b.logit_rows.size());
    const int first = bi.logits == LogitsMode::kAll ? 0 : bi.n - 1;
    for (int t = first; t < bi.n; ++t) b.logit_rows.push_back(bi.row0 + t);
    res.num_logits_rows = bi.n - first;
  }

  last_step_ = StepStats{};  // Forward() accumulates its phase times into it
  if (b.num_tokens > 0) {
    Forward(b);
    for (const Batch::Item& bi : b.items) bi.kv->Commit(bi.n);
  }
  last_step_.num_tokens = b.num_tokens;
  last_step_.num_sessions = static_cast<int>(b.items.size());
  last_step_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A step's forward pass, in the order it runs: buffers and per-row angles, the attention plan, the
// layers (attention then FFN), the logits. Every stage reads and writes the step's Batch.
void Engine::Forward(Batch& b) {
  SizeActivations(b);
  EmbedAndRotate(b);
  PlanAttention(b);
  for (int l = 0; l < model_.config.num_layers; ++l) {
    const model::LayerWeights& lw = model_.weights->layers[static_cast<std::size_t>(l)];
    AttentionLayer(b, l);
    NormRows(b, lw.ffn_norm);
    if (model_.config.is_moe()) {
      MoeFfnLayer(b, lw);
    } else {
      FfnLayer(b, lw);
    }
  }
  Logits(b);
  last_step_.flops = StepFlops(b);
}

void Engine::SizeActivations(Batch& b) const {
  const model::ModelConfig& c = model_.config;
  const int T = b.num_tokens;
  const int pairs = rope_.num_pairs();
  EnsureSize(b.x, Floats(T, c.dim));
  EnsureSize(b.xb, Floats(T, c.dim));
  const std::size_t dense_ffn_floats =
      c.is_moe() ? 0
                 : std::max(FfnBlockFloats(std::min(T, kFfnRowsPerBlock), c.ffn_dim),
                            FfnBlockFloats(T % kFfnRowsPerBlock, c.ffn_dim));
  EnsureSize(b.layer_acts, std::max(Floats(T, c.qkv_dim() + c.q_dim()), dense_ffn_floats));
  if (c.is_moe()) {
    const int rows = std::min(T, kFfnRowsPerBlock);
    const int slots = rows * c.num_experts_used;
    const auto n = static_cast<std::size_t>(slots);
    const auto experts = static_cast<std::size_t>(c.num_experts);
    Batch::Moe& moe = b.moe;
    EnsureSize(moe.probs, Floats(rows, c.num_experts));
    if (moe.expert.size() < n) {
      moe.expert.resize(n);
      moe.weight.resize(n);
      moe.slot.resize(n);
      moe.slot_row.resize(n);
    }
    moe.first.resize(experts + 1);
    moe.cursor.resize(experts);
    moe.products.reserve(experts);
    EnsureSize(moe.in, Floats(slots, c.dim));
    EnsureSize(moe.gate_up, Floats(slots, 2 * c.expert_ffn_dim));
    EnsureSize(moe.hidden, Floats(slots, c.expert_ffn_dim));
  }
  EnsureSize(b.rope_cos, Floats(T, pairs));
  EnsureSize(b.rope_sin, Floats(T, pairs));
  EnsureSize(b.sink_cos, Floats(T, pairs));
  EnsureSize(b.sink_sin, Floats(T, pairs));
}

// The embedding row of every token (dequantised from its stored type), its RoPE angles, and for
// rows with rolling positions the angles that move its query to the sinks' frame.
void Engine::EmbedAndRotate(Batch& b) const {
  const model::ModelWeights& w = *model_.weights;
  const int dim = model_.config.dim;
  const int pairs = rope_.num_pairs();
  // The embedding row plus ~pairs (twice that with rolling positions) sin/cos evaluations in
  // double per row.
  ForRows(*threads_, b.num_tokens, dim + 32 * pairs, [&](int t) {
    quant::DequantizeMatrixRow(w.token_embedding, b.tokens[static_cast<std::size_t>(t)],
                               &b.x[Floats(t, dim)]);
    const TokenPos pos = b.positions[static_cast<std::size_t>(t)];
    rope_.PositionAngles(pos, &b.rope_cos[Floats(t, pairs)], &b.rope_sin[Floats(t, pairs)]);
    const base::QueryKeys& keys = b.query_keys[static_cast<std::size_t>(t)];
    if (keys.rotate_sinks) {
      // A pure rotation (not PositionAngles): the query already carries the rope magnitude.
      rope_.Angles(keys.sink_rotation, &b.sink_cos[Floats(t, pairs)],
                   &b.sink_sin[Floats(t, pairs)]);
    }
  });
}

// Attention work: (item, kv head, query sub-range) units, so one long prefill chunk still spreads
// over all threads and many short decode items are balanced dynamically. A decode item (one query)
// is one unit over all its kv heads when the step has enough units without cutting it per head, or
// when cutting it over its keys gives enough: the kernel then uses each block's K/V rows of every
// kv head (adjacent: a block stores [token][kv_dim]) while they are in L1 and prefetches the next
// block's as it goes, where per-head units read a third of every row (at 3 kv heads) and leave the
// rest to a later unit (bench-decode's attention ms at 32 x 512 and 1 x 512; docs/performance.md,
// "Decode at many sessions"). Too few units for the threads: single queries split over their keys.
void Engine::PlanAttention(Batch& b) const {
  const model::ModelConfig& c = model_.config;
  const int num_kv = c.num_kv_heads;
  const std::int64_t target_units =
      std::int64_t{kAttentionUnitsPerThread} * threads_->num_threads();
  b.max_visible = 1;
  b.attn_flops_per_layer = 0.0;
  // Units of the step's prefill chunks (one per kv head and kQueriesPerWork queries) and its
  // decode items (one query each).
  std::int64_t chunk_units = 0;
  std::int64_t decode_items = 0;
  for (const Batch::Item& bi : b.items) {
    const kv::KvPolicy& policy = bi.kv->policy();
    for (int t = 0; t < bi.n; ++t) {
      const std::int64_t v = policy.VisibleKeys(bi.pos0 + t);
      b.max_visible = std::max(b.max_visible, v);
      b.attn_flops_per_layer += 4.0 * static_cast<double>(v) * c.q_dim();
    }
    if (bi.n == 1) {
      ++decode_items;
    } else {
      chunk_units += std::int64_t{num_kv} * ((bi.n + kQueriesPerWork - 1) / kQueriesPerWork);
    }
  }
  const std::int64_t units_with_whole_decodes = decode_items + chunk_units;
  bool whole_decodes = num_kv > 1 && units_with_whole_decodes >= target_units;
  if (num_kv > 1 && !whole_decodes) {
    std::int64_t with_slices = chunk_units;
    for (const Batch::Item& bi : b.items) {
      if (bi.n == 1) {
        with_slices +=
            SlicesFor(bi.kv->policy().VisibleKeys(bi.pos0), units_with_whole_decodes, target_units);
      }
    }
    whole_decodes = with_slices >= target_units;
  }
  std::vector<Batch::AttnWork>& work = b.attn_work;
  work.clear();
  for (int i = 0; i < static_cast<int>(b.items.size()); ++i) {
    const Batch::Item& bi = b.items[static_cast<std::size_t>(i)];
    if (whole_decodes && bi.n == 1) {
      work.push_back({i, 0, num_kv, 0, 1});
      continue;
    }
    for (int h = 0; h < num_kv; ++h) {
      for (int s = 0; s < bi.n; s += kQueriesPerWork) {
        work.push_back({i, h, 1, s, std::min(kQueriesPerWork, bi.n - s)});
      }
    }
  }
  SplitAttentionOverKeys(b, target_units);
  SizeAttentionScratch(b);
}

// Too few units to keep every thread busy to the end (one long session, a few kv heads):
// single-query units are split over their keys (flash-decoding) into slices of at least
// kMinKeysPerSlice keys, a multiple of 16 (the bf16 kernel's chunk), merged after the loop.
void Engine::SplitAttentionOverKeys(Batch& b, std::int64_t target_units) const {
  std::vector<Batch::AttnWork>& work = b.attn_work;
  b.split_queries.clear();
  b.num_slots = 0;
  const auto base_units = static_cast<std::int64_t>(work.size());
  if (base_units >= target_units) return;
  const std::size_t units = work.size();
  for (std::size_t u = 0; u < units; ++u) {
    const Batch::AttnWork aw = work[u];
    if (aw.n != 1) continue;
    const Batch::Item& bi = b.items[static_cast<std::size_t>(aw.item)];
    const std::int64_t visible = bi.kv->policy().VisibleKeys(bi.pos0 + aw.begin);
    const std::int64_t count = SlicesFor(visible, base_units, target_units);
    if (count < 2) continue;
    const std::int64_t per_slice = ((visible + count - 1) / count + 15) / 16 * 16;
    const int first = b.num_slots;
    int pieces = 0;
    for (std::int64_t k0 = 0; k0 < visible; k0 += per_slice, ++pieces) {
      Batch::AttnWork piece = aw;
      piece.slice = b.num_slots;
      b.num_slots += aw.kv_heads;
      piece.key_begin = k0;
      piece.key_end = std::min(visible, k0 + per_slice);
      if (pieces == 0) {
        work[u] = piece;  // the unit itself becomes the first slice
      } else {
        work.push_back(piece);
      }
    }
    b.split_queries.push_back({bi.row0 + aw.begin, aw.kv_head, aw.kv_heads, first, pieces});
  }
}

// Slice buffers for the split queries, attention scratch per pool slot (slots of one job never run
// two chunks at once), and the units per chunk of the attention loop.
void Engine::SizeAttentionScratch(Batch& b) const {
  const model::ModelConfig& c = model_.config;
  const kernels::AttentionShape shape = AttentionShapeOf(c);
  EnsureSize(b.slice_out, Floats(b.num_slots, shape.group() * c.head_dim));
  EnsureSize(b.slice_stats, Floats(b.num_slots, 2 * shape.group()));
  b.scratch.resize(static_cast<std::size_t>(threads_->num_threads()));
  b.min_work_per_chunk = static_cast<std::int64_t>(
      std::max(1.0, kMinAttentionFlopsPerChunk *
                        static_cast<double>(std::max<std::size_t>(1, b.attn_work.size())) /
                        std::max(1.0, b.attn_flops_per_layer)));
  for (auto& s : b.scratch) EnsureSize(s, kernels::AttentionScratchFloats(shape, b.max_visible));
}

// Layer l's attention half: norm, the fused QKV product, bias and RoPE, K/V into the sessions'
// blocks, the paged attention units, and the output projection added to the residual stream.
void Engine::AttentionLayer(Batch& b, int l) {
  const model::ModelConfig& c = model_.config;
  const model::LayerWeights& lw = model_.weights->layers[static_cast<std::size_t>(l)];
  base::ThreadPool& pool = *threads_;
  const int T = b.num_tokens;
  const int qd = c.q_dim();
  const int kvd = c.kv_dim();
  const int qkvd = c.qkv_dim();
  float* const qkv = b.layer_acts.data();
  float* const att = qkv + Floats(T, qkvd);

  NormRows(b, lw.attn_norm);
  RunProduct(&last_step_, Product::kQkv, pool, b.xb.data(), T, lw.wqkv, qkv, false);

  // Bias, q/k norms, RoPE (q and k at absolute positions), then K/V into the session's blocks.
  const int pairs = rope_.num_pairs();
  ForRows(pool, T, qkvd, [&](int t) {
    float* row = qkv + Floats(t, qkvd);
    if (lw.bqkv != nullptr) kernels::Axpy(1.0f, lw.bqkv, row, qkvd);
    if (lw.q_norm != nullptr) {
      // qwen3: every q and k head RMS-normalised before its rotation.
      for (int h = 0; h < c.num_heads; ++h) {
        float* head = row + Floats(h, c.head_dim);
        kernels::RmsNorm(head, lw.q_norm, c.rms_eps, head, c.head_dim);
      }
      for (int h = 0; h < c.num_kv_heads; ++h) {
        float* head = row + qd + Floats(h, c.head_dim);
        kernels::RmsNorm(head, lw.k_norm, c.rms_eps, head, c.head_dim);
      }
    }
    const float* cs = &b.rope_cos[Floats(t, pairs)];
    const float* sn = &b.rope_sin[Floats(t, pairs)];
    rope_.Apply(row, c.num_heads, cs, sn);
    rope_.Apply(row + qd, c.num_kv_heads, cs, sn);
    b.ItemOfRow(t).kv->WriteKv(l, b.positions[static_cast<std::size_t>(t)], row + qd,
                               row + qd + kvd);
  });

  Timed(&last_step_.attention_seconds, [&] { RunAttention(b, l, qkv, att); });

  RunProduct(&last_step_, Product::kAttentionOut, pool, att, T, {&lw.wo, 1}, b.x.data(), true);
}

// The planned attention units of layer l on the pool, then the merge of split queries.
void Engine::RunAttention(Batch& b, int l, const float* qkv, float* att) const {
  const model::ModelConfig& c = model_.config;
  const kernels::AttentionShape shape = AttentionShapeOf(c);
  const int qd = c.q_dim();
  const int qkvd = c.qkv_dim();
  const int pairs = rope_.num_pairs();
  const int group_floats = shape.group() * c.head_dim;
  const std::vector<Batch::AttnWork>& work = b.attn_work;
  threads_->ParallelForSlot(
      static_cast<std::int64_t>(work.size()), b.min_work_per_chunk,
      [&](int slot, std::int64_t w0, std::int64_t w1) {
        float* scratch = b.scratch[static_cast<std::size_t>(slot)].data();
        for (auto wi = static_cast<std::size_t>(w0); wi < static_cast<std::size_t>(w1); ++wi) {
          const Batch::AttnWork& aw = work[wi];
          const Batch::Item& bi = b.items[static_cast<std::size_t>(aw.item)];
          const int row = bi.row0 + aw.begin;
          const auto row_keys =
              std::span<const base::QueryKeys>(b.query_keys).subspan(static_cast<std::size_t>(row));
          const kernels::RopeAngleRows sink_angles{&b.sink_cos[Floats(row, pairs)],
                                                   &b.sink_sin[Floats(row, pairs)],
                                                   static_cast<std::size_t>(pairs)};
          if (aw.slice >= 0) {
            const kernels::AttentionKeySlice slice{
                aw.key_begin, aw.key_end, &b.slice_out[Floats(aw.slice, group_floats)],
                &b.slice_stats[Floats(aw.slice, 2 * shape.group())]};
            kernels::PagedAttentionSlice(shape, bi.kv->View(), row_keys[0], rope_, l, aw.kv_head,
                                         aw.kv_heads, qkv + Floats(row, qkvd), slice, scratch,
                                         kernels::AttentionImpl::kAuto, &sink_angles);
            continue;
          }
          kernels::PagedAttentionHeads(
              shape, bi.kv->View(), row_keys.first(static_cast<std::size_t>(aw.n)), rope_, l,
              aw.kv_head, aw.kv_heads, qkv + Floats(row, qkvd), att + Floats(row, qd),
              static_cast<std::size_t>(qkvd), static_cast<std::size_t>(qd), scratch,
              kernels::AttentionImpl::kAuto, &sink_angles);
        }
      });

  // Few and small (splitting happens only when units are few): on the caller.
  for (const Batch::SplitQuery& sq : b.split_queries) {
    kernels::MergeAttentionSlices(
        shape, sq.kv_heads, &b.slice_out[Floats(sq.first_slice, group_floats)],
        &b.slice_stats[Floats(sq.first_slice, 2 * shape.group())], sq.count,
        att + Floats(sq.row, qd) + Floats(sq.kv_head, group_floats));
  }
}

// Every row's residual RMS-normalised with `weight` into xb: the input of a layer's attention and
// of its FFN.
void Engine::NormRows(Batch& b, const float* weight) const {
  const int dim = model_.config.dim;
  const float eps = model_.config.rms_eps;
  ForRows(*threads_, b.num_tokens, dim, [&](int t) {
    kernels::RmsNorm(&b.x[Floats(t, dim)], weight, eps, &b.xb[Floats(t, dim)], dim);
  });
}

// A layer's dense FFN half over blocks of at most kFfnRowsPerBlock rows, so its [rows, 2 ffn]
// gate|up rows (the largest activations of a prefill step) are bounded. A block of at least
// kHiddenOverGateUpMinRows rows writes its hidden rows over its gate|up rows (in passes, below), a
// smaller one (decode steps) into a region of its own, in one parallel pass.
void Engine::FfnLayer(Batch& b, const model::LayerWeights& lw) {
  base::ThreadPool& pool = *threads_;
  const int T = b.num_tokens;
  const int dim = model_.config.dim;
  const int ffn = model_.config.ffn_dim;
  float* const gate_up = b.layer_acts.data();
  for (int r0 = 0; r0 < T; r0 += kFfnRowsPerBlock) {
    const int rows = std::min(kFfnRowsPerBlock, T - r0);
    const bool over = rows >= kHiddenOverGateUpMinRows;
    float* const hidden = over ? gate_up : gate_up + Floats(rows, 2 * ffn);
    RunProduct(&last_step_, Product::kGateUp, pool, &b.xb[Floats(r0, dim)], rows, lw.w_gate_up,
               gate_up, false);
    const auto swiglu = [&](int t) {  // row t of the block
      const float* gu = gate_up + Floats(t, 2 * ffn);
      kernels::SwiGlu(gu, gu + ffn, hidden + Floats(t, ffn), ffn);  // elementwise: in place is fine
    };
    if (over) {
      // Row t's hidden lands on [t ffn, (t + 1) ffn), inside the gate|up rows below t. Passes over
      // rows [1, 2), [2, 4), ..., [k, 2k) after row 0: a pass writes [k ffn, 2k ffn), the rows
      // below k that earlier passes consumed, and reads [2k ffn, 4k ffn), which it does not
      // write, so its rows run in parallel.
      swiglu(0);
      for (int k = 1; k < rows; k *= 2) {
        const int end = std::min(rows, 2 * k);
        ForRows(pool, end - k, 2 * ffn, [&](int i) { swiglu(k + i); });
      }
    } else {
      ForRows(pool, rows, 2 * ffn, swiglu);
    }
    RunProduct(&last_step_, Product::kDown, pool, hidden, rows, {&lw.w_down, 1},
               &b.x[Floats(r0, dim)], true);
  }
}

// A layer's mixture-of-experts FFN (qwen3moe) over blocks of at most kFfnRowsPerBlock rows: the
// router (RouteRows), then the block's slots grouped by expert, so that each chosen expert's
// matrices are read once per block (once per step for any decode step), not once per row: its
// slots' rows gathered, the gate|up product, SwiGLU, the down product; finally every row adds its
// experts' outputs times their weights in its own choice order, so that a row's result does not
// depend on which other rows share the step.
void Engine::MoeFfnLayer(Batch& b, const model::LayerWeights& lw) {
  const model::ModelConfig& c = model_.config;
  base::ThreadPool& pool = *threads_;
  const int T = b.num_tokens;
  const int dim = c.dim;
  const int k = c.num_experts_used;
  const int ffn = c.expert_ffn_dim;
  Batch::Moe& moe = b.moe;
  for (int r0 = 0; r0 < T; r0 += kFfnRowsPerBlock) {
    const int rows = std::min(kFfnRowsPerBlock, T - r0);
    const int slots = rows * k;
    const float* xb = &b.xb[Floats(r0, dim)];
    RouteRows(b, lw, xb, rows);

    // Counting sort of the slots by expert (a few hundred at most: on the caller).
    std::fill(moe.first.begin(), moe.first.end(), 0);
    for (int i = 0; i < slots; ++i) {
      ++moe.first[static_cast<std::size_t>(moe.expert[static_cast<std::size_t>(i)]) + 1];
    }
    for (int e = 0; e < c.num_experts; ++e) {
      moe.first[static_cast<std::size_t>(e) + 1] += moe.first[static_cast<std::size_t>(e)];
    }
    std::copy(moe.first.begin(), moe.first.end() - 1, moe.cursor.begin());
    for (int i = 0; i < slots; ++i) {
      const int g = moe.cursor[static_cast<std::size_t>(moe.expert[static_cast<std::size_t>(i)])]++;
      moe.slot[static_cast<std::size_t>(i)] = g;
      moe.slot_row[static_cast<std::size_t>(g)] = i / k;
    }
    ForRows(pool, slots, dim, [&](int g) {
      std::memcpy(&moe.in[Floats(g, dim)],
                  xb + Floats(moe.slot_row[static_cast<std::size_t>(g)], dim),
                  Floats(dim, sizeof(float)));
    });
    // Each expert with slots over its slots, all of a projection's experts as one set of products
    // on the pool (one wake-up and one balanced split per projection, not per expert).
    const auto expert_products = [&](auto&& product_of) {
      moe.products.clear();
      for (int e = 0; e < c.num_experts; ++e) {
        const int g0 = moe.first[static_cast<std::size_t>(e)];
        const int n = moe.first[static_cast<std::size_t>(e) + 1] - g0;
        if (n > 0) moe.products.push_back(product_of(static_cast<std::size_t>(e), g0, n));
      }
      return std::span<const kernels::MatMulProduct>(moe.products);
    };
    RunProducts(&last_step_, Product::kGateUp, pool,
                expert_products([&](std::size_t e, int g0, int n) {
                  return kernels::MatMulProduct{&moe.in[Floats(g0, dim)], n, lw.expert_gate_up[e],
                                                &moe.gate_up[Floats(g0, 2 * ffn)], false};
                }));
    ForRows(pool, slots, 2 * ffn, [&](int g) {
      const float* gu = &moe.gate_up[Floats(g, 2 * ffn)];
      kernels::SwiGlu(gu, gu + ffn, &moe.hidden[Floats(g, ffn)], ffn);
    });
    RunProducts(&last_step_, Product::kDown, pool,
                expert_products([&](std::size_t e, int g0, int n) {
                  return kernels::MatMulProduct{&moe.hidden[Floats(g0, ffn)], n,
                                                std::span(&lw.expert_down[e], 1),
                                                &moe.in[Floats(g0, dim)], false};
                }));
    ForRows(pool, rows, k * dim, [&](int t) {
      float* x = &b.x[Floats(r0 + t, dim)];
      for (int j = 0; j < k; ++j) {
        const std::size_t i = Floats(t, k) + static_cast<std::size_t>(j);
        kernels::Axpy(moe.weight[i], &moe.in[Floats(moe.slot[i], dim)], x, dim);
      }
    });
  }
}

// The router of layer l over `rows` normalised rows, as llama.cpp's build_moe_ffn computes it for
// qwen3moe: softmax over every expert's logit, the num_experts_used most probable (ties to the
// lower index), their probabilities divided by their sum (clamped below at the smallest normal
// f16, llama.cpp's guard against 0). A row of NaN logits still picks k distinct experts.
void Engine::RouteRows(Batch& b, const model::LayerWeights& lw, const float* xb, int rows) {
  const model::ModelConfig& c = model_.config;
  const int num_experts = c.num_experts;
  const int k = c.num_experts_used;
  Batch::Moe& moe = b.moe;
  RunProduct(&last_step_, Product::kRouter, *threads_, xb, rows, {&lw.router, 1}, moe.probs.data(),
             false);
  constexpr float kMinWeightSum = 6.103515625e-5f;
  ForRows(*threads_, rows, num_experts, [&](int t) {
    float* p = &moe.probs[Floats(t, num_experts)];
    kernels::Softmax(p, num_experts);
    int* chosen = &moe.expert[Floats(t, k)];
    float* weight = &moe.weight[Floats(t, k)];
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) {
      int best = -1;
      for (int e = 0; e < num_experts; ++e) {
        if (p[e] < 0.0f) continue;  // taken
        if (best < 0 || p[e] > p[best]) best = e;
      }
      chosen[j] = best;
      weight[j] = p[best];
      sum += std::isnan(p[best]) ? 0.0f : p[best];
      p[best] = -1.0f;  // probabilities are >= 0 (or NaN): -1 marks a taken expert
    }
    const float inv = 1.0f / std::max(sum, kMinWeightSum);
    for (int j = 0; j < k; ++j) weight[j] *= inv;
  });
}

// Final norm and output projection only for the rows whose logits were asked for.
void Engine::Logits(Batch& b) {
  const model::ModelConfig& c = model_.config;
  const model::ModelWeights& w = *model_.weights;
  const int R = static_cast<int>(b.logit_rows.size());
  if (R == 0) return;
  const int dim = c.dim;
  EnsureSize(b.final_rows, Floats(R, dim));
  logits_.resize(Floats(R, c.vocab_size));
  ForRows(*threads_, R, dim, [&](int r) {
    kernels::RmsNorm(&b.x[Floats(b.logit_rows[static_cast<std::size_t>(r)], dim)], w.final_norm,
                     c.rms_eps, &b.final_rows[Floats(r, dim)], dim);
  });
  RunProduct(&last_step_, Product::kLogits, *threads_, b.final_rows.data(), R, {&w.output, 1},
             logits_.data(), false);
}

// The step's arithmetic: projections per token, attention over the visible keys, the logits rows.
double Engine::StepFlops(const Batch& b) const {
  const model::ModelConfig& c = model_.config;
  const double dim = c.dim;
  // A token's FFN: the dense one, or the router and its k experts.
  const double ffn_macs =
      c.is_moe() ? dim * c.num_experts + 3.0 * dim * c.expert_ffn_dim * c.num_experts_used
                 : 3.0 * dim * c.ffn_dim;
  const double proj_flops_per_token =
      2.0 * c.num_layers * (dim * c.qkv_dim() + static_cast<double>(c.q_dim()) * dim + ffn_macs);
  return proj_flops_per_token * b.num_tokens + b.attn_flops_per_layer * c.num_layers +
         2.0 * dim * static_cast<double>(c.vocab_size) * static_cast<double>(b.logit_rows.size());
}

}  // namespace metronome::engine
