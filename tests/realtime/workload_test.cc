#include "metronome/realtime/workload.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "metronome/base/errors.h"

namespace metronome::realtime {
namespace {

TEST(ArrivalProcessTest, PoissonCountMatchesTheRate) {
  const ArrivalProcess p = ArrivalProcess::Parse("poisson:5");
  std::mt19937_64 rng(1);
  int n = 0;
  for (double t = p.NextAfter(0.0, rng); t < 1000.0; t = p.NextAfter(t, rng)) ++n;
  EXPECT_NEAR(n, 5000, 5 * std::sqrt(5000.0));  // 5 sigma
  EXPECT_DOUBLE_EQ(p.ExpectedArrivals(1000.0), 5000.0);
}

TEST(ArrivalProcessTest, RampFollowsTheIntegralOfItsRate) {
  const ArrivalProcess p = ArrivalProcess::Parse("ramp:0,10,100");
  EXPECT_DOUBLE_EQ(p.RateAt(50.0), 5.0);
  EXPECT_DOUBLE_EQ(p.RateAt(200.0), 10.0);
  EXPECT_DOUBLE_EQ(p.ExpectedArrivals(100.0), 500.0);
  EXPECT_DOUBLE_EQ(p.ExpectedArrivals(150.0), 1000.0);
  std::mt19937_64 rng(2);
  int first_half = 0;
  int second_half = 0;
  for (double t = p.NextAfter(0.0, rng); t < 100.0; t = p.NextAfter(t, rng)) {
    (t < 50.0 ? first_half : second_half)++;
  }
  EXPECT_NEAR(first_half, 125, 5 * std::sqrt(125.0));   // integral of 0.1 t over [0, 50)
  EXPECT_NEAR(second_half, 375, 5 * std::sqrt(375.0));  // over [50, 100)
}

TEST(ArrivalProcessTest, SeededRunsRepeat) {
  const ArrivalProcess p = ArrivalProcess::Parse("poisson:2");
  std::mt19937_64 a(7);
  std::mt19937_64 b(7);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(p.NextAfter(i, a), p.NextAfter(i, b));
}

TEST(SessionDurationTest, SamplesHaveTheStatedMeans) {
  std::mt19937_64 rng(3);
  for (const char* spec : {"fixed:30", "exp:20", "lognormal:3,0.5"}) {
    const SessionDuration d = SessionDuration::Parse(spec);
    double sum = 0.0;
    const int n = 200000;
    for (int i = 0; i < n; ++i) {
      const double s = d.Sample(rng);
      ASSERT_GT(s, 0.0);
      sum += s;
    }
    EXPECT_NEAR(sum / n, d.Mean(), 0.02 * d.Mean()) << spec;
  }
  EXPECT_DOUBLE_EQ(SessionDuration::Parse("lognormal:3,0.5").Mean(), std::exp(3.0 + 0.125));
}

// Library errors name the field (PopulationOptions' arrival, session_duration); the CLI maps
// them to flags.
TEST(WorkloadParseTest, ErrorsNameTheFieldAndValue) {
  auto message = [](auto fn) -> std::string {
    try {
      fn();
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(
      message([] { (void)ArrivalProcess::Parse("poisson:-1"); }).find("arrival = 'poisson:-1'"),
      std::string::npos);
  EXPECT_NE(message([] { (void)ArrivalProcess::Parse("burst:3"); }).find("unknown kind 'burst'"),
            std::string::npos);
  EXPECT_NE(message([] { (void)ArrivalProcess::Parse("ramp:1,x,3"); }).find("'x' is not a number"),
            std::string::npos);
  EXPECT_NE(message([] { (void)ArrivalProcess::Parse("poisson"); }).find("KIND:VALUES"),
            std::string::npos);
  EXPECT_NE(
      message([] { (void)SessionDuration::Parse("exp:0"); }).find("session_duration = 'exp:0'"),
      std::string::npos);
  EXPECT_NE(message([] { (void)SessionDuration::Parse("lognormal:1"); }).find("MU,SIGMA"),
            std::string::npos);
  EXPECT_NE(message([] { (void)SessionDuration::Parse("fixed:nan"); }).find("not a number"),
            std::string::npos);
}

TEST(SessionMixTest, ParsesTheIssuesThreeClasses) {
  const std::vector<SessionClass> mix = ParseSessionMix(
      "speech:period_ms=80,in=1,out=1,share=6;omni:period_ms=1000,in=25,out=1,prompt=2048,"
      "share=2;assistant:period_ms=2000,in=64,out=32,deadline_ms=1500,share=2");
  ASSERT_EQ(mix.size(), 3U);
  EXPECT_EQ(mix[0].name, "speech");
  EXPECT_EQ(mix[0].shape.period_ms, 80.0);
  EXPECT_EQ(mix[0].shape.tokens_per_frame, 1);
  EXPECT_DOUBLE_EQ(mix[0].share, 6.0);
  EXPECT_FALSE(mix[0].shape.deadline_ms.has_value());  // unset: the defaults'
  EXPECT_EQ(std::get<SyntheticPrompt>(mix[1].shape.prompt).tokens, 2048);
  EXPECT_EQ(mix[1].shape.tokens_per_frame, 25);
  EXPECT_EQ(mix[2].shape.output_tokens_per_frame, 32);
  EXPECT_EQ(mix[2].shape.deadline_ms, 1500.0);
  // A class with no keys takes every default and a share of 1.
  const std::vector<SessionClass> plain = ParseSessionMix("a:;b:in=2");
  ASSERT_EQ(plain.size(), 2U);
  EXPECT_FALSE(plain[0].shape.period_ms.has_value());
  EXPECT_DOUBLE_EQ(plain[0].share, 1.0);
}

TEST(SessionMixTest, ErrorsNameTheClassKeyAndValue) {
  auto message = [](const std::string& spec) -> std::string {
    try {
      (void)ParseSessionMix(spec);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  const std::pair<const char*, const char*> cases[] = {
      {"speech:in=x", "mix = 'speech:in=x': class 'speech': in=x is not a number"},
      {"speech:in=0", "class 'speech': in=0 must be an integer >= 1"},
      {"speech:in=1.5", "in=1.5 must be an integer >= 1"},
      {"speech:out=-1", "out=-1 must be an integer >= 0"},
      {"s:period_ms=0", "period_ms=0 must be > 0"},
      {"s:share=0", "share=0 must be > 0"},
      {"s:deadline_ms=-1", "deadline_ms=-1 must be >= 0"},
      {"s:speed=3", "unknown key 'speed'"},
      {"s:in=1,in=2", "in is given twice"},
      {"s:in", "'in' must be KEY=VALUE"},
      {"s:in=1;s:in=2", "class 's' is given twice"},
      {"Speech:in=1", "NAME of [a-z0-9_-]"},
      {"speech", "must be NAME:KEY=VALUE"},
      {"", "no class given"},
      {"s:prompt=nan", "prompt=nan is not a number"},
  };
  for (const auto& [spec, expected] : cases) {
    EXPECT_NE(message(spec).find(expected), std::string::npos) << spec << ": " << message(spec);
  }
}

}  // namespace
}  // namespace metronome::realtime
