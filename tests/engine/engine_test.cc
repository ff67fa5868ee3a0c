#include "metronome/engine/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "metronome/base/errors.h"
#include "metronome/base/thread_pool.h"
#include "metronome/engine/feed.h"
#include "metronome/engine/sampler.h"
#include "metronome/model/model.h"
#include "metronome/quant/codec.h"

namespace metronome::engine {
namespace {

const model::Model& Tiny() {
  static const model::Model m = model::MakeSyntheticModel("tiny", 5);
  return m;
}

std::vector<TokenId> RandomTokens(int n, unsigned seed, int vocab) {
  std::mt19937 rng(seed);
  std::vector<TokenId> v(static_cast<std::size_t>(n));
  for (auto& t : v) t = static_cast<TokenId>(rng() % static_cast<unsigned>(vocab));
  return v;
}

// All logits of a sequence fed to one session alone in a fresh engine, `chunk` tokens at a time,
// on `threads` pool threads (0: the engine's default).
std::vector<std::vector<float>> AloneLogits(const kv::KvPolicy& policy,
                                            const std::vector<TokenId>& tokens, int chunk,
                                            kv::KvDtype dtype = kv::KvDtype::kF32,
                                            int threads = 0) {
  EngineOptions eo;
  eo.kv_dtype = dtype;
  eo.num_threads = threads;
  eo.kv_blocks = 512;
  eo.block_tokens = 4;
  eo.poison_freed_blocks = true;
  Engine eng(Tiny(), eo);
  SessionOptions so;
  so.policy = policy;
  const SessionId sid = eng.OpenSession(so);
  std::vector<std::vector<float>> out(tokens.size());
  EXPECT_EQ(
      Feed(eng, sid, tokens, chunk, true,
           [&](std::size_t i, std::span<const float> lg) { out[i].assign(lg.begin(), lg.end()); }),
      StepStatus::kOk);
  return out;
}

double MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    m = std::max(m, static_cast<double>(std::abs(a[i] - b[i])));
  }
  return m;
}

TEST(EngineTest, ChunkedPrefillEqualsTokenByToken) {
  const auto toks = RandomTokens(70, 1, Tiny().config.vocab_size);
  for (const auto& pol : {kv::KvPolicy::Full(), kv::KvPolicy::Window(9, 3),
                          kv::KvPolicy::Window(9, 3, kv::PositionMode::kRolling)}) {
    const auto one = AloneLogits(pol, toks, 1);
    const auto chunked = AloneLogits(pol, toks, 23);
    for (std::size_t i = 0; i < toks.size(); ++i) {
      ASSERT_LT(MaxDiff(one[i], chunked[i]), 1e-4) << pol.ToString() << " pos " << i;
    }
  }
}

// The FFN runs over blocks of at most 256 rows; a block of 128 rows or more writes its hidden rows
// over its gate|up rows (in passes of doubling row ranges), a smaller one into a region of its own.
// Prompts of 300 tokens in one chunk (a block of 256 with passes up to [128, 256), then one of 44),
// in chunks of 150 and of 128 (the smallest block with passes) give the logits of token-by-token
// decoding.
TEST(EngineTest, PrefillStepsWithHiddenOverGateUpEqualTokenByToken) {
  const auto toks = RandomTokens(300, 5, Tiny().config.vocab_size);
  const auto pol = kv::KvPolicy::Window(200, 4, kv::PositionMode::kRolling);
  const auto one = AloneLogits(pol, toks, 1);
  for (const int chunk : {300, 150, 128}) {
    const auto chunked = AloneLogits(pol, toks, chunk);
    for (std::size_t i = 0; i < toks.size(); ++i) {
      ASSERT_LT(MaxDiff(one[i], chunked[i]), 1e-4) << "chunk " << chunk << " pos " << i;
    }
  }
}

