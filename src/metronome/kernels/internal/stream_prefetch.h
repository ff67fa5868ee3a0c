// The cache level the kernels' software prefetches of streamed data fill: the weight streams of the
// decode kernels (quant_gemv_avx512.cc, quant_interleaved_avx512.cc) and the next KV block of the
// bf16 attention kernel (paged_attention_bf16.cc).
//
// L2 (prefetcht1), not L1 (prefetcht0). A stream's lines are used once, a few hundred
// nanoseconds after they are asked for; a T0 prefetch holds one of the core's few L1 miss buffers
// for the whole DRAM round trip and puts the line into a 32 KiB L1 that the kernel's working set
// (a KV block's rows, the activations, the register spills) already fills, so on a loaded core the
// prefetches are dropped or evicted before use. Into L2 the requests queue in the L2's deeper miss
// queue, and the later demand load hits L2. Measured on the Zen 4 VM (docs/performance.md,
// "Stream prefetches into L2"): one thread reading 12 KiB runs 360 KiB apart (one layer of
// consecutive KV blocks) with the next run prefetched: 11-15 GB/s at T0, 19-22 at T1, 12 without;
// the attention of 32 sessions x 512 keys x 30 layers on one thread 67-68 -> 30-32 ms. A pure
// stream (no compute beside it: the bandwidth probe) reads the same with either hint, so the probe
// keeps T0.
//
// Header-only constant; x86-64 only (the callers are AVX-512 translation units).
#pragma once

#if defined(__x86_64__)
#include <xmmintrin.h>

namespace metronome::kernels::internal {

inline constexpr auto kStreamPrefetchHint = _MM_HINT_T1;

}  // namespace metronome::kernels::internal
#endif
