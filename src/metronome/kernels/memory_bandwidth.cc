#include "metronome/kernels/memory_bandwidth.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <new>

namespace metronome::kernels {
namespace {

struct AlignedFree {
  void operator()(std::uint64_t* p) const noexcept { ::operator delete[](p, std::align_val_t{64}); }
};

// Sums 8 independent 64-bit lanes so the loop is limited by loads, not by an add chain; the
// compiler vectorises it to full-width loads for the build's -march.
std::uint64_t SumWords(const std::uint64_t* p, std::size_t words) noexcept {
  std::uint64_t s[8] = {};
  for (std::size_t i = 0; i + 8 <= words; i += 8) {
    for (int l = 0; l < 8; ++l) s[l] += p[i + static_cast<std::size_t>(l)];
  }
  std::uint64_t total = 0;
  for (const std::uint64_t v : s) total += v;
  return total;
}

}  // namespace

double MeasureReadBandwidthGBps(std::size_t buffer_bytes, int repeats) {
  const std::size_t words = buffer_bytes / 64 * 8;
  if (words == 0) return 0.0;
  const std::unique_ptr<std::uint64_t[], AlignedFree> buf(new (std::align_val_t{64})
                                                              std::uint64_t[words]);
  // First touch in parallel, so pages land on the NUMA nodes of the threads that read them.
#pragma omp parallel for schedule(static)
  for (std::size_t i = 0; i < words; ++i) buf[i] = i;
  volatile std::uint64_t sink = 0;
  double best = 0.0;
  for (int r = 0; r < std::max(1, repeats); ++r) {
    std::uint64_t total = 0;
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel reduction(+ : total)
    {
      const auto threads = static_cast<std::size_t>(omp_get_num_threads());
      const auto t = static_cast<std::size_t>(omp_get_thread_num());
      const std::size_t chunk = (words / 8 + threads - 1) / threads * 8;
      const std::size_t begin = std::min(words, t * chunk);
      const std::size_t end = std::min(words, begin + chunk);
      total += SumWords(buf.get() + begin, end - begin);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    sink = sink + total;
    best = std::max(best, static_cast<double>(words * 8) / s / 1e9);
  }
  return best;
}

}  // namespace metronome::kernels