// One session decoding alone has fewer attention units than the engine wants (2 per pool
// thread), so its decode steps past 128 visible keys run split over key slices (flash-decoding)
// and merged; prefill chunks are never split. With 2 threads (4 units wanted) from 256 visible
// keys on each slice covers both kv heads (4 slices of at least 64 keys), below that each kv head
// is cut alone (2 x 2 slices); with 4 threads (8 wanted) always per kv head (2 x 4 slices from
// 256 keys). Every way must give the logits of chunked prefill, with sinks, rolling positions and
// full KV, fp32 and bf16 KV. With bf16 KV the two paths' fp32 rounding differences (sgemm at 1 row
// against 100, slices merged) can put a K or V element on the other side of a bf16 rounding
// boundary, one bf16 step (2^-7 relative) apart, and the next layers carry it to the logits: up
// to 4.5e-4 over 15 token streams against 2.2e-6 with fp32 KV. A wrong slice or merge is off by
// O(1) (logits up to ~5).
TEST(EngineTest, KeySlicedDecodeEqualsChunkedPrefill) {
  const auto toks = RandomTokens(300, 7, Tiny().config.vocab_size);
  for (const kv::KvDtype dtype : {kv::KvDtype::kF32, kv::KvDtype::kBF16}) {
    const double tolerance = dtype == kv::KvDtype::kBF16 ? 2e-3 : 1e-4;
    for (const auto& pol : {kv::KvPolicy::Full(), kv::KvPolicy::Window(200, 4),
                            kv::KvPolicy::Window(200, 4, kv::PositionMode::kRolling)}) {
      const auto chunked = AloneLogits(pol, toks, 100, dtype, 2);
      for (const int threads : {2, 4}) {
        const auto decoded = AloneLogits(pol, toks, 1, dtype, threads);
        for (std::size_t i = 0; i < toks.size(); ++i) {
          ASSERT_LT(MaxDiff(decoded[i], chunked[i]), tolerance)
              << pol.ToString() << " " << kv::ToString(dtype) << " threads " << threads << " pos "
              << i;
        }
      }
    }
  }
}

// A ragged batch (different sessions, policies, chunk sizes, some decoding while others prefill)
// gives each session the logits it gets when run alone.
// Two engines in one process each own a pool of their own thread count: stepped at the same time
// from two threads, each computes what it computes alone, and neither resizes, nor runs its jobs
// on, the other's pool.
TEST(EngineTest, TwoEnginesWithTheirOwnThreadCountsRunConcurrently) {
  const std::vector<TokenId> tokens = RandomTokens(96, 41, Tiny().config.vocab_size);
  const kv::KvPolicy policy = kv::KvPolicy::Full();
  constexpr int kChunk = 32;
  const auto one_alone = AloneLogits(policy, tokens, kChunk, kv::KvDtype::kF32, 1);
  const auto three_alone = AloneLogits(policy, tokens, kChunk, kv::KvDtype::kF32, 3);

  const auto options = [](int threads) {  // AloneLogits's options
    EngineOptions eo;
    eo.kv_dtype = kv::KvDtype::kF32;
    eo.num_threads = threads;
    eo.kv_blocks = 512;
    eo.block_tokens = 4;
    eo.poison_freed_blocks = true;
    return eo;
  };
  Engine one(Tiny(), options(1));
  Engine three(Tiny(), options(3));
  EXPECT_EQ(one.num_threads(), 1);
  EXPECT_EQ(three.num_threads(), 3);
  EXPECT_NE(&one.thread_pool(), &three.thread_pool());

  const auto run = [&](Engine& eng, std::vector<std::vector<float>>* out) {
    SessionOptions so;
    so.policy = policy;
    const SessionId sid = eng.OpenSession(so);
    out->assign(tokens.size(), {});
    return Feed(eng, sid, tokens, kChunk, true, [&](std::size_t i, std::span<const float> lg) {
      (*out)[i].assign(lg.begin(), lg.end());
    });
  };
  std::vector<std::vector<float>> one_logits;
  std::vector<std::vector<float>> three_logits;
  StepStatus one_status = StepStatus::kInvalidRequest;
  std::thread other([&] { one_status = run(one, &one_logits); });
  const StepStatus three_status = run(three, &three_logits);
  other.join();

  ASSERT_EQ(one_status, StepStatus::kOk);
  ASSERT_EQ(three_status, StepStatus::kOk);
  EXPECT_EQ(one_logits, one_alone);
  EXPECT_EQ(three_logits, three_alone);
  EXPECT_EQ(one.num_threads(), 1);
  EXPECT_EQ(three.num_threads(), 3);
  // A one-thread pool runs every job on its caller; the three-thread pool split the larger
  // products over its workers, busy with no other engine's job.
  EXPECT_EQ(one.thread_pool().jobs_run_parallel(), 0);
  EXPECT_GT(three.thread_pool().jobs_run_parallel(), 0);
}

