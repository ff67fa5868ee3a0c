// The window kernel against a dense masked reference: raw q/k/v of every token are kept densely;
// the reference rotates them from scratch at the positions the formulas give (absolute, or rolling
// in-cache positions), applies the mask `j <= p and (j < S or j > p - W)` in double precision, and
// must agree with the paged kernel reading K/V through the block table, with freed blocks poisoned
// with NaN.
#include "metronome/kernels/paged_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "metronome/base/half.h"
#include "metronome/kernels/cpu_features.h"
#include "metronome/kv/session_kv.h"

namespace metronome::kernels {
namespace {

using kv::KvPolicy;
using kv::PositionMode;

// The keys queries pos0 .. pos0 + n - 1 attend to under `policy`, as the engine hands them to the
// kernels.
std::vector<QueryKeys> KeysOf(const KvPolicy& policy, TokenPos pos0, int n) {
  std::vector<QueryKeys> keys;
  for (int i = 0; i < n; ++i) keys.push_back(policy.KeysOf(pos0 + i));
  return keys;
}

struct Dims {
  int heads = 4;
  int kv_heads = 2;
  int hd = 8;
  int layers = 2;
  [[nodiscard]] int q_dim() const { return heads * hd; }
  [[nodiscard]] int kv_dim() const { return kv_heads * hd; }
};

// Independent RoPE in double: rotate adjacent pairs (interleaved style) of one head by position
// pos.
void RotateRef(std::vector<double>& v, int offset, int hd, double pos) {
  for (int i = 0; i < hd; i += 2) {
    const double a = pos * std::pow(10000.0, -static_cast<double>(i) / hd);
    const double x0 = v[static_cast<std::size_t>(offset + i)];
    const double x1 = v[static_cast<std::size_t>(offset + i + 1)];
    v[static_cast<std::size_t>(offset + i)] = x0 * std::cos(a) - x1 * std::sin(a);
    v[static_cast<std::size_t>(offset + i + 1)] = x0 * std::sin(a) + x1 * std::cos(a);
  }
}

// Positions used by the reference for query p and key j (formulas of the design).
void RefPositions(const KvPolicy& pol, TokenPos p, TokenPos j, double* qpos, double* kpos) {
  if (pol.mode == kv::KvMode::kWindow && pol.positions == PositionMode::kRolling &&
      p - pol.window + 1 > pol.sinks) {
    const TokenPos first = p - pol.window + 1;
    *qpos = static_cast<double>(pol.sinks + pol.window - 1);
    *kpos = j < pol.sinks ? static_cast<double>(j) : static_cast<double>(pol.sinks + (j - first));
  } else {
    *qpos = static_cast<double>(p);
    *kpos = static_cast<double>(j);
  }
}

class StreamHarness {
 public:
  StreamHarness(const Dims& d, int block_tokens, const KvPolicy& policy, unsigned seed,
                kv::KvDtype dtype = kv::KvDtype::kF32)
      : d_(d),
        policy_(policy),
        pool_({d.layers, d.kv_heads, d.hd, block_tokens, dtype},
              {.num_blocks = 256, .poison_on_free = true}),
        session_(&pool_, policy, 1 << 20),
        rope_(d.hd, d.hd, 10000.0, RopePairing::kInterleaved),
        rng_(seed) {}

  // Appends a chunk of n tokens with random raw q/k/v, runs the kernel for its queries on every
  // layer, and returns the max abs difference to the reference.
  double AppendChunkAndCompare(int n) {
    const TokenPos pos0 = session_.length();
    EXPECT_EQ(session_.Reserve(n), kv::ReserveResult::kOk);
    std::normal_distribution<double> nd(0.0, 1.0);
    double max_err = 0.0;
    for (int l = 0; l < d_.layers; ++l) {
      // Fresh raw vectors for this chunk and layer.
      std::vector<float> q(static_cast<std::size_t>(n * d_.q_dim()));
      for (int t = 0; t < n; ++t) {
        const TokenPos p = pos0 + t;
        std::vector<double> rq(static_cast<std::size_t>(d_.q_dim())),
            rk(static_cast<std::size_t>(d_.kv_dim())), rv(static_cast<std::size_t>(d_.kv_dim()));
        for (auto& x : rq) x = nd(rng_);
        for (auto& x : rk) x = nd(rng_);
        for (auto& x : rv) x = nd(rng_);
        raw_q_[l].push_back(rq);
        raw_k_[l].push_back(rk);
        raw_v_[l].push_back(rv);
        // Engine convention: q and k rotated at absolute positions, k stored once.
        std::vector<float> qf(rq.begin(), rq.end()), kf(rk.begin(), rk.end());
        rope_.Rotate(qf.data(), d_.heads, p);
        rope_.Rotate(kf.data(), d_.kv_heads, p);
        std::copy(qf.begin(), qf.end(), q.begin() + static_cast<std::ptrdiff_t>(t * d_.q_dim()));
        std::vector<float> vf(rv.begin(), rv.end());
        session_.WriteKv(l, p, kf.data(), vf.data());
      }
      std::vector<float> out(q.size(), -7.0f);
      const AttentionShape shape{d_.heads, d_.kv_heads, d_.hd};
      std::vector<float> scratch(AttentionScratchFloats(shape, pos0 + n + 1));
      for (int g = 0; g < d_.kv_heads; ++g) {
        PagedAttention(shape, session_.View(), KeysOf(policy_, pos0, n), rope_, l, g, q.data(),
                       out.data(), static_cast<std::size_t>(d_.q_dim()),
                       static_cast<std::size_t>(d_.q_dim()), scratch.data());
      }
      last_out_ = out;
      for (int t = 0; t < n; ++t) {
        const auto ref = Reference(l, pos0 + t);
        for (int i = 0; i < d_.q_dim(); ++i) {
          const double got = out[static_cast<std::size_t>(t * d_.q_dim() + i)];
          if (std::isnan(got)) return INFINITY;
          max_err = std::max(max_err, std::abs(got - ref[static_cast<std::size_t>(i)]));
        }
      }
    }
    session_.Commit(n);
    return max_err;
  }

