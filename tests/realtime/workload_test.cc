#include "metronome/realtime/workload.h"

#include <gtest/gtest.h>

#include <cmath>

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

}  // namespace
}  // namespace metronome::realtime