TEST(EngineTest, BatchedSessionsMatchSessionsRunAlone) {
  const int vocab = Tiny().config.vocab_size;
  struct Spec {
    kv::KvPolicy policy;
    int length;
    int chunk;
  };
  const std::vector<Spec> specs = {
      {kv::KvPolicy::Full(), 40, 40},
      {kv::KvPolicy::Window(7, 2), 50, 1},
      {kv::KvPolicy::Window(11, 0, kv::PositionMode::kRolling), 45, 6},
      {kv::KvPolicy::Window(5, 5, kv::PositionMode::kRolling), 33, 3},
      {kv::KvPolicy::Full(), 12, 1},
  };
  std::vector<std::vector<TokenId>> toks;
  std::vector<std::vector<std::vector<float>>> alone;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    toks.push_back(RandomTokens(specs[i].length, 100 + static_cast<unsigned>(i), vocab));
    alone.push_back(AloneLogits(specs[i].policy, toks.back(), 1));
  }

  EngineOptions eo;
  eo.kv_blocks = 512;
  eo.block_tokens = 4;
  eo.poison_freed_blocks = true;
  eo.kv_dtype = kv::KvDtype::kF32;  // as AloneLogits: compared at fp32 precision
  Engine eng(Tiny(), eo);
  std::vector<SessionId> ids;
  for (const auto& s : specs) ids.push_back(eng.OpenSession({s.policy, 0}));
  std::vector<std::size_t> fed(specs.size(), 0);
  std::vector<StepItemResult> results;
  int steps = 0;
  for (;;) {
    std::vector<StepItem> items;
    std::vector<std::size_t> who;
    for (std::size_t i = 0; i < specs.size(); ++i) {
      if (fed[i] >= toks[i].size()) continue;
      // Vary the chunk over time so prefill and decode mix in the same step.
      const std::size_t n = std::min<std::size_t>(
          static_cast<std::size_t>(specs[i].chunk + (steps % 3)), toks[i].size() - fed[i]);
      items.push_back(
          {ids[i], std::span<const TokenId>(toks[i]).subspan(fed[i], n), LogitsMode::kAll});
      who.push_back(i);
    }
    if (items.empty()) break;
    eng.Step(items, &results);
    ++steps;
    for (std::size_t k = 0; k < who.size(); ++k) {
      const std::size_t i = who[k];
      ASSERT_EQ(results[k].status, StepStatus::kOk);
      ASSERT_EQ(results[k].num_logits_rows, static_cast<int>(items[k].tokens.size()));
      for (int r = 0; r < results[k].num_logits_rows; ++r) {
        const auto lg = eng.logits(results[k].first_logits_row + r);
        const std::size_t pos = fed[i] + static_cast<std::size_t>(r);
        ASSERT_LT(MaxDiff(std::vector<float>(lg.begin(), lg.end()), alone[i][pos]), 1e-4)
            << "session " << i << " pos " << pos;
      }
      fed[i] += items[k].tokens.size();
    }
  }
  EXPECT_GT(steps, 5);
}

