// The streaming read bandwidth of the machine it runs on: the denominator of every weight kernel's
// roofline (a decode step must read each weight byte once, so tok/s <= bandwidth / weight bytes
// per token).
#pragma once

#include <cstddef>

#include "metronome/base/streamed_memory.h"

namespace metronome::base {
class ThreadPool;
}

namespace metronome::kernels {

// The probe's buffer, allocated and touched once, probed as often as wanted: a benchmark on a
// machine whose speed comes in phases (a shared or virtual one) measures right before and after
// each stretch of the work it compares with, not once at some other moment.
// A pass reads the buffer on every thread of the pool it is given (pass the pool the kernels run
// on), a few slices per thread, each slice either as several independent streams with software
// prefetch into every cache level (prefetcht0: a non-temporal hint halves the figure, see the
// .cc), what a kernel with several rows in flight per thread can stream, or as one plain stream,
// what the hardware prefetcher alone draws. The figure is the best pass of either kind: neither
// is always the faster.
// Choose `buffer_bytes` well above the last-level cache (the default, 1 GiB, is) or the figure is
// the cache's, not DRAM's.
class ReadBandwidthProbe {
 public:
  // Allocates `buffer_bytes` (rounded down to whole slices of lines) and touches it. The probe is
  // unusable (MeasureGBps returns 0) when the buffer cannot give every slice one line per stream.
  // `pool` (borrowed; must outlive the probe) touches and reads the buffer.
  explicit ReadBandwidthProbe(base::ThreadPool& pool,
                              std::size_t buffer_bytes = std::size_t{1} << 30);

  // Best of `repeats` timed passes of each kind, in GB/s (1e9 bytes/s); 0 when unusable.
  [[nodiscard]] double MeasureGBps(int repeats = 5) const;

 private:
  base::ThreadPool* pool_ = nullptr;
  std::size_t slices_ = 0;
  std::size_t lines_per_stream_ = 0;  // 0: unusable
  base::StreamedBuffer memory_;
};

// ReadBandwidthProbe(pool, buffer_bytes).MeasureGBps(repeats): one measurement, allocation
// included.
[[nodiscard]] double MeasureReadBandwidthGBps(base::ThreadPool& pool,
                                              std::size_t buffer_bytes = std::size_t{1} << 30,
                                              int repeats = 5);

}  // namespace metronome::kernels
