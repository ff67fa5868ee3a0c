// First-order model of KV pool occupancy, rho(t) = rho0 + N r t, fitted online from observed pool
// use: r is each session's growth rate of occupancy (fraction of the pool per second per session),
// and t_sat = (1 - rho0) / (N r) is the predicted time until the pool is full. When every session
// sits at its bound (window mode) occupancy stops growing, r -> 0 and t_sat is infinite.
//
// Thread-safety: not thread-safe; fed by the engine loop.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>

namespace metronome::kv {

struct OccupancyForecastOptions {
  double window_s = 30.0;    // samples older than this are dropped from the fit
  double horizon_s = 300.0;  // Warning() when the predicted saturation is closer than this
  // Slopes below this (fraction of the pool per second) count as "not growing": guards against
  // forecasting saturation in years from rounding noise.
  double min_slope_per_s = 1e-7;

  void Validate() const;  // ConfigError naming the field
};

class OccupancyForecast {
 public:
  explicit OccupancyForecast(const OccupancyForecastOptions& options = {});

  // One observation; t_s must not decrease. `bounded_blocks` is the most the active sessions can
  // ever hold together (the sum of their window bounds), or -1 when some session is unbounded
  // (full KV). When it fits in the pool, occupancy plateaus at or below 1 and t_sat is infinite
  // whatever the current slope: the first-order model cannot see bounds, the caller can.
  void Observe(double t_s, std::int64_t used_blocks, std::int64_t total_blocks,
               std::int64_t active_sessions, std::int64_t bounded_blocks = -1);

  [[nodiscard]] double occupancy() const { return rho_; }  // rho0: latest used / total
  // r: least-squares slope of occupancy over the window divided by the mean session count; 0 when
  // there are fewer than 2 samples or no sessions.
  [[nodiscard]] double per_session_rate() const { return rate_; }
  // (1 - rho0) / (N r) with the latest N; nullopt = infinite (not growing).
  [[nodiscard]] std::optional<double> TimeToSaturationSeconds() const;
  [[nodiscard]] bool Warning() const;

 private:
  struct Sample {
    double t_s;
    double rho;
    double sessions;
  };
  void Refit();

  OccupancyForecastOptions options_;
  std::deque<Sample> samples_;
  double rho_ = 0.0;
  double rate_ = 0.0;
  double slope_ = 0.0;
  double sessions_ = 0.0;
  bool plateau_below_full_ = false;  // the latest bounded_blocks fits in the pool
};

}  // namespace metronome::kv
