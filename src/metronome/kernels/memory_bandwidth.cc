#include "metronome/kernels/memory_bandwidth.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "metronome/base/streamed_memory.h"
#include "metronome/base/thread_pool.h"

namespace metronome::kernels {
namespace {

constexpr std::size_t kLineWords = 8;  // 64-byte cache line in 64-bit words
// Independent streams per thread: one sequential stream leaves the core's line-fill buffers mostly
// idle (the hardware prefetcher runs a limited distance ahead of one stream); several streams a
// slice apart keep more lines in flight, as a kernel reading several weight rows does.
constexpr std::size_t kStreams = 4;
// Software prefetch distance in lines ahead of each stream (~1 KB: a few hundred ns of DRAM
// latency at the per-stream rate). The hint is T0 (into every cache level): with nothing computed
// beside the loads it reads as fast as T1, the kernels' hint (internal/stream_prefetch.h), and a
// non-temporal prefetch (prefetchnta, what __builtin_prefetch(p, 0, 0) emits) fills only
// L1 and does not train the L2 streamer, so the probe would read well below what the weight
// kernels stream (a probe below oneDNN's fp32 GEMV is the symptom: compare bench-decode's F32
// `gemm reads GB/s` with its probe).
constexpr std::size_t kPrefetchLines = 16;
constexpr int kPrefetchLocalityAllLevels = 3;  // __builtin_prefetch's locality for prefetcht0
// Slices per pool thread: the pool hands out chunks dynamically, so a thread that is preempted for
// a while leaves its remaining slices to the others instead of holding up the pass.
constexpr std::size_t kSlicesPerThread = 4;

// Sums `lines` cache lines of each of kStreams streams `stride` words apart, 8 lanes per stream so
// the loop is limited by loads, not by an add chain (the compiler widens the lanes to the build's
// vector width).
std::uint64_t SumStreams(const std::uint64_t* p, std::size_t stride, std::size_t lines) noexcept {
  std::uint64_t s[kStreams][kLineWords] = {};
  for (std::size_t i = 0; i < lines; ++i) {
    const std::size_t at = i * kLineWords;
    for (std::size_t st = 0; st < kStreams; ++st) {
      const std::uint64_t* line = p + st * stride + at;
      __builtin_prefetch(line + kPrefetchLines * kLineWords, 0, kPrefetchLocalityAllLevels);
      for (std::size_t l = 0; l < kLineWords; ++l) s[st][l] += line[l];
    }
  }
  std::uint64_t total = 0;
  for (const auto& stream : s) {
    for (const std::uint64_t v : stream) total += v;
  }
  return total;
}

// Sums `lines` cache lines read as one ascending stream, no software prefetch: what the hardware
// prefetcher alone draws from one stream (on some machines, and in some phases of a shared one,
// more than the prefetched streams above).
std::uint64_t SumSequential(const std::uint64_t* p, std::size_t lines) noexcept {
  std::uint64_t s[kLineWords] = {};
  for (std::size_t i = 0; i < lines; ++i) {
    const std::uint64_t* line = p + i * kLineWords;
    for (std::size_t l = 0; l < kLineWords; ++l) s[l] += line[l];
  }
  std::uint64_t total = 0;
  for (const std::uint64_t v : s) total += v;
  return total;
}

}  // namespace

ReadBandwidthProbe::ReadBandwidthProbe(base::ThreadPool& pool, std::size_t buffer_bytes)
    : pool_(&pool) {
  slices_ = static_cast<std::size_t>(pool.num_threads()) * kSlicesPerThread;
  // Every slice holds kStreams whole streams of whole lines.
  const std::size_t lines_per_stream = buffer_bytes / 64 / (slices_ * kStreams);
  if (lines_per_stream == 0) return;
  const std::size_t slice_words = lines_per_stream * kLineWords * kStreams;
  // The same memory the weights and the KV pool live in (huge pages where available): the probe
  // measures what the machine streams from it, not the cost of 4 KiB pages.
  memory_ = base::AllocateStreamed(slice_words * slices_ * sizeof(std::uint64_t));
  if (memory_ == nullptr) return;
  lines_per_stream_ = lines_per_stream;
  auto* const words_at = reinterpret_cast<std::uint64_t*>(memory_.get());
  // First touch by the pool threads, so pages land on the NUMA nodes of the threads that read them.
  pool.ParallelFor(static_cast<std::int64_t>(slices_), 1, [&](std::int64_t b, std::int64_t e) {
    for (auto s = static_cast<std::size_t>(b); s < static_cast<std::size_t>(e); ++s) {
      std::uint64_t* slice = words_at + s * slice_words;
      for (std::size_t i = 0; i < slice_words; ++i) slice[i] = i;
    }
  });
}

double ReadBandwidthProbe::MeasureGBps(int repeats) const {
  if (lines_per_stream_ == 0) return 0.0;
  base::ThreadPool& pool = *pool_;
  const std::size_t stream_words = lines_per_stream_ * kLineWords;
  const std::size_t slice_words = stream_words * kStreams;
  const std::size_t words = slice_words * slices_;
  const auto* const words_at = reinterpret_cast<const std::uint64_t*>(memory_.get());
  std::vector<std::uint64_t> totals(slices_);
  volatile std::uint64_t sink = 0;
  double best = 0.0;
  // Each repeat reads the buffer both ways (prefetched streams, one plain stream a slice); the
  // figure is the best pass: the bandwidth the machine streams however it is read.
  for (int r = 0; r < std::max(1, repeats); ++r) {
    for (const bool streams : {true, false}) {
      const auto t0 = std::chrono::steady_clock::now();
      pool.ParallelFor(static_cast<std::int64_t>(slices_), 1, [&](std::int64_t b, std::int64_t e) {
        for (auto s = static_cast<std::size_t>(b); s < static_cast<std::size_t>(e); ++s) {
          const std::uint64_t* slice = words_at + s * slice_words;
          totals[s] = streams ? SumStreams(slice, stream_words, lines_per_stream_)
                              : SumSequential(slice, lines_per_stream_ * kStreams);
        }
      });
      const double sec =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      for (const std::uint64_t t : totals) sink = sink + t;
      best = std::max(best, static_cast<double>(words * sizeof(std::uint64_t)) / sec / 1e9);
    }
  }
  return best;
}

double MeasureReadBandwidthGBps(base::ThreadPool& pool, std::size_t buffer_bytes, int repeats) {
  return ReadBandwidthProbe(pool, buffer_bytes).MeasureGBps(repeats);
}

}  // namespace metronome::kernels
