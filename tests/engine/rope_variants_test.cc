// The engine with every rope variant real GGUFs carry (Llama 3.1+ rope_freqs, linear, YaRN; each
// with both pairings) against a scalar forward pass written out here in double from the
// definitions, not from the engine's code: full attention, and window + sinks with rolling
// positions (sink keys seen from S + W - 1 once a gap exists, window keys from the query's own
// position). The reference's rope: pair i's frequency theta^(-2i/d) / factor_i, times 1/s for
// linear scaling s; YaRN blends that with the unscaled one by a ramp between the dims where a pair
// turns 32 resp. 1 times over the original context, and q and k are scaled by 1 + 0.1 ln s.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <random>
#include <vector>

#include "metronome/engine/engine.h"
#include "metronome/engine/feed.h"
#include "metronome/model/model.h"
#include "metronome/model/weights.h"
#include "metronome/quant/weight_matrix.h"

namespace metronome::engine {
namespace {

using Vec = std::vector<double>;

double RefFrequency(const model::ModelConfig& c, int i) {
  const int d = c.rotary_dim();
  double f = std::pow(c.rope_theta, -2.0 * i / d);
  if (!c.rope_freq_factors.empty()) f /= c.rope_freq_factors[static_cast<std::size_t>(i)];
  const double s = c.rope_scaling == model::RopeScaling::kNone ? 1.0 : c.rope_scaling_factor;
  if (c.rope_scaling != model::RopeScaling::kYarn) return f / s;
  const double orig = c.yarn_original_context();
  const auto dim_turning = [&](double turns) {
    return d * std::log(orig / (turns * 2.0 * std::numbers::pi)) / (2.0 * std::log(c.rope_theta));
  };
  const double low = std::max(0.0, std::floor(dim_turning(32.0)));
  const double high = std::min(d - 1.0, std::ceil(dim_turning(1.0)));
  const double keep = 1.0 - std::clamp((i - low) / std::max(0.001, high - low), 0.0, 1.0);
  return (f / s) * (1.0 - keep) + f * keep;
}

double RefMagnitude(const model::ModelConfig& c) {
  double m = c.rope_attn_factor;
  if (c.rope_scaling == model::RopeScaling::kYarn && c.rope_scaling_factor > 1.0) {
    m *= 1.0 + 0.1 * std::log(c.rope_scaling_factor);
  }
  return m;
}

// One head's vector placed at `pos`.
Vec Rotated(const model::ModelConfig& c, const double* x, double pos) {
  Vec out(x, x + c.head_dim);
  const int pairs = c.rotary_dim() / 2;
  const double m = RefMagnitude(c);
  for (int i = 0; i < pairs; ++i) {
    const bool neox = c.rope_style == model::RopeStyle::kNeox;
    const int a = neox ? i : 2 * i;
    const int b = neox ? i + pairs : 2 * i + 1;
    const double th = pos * RefFrequency(c, i);
    out[static_cast<std::size_t>(a)] = m * (x[a] * std::cos(th) - x[b] * std::sin(th));
    out[static_cast<std::size_t>(b)] = m * (x[a] * std::sin(th) + x[b] * std::cos(th));
  }
  return out;
}

Vec MatVec(const quant::WeightMatrix& w, const Vec& x) {
  const std::vector<float> rows = model::DequantizeRows(w, 0, w.rows);
  Vec y(static_cast<std::size_t>(w.rows));
  for (int r = 0; r < w.rows; ++r) {
    double s = 0.0;
    for (int k = 0; k < w.cols; ++k) s += rows[static_cast<std::size_t>(r) * w.cols + k] * x[k];
    y[static_cast<std::size_t>(r)] = s;
  }
  return y;
}

Vec GroupVec(const model::MatrixGroup& g, int rows, const Vec& x) {
  const std::vector<float> w = model::DequantizeRows(g, 0, rows);
  const auto cols = static_cast<int>(x.size());
  Vec y(static_cast<std::size_t>(rows));
  for (int r = 0; r < rows; ++r) {
    double s = 0.0;
    for (int k = 0; k < cols; ++k) s += w[static_cast<std::size_t>(r) * cols + k] * x[k];
    y[static_cast<std::size_t>(r)] = s;
  }
  return y;
}

Vec RmsNorm(const Vec& x, const float* w, double eps) {
  double ss = 0.0;
  for (const double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  Vec y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * w[i];
  return y;
}

// qwen3: each head_dim slice of `v` RMS-normalised with the same weights.
void NormHeads(Vec& v, const float* w, int head_dim, double eps) {
  for (std::size_t h = 0; h * head_dim < v.size(); ++h) {
    const auto begin = v.begin() + static_cast<std::ptrdiff_t>(h * head_dim);
    const Vec y = RmsNorm(Vec(begin, begin + head_dim), w, eps);
    std::copy(y.begin(), y.end(), begin);
  }
}

// SwiGLU FFN of hidden width `ffn` over `xn`: gate|up rows of `gate_up`, then `down`.
Vec SwiGluFfn(const model::MatrixGroup& gate_up, const quant::WeightMatrix& down, int ffn,
              const Vec& xn) {
  const Vec gu = GroupVec(gate_up, 2 * ffn, xn);
  Vec hidden(static_cast<std::size_t>(ffn));
  for (int i = 0; i < ffn; ++i) {
    const double gate = gu[i];
    hidden[i] = gate / (1.0 + std::exp(-gate)) * gu[static_cast<std::size_t>(ffn) + i];
  }
  return MatVec(down, hidden);
}

// qwen3moe's FFN from its definition: softmax over the router's logits, the k most probable
// experts, their probabilities renormalised to sum 1, the experts' SwiGLU outputs summed with
// those weights.
Vec MoeFfn(const model::ModelConfig& c, const model::LayerWeights& lw, const Vec& xn) {
  Vec p = MatVec(lw.router, xn);
  const double mx = *std::max_element(p.begin(), p.end());
  double total = 0.0;
  for (double& v : p) total += (v = std::exp(v - mx));
  for (double& v : p) v /= total;
  std::vector<int> order(p.size());
  for (std::size_t e = 0; e < order.size(); ++e) order[e] = static_cast<int>(e);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
  double chosen = 0.0;
  for (int j = 0; j < c.num_experts_used; ++j) chosen += p[order[j]];
  Vec out(static_cast<std::size_t>(c.dim), 0.0);
  for (int j = 0; j < c.num_experts_used; ++j) {
    const auto e = static_cast<std::size_t>(order[j]);
    const Vec y = SwiGluFfn(lw.expert_gate_up[e], lw.expert_down[e], c.expert_ffn_dim, xn);
    for (int i = 0; i < c.dim; ++i) out[i] += p[e] / chosen * y[i];
  }
  return out;
}

// Logits after every token. window 0: full attention; else window + sinks, rolling positions.
std::vector<Vec> ReferenceLogits(const model::Model& m, const std::vector<TokenId>& tokens,
                                 int window, int sinks) {
  const model::ModelConfig& c = m.config;
  const model::ModelWeights& w = *m.weights;
  const auto T = static_cast<int>(tokens.size());
  const int hd = c.head_dim;
  const int group = c.num_heads / c.num_kv_heads;
  std::vector<Vec> x(static_cast<std::size_t>(T));
  for (int t = 0; t < T; ++t) {
    const std::vector<float> e = model::DequantizeRows(w.token_embedding, tokens[t], 1);
    x[static_cast<std::size_t>(t)].assign(e.begin(), e.end());
  }
  for (const model::LayerWeights& lw : w.layers) {
    std::vector<Vec> q(static_cast<std::size_t>(T)), k(q.size()), v(q.size());
    for (int t = 0; t < T; ++t) {
      const Vec qkv = GroupVec(lw.wqkv, c.qkv_dim(), RmsNorm(x[t], lw.attn_norm, c.rms_eps));
      q[t].assign(qkv.begin(), qkv.begin() + c.q_dim());
      k[t].assign(qkv.begin() + c.q_dim(), qkv.begin() + c.q_dim() + c.kv_dim());
      v[t].assign(qkv.begin() + c.q_dim() + c.kv_dim(), qkv.end());
      if (c.has_qk_norm) {
        NormHeads(q[t], lw.q_norm, hd, c.rms_eps);
        NormHeads(k[t], lw.k_norm, hd, c.rms_eps);
      }
    }
    for (int p = 0; p < T; ++p) {
      // Visible keys and the position the query is seen from for each.
      std::vector<std::pair<int, double>> keys;
      const bool gap = window > 0 && p - window + 1 > sinks;
      for (int j = 0; j <= p; ++j) {
        if (!gap || j >= p - window + 1) {
          keys.emplace_back(j, p);
        } else if (j < sinks) {
          keys.emplace_back(j, sinks + window - 1);
        }
      }
      Vec att(static_cast<std::size_t>(c.q_dim()), 0.0);
      for (int h = 0; h < c.num_heads; ++h) {
        const int g = h / group;
        std::vector<double> scores;
        for (const auto& [j, qpos] : keys) {
          const Vec qr = Rotated(c, &q[p][static_cast<std::size_t>(h) * hd], qpos);
          const Vec kr = Rotated(c, &k[j][static_cast<std::size_t>(g) * hd], j);
          double s = 0.0;
          for (int i = 0; i < hd; ++i) s += qr[i] * kr[i];
          scores.push_back(s / std::sqrt(static_cast<double>(hd)));
        }
        const double mx = *std::max_element(scores.begin(), scores.end());
        double sum = 0.0;
        for (double& s : scores) sum += (s = std::exp(s - mx));
        for (std::size_t n = 0; n < keys.size(); ++n) {
          const int j = keys[n].first;
          for (int i = 0; i < hd; ++i) {
            att[static_cast<std::size_t>(h) * hd + i] +=
                scores[n] / sum * v[j][static_cast<std::size_t>(g) * hd + i];
          }
        }
      }
      const Vec o = MatVec(lw.wo, att);
      for (int i = 0; i < c.dim; ++i) x[p][i] += o[i];
    }
    for (int t = 0; t < T; ++t) {
      const Vec xn = RmsNorm(x[t], lw.ffn_norm, c.rms_eps);
      const Vec d =
          c.is_moe() ? MoeFfn(c, lw, xn) : SwiGluFfn(lw.w_gate_up, lw.w_down, c.ffn_dim, xn);
      for (int i = 0; i < c.dim; ++i) x[t][i] += d[i];
    }
  }
  std::vector<Vec> logits;
  for (int t = 0; t < T; ++t)
    logits.push_back(MatVec(w.output, RmsNorm(x[t], w.final_norm, c.rms_eps)));
  return logits;
}

std::vector<std::vector<float>> EngineLogits(const model::Model& m,
                                             const std::vector<TokenId>& tokens,
                                             const kv::KvPolicy& policy) {
  EngineOptions eo;
  eo.kv_dtype = kv::KvDtype::kF32;
  eo.kv_blocks = 256;
  eo.block_tokens = 4;
  Engine eng(m, eo);
  SessionOptions so;
  so.policy = policy;
  const SessionId sid = eng.OpenSession(so);
  std::vector<std::vector<float>> out(tokens.size());
  EXPECT_EQ(
      Feed(eng, sid, tokens, 7, true,
           [&](std::size_t i, std::span<const float> lg) { out[i].assign(lg.begin(), lg.end()); }),
      StepStatus::kOk);
  return out;
}

struct Variant {
  const char* name;
  void (*apply)(model::ModelConfig&);
};

const Variant kVariants[] = {
    {"plain", [](model::ModelConfig&) {}},
    {"llama3 rope_freqs",
     [](model::ModelConfig& c) {
       c.rope_theta = 500000.0;
       c.rope_freq_factors =
           model::Llama3RopeFreqFactors(c.rope_theta, c.rotary_dim(), 8.0, 1.0, 4.0, 8192.0);
     }},
    {"linear x4",
     [](model::ModelConfig& c) {
       c.rope_scaling = model::RopeScaling::kLinear;
       c.rope_scaling_factor = 4.0;
     }},
    {"yarn x4 from 24",
     [](model::ModelConfig& c) {
       c.rope_scaling = model::RopeScaling::kYarn;
       c.rope_scaling_factor = 4.0;
       c.rope_original_context = 24;
       c.rope_attn_factor = 1.1;
     }},
};

TEST(RopeVariantsTest, EngineMatchesScalarReferenceFullAndRolling) {
  std::mt19937 rng(3);
  std::vector<TokenId> tokens(40);
  for (TokenId& t : tokens) t = static_cast<TokenId>(rng() % 512);
  for (const bool neox : {false, true}) {
    for (const Variant& v : kVariants) {
      model::Model m = model::MakeSyntheticModel("tiny", 9);
      if (neox) m.config.rope_style = model::RopeStyle::kNeox;
      v.apply(m.config);
      m.config.Validate("test");
      for (const int window : {0, 9}) {
        const int sinks = 3;
        const kv::KvPolicy policy =
            window == 0 ? kv::KvPolicy::Full()
                        : kv::KvPolicy::Window(window, sinks, kv::PositionMode::kRolling);
        const std::vector<Vec> want = ReferenceLogits(m, tokens, window, sinks);
        const std::vector<std::vector<float>> got = EngineLogits(m, tokens, policy);
        double max_diff = 0.0;
        for (std::size_t t = 0; t < tokens.size(); ++t) {
          ASSERT_EQ(got[t].size(), want[t].size());
          for (std::size_t i = 0; i < want[t].size(); ++i) {
            max_diff = std::max(max_diff, std::abs(got[t][i] - want[t][i]));
          }
        }
        EXPECT_LT(max_diff, 2e-4) << v.name << (neox ? " neox" : " interleaved")
                                  << (window == 0 ? " full" : " window 9 + 3 sinks, rolling");
      }
    }
  }
}

// max |got - want| over every position, relative to the largest reference logit (the qwen3
// preset's tied embeddings make logits of ~100).
double MaxRelativeDiff(const std::vector<std::vector<float>>& got, const std::vector<Vec>& want) {
  double diff = 0.0;
  double largest = 0.0;
  for (std::size_t t = 0; t < want.size(); ++t) {
    EXPECT_EQ(got[t].size(), want[t].size());
    for (std::size_t i = 0; i < want[t].size() && i < got[t].size(); ++i) {
      diff = std::max(diff, std::abs(got[t][i] - want[t][i]));
      largest = std::max(largest, std::abs(want[t][i]));
    }
  }
  return diff / largest;
}

// qwen3 (per-head q/k norms before NeoX RoPE, head_dim 64 != dim / heads = 32) and qwen3moe (8
// experts, 2 per token) against the reference, full attention and window + sinks.
TEST(Qwen3ReferenceTest, EngineMatchesScalarReference) {
  std::mt19937 rng(5);
  std::vector<TokenId> tokens(24);
  for (TokenId& t : tokens) t = static_cast<TokenId>(rng() % 4096);
  for (const char* preset : {"qwen3-small", "qwen3moe-small"}) {
    const model::Model m = model::MakeSyntheticModel(preset, 11);
    ASSERT_TRUE(m.config.has_qk_norm);
    ASSERT_NE(m.config.q_dim(), m.config.dim);
    for (const int window : {0, 7}) {
      const int sinks = 2;
      const kv::KvPolicy policy =
          window == 0 ? kv::KvPolicy::Full()
                      : kv::KvPolicy::Window(window, sinks, kv::PositionMode::kRolling);
      const double rel = MaxRelativeDiff(EngineLogits(m, tokens, policy),
                                         ReferenceLogits(m, tokens, window, sinks));
      EXPECT_LT(rel, 1e-5) << preset << (window == 0 ? " full" : " window 7 + 2 sinks");
    }
  }
}

// The reference's qwen3 parts matter: without the q/k norms, or with the router's top-k weights
// left unnormalised, its logits move by far more than the tolerance above.
TEST(Qwen3ReferenceTest, NormsAndRenormalisationChangeTheLogits) {
  std::vector<TokenId> tokens = {5, 900, 17, 2048, 33, 4000, 1, 77};
  const model::Model dense = model::MakeSyntheticModel("qwen3-small", 11);
  model::Model no_norm = model::MakeSyntheticModel("qwen3-small", 11);
  no_norm.config.has_qk_norm = false;
  std::vector<std::vector<float>> without(tokens.size());
  const std::vector<Vec> ref_without = ReferenceLogits(no_norm, tokens, 0, 0);
  for (std::size_t t = 0; t < tokens.size(); ++t) {
    without[t].assign(ref_without[t].begin(), ref_without[t].end());
  }
  EXPECT_GT(MaxRelativeDiff(without, ReferenceLogits(dense, tokens, 0, 0)), 1e-2);

  // Every expert used: the renormalised top-k is then the plain softmax mixture, a different
  // model from top-2 of 8.
  const model::Model moe = model::MakeSyntheticModel("qwen3moe-small", 11);
  model::Model all = model::MakeSyntheticModel("qwen3moe-small", 11);
  all.config.num_experts_used = all.config.num_experts;
  const std::vector<std::vector<float>> got_all = EngineLogits(all, tokens, kv::KvPolicy::Full());
  EXPECT_LT(MaxRelativeDiff(got_all, ReferenceLogits(all, tokens, 0, 0)), 1e-5);
  EXPECT_GT(MaxRelativeDiff(got_all, ReferenceLogits(moe, tokens, 0, 0)), 1e-2);
}

// The variants must change the logits (a test that passes with the variant ignored would be
// worthless): each differs from plain rope by far more than the tolerance above.
TEST(RopeVariantsTest, EveryVariantChangesTheLogits) {
  std::vector<TokenId> tokens(30);
  std::mt19937 rng(4);
  for (TokenId& t : tokens) t = static_cast<TokenId>(rng() % 512);
  const model::Model plain = model::MakeSyntheticModel("tiny", 9);
  const std::vector<Vec> base = ReferenceLogits(plain, tokens, 0, 0);
  for (const Variant& v : kVariants) {
    if (std::string_view(v.name) == "plain") continue;
    model::Model m = model::MakeSyntheticModel("tiny", 9);
    v.apply(m.config);
    const std::vector<Vec> other = ReferenceLogits(m, tokens, 0, 0);
    double max_diff = 0.0;
    for (std::size_t t = 0; t < tokens.size(); ++t) {
      for (std::size_t i = 0; i < base[t].size(); ++i) {
        max_diff = std::max(max_diff, std::abs(base[t][i] - other[t][i]));
      }
    }
    EXPECT_GT(max_diff, 1e-2) << v.name;
  }
}

}  // namespace
}  // namespace metronome::engine
