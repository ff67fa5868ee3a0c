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
#include <vector>

#include "metronome/base/half.h"
#include "metronome/kernels/cpu_features.h"
#include "metronome/kv/session_kv.h"

namespace metronome::kernels {
namespace {

using kv::KvPolicy;
using kv::PositionMode;

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
        rope_(d.hd, d.hd, 10000.0, model::RopeStyle::kInterleaved),
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
        PagedAttention(shape, session_.View(), policy_, rope_, l, g, pos0, n, q.data(), out.data(),
                       static_cast<std::size_t>(d_.q_dim()), static_cast<std::size_t>(d_.q_dim()),
                       scratch.data());
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
ImplComparison CompareImpl(const ImplCase& c, AttentionImpl impl, double u_q) {
  const Dims& d = c.dims;
  kv::BlockPool pool({d.layers, d.kv_heads, d.hd, c.block_tokens, kv::KvDtype::kBF16},
                     {.num_blocks = 512, .poison_on_free = true});
  kv::SessionKv session(&pool, c.policy, 1 << 20);
  const Rope rope(d.hd, d.hd, 10000.0, model::RopeStyle::kInterleaved);
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
      for (int g = 0; g < d.kv_heads; ++g) {
        const auto stride = static_cast<std::size_t>(d.q_dim());
        PagedAttention(shape, session.View(), c.policy, rope, l, g, pos0, n, ql.data(), got.data(),
                       stride, stride, scratch.data(), impl);
        PagedAttention(shape, session.View(), c.policy, rope, l, g, pos0, n, ql.data(), want.data(),
                       stride, stride, scratch.data(), AttentionImpl::kPortable);
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
       {AttentionImpl::kAvx512, AttentionImpl::kAvx512Bf16, AttentionImpl::kAvx512Bf16RoundedQ}) {
    if (!AttentionImplAvailable(impl, shape, kv::KvDtype::kBF16)) continue;
    ++ran;
    const ImplComparison r = CompareImpl(c, impl, RoundoffOfQ(impl));
    EXPECT_TRUE(r.within) << c.name << " " << ToString(impl) << ": max error " << r.max_err
                          << ", bound up to " << r.max_bound;
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
                 {300, 1, 1, 211, 1}}),
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

}  // namespace
}  // namespace metronome::kernels
