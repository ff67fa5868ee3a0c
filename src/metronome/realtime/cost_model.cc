#include "metronome/realtime/cost_model.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <system_error>
#include <vector>

#include "metronome/base/byte_io.h"
#include "metronome/base/check.h"
#include "metronome/base/errors.h"

namespace metronome::realtime {

CostModelBackend::CostModelBackend(const CostModel& cost, std::int64_t num_blocks, int block_tokens)
    : cost_(cost), pool_({1, 1, 1, block_tokens}, {.num_blocks = static_cast<int>(num_blocks)}) {}

std::unique_ptr<kv::SessionKv> CostModelBackend::NewSession(const kv::KvPolicy& policy,
                                                            TokenPos max_context) {
  policy.Validate();
  const bool limited = policy.mode == kv::KvMode::kFull && max_context > 0;
  return std::make_unique<kv::SessionKv>(
      &pool_, policy, limited ? max_context : std::numeric_limits<TokenPos>::max() / 4);
}

BackendSessionId CostModelBackend::Open(const kv::KvPolicy& policy, TokenPos max_context) {
  auto kv = NewSession(policy, max_context);
  const BackendSessionId id = next_id_++;
  sessions_.emplace(id, std::move(kv));
  return id;
}

std::vector<std::byte> CostModelBackend::ExportSession(BackendSessionId id) const {
  const auto it = sessions_.find(id);
  if (it == sessions_.end()) return {};
  base::ByteWriter out;
  kv::EncodeSnapshot(it->second->Snapshot(), pool_.layout(), &out);
  return out.Take();
}

BackendImport CostModelBackend::ImportSession(const kv::KvPolicy& policy, TokenPos max_context,
                                              std::span<const std::byte> state) {
  BackendImport result;
  base::ByteReader in(state);
  kv::SessionKvSnapshot snapshot;
  if (!kv::DecodeSnapshot(&in, pool_.layout(), &snapshot, &result.error)) return result;
  auto kv = NewSession(policy, max_context);
  std::string error;
  const kv::RestoreResult restored = kv->Restore(snapshot, &error);
  if (restored == kv::RestoreResult::kOk) sessions_.emplace(next_id_, std::move(kv));
  return ImportOf(restored, restored == kv::RestoreResult::kOk ? next_id_++ : 0, error);
}

std::string CostModelBackend::model_identity() const {
  char text[160];
  std::snprintf(text, sizeof text, "sim:%.9g,%.9g,%.9g,%d", cost_.c0_s, cost_.c1_s_per_token,
                cost_.c2_s_per_kv_token, pool_.layout().block_tokens);
  return text;
}

void CostModelBackend::Close(BackendSessionId id) {
  const auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  sessions_.erase(it);
}

double CostModelBackend::Step(std::span<const BackendItem> items,
                              std::vector<BackendItemResult>* out) {
  out->assign(items.size(), BackendItemResult{});
  double batch_tokens = 0.0;
  double visible = 0.0;
  std::vector<std::pair<kv::SessionKv*, int>> commits;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const auto it = sessions_.find(items[i].session);
    if (it == sessions_.end()) {
      (*out)[i].status = StepStatus::kUnknownSession;
      continue;
    }
    kv::SessionKv& kv = *it->second;
    const int n = static_cast<int>(items[i].tokens.size());
    switch (kv.Reserve(n)) {
      case kv::ReserveResult::kOk:
        break;
      case kv::ReserveResult::kPoolExhausted:
        (*out)[i].status = StepStatus::kPoolExhausted;
        continue;
      case kv::ReserveResult::kContextFull:
        (*out)[i].status = StepStatus::kContextFull;
        continue;
    }
    visible += static_cast<double>(kv.policy().VisibleKeysOfChunk(kv.length(), n));
    batch_tokens += n;
    commits.emplace_back(&kv, n);
    // A deterministic stand-in for the model's output.
    (*out)[i].next_token = static_cast<TokenId>((kv.length() + n) % 997);
  }
  for (auto& [kv, n] : commits) kv->Commit(n);
  return items.empty() ? 0.0 : cost_.StepSeconds(batch_tokens, visible);
}