// With bf16 KV and enough decoding sessions per pool thread, a decode query is one attention unit
// over all its kv heads (the bf16 kernel walks their blocks together); with fewer sessions per
// thread, one unit per kv head. The same steps (full, window + sinks and rolling sessions
// decoding, another session prefilling in the same steps) run with 2 pool threads (whole-session
// units: 10 >= 2 x 2) and with 8 (10 < 2 x 8: per-head units, 16 of them, so no key slices) must
// give the same logits.
TEST(EngineTest, Bf16DecodeWithWholeSessionUnitsEqualsPerHeadUnits) {
  const int vocab = Tiny().config.vocab_size;
  const std::vector<kv::KvPolicy> policies = {
      kv::KvPolicy::Full(),
      kv::KvPolicy::Window(37, 3),
      kv::KvPolicy::Window(50, 4, kv::PositionMode::kRolling),
      kv::KvPolicy::Full(),
      kv::KvPolicy::Window(9, 0),
      kv::KvPolicy::Window(130, 2, kv::PositionMode::kRolling)};
  const int prompt = 150;
  const int decode = 6;
  const int extra_chunk = 20;
  std::vector<std::vector<TokenId>> toks;
  for (std::size_t i = 0; i < policies.size(); ++i) {
    toks.push_back(RandomTokens(prompt + decode, 300 + static_cast<unsigned>(i), vocab));
  }
  const auto extra_toks = RandomTokens(decode * extra_chunk, 399, vocab);
  // Logits of every decoding session at every decode step, [step][session].
  const auto run = [&](int threads) {
    EngineOptions eo;
    eo.kv_dtype = kv::KvDtype::kBF16;
    eo.kv_blocks = 1024;
    eo.block_tokens = 16;
    eo.poison_freed_blocks = true;
    eo.num_threads = threads;
    Engine eng(Tiny(), eo);
    std::vector<SessionId> ids;
    ids.reserve(policies.size());
    for (const auto& p : policies) ids.push_back(eng.OpenSession({p, 0}));
    std::vector<StepItemResult> results;
    for (std::size_t i = 0; i < policies.size(); ++i) {
      eng.Step(
          std::vector<StepItem>{
              {ids[i], std::span<const TokenId>(toks[i]).first(static_cast<std::size_t>(prompt)),
               LogitsMode::kNone}},
          &results);
      EXPECT_EQ(results[0].status, StepStatus::kOk);
    }
    const SessionId extra = eng.OpenSession({kv::KvPolicy::Full(), 0});
    std::vector<std::vector<std::vector<float>>> logits;
    for (int k = 0; k < decode; ++k) {
      std::vector<StepItem> items;
      for (std::size_t i = 0; i < policies.size(); ++i) {
        items.push_back({ids[i],
                         std::span<const TokenId>(toks[i]).subspan(
                             static_cast<std::size_t>(prompt) + static_cast<std::size_t>(k), 1),
                         LogitsMode::kLast});
      }
      items.push_back(
          {extra,
           std::span<const TokenId>(extra_toks)
               .subspan(static_cast<std::size_t>(k) * static_cast<std::size_t>(extra_chunk),
                        static_cast<std::size_t>(extra_chunk)),
           LogitsMode::kNone});
      eng.Step(items, &results);
      logits.emplace_back();
      for (std::size_t i = 0; i < policies.size(); ++i) {
        EXPECT_EQ(results[i].status, StepStatus::kOk);
        const auto lg = eng.logits(results[i].first_logits_row);
        logits.back().emplace_back(lg.begin(), lg.end());
      }
    }
    return logits;
  };
  const auto whole = run(2);
  const auto per_head = run(8);
  for (int k = 0; k < decode; ++k) {
    for (std::size_t i = 0; i < policies.size(); ++i) {
      const auto ks = static_cast<std::size_t>(k);
      ASSERT_LT(MaxDiff(whole[ks][i], per_head[ks][i]), 1e-5)
          << policies[i].ToString() << " decode step " << k;
    }
  }
}

// bf16 KV is an approximation: logits stay close to the fp32 ones and the greedy choice agrees
// almost everywhere (synthetic weights give near-ties, so not everywhere).
TEST(EngineTest, Bf16KvTracksF32) {
  const auto toks = RandomTokens(80, 11, Tiny().config.vocab_size);
  const auto pol = kv::KvPolicy::Window(24, 4, kv::PositionMode::kRolling);
  const auto f32 = AloneLogits(pol, toks, 7, kv::KvDtype::kF32);
  const auto bf16 = AloneLogits(pol, toks, 7, kv::KvDtype::kBF16);
  int agree = 0;
  double worst = 0.0;
  for (std::size_t i = 0; i < toks.size(); ++i) {
    worst = std::max(worst, MaxDiff(f32[i], bf16[i]));
    const auto a = std::max_element(f32[i].begin(), f32[i].end()) - f32[i].begin();
    const auto b = std::max_element(bf16[i].begin(), bf16[i].end()) - bf16[i].begin();
    agree += a == b ? 1 : 0;
  }
  EXPECT_LT(worst, 0.1);
  EXPECT_GT(worst, 0.0) << "bf16 storage must actually round";
  EXPECT_GE(agree, 72);
}

TEST(EngineTest, PoolExhaustionIsAResultAndOtherSessionsProceed) {
  EngineOptions eo;
  eo.kv_blocks = 6;
  eo.block_tokens = 4;
  Engine eng(Tiny(), eo);
  const SessionId a = eng.OpenSession({kv::KvPolicy::Full(), 0});
  const SessionId b = eng.OpenSession({kv::KvPolicy::Window(4, 0), 0});
  const auto toks = RandomTokens(20, 3, Tiny().config.vocab_size);
  std::vector<StepItemResult> r;
  // a takes 5 blocks (20 tokens); b needs 1.
  StepItem items[2] = {{a, toks, LogitsMode::kLast},
                       {b, std::span<const TokenId>(toks).first(4), LogitsMode::kLast}};
  eng.Step(items, &r);
  EXPECT_EQ(r[0].status, StepStatus::kOk);
  EXPECT_EQ(r[1].status, StepStatus::kOk);
  EXPECT_EQ(eng.pool_stats().free_blocks, 0);
  // a cannot grow; b (window 4) keeps going forever in its bounded footprint... once it has freed
  // a block. Its next token needs a new block, which is only possible after its window moves on.
  StepItem grow_a{a, std::span<const TokenId>(toks).first(1), LogitsMode::kLast};
  eng.Step({&grow_a, 1}, &r);
  EXPECT_EQ(r[0].status, StepStatus::kPoolExhausted);
  EXPECT_EQ(eng.session_kv(a)->length(), 20) << "a failed step leaves the session unchanged";
  EXPECT_TRUE(eng.CloseSession(a));
  EXPECT_EQ(eng.pool_stats().used_blocks, 1);
  for (int i = 0; i < 100; ++i) {
    StepItem one{b, std::span<const TokenId>(toks).subspan(static_cast<std::size_t>(i % 20), 1),
                 LogitsMode::kLast};
    eng.Step({&one, 1}, &r);
    ASSERT_EQ(r[0].status, StepStatus::kOk);
    ASSERT_LE(eng.session_kv(b)->resident_blocks(),
              kv::KvPolicy::Window(4, 0).MaxResidentBlocks(4));
  }
}

