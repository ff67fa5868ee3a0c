#include "metronome/telemetry/quantile_sketch.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "metronome/base/errors.h"

namespace metronome::telemetry {

QuantileSketch::QuantileSketch(const QuantileSketchOptions& options) : options_(options) {
  if (!(options.min_value > 0.0 && options.max_value > options.min_value)) {
    throw ConfigError("quantile sketch: need 0 < min_value < max_value");
  }
  if (!(options.relative_error > 0.0 && options.relative_error < 0.5)) {
    throw ConfigError("quantile sketch: relative_error must be in (0, 0.5)");
  }
  gamma_ = (1.0 + options.relative_error) / (1.0 - options.relative_error);
  log_gamma_ = std::log(gamma_);
  const auto n = static_cast<std::size_t>(
      std::ceil(std::log(options.max_value / options.min_value) / log_gamma_));
  buckets_.assign(n + 2, 0);
}

void QuantileSketch::Add(double value) noexcept {
  if (std::isnan(value)) return;
  std::size_t b = 0;
  if (value >= options_.min_value) {
    const double i = std::floor(std::log(value / options_.min_value) / log_gamma_) + 1.0;
    b = std::min(static_cast<std::size_t>(i), buckets_.size() - 1);
  }
  ++buckets_[b];
  ++count_;
  max_ = count_ == 1 ? value : std::max(max_, value);
}

double QuantileSketch::Quantile(double q) const noexcept {
  if (count_ == 0) return std::numeric_limits<double>::quiet_NaN();
  q = std::clamp(q, 0.0, 1.0);
  // Nearest rank: the smallest value with at least ceil(q * n) values at or below it.
  const auto rank = std::max<std::int64_t>(
      1, static_cast<std::int64_t>(std::ceil(q * static_cast<double>(count_))));
  std::int64_t seen = 0;
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    seen += buckets_[b];
    if (seen < rank) continue;
    if (b == 0) return 0.0;
    // Bucket b covers [min * gamma^(b-1), min * gamma^b); its centre in the relative sense is
    // within relative_error of every value in it. Never report above the true maximum.
    const double lo = options_.min_value * std::exp(static_cast<double>(b - 1) * log_gamma_);
    return std::min(lo * 2.0 * gamma_ / (1.0 + gamma_), max_);
  }
  return max_;
}

}  // namespace metronome::telemetry
