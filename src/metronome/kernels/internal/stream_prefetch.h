// The cache level the kernels' software prefetches of streamed data fill (the decode kernels'
// weight streams, the bf16 attention's next KV block): L2, not L1. A streamed line is used once;
// a T0 prefetch holds one of the core's few L1 miss buffers for the whole DRAM round trip and lands
// in an L1 the kernel's working set already fills, while L2's deeper miss queue absorbs it
// (bench/kernels_benchmark BM_PagedAttentionDecodeStep; docs/performance.md, "Attention kernel").
// A pure stream reads the same with either hint, so the bandwidth probe keeps T0.
#pragma once

#if defined(__x86_64__)
#include <xmmintrin.h>

#include <cstddef>

namespace metronome::kernels::internal {

inline constexpr auto kStreamPrefetchHint = _MM_HINT_T1;

// Where a prefetch may go. kScheduled: _mm_prefetch, which the compiler may schedule anywhere in
// its basic block (it depends on nothing). kInPlace: a volatile asm statement, which GCC's
// scheduler does not move (nor anything across it). In an unrolled K-quant super-block the
// scheduler hoisted every _mm_prefetch to the block's start, a burst of 36-52 that holds the core's
// miss buffers while the loads behind it wait (BM_DecodeDram's paired_fraction: Q6_K lost a
// twentieth of its read rate at one row and a tenth or more at 8). Not for compute-bound blocks
// that need the scheduler's freedom: Q8_0's interleaved tile at 8 rows lost a twentieth to
// kInPlace.
enum class PrefetchPlacement { kScheduled, kInPlace };

// Prefetches the kBytes from `from` on with kStreamPrefetchHint, one per 64-byte cache line (a
// line's first prefetch brings it; a range that starts mid-line may leave its last line out).
template <std::size_t kBytes, PrefetchPlacement kPlacement = PrefetchPlacement::kScheduled>
inline void PrefetchStreamLines(const void* from) noexcept {
  static_assert(kStreamPrefetchHint == _MM_HINT_T1, "the asm below spells the hint");
  constexpr std::size_t kCacheLineBytes = 64;
#pragma GCC unroll 64
  for (std::size_t line = 0; line < kBytes; line += kCacheLineBytes) {
    const char* at = static_cast<const char*>(from) + line;
    if constexpr (kPlacement == PrefetchPlacement::kInPlace) {
      asm volatile("prefetcht1 %0" : : "m"(*at));
    } else {
      _mm_prefetch(at, kStreamPrefetchHint);
    }
  }
}

}  // namespace metronome::kernels::internal
#endif
