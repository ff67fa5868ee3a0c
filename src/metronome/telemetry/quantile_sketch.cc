#include "metronome/telemetry/quantile_sketch.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "metronome/base/errors.h"

namespace metronome::telemetry {

// Buckets are read straight off the bits of a positive double: dropping the low (52 - m) mantissa
// bits leaves exponent and top m mantissa bits, a bucket of relative width <= 2^-m. Its midpoint
// is within 2^-(m+1) of every value in it. No log() per sample.
QuantileSketch::QuantileSketch(const QuantileSketchOptions& options) : options_(options) {
  if (!(options.min_value > 0.0 && options.max_value > options.min_value &&
        std::isfinite(options.max_value))) {
    throw ConfigError("quantile sketch: need 0 < min_value < max_value < inf");
  }
  if (!(options.relative_error > 0.0 && options.relative_error < 0.5)) {
    throw ConfigError("quantile sketch: relative_error must be in (0, 0.5)");
  }
  int m = 0;
  while (m < 52 && std::ldexp(1.0, -(m + 1)) > options.relative_error) ++m;
  shift_ = 52 - m;
  base_ = std::bit_cast<std::uint64_t>(options.min_value) >> shift_;
  const std::uint64_t top = std::bit_cast<std::uint64_t>(options.max_value) >> shift_;
  buckets_.assign(static_cast<std::size_t>(top - base_) + 2, 0);
}

void QuantileSketch::Clear() noexcept {
  std::fill(buckets_.begin(), buckets_.end(), 0);
  count_ = 0;
  max_ = 0.0;
}

void QuantileSketch::Add(double value) noexcept {
  if (std::isnan(value)) return;
  std::size_t b = 0;
  if (value >= options_.min_value) {
    const std::uint64_t key = std::bit_cast<std::uint64_t>(value) >> shift_;
    b = std::min(static_cast<std::size_t>(key - base_) + 1, buckets_.size() - 1);
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
    const std::uint64_t key = base_ + (b - 1);
    const double lo = std::bit_cast<double>(key << shift_);
    const double hi = std::bit_cast<double>((key + 1) << shift_);
    return std::min(0.5 * (lo + hi), max_);  // never above the true maximum
  }
  return max_;
}

}  // namespace metronome::telemetry
