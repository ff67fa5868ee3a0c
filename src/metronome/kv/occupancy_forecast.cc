#include "metronome/kv/occupancy_forecast.h"

#include <string>

#include "metronome/base/errors.h"

namespace metronome::kv {

void OccupancyForecastOptions::Validate() const {
  if (!(window_s > 0.0)) {
    throw ConfigError("forecast window_s = " + std::to_string(window_s) + " must be > 0");
  }
  if (!(horizon_s > 0.0)) {
    throw ConfigError("forecast horizon_s = " + std::to_string(horizon_s) + " must be > 0");
  }
  if (!(min_slope_per_s >= 0.0)) {
    throw ConfigError("forecast min_slope_per_s = " + std::to_string(min_slope_per_s) +
                      " must be >= 0");
  }
}

OccupancyForecast::OccupancyForecast(const OccupancyForecastOptions& options) : options_(options) {
  options.Validate();
}

void OccupancyForecast::Observe(double t_s, std::int64_t used_blocks, std::int64_t total_blocks,
                                std::int64_t active_sessions, std::int64_t bounded_blocks) {
  plateau_below_full_ = bounded_blocks >= 0 && bounded_blocks <= total_blocks;
  const double rho =
      total_blocks > 0 ? static_cast<double>(used_blocks) / static_cast<double>(total_blocks) : 0.0;
  samples_.push_back({t_s, rho, static_cast<double>(active_sessions)});
  while (!samples_.empty() && samples_.front().t_s < t_s - options_.window_s) samples_.pop_front();
  rho_ = rho;
  sessions_ = static_cast<double>(active_sessions);
  Refit();
}

void OccupancyForecast::Refit() {
  slope_ = 0.0;
  rate_ = 0.0;
  const auto n = static_cast<double>(samples_.size());
  if (samples_.size() < 2) return;
  // Least squares on (t - t_mean): numerically stable for large absolute times.
  double t_mean = 0.0;
  double rho_mean = 0.0;
  double n_mean = 0.0;
  for (const Sample& s : samples_) {
    t_mean += s.t_s;
    rho_mean += s.rho;
    n_mean += s.sessions;
  }
  t_mean /= n;
  rho_mean /= n;
  n_mean /= n;
  double sxy = 0.0;
  double sxx = 0.0;
  for (const Sample& s : samples_) {
    sxy += (s.t_s - t_mean) * (s.rho - rho_mean);
    sxx += (s.t_s - t_mean) * (s.t_s - t_mean);
  }
  if (sxx <= 0.0) return;
  slope_ = sxy / sxx;
  if (n_mean > 0.0) rate_ = slope_ / n_mean;
}

std::optional<double> OccupancyForecast::TimeToSaturationSeconds() const {
  if (plateau_below_full_) return std::nullopt;
  if (rho_ >= 1.0) return 0.0;  // already full
  if (slope_ <= options_.min_slope_per_s || rate_ <= 0.0 || sessions_ <= 0.0) return std::nullopt;
  const double remaining = rho_ < 1.0 ? 1.0 - rho_ : 0.0;
  return remaining / (sessions_ * rate_);
}

bool OccupancyForecast::Warning() const {
  const auto t = TimeToSaturationSeconds();
  return t.has_value() && *t < options_.horizon_s;
}

}  // namespace metronome::kv
