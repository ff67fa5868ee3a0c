// Measured streaming read bandwidth of this machine: the denominator of every weight kernel's
// roofline (a decode step must read each weight byte once, so tok/s <= bandwidth / weight bytes
// per token).
#pragma once

#include <cstddef>

namespace metronome::kernels {

// Best of `repeats` timed passes of a read of `buffer_bytes` (rounded down to whole slices of
// lines), in GB/s (1e9 bytes/s). The read runs on every thread of base::DefaultThreadPool() (the
// threads the kernels run on), a few slices per thread, each slice as several independent streams
// with software prefetch into every cache level (prefetcht0: a non-temporal hint halves the
// figure, see the .cc): what a kernel with several rows in flight per thread can stream, not
// what one sequential reader gets. 0 when `buffer_bytes` cannot give every slice one line per
// stream.
// Choose `buffer_bytes` well above the last-level cache (the default, 1 GiB, is) or the figure is
// the cache's, not DRAM's. Allocates and touches the buffer once.
[[nodiscard]] double MeasureReadBandwidthGBps(std::size_t buffer_bytes = std::size_t{1} << 30,
                                              int repeats = 5);

}  // namespace metronome::kernels