TEST(EngineTest, RejectsBadRequestsWithoutHarm) {
  EngineOptions eo;
  eo.kv_blocks = 16;
  Engine eng(Tiny(), eo);
  const SessionId a = eng.OpenSession({kv::KvPolicy::Full(), 0});
  const std::vector<TokenId> bad = {1, Tiny().config.vocab_size};
  const std::vector<TokenId> good = {1, 2};
  std::vector<StepItemResult> r;
  StepItem items[4] = {{a, bad, LogitsMode::kLast},
                       {SessionId{999}, good, LogitsMode::kLast},
                       {a, {}, LogitsMode::kLast},
                       {a, good, LogitsMode::kLast}};
  eng.Step(items, &r);
  EXPECT_EQ(r[0].status, StepStatus::kInvalidRequest);
  EXPECT_EQ(r[1].status, StepStatus::kUnknownSession);
  EXPECT_EQ(r[2].status, StepStatus::kInvalidRequest);
  EXPECT_EQ(r[3].status, StepStatus::kOk);
  EXPECT_EQ(eng.session_kv(a)->length(), 2);
  EXPECT_THROW(eng.OpenSession({kv::KvPolicy::Window(0, 0), 0}), ConfigError);
}

TEST(EngineTest, ContextLimitIsReported) {
  EngineOptions eo;
  eo.kv_blocks = 64;
  Engine eng(Tiny(), eo);
  const SessionId a = eng.OpenSession({kv::KvPolicy::Full(), 8});
  const auto toks = RandomTokens(9, 4, Tiny().config.vocab_size);
  std::vector<StepItemResult> r;
  StepItem it{a, toks, LogitsMode::kNone};
  eng.Step({&it, 1}, &r);
  EXPECT_EQ(r[0].status, StepStatus::kContextFull);
}

// Resident KV bytes per windowed session equal the stated bound once the window has slid, and a
// pool sized for 1000 bounded sessions holds 1000 concurrent sessions.
TEST(EngineTest, ThousandWindowedSessionsInOnePool) {
  const kv::KvPolicy pol = kv::KvPolicy::Window(24, 4);
  EngineOptions eo;
  eo.block_tokens = 8;
  const std::int64_t bound = pol.MaxResidentBlocks(eo.block_tokens, 1);
  eo.kv_blocks = 1000 * bound;
  Engine eng(Tiny(), eo);
  std::vector<SessionId> ids;
  for (int i = 0; i < 1000; ++i) ids.push_back(eng.OpenSession({pol, 0}));
  std::vector<TokenId> next(1000, 5);
  std::vector<StepItemResult> r;
  for (int step = 0; step < 60; ++step) {
    std::vector<StepItem> items;
    for (int i = 0; i < 1000; ++i)
      items.push_back({ids[static_cast<std::size_t>(i)],
                       {&next[static_cast<std::size_t>(i)], 1},
                       LogitsMode::kNone});
    eng.Step(items, &r);
    for (const auto& x : r) ASSERT_EQ(x.status, StepStatus::kOk) << "step " << step;
  }
  for (const SessionId id : ids) {
    ASSERT_LE(eng.session_kv(id)->resident_blocks(), pol.MaxResidentBlocks(eo.block_tokens));
  }
  EXPECT_EQ(eng.pool_stats().num_sessions, 1000);
  EXPECT_GT(eng.pool_stats().blocks_freed_by_window, 1000);
  for (const SessionId id : ids) EXPECT_TRUE(eng.CloseSession(id));
  EXPECT_EQ(eng.pool_stats().used_blocks, 0);
}

}  // namespace
}  // namespace metronome::engine

