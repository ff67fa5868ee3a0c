// The cache level the kernels' software prefetches of streamed data fill (the decode kernels'
// weight streams, the bf16 attention's next KV block): L2, not L1. A streamed line is used once;
// a T0 prefetch holds one of the core's few L1 miss buffers for the whole DRAM round trip and lands
// in an L1 the kernel's working set already fills, while L2's deeper miss queue absorbs it
// (bench/kernels_benchmark BM_PagedAttentionDecodeStep; docs/performance.md, "Attention kernel").
// A pure stream reads the same with either hint, so the bandwidth probe keeps T0.
#pragma once

#if defined(__x86_64__)
#include <xmmintrin.h>

namespace metronome::kernels::internal {

inline constexpr auto kStreamPrefetchHint = _MM_HINT_T1;

}  // namespace metronome::kernels::internal
#endif
