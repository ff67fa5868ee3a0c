#include "metronome/kv/occupancy_forecast.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "metronome/base/errors.h"

namespace metronome::kv {
namespace {

// rho(t) = rho0 + N r t exactly: the forecast recovers r and t_sat = (1 - rho) / (N r).
TEST(OccupancyForecastTest, RecoversTheFirstOrderModel) {
  OccupancyForecast f({.window_s = 20.0, .horizon_s = 100.0});
  const double rho0 = 0.1;
  const double r = 0.001;  // per session per second
  const int n = 20;
  const std::int64_t total = 100000;
  for (int i = 0; i <= 100; ++i) {
    const double t = 1000.0 + 0.1 * i;  // large absolute times must not hurt the fit
    const double rho = rho0 + n * r * (t - 1000.0);
    f.Observe(t, static_cast<std::int64_t>(std::llround(rho * total)), total, n);
  }
  EXPECT_NEAR(f.per_session_rate(), r, 1e-6);
  const double rho_now = rho0 + n * r * 10.0;  // 0.3
  ASSERT_TRUE(f.TimeToSaturationSeconds().has_value());
  EXPECT_NEAR(*f.TimeToSaturationSeconds(), (1.0 - rho_now) / (n * r), 0.05);  // 35 s
  EXPECT_TRUE(f.Warning());
}

TEST(OccupancyForecastTest, FlatOccupancyIsNeverSaturating) {
  OccupancyForecast f;
  for (int i = 0; i < 50; ++i) f.Observe(i, 340, 1000, 10);
  EXPECT_FALSE(f.TimeToSaturationSeconds().has_value());
  EXPECT_FALSE(f.Warning());
}

TEST(OccupancyForecastTest, GrowthThatStopsAtTheBoundBecomesInfiniteOnceTheWindowPasses) {
  OccupancyForecast f({.window_s = 10.0, .horizon_s = 1e9});
  for (int i = 0; i <= 100; ++i) {
    const double t = i;
    const std::int64_t used = std::min<std::int64_t>(i * 10, 400);  // window bound reached at 40 s
    f.Observe(t, used, 1000, 10);
    if (i == 30) {
      EXPECT_TRUE(f.TimeToSaturationSeconds().has_value());
    }
  }
  EXPECT_FALSE(f.TimeToSaturationSeconds().has_value());
}

// With the sessions' bounds known, growing occupancy that will plateau inside the pool is never a
// saturation, even while the slope is steep; bounds that exceed the pool keep the first-order
// forecast; a full pool forecasts 0.
TEST(OccupancyForecastTest, KnownBoundsThatFitThePoolMeanNeverSaturating) {
  OccupancyForecast f({.window_s = 10.0, .horizon_s = 1e9});
  for (int i = 0; i <= 20; ++i) f.Observe(i, i * 10, 1000, 10, /*bounded_blocks=*/1000);
  EXPECT_FALSE(f.TimeToSaturationSeconds().has_value()) << "10 x 100 blocks fit in 1000";
  f.Observe(21, 210, 1000, 10, /*bounded_blocks=*/1001);
  ASSERT_TRUE(f.TimeToSaturationSeconds().has_value());
  EXPECT_NEAR(*f.TimeToSaturationSeconds(), (1000.0 - 210.0) / 10.0, 1.0);
  OccupancyForecast full;
  full.Observe(0, 1000, 1000, 10);
  full.Observe(1, 1000, 1000, 10);
  ASSERT_TRUE(full.TimeToSaturationSeconds().has_value());
  EXPECT_EQ(*full.TimeToSaturationSeconds(), 0.0);
}

TEST(OccupancyForecastTest, RejectsBadOptions) {
  EXPECT_THROW(OccupancyForecast({.window_s = 0.0}), ConfigError);
  EXPECT_THROW(OccupancyForecast({.window_s = 1.0, .horizon_s = -1.0}), ConfigError);
}

}  // namespace
}  // namespace metronome::kv