namespace metronome::engine {
namespace {

// The step's gemm time is split over the products that make it (each timed once, into exactly
// one product), and the products' weight bytes are every matrix a step streams: with the norms'
// floats and the (untied) embedding table they are the model's WeightBytes.
TEST(EngineTest, ProductTimesAddUpToGemmTimeAndProductBytesToWeightBytes) {
  const model::Model& m = Tiny();
  EngineOptions eo;
  eo.kv_blocks = 64;
  Engine eng(m, eo);
  const SessionId sid = eng.OpenSession({});
  const std::vector<TokenId> ids = {1, 2, 3};
  std::vector<StepItemResult> results;
  eng.Step(std::vector<StepItem>{{sid, ids, LogitsMode::kLast}}, &results);
  const StepStats& st = eng.last_step();
  double sum = 0.0;
  double bytes = 0.0;
  for (int p = 0; p < kNumProducts; ++p) {
    const auto product = static_cast<Product>(p);
    const double s = st.product_seconds[static_cast<std::size_t>(p)];
    // A dense model has no router; every other product runs once a layer (the logits once).
    if (product == Product::kRouter) {
      EXPECT_EQ(s, 0.0);
    } else {
      EXPECT_GT(s, 0.0) << Name(product);
    }
    sum += s;
    // One FFN block of rows: the step read every matrix once.
    EXPECT_DOUBLE_EQ(st.product_bytes[static_cast<std::size_t>(p)],
                     ProductWeightBytes(*m.weights, product))
        << Name(product);
    bytes += ProductWeightBytes(*m.weights, product);
  }
  EXPECT_NEAR(sum, st.gemm_seconds, 1e-12 + 1e-9 * st.gemm_seconds);
  EXPECT_LE(st.gemm_seconds, st.seconds);

  const model::ModelConfig& c = m.config;
  const double norm_bytes =
      static_cast<double>((2 * c.num_layers + 1) * c.dim) * sizeof(float) +
      (c.has_qkv_bias ? static_cast<double>(c.num_layers * c.qkv_dim()) * sizeof(float) : 0.0);
  // An untied embedding table is in WeightBytes but no product streams it (a step looks up rows).
  ASSERT_FALSE(c.tied_embeddings);
  const double table_bytes = static_cast<double>(m.weights->token_embedding.Bytes());
  EXPECT_DOUBLE_EQ(bytes + norm_bytes + table_bytes, static_cast<double>(m.weights->WeightBytes()));
  EXPECT_EQ(Name(Product::kQkv), "qkv");
  EXPECT_EQ(Name(Product::kRouter), "router");
  EXPECT_EQ(Name(Product::kLogits), "logits");
}

TEST(EngineWarmUpTest, LeavesThePoolAsItWasAndFitsSmallPools) {
  const model::Model m = model::MakeSyntheticModel("tiny", 3);
  EngineOptions eo;
  eo.kv_blocks = 64;
  eo.num_threads = 1;
  Engine eng(m, eo);
  const SessionId keep = eng.OpenSession({});
  std::vector<TokenId> ids = {1, 2, 3, 4, 5};
  std::vector<StepItemResult> results;
  eng.Step(std::vector<StepItem>{{keep, ids, LogitsMode::kLast}}, &results);
  const kv::PoolStats before = eng.pool_stats();
  EXPECT_GT(eng.WarmUp(256), 0.0);
  const kv::PoolStats after = eng.pool_stats();
  EXPECT_EQ(after.free_blocks, before.free_blocks);
  EXPECT_EQ(after.num_sessions, before.num_sessions);
  EXPECT_EQ(eng.session_kv(keep)->length(), 5);

  EngineOptions tiny = eo;
  tiny.kv_blocks = 1;  // one block of 16 tokens: the chunk shrinks to fit half of it
  Engine small(m, tiny);
  EXPECT_GT(small.WarmUp(256), 0.0);
  EXPECT_EQ(small.pool_stats().free_blocks, 1);
}

// A logits row computed from a NaN stops Feed before its callback sees it, whether the NaN
// reaches the logits (fp32 output) or only the hidden state behind them (a Q8_0 output product
// quantises its activations with a scale that ignores NaN and answers finite zeros).
TEST(EngineTest, LogitsFromANanAreNotFiniteAndFeedStopsAtThem) {
  for (const bool q8_output : {false, true}) {
    SCOPED_TRACE(q8_output ? "Q8_0 output" : "fp32 output");
    model::Model m = model::MakeSyntheticModel("tiny", 5);
    constexpr TokenId kPoisoned = 7;
    float* embedding = m.weights->MutableFloats(m.weights->token_embedding);
    std::fill_n(embedding + static_cast<std::ptrdiff_t>(kPoisoned) * m.config.dim, m.config.dim,
                std::numeric_limits<float>::quiet_NaN());
    std::vector<std::uint8_t> q8;
    if (q8_output) {
      quant::WeightMatrix& out = m.weights->output;
      ASSERT_EQ(out.type, quant::GgmlType::kF32);
      const std::vector<float> rows = model::DequantizeRows(out, 0, out.rows);
      const std::size_t row_bytes =
          static_cast<std::size_t>(out.cols) / 32 * sizeof(quant::BlockQ8_0);
      q8.resize(row_bytes * static_cast<std::size_t>(out.rows));
      quant::QuantizeRow(quant::GgmlType::kQ8_0, rows.data(),
                         static_cast<std::int64_t>(rows.size()), q8.data());
      out = {quant::GgmlType::kQ8_0, out.rows, out.cols,
             reinterpret_cast<const std::byte*>(q8.data()), row_bytes};
    }
    EngineOptions eo;
    eo.kv_blocks = 16;
    eo.num_threads = 1;
    Engine eng(m, eo);
    const SessionId clean = eng.OpenSession({});
    const SessionId poisoned = eng.OpenSession({});
    std::vector<StepItemResult> results;
    const std::vector<TokenId> a = {1, 5, 9};
    const std::vector<TokenId> b = {1, kPoisoned, 9};
    eng.Step(std::vector<StepItem>{{clean, a, LogitsMode::kLast}, {poisoned, b, LogitsMode::kLast}},
             &results);
    ASSERT_EQ(results[0].status, StepStatus::kOk);
    ASSERT_EQ(results[1].status, StepStatus::kOk);
    EXPECT_TRUE(eng.logits_finite(results[0].first_logits_row));
    EXPECT_FALSE(eng.logits_finite(results[1].first_logits_row));

    const SessionId fed = eng.OpenSession({});
    int calls = 0;
    EXPECT_EQ(Feed(eng, fed, b, 8, true, [&](std::size_t, std::span<const float>) { ++calls; }),
              StepStatus::kNonFiniteLogits);
    EXPECT_EQ(calls, 1) << "the row after token 1 is clean, the one after token 7 is not";
  }
}

}  // namespace
}  // namespace metronome::engine

