#include "metronome/realtime/cost_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "metronome/base/errors.h"

namespace metronome::realtime {
namespace {

// The calibrate grid's shape: B sessions, each a chunk of `chunk` query tokens at context `ctx`
// under full KV (query at position p sees p + 1 keys).
std::vector<StepObservation> Grid(const CostModel& truth) {
  std::vector<StepObservation> points;
  for (const double b : {1.0, 4.0, 16.0, 32.0}) {
    for (const double ctx : {64.0, 256.0, 1024.0}) {
      for (const double chunk : {1.0, 16.0}) {
        const double bt = b * chunk;
        const double vis = b * (chunk * (ctx + 1.0) + chunk * (chunk - 1.0) / 2.0);
        points.push_back({bt, vis, truth.StepSeconds(bt, vis)});
      }
    }
  }
  return points;
}

// Message of the ConfigError `f` throws; fails the test when it throws nothing.
template <typename F>
std::string ErrorOf(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ConfigError thrown";
  return "";
}

TEST(FitCostModelTest, RecoversExactCoefficientsFromNoiselessPoints) {
  const CostModel truth{2e-4, 3e-6, 4e-9};
  const std::vector<StepObservation> points = Grid(truth);
  const CostModelFit fit = FitCostModel(points);
  EXPECT_NEAR(fit.model.c0_s, truth.c0_s, 1e-9 * truth.c0_s);
  EXPECT_NEAR(fit.model.c1_s_per_token, truth.c1_s_per_token, 1e-9 * truth.c1_s_per_token);
  EXPECT_NEAR(fit.model.c2_s_per_kv_token, truth.c2_s_per_kv_token, 1e-9 * truth.c2_s_per_kv_token);
  EXPECT_NEAR(fit.r2, 1.0, 1e-12);
  EXPECT_LT(fit.max_abs_rel_error, 1e-9);
  EXPECT_LE(fit.median_abs_rel_error, fit.max_abs_rel_error);
  EXPECT_EQ(fit.num_points, static_cast<std::int64_t>(points.size()));
}

TEST(FitCostModelTest, NoisyPointsGiveCoefficientsWithinAFewPercent) {
  const CostModel truth{1e-3, 5e-6, 2e-8};  // attention-dominated, as on the CPU engine
  std::mt19937_64 rng(11);
  std::normal_distribution<double> noise(0.0, 0.01);  // 1 % multiplicative timing noise
  std::vector<StepObservation> points;
  for (int rep = 0; rep < 5; ++rep) {
    for (StepObservation p : Grid(truth)) {
      p.seconds *= 1.0 + noise(rng);
      points.push_back(p);
    }
  }
  const CostModelFit fit = FitCostModel(points);
  EXPECT_NEAR(fit.model.c0_s, truth.c0_s, 0.05 * truth.c0_s);
  EXPECT_NEAR(fit.model.c1_s_per_token, truth.c1_s_per_token, 0.05 * truth.c1_s_per_token);
  EXPECT_NEAR(fit.model.c2_s_per_kv_token, truth.c2_s_per_kv_token, 0.02 * truth.c2_s_per_kv_token);
  EXPECT_GT(fit.r2, 0.99);
  EXPECT_LT(fit.median_abs_rel_error, 0.02);
  EXPECT_LT(fit.max_abs_rel_error, 0.1);
}

TEST(FitCostModelTest, ClampsATermThatWouldBeNegativeAndRefitsTheRest) {
  // Data with a negative per-token slope: unconstrained OLS would return c1 < 0.
  const CostModel truth{5e-3, -1e-6, 4e-9};
  const std::vector<StepObservation> points = Grid(truth);
  for (const StepObservation& p : points) ASSERT_GT(p.seconds, 0.0);
  const CostModelFit fit = FitCostModel(points);
  EXPECT_EQ(fit.model.c1_s_per_token, 0.0);
  EXPECT_GE(fit.model.c0_s, 0.0);
  EXPECT_GE(fit.model.c2_s_per_kv_token, 0.0);
  // The remaining terms are the weighted (1/t^2: relative error) least-squares line of seconds on
  // visible_kv_tokens.
  double sw = 0.0;
  double mx = 0.0;
  double my = 0.0;
  for (const StepObservation& p : points) {
    const double w = 1.0 / (p.seconds * p.seconds);
    sw += w;
    mx += w * p.visible_kv_tokens;
    my += w * p.seconds;
  }
  mx /= sw;
  my /= sw;
  double sxy = 0.0;
  double sxx = 0.0;
  for (const StepObservation& p : points) {
    const double w = 1.0 / (p.seconds * p.seconds);
    sxy += w * (p.visible_kv_tokens - mx) * (p.seconds - my);
    sxx += w * (p.visible_kv_tokens - mx) * (p.visible_kv_tokens - mx);
  }
  const double slope = sxy / sxx;
  EXPECT_NEAR(fit.model.c2_s_per_kv_token, slope, 1e-9 * slope);
  EXPECT_NEAR(fit.model.c0_s, my - slope * mx, 1e-9 * (my - slope * mx));
  EXPECT_LT(fit.r2, 1.0);
}

TEST(FitCostModelTest, RejectsFewerThanThreePoints) {
  EXPECT_NE(ErrorOf([] { (void)FitCostModel({}); }).find("0 points given; at least 3"),
            std::string::npos);
  const std::vector<StepObservation> two = {{1, 10, 1e-3}, {4, 100, 2e-3}};
  EXPECT_NE(ErrorOf([&] { (void)FitCostModel(two); }).find("2 points given; at least 3"),
            std::string::npos);
}

TEST(FitCostModelTest, RejectsDegenerateDesigns) {
  // Same batch size everywhere: batch_tokens cannot be told from the constant.
  const std::vector<StepObservation> same_batch = {{4, 10, 1e-3}, {4, 100, 2e-3}, {4, 300, 3e-3}};
  const std::string e1 = ErrorOf([&] { (void)FitCostModel(same_batch); });
  EXPECT_NE(e1.find("degenerate"), std::string::npos) << e1;
  EXPECT_NE(e1.find("batch_tokens is (nearly) constant"), std::string::npos) << e1;
  // visible_kv_tokens proportional to batch_tokens (one context for every point).
  const std::vector<StepObservation> collinear = {
      {1, 100, 1e-3}, {4, 400, 2e-3}, {16, 1600, 3e-3}, {32, 3200, 5e-3}};
  const std::string e2 = ErrorOf([&] { (void)FitCostModel(collinear); });
  EXPECT_NE(e2.find("visible_kv_tokens is (nearly) a linear combination"), std::string::npos) << e2;
  const std::vector<StepObservation> no_kv = {{1, 0, 1e-3}, {4, 0, 2e-3}, {16, 0, 3e-3}};
  const std::string e3 = ErrorOf([&] { (void)FitCostModel(no_kv); });
  EXPECT_NE(e3.find("visible_kv_tokens is 0 at every point"), std::string::npos) << e3;
}

TEST(FitCostModelTest, RejectsBadPointsNamingThePointAndField) {
  std::vector<StepObservation> points = {{1, 10, 1e-3}, {4, 100, 2e-3}, {16, 500, 3e-3}};
  points[1].seconds = 0.0;
  EXPECT_NE(ErrorOf([&] { (void)FitCostModel(points); }).find("point 1: seconds = 0"),
            std::string::npos);
  points[1].seconds = 2e-3;
  points[2].visible_kv_tokens = std::numeric_limits<double>::quiet_NaN();
  EXPECT_NE(ErrorOf([&] { (void)FitCostModel(points); }).find("point 2: visible_kv_tokens"),
            std::string::npos);
  points[2].visible_kv_tokens = 500;
  points[0].batch_tokens = -1;
  EXPECT_NE(ErrorOf([&] { (void)FitCostModel(points); }).find("point 0: batch_tokens = -1"),
            std::string::npos);
}

TEST(CostModelJsonTest, RoundTripsThroughTextAndFiles) {
  const CostModel m{1.25e-3, 3.5e-6, 7.125e-9};
  const nlohmann::json j = CostModelToJson(m);
  EXPECT_EQ(j.size(), 3U);
  const CostModel back = CostModelFromJson(nlohmann::json::parse(j.dump()), "test");
  EXPECT_EQ(back.c0_s, m.c0_s);
  EXPECT_EQ(back.c1_s_per_token, m.c1_s_per_token);
  EXPECT_EQ(back.c2_s_per_kv_token, m.c2_s_per_kv_token);

  // A calibrate output file: the coefficients plus fields the loader ignores.
  nlohmann::json file = j;
  file["fit"] = {{"r2", 0.99}};
  file["model"] = "synthetic:tiny";
  const std::string path = ::testing::TempDir() + "/cost_model_test.json";
  std::ofstream(path) << file.dump(2);
  const CostModel loaded = LoadCostModelFile(path);
  EXPECT_EQ(loaded.c0_s, m.c0_s);
  EXPECT_EQ(loaded.c1_s_per_token, m.c1_s_per_token);
  EXPECT_EQ(loaded.c2_s_per_kv_token, m.c2_s_per_kv_token);
}

TEST(CostModelJsonTest, BadValuesNameTheSourceAndField) {
  const nlohmann::json good = CostModelToJson(CostModel{1e-3, 1e-6, 1e-9});
  for (const char* field : {"c0_s", "c1_s_per_token", "c2_s_per_kv_token"}) {
    nlohmann::json j = good;
    j.erase(field);
    EXPECT_EQ(ErrorOf([&] { (void)CostModelFromJson(j, "src.json"); }),
              "src.json: field \"" + std::string(field) + "\" is missing");
    j[field] = "fast";
    EXPECT_EQ(
        ErrorOf([&] { (void)CostModelFromJson(j, "src.json"); }),
        "src.json: field \"" + std::string(field) + "\" must be a number, got string \"fast\"");
    j[field] = -2e-6;
    EXPECT_EQ(ErrorOf([&] { (void)CostModelFromJson(j, "src.json"); }),
              "src.json: field \"" + std::string(field) + "\" = -2e-06 must be >= 0");
    j[field] = std::numeric_limits<double>::infinity();
    EXPECT_EQ(ErrorOf([&] { (void)CostModelFromJson(j, "src.json"); }),
              "src.json: field \"" + std::string(field) + "\" = inf must be finite");
  }
  const std::string e = ErrorOf([] { (void)CostModelFromJson(nlohmann::json::array(), "a.json"); });
  EXPECT_NE(e.find("a.json: expected a JSON object"), std::string::npos) << e;
  EXPECT_NE(e.find("got array"), std::string::npos) << e;
}

TEST(CostModelJsonTest, FileErrorsNameThePath) {
  const std::string dir = ::testing::TempDir();
  const std::string missing = dir + "/no_such_cost_model.json";
  const std::string e1 = ErrorOf([&] { (void)LoadCostModelFile(missing); });
  EXPECT_NE(e1.find("cost model file '" + missing + "': cannot read"), std::string::npos) << e1;

  const std::string broken = dir + "/broken_cost_model.json";
  std::ofstream(broken) << "{\"c0_s\": 0.001,";
  const std::string e2 = ErrorOf([&] { (void)LoadCostModelFile(broken); });
  EXPECT_NE(e2.find("cost model file '" + broken + "': invalid JSON"), std::string::npos) << e2;

  const std::string negative = dir + "/negative_cost_model.json";
  std::ofstream(negative) << R"({"c0_s": 0.001, "c1_s_per_token": 0, "c2_s_per_kv_token": -1})";
  EXPECT_EQ(ErrorOf([&] { (void)LoadCostModelFile(negative); }),
            "cost model file '" + negative + "': field \"c2_s_per_kv_token\" = -1 must be >= 0");

  const std::string e3 = ErrorOf([&] { (void)LoadCostModelFile(dir); });
  EXPECT_NE(e3.find("is a directory"), std::string::npos) << e3;
}

SessionSpec WindowSession(int a, int o, TokenPos window, TokenPos sinks, double deadline_ms) {
  SessionSpec s;
  s.period_ms = deadline_ms;
  s.deadline_ms = deadline_ms;
  s.input_tokens_per_frame = a;
  s.output_tokens_per_frame = o;
  s.policy = kv::KvPolicy::Window(window, sinks, kv::PositionMode::kRolling);
  return s;
}

// The prediction against the latency it stands for, computed by hand: a = 4, o = 2, W = 60 + 4
// sinks at steady state: iteration 1 has 5 tokens each seeing 64 keys, iteration 2 one token
// seeing 64; per session 6 c1 + 384 c2.
TEST(PredictedSessionLimitTest, IsTheLargestNWithinTheLatencyBudget) {
  const CostModel m{.c0_s = 0.002, .c1_s_per_token = 1e-4, .c2_s_per_kv_token = 1e-6};
  const SessionSpec s = WindowSession(4, 2, 60, 4, 100.0);
  const double per_session_s = 6 * 1e-4 + 384 * 1e-6;
  const double budget_s = 0.65 * 0.1 - 2 * 0.002;
  const std::int64_t n = PredictedSessionLimit(m, s, 0.65);
  EXPECT_EQ(n, static_cast<std::int64_t>(std::floor(budget_s / per_session_s)));
  // The defining property: n fits, n + 1 does not.
  const auto latency_s = [&](std::int64_t sessions) {
    return 2 * m.c0_s + static_cast<double>(sessions) * per_session_s;
  };
  EXPECT_LE(latency_s(n), 0.65 * 0.1);
  EXPECT_GT(latency_s(n + 1), 0.65 * 0.1);
  // More latency budget, more sessions; a longer window, fewer.
  EXPECT_GT(PredictedSessionLimit(m, s, 0.85), n);
  EXPECT_LT(PredictedSessionLimit(m, WindowSession(4, 2, 600, 4, 100.0), 0.65), n);
}

// A prompt's prefill, computed by hand: 100 tokens under W = 60 + 4 sinks; the query at position p
// sees p + 1 keys until the window is full (64), then 64: 1 + ... + 64 + 36 x 64 = 4384 keys.
TEST(PriceSessionTest, APromptIsPricedOnceByTheWindowsRule) {
  const CostModel m{.c0_s = 0.002, .c1_s_per_token = 1e-4, .c2_s_per_kv_token = 1e-6};
  SessionSpec s = WindowSession(4, 2, 60, 4, 100.0);
  EXPECT_EQ(PriceSession(m, s).prompt_work_s, 0.0) << "no prompt, no prefill";
  const SessionPrice steady = PriceSession(m, s);
  s.prompt.assign(100, 7);
  const SessionPrice priced = PriceSession(m, s);
  EXPECT_DOUBLE_EQ(priced.prompt_work_s, 100 * 1e-4 + 4384 * 1e-6);
  EXPECT_DOUBLE_EQ(priced.work_share, steady.work_share) << "the steady share is the frames'";
  // Full KV: every earlier token stays visible, 1 + ... + 100 keys.
  s.policy = kv::KvPolicy::Full();
  EXPECT_DOUBLE_EQ(PriceSession(m, s).prompt_work_s, 100 * 1e-4 + 5050 * 1e-6);
}

// A frame the model prices too fast raises c2 by the shortfall over the frame's keys, so the sum
// comes out exact; one it prices slower, or one with no keys, leaves the model as it is.
TEST(AnchorKvCostTest, RaisesOnlyC2AndOnlyToTheFramesTime) {
  const CostModel m{.c0_s = 0.04, .c1_s_per_token = 0.015, .c2_s_per_kv_token = 2e-6};
  // A chunk of 14 at 2048 keys, then one decode: 0.318 + 0.0599 s modelled, 0.390 + 0.071 timed.
  const std::vector<StepObservation> frame = {{14.0, 28770.0, 0.390}, {1.0, 2052.0, 0.071}};
  const CostModel anchored = AnchorKvCost(m, frame);
  EXPECT_EQ(anchored.c0_s, m.c0_s);
  EXPECT_EQ(anchored.c1_s_per_token, m.c1_s_per_token);
  const double shortfall_s = 0.461 - (2 * 0.04 + 15 * 0.015 + 30822.0 * 2e-6);
  EXPECT_NEAR(anchored.c2_s_per_kv_token, 2e-6 + shortfall_s / 30822.0, 1e-15);
  EXPECT_NEAR(anchored.StepSeconds(14.0, 28770.0) + anchored.StepSeconds(1.0, 2052.0), 0.461,
              1e-12);
  const struct {
    const char* what;
    std::vector<StepObservation> frame;
  } kept[] = {
      {"priced slower than it ran", {{14.0, 28770.0, 0.2}, {1.0, 2052.0, 0.05}}},
      {"no keys", {{14.0, 0.0, 5.0}}},
      {"no steps", {}},
  };
  for (const auto& k : kept) {
    const CostModel same = AnchorKvCost(m, k.frame);
    EXPECT_EQ(same.c2_s_per_kv_token, m.c2_s_per_kv_token) << k.what;
    EXPECT_EQ(same.c0_s, m.c0_s) << k.what;
    EXPECT_EQ(same.c1_s_per_token, m.c1_s_per_token) << k.what;
  }
}

TEST(PredictedSessionLimitTest, NothingForFullKvOrWhenOneSessionDoesNotFit) {
  const CostModel m{.c0_s = 0.002, .c1_s_per_token = 1e-4, .c2_s_per_kv_token = 1e-6};
  SessionSpec full = WindowSession(4, 2, 60, 4, 100.0);
  full.policy = kv::KvPolicy::Full();
  EXPECT_EQ(PredictedSessionLimit(m, full, 0.65), 0);
  // The fixed cost alone exceeds the budget.
  EXPECT_EQ(PredictedSessionLimit({.c0_s = 0.05}, WindowSession(4, 2, 60, 4, 100.0), 0.65), 0);
  // No per-session cost: no bound from the model.
  EXPECT_EQ(PredictedSessionLimit({.c0_s = 0.001}, WindowSession(4, 2, 60, 4, 100.0), 0.65),
            std::numeric_limits<std::int64_t>::max());
}

}  // namespace
}  // namespace metronome::realtime