  [[nodiscard]] const std::vector<float>& last_out() const { return last_out_; }
  kv::SessionKv& session() { return session_; }

 private:
  std::vector<double> Reference(int l, TokenPos p) {
    const int group = d_.heads / d_.kv_heads;
    std::vector<double> out(static_cast<std::size_t>(d_.q_dim()), 0.0);
    for (int h = 0; h < d_.heads; ++h) {
      const int g = h / group;
      std::vector<double> scores;
      std::vector<TokenPos> keys;
      for (TokenPos j = 0; j <= p; ++j) {
        const bool visible =
            j <= p && (j < policy_.effective_sinks() || j > p - policy_.effective_window());
        if (!visible) continue;
        double qpos = 0, kpos = 0;
        RefPositions(policy_, p, j, &qpos, &kpos);
        auto q = raw_q_[l][static_cast<std::size_t>(p)];
        auto k = raw_k_[l][static_cast<std::size_t>(j)];
        RotateRef(q, h * d_.hd, d_.hd, qpos);
        RotateRef(k, g * d_.hd, d_.hd, kpos);
        double s = 0.0;
        for (int i = 0; i < d_.hd; ++i)
          s += q[static_cast<std::size_t>(h * d_.hd + i)] *
               k[static_cast<std::size_t>(g * d_.hd + i)];
        scores.push_back(s / std::sqrt(static_cast<double>(d_.hd)));
        keys.push_back(j);
      }
      double m = -INFINITY;
      for (double s : scores) m = std::max(m, s);
      double sum = 0.0;
      for (double& s : scores) sum += (s = std::exp(s - m));
      for (std::size_t k = 0; k < keys.size(); ++k) {
        const auto& v = raw_v_[l][static_cast<std::size_t>(keys[k])];
        for (int i = 0; i < d_.hd; ++i) {
          out[static_cast<std::size_t>(h * d_.hd + i)] +=
              scores[k] / sum * v[static_cast<std::size_t>(g * d_.hd + i)];
        }
      }
    }
    return out;
  }