namespace metronome::engine {
namespace {

// A mixture-of-experts step reads the router and the experts its rows were routed to, each chosen
// expert's matrices once: one decode row reads k experts a layer, a longer step between k and all
// of them, and the products' bytes say so (bench-decode's read rates and roofline divide them).
TEST(EngineMoeTest, ProductBytesCountTheExpertsAStepRan) {
  const model::Model m = model::MakeSyntheticModel("qwen3moe-small", 13);
  const model::ModelConfig& c = m.config;
  ASSERT_TRUE(c.is_moe());
  ASSERT_LT(c.num_experts_used, c.num_experts);
  const model::LayerWeights& l0 = m.weights->layers[0];
  double expert_gate_up = 0.0;
  for (const quant::WeightMatrix& w : l0.expert_gate_up[0]) {
    expert_gate_up += static_cast<double>(w.Bytes());
  }
  const auto expert_down = static_cast<double>(l0.expert_down[0].Bytes());
  const double layers = c.num_layers;
  EngineOptions eo;
  eo.kv_blocks = 64;
  Engine eng(m, eo);
  const SessionId sid = eng.OpenSession({});
  std::vector<TokenId> prompt(48);
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<TokenId>(37 * i % 4096);
  std::vector<StepItemResult> results;
  const auto bytes = [&](Product p) {
    return eng.last_step().product_bytes[static_cast<std::size_t>(p)];
  };

  eng.Step(std::vector<StepItem>{{sid, prompt, LogitsMode::kLast}}, &results);
  ASSERT_EQ(results[0].status, StepStatus::kOk);
  const double prefill_experts = bytes(Product::kGateUp) / expert_gate_up;
  EXPECT_DOUBLE_EQ(prefill_experts, std::round(prefill_experts));
  EXPECT_GT(prefill_experts, layers * c.num_experts_used);
  EXPECT_LE(prefill_experts, layers * c.num_experts);
  EXPECT_DOUBLE_EQ(bytes(Product::kDown), prefill_experts * expert_down);

  const TokenId next = 5;
  eng.Step(std::vector<StepItem>{{sid, {&next, 1}, LogitsMode::kLast}}, &results);
  ASSERT_EQ(results[0].status, StepStatus::kOk);
  EXPECT_DOUBLE_EQ(bytes(Product::kGateUp), layers * c.num_experts_used * expert_gate_up);
  EXPECT_DOUBLE_EQ(bytes(Product::kDown), layers * c.num_experts_used * expert_down);
  EXPECT_DOUBLE_EQ(bytes(Product::kRouter), ProductWeightBytes(*m.weights, Product::kRouter));
  EXPECT_DOUBLE_EQ(bytes(Product::kRouter), layers * static_cast<double>(l0.router.Bytes()));
  EXPECT_DOUBLE_EQ(bytes(Product::kQkv), ProductWeightBytes(*m.weights, Product::kQkv));
  EXPECT_LT(bytes(Product::kGateUp), ProductWeightBytes(*m.weights, Product::kGateUp));
}

// A mixture-of-experts step groups the rows of all its sessions by expert (each chosen expert's
// matrices read once per step): every session's logits must still be those of the session run
// alone, through a step with a prefill chunk beside decodes and through batched decode steps.
TEST(EngineMoeTest, GroupedExpertsMatchEachSessionAlone) {
  const model::Model m = model::MakeSyntheticModel("qwen3moe-small", 13);
  ASSERT_TRUE(m.config.is_moe());
  constexpr int kSessions = 5;
  constexpr int kDecodes = 4;
  std::mt19937 rng(8);
  std::vector<std::vector<TokenId>> prompts(kSessions);
  std::vector<std::vector<TokenId>> decodes(kSessions);
  for (int s = 0; s < kSessions; ++s) {
    prompts[s].resize(1 + 3 * static_cast<std::size_t>(s));  // 1 (a decode) .. 13 tokens
    for (TokenId& t : prompts[s]) t = static_cast<TokenId>(rng() % 4096);
    decodes[s].resize(kDecodes);
    for (TokenId& t : decodes[s]) t = static_cast<TokenId>(rng() % 4096);
  }
  EngineOptions eo;
  eo.kv_dtype = kv::KvDtype::kF32;
  eo.kv_blocks = 128;
  // [session][step]: the last row's logits after the prompt, then after each decode.
  using Logits = std::vector<std::vector<std::vector<float>>>;
  const auto run = [&](const std::vector<int>& sessions) {
    Engine eng(m, eo);
    std::vector<SessionId> ids;
    for (std::size_t i = 0; i < sessions.size(); ++i) ids.push_back(eng.OpenSession({}));
    Logits out(kSessions);
    std::vector<StepItemResult> results;
    for (int step = 0; step <= kDecodes; ++step) {
      std::vector<StepItem> items;
      for (std::size_t i = 0; i < sessions.size(); ++i) {
        const int s = sessions[i];
        const std::vector<TokenId>& toks = prompts[s];
        items.push_back({ids[i],
                         step == 0 ? std::span<const TokenId>(toks)
                                   : std::span<const TokenId>(&decodes[s][step - 1], 1),
                         LogitsMode::kLast});
      }
      eng.Step(items, &results);
      for (std::size_t i = 0; i < sessions.size(); ++i) {
        EXPECT_EQ(results[i].status, StepStatus::kOk);
        const auto lg = eng.logits(results[i].first_logits_row);
        out[sessions[i]].emplace_back(lg.begin(), lg.end());
      }
    }
    return out;
  };
  std::vector<int> all(kSessions);
  for (int s = 0; s < kSessions; ++s) all[s] = s;
  const Logits together = run(all);
  for (int s = 0; s < kSessions; ++s) {
    const Logits alone = run({s});
    for (int step = 0; step <= kDecodes; ++step) {
      const std::vector<float>& a = alone[s][step];
      const std::vector<float>& b = together[s][step];
      ASSERT_EQ(a.size(), b.size());
      double diff = 0.0;
      double largest = 0.0;
      for (std::size_t i = 0; i < a.size(); ++i) {
        diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
        largest = std::max(largest, static_cast<double>(std::fabs(a[i])));
      }
      // fp32 summation order may differ with a product's row count; a wrong grouping, weight or
      // scatter is off by the logits' own size.
      EXPECT_LE(diff, 1e-5 * largest) << "session " << s << " step " << step;
    }
  }
}

}  // namespace
}  // namespace metronome::engine
