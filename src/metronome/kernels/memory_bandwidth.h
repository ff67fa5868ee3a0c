// Measured streaming read bandwidth of this machine: the denominator of every weight kernel's
// roofline (a decode step must read each weight byte once, so tok/s <= bandwidth / weight bytes
// per token).
#pragma once

#include <cstddef>

namespace metronome::kernels {

// Best of `repeats` timed passes of a read of `buffer_bytes` (rounded down to 64 bytes) split in
// static chunks over the OpenMP threads (the threads the kernels run on), in GB/s (1e9 bytes/s).
// Choose `buffer_bytes` well above the last-level cache (the default, 1 GiB, is) or the figure is
// the cache's, not DRAM's. Allocates and touches the buffer once.
[[nodiscard]] double MeasureReadBandwidthGBps(std::size_t buffer_bytes = std::size_t{1} << 30,
                                              int repeats = 5);

}  // namespace metronome::kernels
