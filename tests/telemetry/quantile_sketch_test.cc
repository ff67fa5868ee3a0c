#include "metronome/telemetry/quantile_sketch.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "metronome/base/errors.h"

namespace metronome::telemetry {
namespace {

// Exact nearest-rank quantile of a sorted sample.
double ExactQuantile(const std::vector<double>& sorted, double q) {
  const auto rank = std::max<std::size_t>(
      1, static_cast<std::size_t>(std::ceil(q * static_cast<double>(sorted.size()))));
  return sorted[rank - 1];
}

TEST(QuantileSketchTest, EmptyIsNan) {
  const QuantileSketch sketch;
  EXPECT_TRUE(std::isnan(sketch.Quantile(0.5)));
  EXPECT_EQ(sketch.count(), 0);
}

TEST(QuantileSketchTest, WithinRelativeErrorOfExactQuantiles) {
  std::mt19937_64 rng(7);
  std::lognormal_distribution<double> dist(3.0, 1.2);  // latencies in ms, heavy tail
  QuantileSketch sketch;
  std::vector<double> values;
  for (int i = 0; i < 200000; ++i) {
    const double v = dist(rng);
    values.push_back(v);
    sketch.Add(v);
  }
  std::sort(values.begin(), values.end());
  for (const double q : {0.0, 0.01, 0.5, 0.9, 0.99, 0.999, 1.0}) {
    const double exact = ExactQuantile(values, q);
    EXPECT_NEAR(sketch.Quantile(q), exact, exact * 0.005 + 1e-12) << "q=" << q;
  }
  EXPECT_EQ(sketch.count(), 200000);
  EXPECT_DOUBLE_EQ(sketch.max(), values.back());
}

TEST(QuantileSketchTest, SmallValuesReadAsZeroAndNanIgnored) {
  QuantileSketch sketch({.min_value = 1.0, .max_value = 100.0, .relative_error = 0.01});
  sketch.Add(0.5);
  sketch.Add(std::nan(""));
  sketch.Add(50.0);
  EXPECT_EQ(sketch.count(), 2);
  EXPECT_EQ(sketch.Quantile(0.5), 0.0);
  EXPECT_NEAR(sketch.Quantile(1.0), 50.0, 0.5);
}

TEST(QuantileSketchTest, RejectsBadOptions) {
  EXPECT_THROW(QuantileSketch({.min_value = 0.0}), ConfigError);
  EXPECT_THROW(QuantileSketch({.relative_error = 0.7}), ConfigError);
}

}  // namespace
}  // namespace metronome::telemetry

namespace metronome::telemetry {
namespace {

TEST(QuantileSketchClearTest, ClearForgetsEverythingAndKeepsWorking) {
  QuantileSketch q;
  for (int i = 1; i <= 100; ++i) q.Add(i);
  q.Clear();
  EXPECT_EQ(q.count(), 0);
  EXPECT_TRUE(std::isnan(q.Quantile(0.5)));
  EXPECT_EQ(q.max(), 0.0);
  q.Add(7.0);
  EXPECT_NEAR(q.Quantile(0.5), 7.0, 7.0 * 0.01);
  EXPECT_EQ(q.count(), 1);
}

}  // namespace
}  // namespace metronome::telemetry