  Dims d_;
  KvPolicy policy_;
  kv::BlockPool pool_;
  kv::SessionKv session_;
  Rope rope_;
  std::mt19937 rng_;
  std::vector<std::vector<double>> raw_q_[2], raw_k_[2], raw_v_[2];
  std::vector<float> last_out_;
};

struct Case {
  const char* name;
  KvPolicy policy;
  int block_tokens;
  Dims dims = {};  // head_dim 8: the generic path; 16/32/64/128 take the SIMD path
  kv::KvDtype dtype = kv::KvDtype::kF32;
};

class PagedAttentionReferenceTest : public ::testing::TestWithParam<Case> {};

// Chunks of mixed sizes, including prefill chunks that straddle the window edge and single decode
// tokens, for 60 tokens in total.
TEST_P(PagedAttentionReferenceTest, MatchesDenseMaskedReference) {
  const Case& c = GetParam();
  StreamHarness h(c.dims, c.block_tokens, c.policy, 17, c.dtype);
  // bf16 K/V carry 8 bits of mantissa: outputs (convex combinations of unit-scale V) move by ~1e-2.
  const double tolerance = c.dtype == kv::KvDtype::kBF16 ? 3e-2 : 2e-5;
  for (int n : {1, 5, 9, 1, 1, 13, 2, 7, 1, 1, 1, 19}) {
    const double err = h.AppendChunkAndCompare(n);
    ASSERT_LT(err, tolerance) << c.name << " after " << h.session().length() << " tokens";
  }
  const std::int64_t bound = c.policy.MaxResidentBlocks(c.block_tokens);
  if (bound >= 0) {
    EXPECT_LE(h.session().resident_blocks(), bound);
  }
  if (c.policy.mode == kv::KvMode::kWindow && c.policy.window < 30) {
    EXPECT_GT(h.session().stats().blocks_freed_by_window, 0) << "the test must exercise freeing";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Policies, PagedAttentionReferenceTest,
    ::testing::Values(Case{"full", KvPolicy::Full(), 4},
                      Case{"w7_s3_abs_b4", KvPolicy::Window(7, 3), 4},
                      Case{"w7_s3_roll_b4", KvPolicy::Window(7, 3, PositionMode::kRolling), 4},
                      Case{"w10_s0_b4", KvPolicy::Window(10, 0), 4},
                      Case{"w10_s0_roll_b3", KvPolicy::Window(10, 0, PositionMode::kRolling), 3},
                      Case{"w1_s1_b2", KvPolicy::Window(1, 1), 2},
                      Case{"w5_s6_roll_b4", KvPolicy::Window(5, 6, PositionMode::kRolling), 4},
                      Case{"w13_s5_roll_b16", KvPolicy::Window(13, 5, PositionMode::kRolling), 16},
                      Case{"w_ge_len_roll", KvPolicy::Window(1000, 4, PositionMode::kRolling), 4},
                      Case{"hd64_gqa3_w9_s3_roll", KvPolicy::Window(9, 3, PositionMode::kRolling),
                           4, Dims{6, 2, 64, 2}},
                      Case{"hd64_full", KvPolicy::Full(), 16, Dims{6, 2, 64, 2}},
                      Case{"hd16_mha_w6_s2", KvPolicy::Window(6, 2), 4, Dims{4, 4, 16, 2}},
                      Case{"hd32_w11_s0_roll", KvPolicy::Window(11, 0, PositionMode::kRolling), 8,
                           Dims{2, 1, 32, 2}},
                      Case{"hd128_w8_s4_roll", KvPolicy::Window(8, 4, PositionMode::kRolling), 4,
                           Dims{2, 1, 128, 2}},
                      Case{"bf16_hd64_w9_s3_roll", KvPolicy::Window(9, 3, PositionMode::kRolling),
                           4, Dims{6, 2, 64, 2}, kv::KvDtype::kBF16},
                      Case{"bf16_hd8_w7_s3", KvPolicy::Window(7, 3), 4, Dims{},
                           kv::KvDtype::kBF16}),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

TEST(PagedAttentionTest, WindowCoveringTheStreamIsExactlyFullAttention) {
  StreamHarness full(Dims{}, 4, KvPolicy::Full(), 99);
  StreamHarness wide(Dims{}, 4, KvPolicy::Window(64, 0), 99);
  for (int n : {3, 1, 8, 1, 20}) {
    full.AppendChunkAndCompare(n);
    wide.AppendChunkAndCompare(n);
    ASSERT_EQ(full.last_out(), wide.last_out());
  }
}

// Every implementation against the portable one on the same bf16 pool and queries (the portable
// kernel widens bf16 exactly and is checked against the dense reference above; head dims other
// than 16/32/64/128, e.g. 8, run only the portable kernel: bf16_hd8_w7_s3 above).
//
// Tolerance, derived: K and V are identical bf16 in both, so a score differs only by the
// rounding of q (unit roundoff u_q: 0 for the fp32-q kernels, 2^-16 for the hi + lo split,
// 2^-8 for q rounded once) and fp32 summation order (hd * 2^-24):
//   |ds| <= (u_q + hd 2^-24) * |q_h|_2 * |k|_2 / sqrt(hd)   (Cauchy-Schwarz; rotation keeps |q_h|)
// and a softmax-weighted mean of V moves by at most 2 |ds| max|v|, plus fp32 rounding of the
// softmax and of the accumulation (~ (visible + hd) 2^-24 max|v|, with a factor 4 of slack).
struct ImplCase {
  const char* name;
  KvPolicy policy;
  int block_tokens;
  Dims dims;
  std::vector<int> chunks;  // prompt/decode chunk sizes streamed through the session
};

double RoundoffOfQ(AttentionImpl impl) {
  switch (impl) {
    case AttentionImpl::kAvx512Bf16:
      return std::ldexp(1.0, -16);
    case AttentionImpl::kAvx512Bf16RoundedQ:
      return std::ldexp(1.0, -8);
    default:
      return 0.0;
  }
}

struct ImplComparison {
  double max_err = 0.0;    // over every output of every query
  double max_bound = 0.0;  // the derived tolerance at that output's query (max over queries)
  bool within = true;      // every output within its query's bound
};

// Streams c.chunks through a bf16 session and compares `impl` with kPortable after each chunk,
// for every query of the chunk, every layer and kv head. `u_q` overrides the implementation's q
// roundoff in the bound (to show a bound is tight enough to tell the implementations apart).
// `heads_together`: `impl` runs as one PagedAttentionHeads call over all kv heads (what the engine
// does for a decode query) instead of one PagedAttention call per kv head.
ImplComparison CompareImpl(const ImplCase& c, AttentionImpl impl, double u_q,
                           bool heads_together = false) {
  const Dims& d = c.dims;
  kv::BlockPool pool({d.layers, d.kv_heads, d.hd, c.block_tokens, kv::KvDtype::kBF16},
                     {.num_blocks = 512, .poison_on_free = true});
  kv::SessionKv session(&pool, c.policy, 1 << 20);
  const Rope rope(d.hd, d.hd, 10000.0, RopePairing::kInterleaved);
  const AttentionShape shape{d.heads, d.kv_heads, d.hd};
  std::mt19937 rng(1234);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  double max_k_norm = 0.0;
  double max_v = 0.0;
  ImplComparison result;
  for (const int n : c.chunks) {
    const TokenPos pos0 = session.length();
    EXPECT_EQ(session.Reserve(n), kv::ReserveResult::kOk);
    std::vector<std::vector<float>> q(static_cast<std::size_t>(d.layers));
    for (int l = 0; l < d.layers; ++l) {
      q[static_cast<std::size_t>(l)].resize(static_cast<std::size_t>(n * d.q_dim()));
      for (float& x : q[static_cast<std::size_t>(l)]) x = nd(rng);
      for (int t = 0; t < n; ++t) {
        std::vector<float> k(static_cast<std::size_t>(d.kv_dim())), v(k.size());
        for (float& x : k) x = nd(rng);
        for (float& x : v) x = nd(rng);
        for (int g = 0; g < d.kv_heads; ++g) {
          double norm = 0.0;
          for (int i = 0; i < d.hd; ++i) {
            const double kb = Bf16ToFloat(FloatToBf16(k[static_cast<std::size_t>(g * d.hd + i)]));
            norm += kb * kb;
          }
          max_k_norm = std::max(max_k_norm, std::sqrt(norm));
        }
        for (const float x : v) max_v = std::max(max_v, std::abs(static_cast<double>(x)) * 1.01);
        session.WriteKv(l, pos0 + t, k.data(), v.data());
      }
    }
    const std::int64_t max_visible = c.policy.VisibleKeys(pos0 + n - 1) + n;
    std::vector<float> scratch(AttentionScratchFloats(shape, max_visible + 1));
    for (int l = 0; l < d.layers; ++l) {
      const auto& ql = q[static_cast<std::size_t>(l)];
      // Filled with different values so an output the kernel never writes cannot match.
      std::vector<float> got(ql.size());
      std::vector<float> want(ql.size());
      std::fill(got.begin(), got.end(), -7.0f);
      std::fill(want.begin(), want.end(), 7.0f);
      const auto stride = static_cast<std::size_t>(d.q_dim());
      if (heads_together) {
        PagedAttentionHeads(shape, session.View(), KeysOf(c.policy, pos0, n), rope, l, 0,
                            d.kv_heads, ql.data(), got.data(), stride, stride, scratch.data(),
                            impl);
      }
      for (int g = 0; g < d.kv_heads; ++g) {
        if (!heads_together) {
          PagedAttention(shape, session.View(), KeysOf(c.policy, pos0, n), rope, l, g, ql.data(),
                         got.data(), stride, stride, scratch.data(), impl);
        }
        PagedAttention(shape, session.View(), KeysOf(c.policy, pos0, n), rope, l, g, ql.data(),
                       want.data(), stride, stride, scratch.data(), AttentionImpl::kPortable);
      }
      for (int t = 0; t < n; ++t) {
        const auto visible = static_cast<double>(c.policy.VisibleKeys(pos0 + t));
        for (int h = 0; h < d.heads; ++h) {
          const std::size_t off = static_cast<std::size_t>(t * d.q_dim() + h * d.hd);
          double q_norm = 0.0;
          for (int i = 0; i < d.hd; ++i) q_norm += ql[off + i] * ql[off + i];
          const double ds = (u_q + d.hd * std::ldexp(1.0, -24)) * std::sqrt(q_norm) * max_k_norm /
                            std::sqrt(static_cast<double>(d.hd));
          const double bound =
              2.0 * ds * max_v + 4.0 * (visible + d.hd) * std::ldexp(1.0, -24) * max_v;
          result.max_bound = std::max(result.max_bound, bound);
          for (int i = 0; i < d.hd; ++i) {
            const double err = std::abs(static_cast<double>(got[off + i]) - want[off + i]);
            if (!(err <= bound)) result.within = false;  // NaN fails too
            result.max_err = std::max(result.max_err, std::isnan(err) ? INFINITY : err);
          }
        }
      }
    }
    session.Commit(n);
  }
  return result;
}

class AttentionImplTest : public ::testing::TestWithParam<ImplCase> {};

TEST_P(AttentionImplTest, EveryImplementationMatchesPortableOnBf16Kv) {
  const ImplCase& c = GetParam();
  const AttentionShape shape{c.dims.heads, c.dims.kv_heads, c.dims.hd};
  int ran = 0;
  for (const AttentionImpl impl :
       {AttentionImpl::kAvx512, AttentionImpl::kAvx2, AttentionImpl::kAvx512Bf16,
        AttentionImpl::kAvx512Bf16RoundedQ}) {
    if (!AttentionImplAvailable(impl, shape, kv::KvDtype::kBF16)) continue;
    ++ran;
    for (const bool together : {false, true}) {
      const ImplComparison r = CompareImpl(c, impl, RoundoffOfQ(impl), together);
      EXPECT_TRUE(r.within) << c.name << " " << ToString(impl)
                            << (together ? " (kv heads together)" : "") << ": max error "
                            << r.max_err << ", bound up to " << r.max_bound;
    }
  }
  if (ran == 0) GTEST_SKIP() << "no SIMD attention for head dim " << c.dims.hd << " on this CPU";
}

INSTANTIATE_TEST_SUITE_P(
    HeadDimsAndPolicies, AttentionImplTest,
    ::testing::Values(
        ImplCase{"hd16_mha_w6_s2_roll",
                 KvPolicy::Window(6, 2, PositionMode::kRolling),
                 4,
                 Dims{4, 4, 16, 2},
                 {3, 1, 1, 11, 1, 7}},
        ImplCase{"hd32_gqa4_full", KvPolicy::Full(), 8, Dims{8, 2, 32, 1}, {17, 1, 1, 5}},
        ImplCase{"hd64_gqa3_w9_s3_roll",
                 KvPolicy::Window(9, 3, PositionMode::kRolling),
                 4,
                 Dims{9, 3, 64, 2},
                 {13, 1, 1, 1, 7, 1, 19}},
        ImplCase{"hd64_gqa3_w40_s4_b16",
                 KvPolicy::Window(40, 4),
                 16,
                 Dims{9, 3, 64, 1},
                 {33, 1, 1, 29, 1}},
        ImplCase{"hd128_gqa2_w11_s5_roll",
                 KvPolicy::Window(11, 5, PositionMode::kRolling),
                 3,
                 Dims{4, 2, 128, 2},
                 {1, 7, 1, 13, 1, 1, 5}},
        ImplCase{"hd128_mqa_full_b5", KvPolicy::Full(), 5, Dims{4, 1, 128, 1}, {21, 1, 3}},
        // The blockwise kernel's edges: chunks of 16 keys inside blocks of 16 / 32 / 20, odd
        // lengths ending mid-chunk, groups that are not a whole number of head tiles (5 = 4 + 1,
        // 3 = 2 + 1 at head dim 128, 8 = 4 + 4), window + sinks crossing block edges, and a long
        // full context (many running-maximum updates).
        ImplCase{"hd64_gqa3_full_b16_odd",
                 KvPolicy::Full(),
                 16,
                 Dims{9, 3, 64, 1},
                 {31, 1, 1, 16, 1, 13}},
        ImplCase{"hd64_gqa5_w23_s5_roll_b7",
                 KvPolicy::Window(23, 5, PositionMode::kRolling),
                 7,
                 Dims{10, 2, 64, 1},
                 {29, 1, 1, 17, 1}},
        ImplCase{"hd128_gqa3_w37_s3_b32",
                 KvPolicy::Window(37, 3),
                 32,
                 Dims{6, 2, 128, 1},
                 {45, 1, 1, 33, 1}},
        ImplCase{
            "hd32_gqa8_w50_s0_b20", KvPolicy::Window(50, 0), 20, Dims{8, 1, 32, 1}, {61, 1, 19, 1}},
        ImplCase{"hd64_gqa3_full_b16_long",
                 KvPolicy::Full(),
                 16,
                 Dims{9, 3, 64, 1},
                 {300, 1, 1, 211, 1}},
        // A prefill chunk's queries walk the union of their windows together: Qwen3-30B-A3B's
        // group of 8 at head dim 128 (four tiles of two), chunks longer than the window and than
        // one block of queries (16), windows starting mid-chunk; and a group of 32 (eight tiles
        // of four: blocks of 8 queries).
        ImplCase{"hd128_gqa8_w40_s4_roll_b16",
                 KvPolicy::Window(40, 4, PositionMode::kRolling),
                 16,
                 Dims{16, 2, 128, 1},
                 {13, 1, 57, 1, 13, 2}},
        ImplCase{"hd64_gqa32_w30_s2_b8",
                 KvPolicy::Window(30, 2),
                 8,
                 Dims{32, 1, 64, 1},
                 {21, 1, 9, 40}}),
    [](const ::testing::TestParamInfo<ImplCase>& i) { return std::string(i.param.name); });

// The split-q bound is tight enough to reject q rounded to one bf16: the test above can fail.
TEST(AttentionImplTest, RoundedQueryExceedsTheSplitQueryBound) {
  const ImplCase c{
      "hd64", KvPolicy::Window(9, 3, PositionMode::kRolling), 4, Dims{9, 3, 64, 1}, {13, 1, 7}};
  const AttentionShape shape{9, 3, 64};
  if (!AttentionImplAvailable(AttentionImpl::kAvx512Bf16RoundedQ, shape, kv::KvDtype::kBF16)) {
    GTEST_SKIP() << "no AVX512_BF16 on this CPU";
  }
  const ImplComparison split_q = CompareImpl(c, AttentionImpl::kAvx512Bf16, std::ldexp(1.0, -16));
  const ImplComparison rounded_q =
      CompareImpl(c, AttentionImpl::kAvx512Bf16RoundedQ, std::ldexp(1.0, -16));
  std::printf("hd64 bf16 KV vs portable: max |error| split q %.3g, rounded q %.3g (bound %.3g)\n",
              split_q.max_err, rounded_q.max_err, split_q.max_bound);
  EXPECT_TRUE(split_q.within);
  EXPECT_FALSE(rounded_q.within) << "max error " << rounded_q.max_err;
  EXPECT_LT(split_q.max_err * 8, rounded_q.max_err);
}

TEST(AttentionImplTest, AutoPicksTheBf16DotKernelOnlyForBf16Kv) {
  const AttentionShape shape{9, 3, 64};
  EXPECT_NE(ResolveAttentionImpl(shape, kv::KvDtype::kF32), AttentionImpl::kAvx512Bf16);
  EXPECT_EQ(ResolveAttentionImpl(shape, kv::KvDtype::kBF16) == AttentionImpl::kAvx512Bf16,
            CpuHasAvx512Bf16());
  EXPECT_EQ(ResolveAttentionImpl(AttentionShape{4, 2, 8}, kv::KvDtype::kBF16),
            AttentionImpl::kPortable);
}

// A session of `length` tokens with random K/V in every layer and random queries for a chunk
// of the last `n` positions (one row of q_dim floats per query). The first length - n tokens are
// committed in chunks (a window session frees blocks behind them as the engine's would); the last
// n are the chunk of the current step: reserved, written, not committed, as during a step.
struct RandomSession {
  RandomSession(const Dims& d, int block_tokens, const KvPolicy& policy, kv::KvDtype dtype,
                TokenPos length, int queries, unsigned seed)
      : dims(d),
        pool({d.layers, d.kv_heads, d.hd, block_tokens, dtype},
             {.num_blocks = 4096, .poison_on_free = true}),
        session(&pool, policy, 1 << 20),
        rope(d.hd, d.hd, 10000.0, RopePairing::kInterleaved),
        pos0(length - queries),
        n(queries) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (TokenPos done = 0; done < length;) {
      const TokenPos left = done < pos0 ? pos0 - done : length - done;
      const auto chunk = static_cast<int>(done < pos0 ? std::min<TokenPos>(64, left) : left);
      EXPECT_EQ(session.Reserve(chunk), kv::ReserveResult::kOk);
      for (int l = 0; l < d.layers; ++l) {
        for (int t = 0; t < chunk; ++t) {
          std::vector<float> k(static_cast<std::size_t>(d.kv_dim())), v(k.size());
          for (float& x : k) x = nd(rng);
          for (float& x : v) x = nd(rng);
          session.WriteKv(l, done + t, k.data(), v.data());
        }
      }
      if (done < pos0) session.Commit(chunk);
      done += chunk;
    }
    q.resize(static_cast<std::size_t>(n * d.q_dim()));
    for (float& x : q) x = nd(rng);
  }
  // Outputs of `impl` for every query, layer 0, every kv head.
  std::vector<float> Attend(AttentionImpl impl, const RopeAngleRows* sink_angles) const {
    const AttentionShape shape{dims.heads, dims.kv_heads, dims.hd};
    std::vector<float> out(q.size(), -7.0f);
    std::vector<float> scratch(AttentionScratchFloats(shape, pos0 + n + 1));
    const auto stride = static_cast<std::size_t>(dims.q_dim());
    for (int g = 0; g < dims.kv_heads; ++g) {
      PagedAttention(shape, session.View(), KeysOf(session.policy(), pos0, n), rope, 0, g, q.data(),
                     out.data(), stride, stride, scratch.data(), impl, sink_angles);
    }
    return out;
  }

  // Outputs of `impl` for every query, `layer`, kv heads [kv_head, kv_head + kv_heads) in one
  // PagedAttentionHeads call (the other columns keep their fill).
  std::vector<float> AttendHeads(AttentionImpl impl, int layer, int kv_head, int kv_heads,
                                 const RopeAngleRows* sink_angles) const {
    const AttentionShape shape{dims.heads, dims.kv_heads, dims.hd};
    std::vector<float> out(q.size(), -7.0f);
    std::vector<float> scratch(AttentionScratchFloats(shape, pos0 + n + 1));
    const auto stride = static_cast<std::size_t>(dims.q_dim());
    PagedAttentionHeads(shape, session.View(), KeysOf(session.policy(), pos0, n), rope, layer,
                        kv_head, kv_heads, q.data(), out.data(), stride, stride, scratch.data(),
                        impl, sink_angles);
    return out;
  }
  // The same with one PagedAttention call per kv head.
  std::vector<float> AttendEachHead(AttentionImpl impl, int layer, int kv_head, int kv_heads,
                                    const RopeAngleRows* sink_angles) const {
    const AttentionShape shape{dims.heads, dims.kv_heads, dims.hd};
    std::vector<float> out(q.size(), -7.0f);
    std::vector<float> scratch(AttentionScratchFloats(shape, pos0 + n + 1));
    const auto stride = static_cast<std::size_t>(dims.q_dim());
    for (int g = kv_head; g < kv_head + kv_heads; ++g) {
      PagedAttention(shape, session.View(), KeysOf(session.policy(), pos0, n), rope, layer, g,
                     q.data(), out.data(), stride, stride, scratch.data(), impl, sink_angles);
    }
    return out;
  }

  Dims dims;
  kv::BlockPool pool;
  kv::SessionKv session;
  Rope rope;
  TokenPos pos0;
  int n;
  std::vector<float> q;
};

// Rolling positions: the sinks' rotation from angles the caller prepared once per step (what the
// engine passes) gives exactly the result of the kernel evaluating them per call, for every
// implementation, both pool dtypes, queries before and after the rolling gap opens.
TEST(PagedAttentionTest, PreparedSinkAnglesGiveTheSameOutput) {
  const KvPolicy policy = KvPolicy::Window(24, 4, PositionMode::kRolling);
  const Dims d{6, 2, 64, 1};
  for (const kv::KvDtype dtype : {kv::KvDtype::kF32, kv::KvDtype::kBF16}) {
    const RandomSession rs(d, 16, policy, dtype, 70, 50, 5);
    const int pairs = rs.rope.num_pairs();
    std::vector<float> cos_rows(static_cast<std::size_t>(rs.n * pairs), 0.0f);
    std::vector<float> sin_rows(cos_rows.size(), 0.0f);
    int rolling_rows = 0;
    for (int i = 0; i < rs.n; ++i) {
      const TokenPos p = rs.pos0 + i;
      if (!policy.RollingGap(p)) continue;
      ++rolling_rows;
      rs.rope.Angles(policy.sinks + policy.window - 1 - p,
                     &cos_rows[static_cast<std::size_t>(i * pairs)],
                     &sin_rows[static_cast<std::size_t>(i * pairs)]);
    }
    ASSERT_GT(rolling_rows, 0);
    ASSERT_LT(rolling_rows, rs.n) << "some queries must come before the gap opens";
    const RopeAngleRows angles{cos_rows.data(), sin_rows.data(), static_cast<std::size_t>(pairs)};
    const AttentionShape shape{d.heads, d.kv_heads, d.hd};
    for (const AttentionImpl impl :
         {AttentionImpl::kPortable, AttentionImpl::kAvx512, AttentionImpl::kAvx2,
          AttentionImpl::kAvx512Bf16, AttentionImpl::kAvx512Bf16RoundedQ}) {
      if (!AttentionImplAvailable(impl, shape, dtype)) continue;
      EXPECT_EQ(rs.Attend(impl, &angles), rs.Attend(impl, nullptr))
          << ToString(impl) << " " << kv::ToString(dtype);
    }
  }
}

// PagedAttentionHeads over a range of kv heads equals one PagedAttention call per kv head, bit for
// bit (the kv heads walking the blocks together do the same arithmetic in the same order; only the
// order of memory reads changes), and writes no column outside those heads' groups: for every
// implementation and dtype, ranges of kv heads that are all, a prefix, a middle or one head, groups
// that fit one register tile and groups that do not (the kernel's fallback), blocks of 16, 7 and
// 64 tokens (more rows than a walk prefetches), window + sinks with rolling positions (the sinks'
// query rotated for every head), layers past the first, and chunks of one and of several queries.
struct HeadsCase {
  const char* name;
  KvPolicy policy;
  int block_tokens;
  Dims dims;
  TokenPos length;
  int queries;
};

class AttentionHeadsTest : public ::testing::TestWithParam<HeadsCase> {};

TEST_P(AttentionHeadsTest, HeadsTogetherEqualOneCallPerHead) {
  const HeadsCase& c = GetParam();
  const AttentionShape shape{c.dims.heads, c.dims.kv_heads, c.dims.hd};
  for (const kv::KvDtype dtype : {kv::KvDtype::kF32, kv::KvDtype::kBF16}) {
    const RandomSession rs(c.dims, c.block_tokens, c.policy, dtype, c.length, c.queries, 17);
    const int pairs = rs.rope.num_pairs();
    std::vector<float> cos_rows(static_cast<std::size_t>(rs.n * pairs), 0.0f);
    std::vector<float> sin_rows(cos_rows.size(), 0.0f);
    for (int i = 0; i < rs.n; ++i) {
      const TokenPos p = rs.pos0 + i;
      if (!c.policy.RollingGap(p)) continue;
      rs.rope.Angles(c.policy.sinks + c.policy.window - 1 - p,
                     &cos_rows[static_cast<std::size_t>(i) * static_cast<std::size_t>(pairs)],
                     &sin_rows[static_cast<std::size_t>(i) * static_cast<std::size_t>(pairs)]);
    }
    const RopeAngleRows angles{cos_rows.data(), sin_rows.data(), static_cast<std::size_t>(pairs)};
    const int kvh = c.dims.kv_heads;
    const std::vector<std::pair<int, int>> ranges = {
        {0, kvh}, {0, std::max(1, kvh - 1)}, {kvh / 2, kvh - kvh / 2}, {kvh - 1, 1}};
    for (const AttentionImpl impl :
         {AttentionImpl::kPortable, AttentionImpl::kAvx512, AttentionImpl::kAvx2,
          AttentionImpl::kAvx512Bf16, AttentionImpl::kAvx512Bf16RoundedQ}) {
      if (!AttentionImplAvailable(impl, shape, dtype)) continue;
      for (const auto& [first, count] : ranges) {
        for (int layer = 0; layer < c.dims.layers; ++layer) {
          const std::vector<float> together = rs.AttendHeads(impl, layer, first, count, &angles);
          EXPECT_EQ(together, rs.AttendEachHead(impl, layer, first, count, &angles))
              << c.name << " " << ToString(impl) << " " << kv::ToString(dtype) << " kv heads ["
              << first << ", " << first + count << ") layer " << layer;
          // Columns of other kv heads keep their fill; those of these heads were all written.
          const int group = shape.group();
          for (std::size_t i = 0; i < together.size(); ++i) {
            const auto head =
                static_cast<int>(i % static_cast<std::size_t>(c.dims.q_dim())) / c.dims.hd / group;
            const bool inside = head >= first && head < first + count;
            ASSERT_EQ(together[i] == -7.0f, !inside)
                << c.name << " " << ToString(impl) << " output " << i;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    ShapesAndPolicies, AttentionHeadsTest,
    ::testing::Values(
        // smol-135m's shape, decode queries at 512 and at an odd length mid-block.
        HeadsCase{"hd64_gqa3_full_b16", KvPolicy::Full(), 16, Dims{9, 3, 64, 2}, 513, 1},
        HeadsCase{"hd64_gqa3_full_b16_odd", KvPolicy::Full(), 16, Dims{9, 3, 64, 1}, 77, 1},
        HeadsCase{"hd64_gqa3_w100_s4_roll_b16", KvPolicy::Window(100, 4, PositionMode::kRolling),
                  16, Dims{9, 3, 64, 2}, 301, 1},
        HeadsCase{"hd64_gqa2_w37_s3_roll_b7_chunk", KvPolicy::Window(37, 3, PositionMode::kRolling),
                  7, Dims{8, 4, 64, 1}, 120, 5},
        HeadsCase{"hd32_mha_full_b64", KvPolicy::Full(), 64, Dims{4, 4, 32, 1}, 200, 1},
        HeadsCase{"hd128_gqa2_w50_s2_b16", KvPolicy::Window(50, 2), 16, Dims{6, 3, 128, 1}, 130, 3},
        // Groups larger than a register tile (5 at head dim 64, 3 at 128): one head at a time.
        HeadsCase{"hd64_gqa5_full_b16", KvPolicy::Full(), 16, Dims{10, 2, 64, 1}, 90, 1},
        HeadsCase{"hd128_gqa3_full_b5", KvPolicy::Full(), 5, Dims{6, 2, 128, 1}, 41, 2},
        // Qwen3-30B-A3B's group of 8 at head dim 128: a decode query's four tiles in one walk.
        HeadsCase{"hd128_gqa8_w60_s4_roll_b16", KvPolicy::Window(60, 4, PositionMode::kRolling), 16,
                  Dims{16, 2, 128, 1}, 150, 1},
        HeadsCase{"hd8_portable_full_b3", KvPolicy::Full(), 3, Dims{4, 2, 8, 1}, 41, 1}),
    [](const ::testing::TestParamInfo<HeadsCase>& i) { return std::string(i.param.name); });

// Flash-decoding: one query's visible keys cut into slices of `slice_keys` (the last may be
// shorter), each attended alone (over one kv head, or over all kv heads at once), then merged,
// equal the unsplit kernel and the portable reference
// within fp32 rounding; for every implementation, window and full policies, sinks (slices that
// cut the sink range and the window apart), rolling positions, slice sizes that do and do not
// divide the visible count, and blocks the slices cut mid-block.
struct SliceCase {
  const char* name;
  KvPolicy policy;
  int block_tokens;
  Dims dims;
  TokenPos length;
};

class AttentionSliceTest : public ::testing::TestWithParam<SliceCase> {};

TEST_P(AttentionSliceTest, MergedSlicesEqualTheUnsplitKernel) {
  const SliceCase& c = GetParam();
  const AttentionShape shape{c.dims.heads, c.dims.kv_heads, c.dims.hd};
  const int group = shape.group();
  const auto group_floats = static_cast<std::size_t>(group * c.dims.hd);
  for (const kv::KvDtype dtype : {kv::KvDtype::kF32, kv::KvDtype::kBF16}) {
    const RandomSession rs(c.dims, c.block_tokens, c.policy, dtype, c.length, 1, 11);
    const TokenPos p = rs.pos0;
    const std::int64_t visible = c.policy.VisibleKeys(p);
    const std::vector<float> reference = rs.Attend(AttentionImpl::kPortable, nullptr);
    std::vector<float> scratch(AttentionScratchFloats(shape, visible + 1));
    for (const AttentionImpl impl :
         {AttentionImpl::kPortable, AttentionImpl::kAvx512, AttentionImpl::kAvx2,
          AttentionImpl::kAvx512Bf16, AttentionImpl::kAvx512Bf16RoundedQ}) {
      if (!AttentionImplAvailable(impl, shape, dtype)) continue;
      const std::vector<float> unsplit = rs.Attend(impl, nullptr);
      // The q roundoff of the bf16 dot kernels moves them off the portable reference (bounded in
      // AttentionImplTest); the split must not add to it beyond fp32 rounding.
      const double to_reference = impl == AttentionImpl::kAvx512Bf16RoundedQ ? 5e-2
                                  : impl == AttentionImpl::kAvx512Bf16       ? 2e-3
                                                                             : 1e-5;
      for (const std::int64_t slice_keys : {std::int64_t{1}, std::int64_t{7}, std::int64_t{16},
                                            std::int64_t{64}, visible - 1, visible}) {
        if (slice_keys < 1) continue;
        const auto count = static_cast<int>((visible + slice_keys - 1) / slice_keys);
        // Slices of one kv head, and of all kv heads at once (what the engine runs for one long
        // session).
        for (const int span : {1, c.dims.kv_heads}) {
          const auto span_floats = static_cast<std::size_t>(span) * group_floats;
          std::vector<float> outs(static_cast<std::size_t>(count) * span_floats, -9.0f);
          std::vector<float> stats(static_cast<std::size_t>(count * 2 * group * span), -9.0f);
          for (int g = 0; g + span <= c.dims.kv_heads; g += span) {
            for (int s = 0; s < count; ++s) {
              const AttentionKeySlice slice{s * slice_keys, std::min(visible, (s + 1) * slice_keys),
                                            &outs[static_cast<std::size_t>(s) * span_floats],
                                            &stats[static_cast<std::size_t>(s * 2 * group * span)]};
              PagedAttentionSlice(shape, rs.session.View(), c.policy.KeysOf(p), rs.rope, 0, g, span,
                                  rs.q.data(), slice, scratch.data(), impl);
            }
            std::vector<float> merged(span_floats, -5.0f);
            MergeAttentionSlices(shape, span, outs.data(), stats.data(), count, merged.data());
            for (std::size_t i = 0; i < span_floats; ++i) {
              const std::size_t col = static_cast<std::size_t>(g) * group_floats + i;
              ASSERT_NEAR(merged[i], unsplit[col], 1e-5)
                  << c.name << " " << ToString(impl) << " " << kv::ToString(dtype) << " slices of "
                  << slice_keys << " of " << visible << " keys over " << span
                  << " kv heads, output " << col;
              ASSERT_NEAR(merged[i], reference[col], to_reference)
                  << c.name << " " << ToString(impl) << " " << kv::ToString(dtype) << " slices of "
                  << slice_keys << " of " << visible << " keys over " << span
                  << " kv heads, output " << col;
            }
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    ShapesAndPolicies, AttentionSliceTest,
    ::testing::Values(
        SliceCase{"hd64_gqa3_full_b16", KvPolicy::Full(), 16, Dims{9, 3, 64, 1}, 300},
        SliceCase{"hd64_gqa3_w100_s4_roll_b16", KvPolicy::Window(100, 4, PositionMode::kRolling),
                  16, Dims{6, 2, 64, 1}, 400},
        SliceCase{"hd128_gqa2_w37_s3_b5", KvPolicy::Window(37, 3), 5, Dims{4, 2, 128, 1}, 90},
        SliceCase{"hd16_mha_w20_s2_roll_b4", KvPolicy::Window(20, 2, PositionMode::kRolling), 4,
                  Dims{4, 4, 16, 1}, 61},
        SliceCase{"hd32_gqa8_w50_s0_b20", KvPolicy::Window(50, 0), 20, Dims{8, 1, 32, 1}, 130},
        SliceCase{"hd128_gqa8_w60_s4_roll_b16", KvPolicy::Window(60, 4, PositionMode::kRolling), 16,
                  Dims{16, 2, 128, 1}, 150},
        SliceCase{"hd8_portable_full_b3", KvPolicy::Full(), 3, Dims{4, 2, 8, 1}, 41},
        SliceCase{"hd64_before_the_gap_roll", KvPolicy::Window(64, 4, PositionMode::kRolling), 16,
                  Dims{9, 3, 64, 1}, 50}),
    [](const ::testing::TestParamInfo<SliceCase>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace metronome::kernels
