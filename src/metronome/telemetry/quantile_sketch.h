// Percentiles of a long stream in fixed memory: values fall into logarithmic buckets whose width is
// at most a fixed fraction of their value (read off the double's exponent and top mantissa bits),
// so any quantile is returned within `relative_error` of a value that really occurred at that rank.
// Used for run summaries (p50/p99 frame latency over an hour of frames at 500 sessions would be 22
// M samples). Values below `min_value` share one bucket and are reported as 0; values above
// `max_value` are clamped into the last bucket.
//
// Thread-safety: not thread-safe; one writer.
#pragma once

#include <cstdint>
#include <vector>

namespace metronome::telemetry {

struct QuantileSketchOptions {
  double min_value = 1e-3;        // smallest value told apart from 0
  double max_value = 1e7;         // larger values are clamped
  double relative_error = 0.005;  // half-width of a bucket relative to its centre; in (0, 0.5)
};

class QuantileSketch {
 public:
  explicit QuantileSketch(const QuantileSketchOptions& options = {});

  void Add(double value) noexcept;  // NaN is ignored
  void Clear() noexcept;            // empty again, same options (no allocation)
  // The q-quantile (q in [0, 1]) by the nearest-rank rule; NaN when empty.
  [[nodiscard]] double Quantile(double q) const noexcept;
  [[nodiscard]] std::int64_t count() const noexcept { return count_; }
  [[nodiscard]] double max() const noexcept { return max_; }

 private:
  QuantileSketchOptions options_;
  int shift_ = 0;                      // mantissa bits dropped from a double to get its bucket key
  std::uint64_t base_ = 0;             // key of min_value
  std::vector<std::int64_t> buckets_;  // [0]: below min_value; [i >= 1]: key base_ + i - 1
  std::int64_t count_ = 0;
  double max_ = 0.0;
};

}  // namespace metronome::telemetry