kv::PoolStats CostModelBackend::pool() const {
  return kv::PoolStatsOf(pool_, static_cast<std::int64_t>(sessions_.size()));
}

std::int64_t CostModelBackend::resident_blocks(BackendSessionId id) const {
  const auto it = sessions_.find(id);
  return it == sessions_.end() ? 0 : it->second->resident_blocks();
}

namespace {

constexpr std::size_t kTerms = 3;  // c0 (constant), c1 (per batch token), c2 (per visible KV token)
constexpr std::array<const char*, kTerms> kTermNames = {"the constant term", "batch_tokens",
                                                        "visible_kv_tokens"};
constexpr std::array<const char*, kTerms> kJsonFields = {"c0_s", "c1_s_per_token",
                                                         "c2_s_per_kv_token"};

// A term whose scaled Cholesky pivot falls below this is taken as a linear combination of the
// terms before it: the pivot is 1 - R^2 of regressing that (unit-RMS) column on the earlier ones,
// so 1e-9 means the column's own variation is ~3e-5 of its size, far below any timing noise.
constexpr double kMinPivot = 1e-9;

using Matrix = std::array<std::array<double, kTerms>, kTerms>;
using Vector = std::array<double, kTerms>;

double Term(const StepObservation& p, std::size_t j) {
  return j == 0 ? 1.0 : (j == 1 ? p.batch_tokens : p.visible_kv_tokens);
}

void ValidatePoint(const StepObservation& p, std::size_t i) {
  const auto bad = [&](const char* field, double v, const char* want) {
    std::string msg = "cost model fit: point ";
    msg += std::to_string(i);
    msg += ": ";
    msg += field;
    msg += " = " + FormatValue(v) + " must be " + want;
    return ConfigError(msg);
  };
  if (!std::isfinite(p.batch_tokens) || p.batch_tokens < 0.0) {
    throw bad("batch_tokens", p.batch_tokens, "finite and >= 0");
  }
  if (!std::isfinite(p.visible_kv_tokens) || p.visible_kv_tokens < 0.0) {
    throw bad("visible_kv_tokens", p.visible_kv_tokens, "finite and >= 0");
  }
  if (!std::isfinite(p.seconds) || p.seconds <= 0.0) {
    throw bad("seconds", p.seconds, "finite and > 0");
  }
}

// Cholesky factor l of g restricted to the m terms idx[0..m): l l^T = g[idx][idx]. Returns the
// position of the first pivot below kMinPivot (that term is a linear combination of the earlier
// ones), or m when the submatrix is positive definite.
std::size_t Cholesky(const Matrix& g, const std::array<std::size_t, kTerms>& idx, std::size_t m,
                     Matrix* l) {
  *l = Matrix{};
  for (std::size_t a = 0; a < m; ++a) {
    for (std::size_t b = 0; b <= a; ++b) {
      double s = g[idx[a]][idx[b]];
      for (std::size_t k = 0; k < b; ++k) s -= (*l)[a][k] * (*l)[b][k];
      if (a != b) {
        (*l)[a][b] = s / (*l)[b][b];
      } else if (s >= kMinPivot) {
        (*l)[a][a] = std::sqrt(s);
      } else {
        return a;
      }
    }
  }
  return m;
}

// Solves g x = r for the terms in `mask` (bit j: term j); the other entries of x are 0. The
// submatrix is positive definite because the full matrix passed CheckNotDegenerate.
Vector SolveSubset(const Matrix& g, const Vector& r, unsigned mask) {
  std::array<std::size_t, kTerms> idx{};
  std::size_t m = 0;
  for (std::size_t j = 0; j < kTerms; ++j) {
    if (((mask >> j) & 1U) != 0) idx[m++] = j;
  }
  Matrix l;
  Cholesky(g, idx, m, &l);
  Vector y{};  // forward: l y = r[idx]
  for (std::size_t a = 0; a < m; ++a) {
    double s = r[idx[a]];
    for (std::size_t k = 0; k < a; ++k) s -= l[a][k] * y[k];
    y[a] = s / l[a][a];
  }
  Vector x{};  // backward: l^T x[idx] = y
  for (std::size_t a = m; a-- > 0;) {
    double s = y[a];
    for (std::size_t k = a + 1; k < m; ++k) s -= l[k][a] * x[idx[k]];
    x[idx[a]] = s / l[a][a];
  }
  return x;
}

// Throws when some term is all zero or (nearly) a linear combination of the terms before it.
void CheckNotDegenerate(const Matrix& g, const Vector& scale, std::size_t n) {
  std::string msg = "cost model fit: degenerate design over " + std::to_string(n) + " points: ";
  const char* hint = "; measure points that vary the batch size, the context and the chunk size";
  for (std::size_t j = 0; j < kTerms; ++j) {
    if (scale[j] == 0.0) {
      msg += kTermNames[j];
      msg += " is 0 at every point";
      msg += hint;
      throw ConfigError(msg);
    }
  }
  Matrix l;
  const std::size_t bad = Cholesky(g, {0, 1, 2}, kTerms, &l);
  if (bad < kTerms) {
    msg += kTermNames[bad];
    msg += bad == 1 ? " is (nearly) constant"
                    : " is (nearly) a linear combination of batch_tokens and a constant";
    msg += hint;
    throw ConfigError(msg);
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t h = v.size() / 2;
  return v.size() % 2 == 1 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

// The weighted, column-scaled normal equations g c = r of the points (c: the coefficients times
// `scale`).
struct NormalEquations {
  Vector scale{};
  Matrix g{};
  Vector r{};
};

NormalEquations BuildNormalEquations(std::span<const StepObservation> points) {
  const std::size_t n = points.size();
  NormalEquations e;
  // Column scaling: each term divided by its RMS over the points, so the normal matrix has a unit
  // diagonal (batch_tokens ~ 1e1..1e3 and visible_kv_tokens ~ 1e2..1e6 would otherwise make it
  // ill-conditioned). Sums are divided by n to keep magnitudes near 1.
  for (const StepObservation& p : points) {
    for (std::size_t j = 0; j < kTerms; ++j) {
      e.scale[j] += Term(p, j) * Term(p, j) / (p.seconds * p.seconds);
    }
  }
  for (double& s : e.scale) s = std::sqrt(s / static_cast<double>(n));
  for (const StepObservation& p : points) {
    Vector x{};
    for (std::size_t j = 0; j < kTerms; ++j) {
      x[j] = e.scale[j] > 0.0 ? Term(p, j) / e.scale[j] : 0.0;
    }
    // Weight 1/t^2: the fit minimises relative error, so a 40 us decode step counts as much as
    // a 20 ms prefill (unweighted, the big steps dominate and small ones come out several x off).
    const double w = 1.0 / (p.seconds * p.seconds);
    for (std::size_t a = 0; a < kTerms; ++a) {
      e.r[a] += w * x[a] * p.seconds / static_cast<double>(n);
      for (std::size_t b = 0; b < kTerms; ++b) {
        e.g[a][b] += w * x[a] * x[b] / static_cast<double>(n);
      }
    }
  }
  return e;
}

// Non-negative least squares by enumeration: 7 subsets of 3 terms. The constant-only fit (mean
// of the seconds, > 0) is always feasible, so a best feasible subset exists.
CostModel BestNonNegativeFit(const NormalEquations& e, std::span<const StepObservation> points) {
  const auto sse_of = [&](const CostModel& m) {
    double sse = 0.0;
    for (const StepObservation& p : points) {
      const double err =
          (m.StepSeconds(p.batch_tokens, p.visible_kv_tokens) - p.seconds) / p.seconds;
      sse += err * err;
    }
    return sse;
  };
  CostModel best;
  double best_sse = std::numeric_limits<double>::infinity();
  for (unsigned mask = 1; mask < (1U << kTerms); ++mask) {
    const Vector c = SolveSubset(e.g, e.r, mask);
    if (std::any_of(c.begin(), c.end(), [](double v) { return v < 0.0; })) continue;
    const CostModel m{c[0] / e.scale[0], c[1] / e.scale[1], c[2] / e.scale[2]};
    const double sse = sse_of(m);
    if (sse < best_sse) {
      best_sse = sse;
      best = m;
    }
  }
  return best;
}

// How well `best` fits the points: r2 and the relative errors.
CostModelFit FitQuality(const CostModel& best, std::span<const StepObservation> points) {
  const std::size_t n = points.size();
  CostModelFit fit;
  fit.model = best;
  fit.num_points = static_cast<std::int64_t>(n);
  double mean = 0.0;
  for (const StepObservation& p : points) mean += p.seconds / static_cast<double>(n);
  double sst = 0.0;
  std::vector<double> rel;
  rel.reserve(n);
  for (const StepObservation& p : points) {
    sst += (p.seconds - mean) * (p.seconds - mean);
    rel.push_back(std::abs(best.StepSeconds(p.batch_tokens, p.visible_kv_tokens) - p.seconds) /
                  p.seconds);
  }
  double sse = 0.0;
  for (const StepObservation& p : points) {
    const double e = best.StepSeconds(p.batch_tokens, p.visible_kv_tokens) - p.seconds;
    sse += e * e;
  }
  fit.r2 = sst > 0.0 ? 1.0 - sse / sst : (sse > 0.0 ? 0.0 : 1.0);
  fit.median_abs_rel_error = Median(rel);
  fit.max_abs_rel_error = *std::max_element(rel.begin(), rel.end());
  return fit;
}

}  // namespace

CostModelFit FitCostModel(std::span<const StepObservation> points) {
  const std::size_t n = points.size();
  if (n < 3) {
    throw ConfigError("cost model fit: " + std::to_string(n) +
                      " points given; at least 3 are needed for 3 coefficients");
  }
  for (std::size_t i = 0; i < n; ++i) ValidatePoint(points[i], i);
  const NormalEquations e = BuildNormalEquations(points);
  CheckNotDegenerate(e.g, e.scale, n);
  return FitQuality(BestNonNegativeFit(e, points), points);
}

nlohmann::json CostModelToJson(const CostModel& model) {
  return nlohmann::json{{kJsonFields[0], model.c0_s},
                        {kJsonFields[1], model.c1_s_per_token},
                        {kJsonFields[2], model.c2_s_per_kv_token}};
}

CostModel CostModelFromJson(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) {
    std::string msg = source;
    msg += ": expected a JSON object with fields c0_s, c1_s_per_token, c2_s_per_kv_token, got ";
    msg += j.type_name();
    throw ConfigError(msg);
  }
  std::array<double, kTerms> v{};
  for (std::size_t k = 0; k < kTerms; ++k) {
    std::string msg = source;
    msg += ": field \"";
    msg += kJsonFields[k];
    msg += "\"";
    const auto it = j.find(kJsonFields[k]);
    if (it == j.end()) throw ConfigError(msg + " is missing");
    if (!it->is_number()) {
      throw ConfigError(msg + " must be a number, got " + it->type_name() + " " + it->dump());
    }
    v[k] = it->get<double>();
    if (!std::isfinite(v[k]))
      throw ConfigError(msg + " = " + FormatValue(v[k]) + " must be finite");
    if (v[k] < 0.0) throw ConfigError(msg + " = " + FormatValue(v[k]) + " must be >= 0");
  }
  return CostModel{v[0], v[1], v[2]};
}

CostModel LoadCostModelFile(const std::string& path) {
  const std::string source = "cost model file '" + path + "'";
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw ConfigError(source + ": cannot read: is a directory");
  }
  std::ifstream f(path, std::ios::binary);
  if (!f) throw ConfigError(source + ": cannot read: " + ErrnoMessage(errno));
  std::ostringstream text;
  text << f.rdbuf();
  if (f.bad()) throw ConfigError(source + ": cannot read: " + ErrnoMessage(errno));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::parse_error& e) {
    throw ConfigError(source + ": invalid JSON: " + e.what());
  }
  return CostModelFromJson(j, source);
}

int FrameIterations(const SessionSpec& session) {
  return std::max(1, session.output_tokens_per_frame);
}

CostModel AnchorKvCost(const CostModel& model, std::span<const StepObservation> frame) {
  double short_s = 0.0;
  double keys = 0.0;
  for (const StepObservation& step : frame) {
    short_s += step.seconds - model.StepSeconds(step.batch_tokens, step.visible_kv_tokens);
    keys += step.visible_kv_tokens;
  }
  CostModel anchored = model;
  if (short_s > 0.0 && keys > 0.0) anchored.c2_s_per_kv_token += short_s / keys;
  return anchored;
}

SessionPrice PriceSession(const CostModel& model, const SessionSpec& session,
                          TokenPos full_kv_context_tokens) {
  MTR_CHECK(session.period_ms > 0.0 && full_kv_context_tokens >= 0,
            "a resolved session and a context >= 0");
  const kv::KvPolicy& policy = session.policy;
  const TokenPos pos =
      policy.mode == kv::KvMode::kWindow ? policy.window + policy.sinks : full_kv_context_tokens;
  const int iterations = FrameIterations(session);
  const TokenPos first_chunk = session.input_tokens_per_frame + 1;  // + the carried-over output
  double tokens = static_cast<double>(first_chunk);
  double visible = static_cast<double>(policy.VisibleKeysOfChunk(pos, first_chunk));
  for (int k = 1; k < iterations; ++k) {
    tokens += 1.0;
    visible += static_cast<double>(policy.VisibleKeys(pos + first_chunk + k - 1));
  }
  SessionPrice price;
  price.frame_work_s = model.c1_s_per_token * tokens + model.c2_s_per_kv_token * visible;
  price.lone_frame_s = iterations * model.c0_s + price.frame_work_s;
  price.work_share = price.frame_work_s / (session.period_ms / 1000.0);
  const auto prompt_tokens = static_cast<TokenPos>(session.prompt.size());
  price.prompt_work_s =
      model.c1_s_per_token * static_cast<double>(prompt_tokens) +
      model.c2_s_per_kv_token * static_cast<double>(policy.VisibleKeysOfChunk(0, prompt_tokens));
  return price;
}

std::int64_t PredictedSessionLimit(const CostModel& model, const SessionSpec& session,
                                   double latency_fraction) {
  MTR_CHECK(latency_fraction > 0.0 && latency_fraction <= 1.0 && session.deadline_ms > 0.0,
            "latency_fraction in (0, 1] and a resolved deadline");
  if (session.policy.mode != kv::KvMode::kWindow) return 0;
  const SessionPrice price = PriceSession(model, session);
  const int iterations = FrameIterations(session);
  const double budget_s = latency_fraction * session.deadline_ms / 1000.0 - iterations * model.c0_s;
  const double per_session_s = price.frame_work_s;
  if (budget_s < per_session_s) return 0;
  // A model with no per-session cost admits everything: the caller's max limit applies.
  if (!(per_session_s > 0.0)) return std::numeric_limits<std::int64_t>::max();
  const double n = std::floor(budget_s / per_session_s);
  return n >= 9e18 ? std::numeric_limits<std::int64_t>::max() : static_cast<std::int64_t>(n);
}

}  // namespace metronome::realtime
