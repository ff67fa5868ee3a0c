// PagedAttention for bf16 KV on CPUs with AVX512_BF16: q.k by vdpbf16ps straight on the stored
// bf16 keys; V widened to fp32 (exact) and accumulated with FMAs in the shared loop's AVX-512 ops.
//
// This file is compiled for AVX512_BF16 by a target pragma (not a per-file -m flag), so only the
// code after the pragma may use those instructions: every header it needs is included before, and
// the shared loop (internal/attention_loop.h, internal linkage) is instantiated here for this ISA
// only. PagedAttention calls in only after CpuHasAvx512Bf16().
//
// Accuracy: vdpbf16ps multiplies bf16 pairs exactly and accumulates in fp32. K is stored as bf16
// already, so the only new rounding is q's. q = hi + lo with hi = bf16(q), lo = bf16(q - hi)
// leaves |q - hi - lo| <= 2^-16 |q| (vs 2^-8 for hi alone), at two dot products per pair.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "metronome/base/check.h"
#include "metronome/base/types.h"
#include "metronome/kernels/paged_attention.h"
#include "metronome/kernels/rope.h"
#include "metronome/kernels/vector_ops.h"
#include "metronome/kv/kv_policy.h"
#include "metronome/kv/paged_kv_view.h"

#if defined(__x86_64__)
#include <immintrin.h>
#if defined(__clang__)
#pragma clang attribute push( \
    __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")
#endif
#endif

#include "metronome/kernels/internal/attention_loop.h"

#if defined(__x86_64__) && defined(__AVX512BF16__) && defined(__AVX512F__)
#define MTR_HAVE_BF16_DOT 1
#endif

namespace metronome::kernels {
namespace {

#if defined(MTR_HAVE_BF16_DOT)
// Head dims 32k (+16): each register holds 32 bf16 = 16 pairs; a trailing half register is
// loaded with a 16-lane mask (its upper lanes are zero in q and in the key load).
template <int HD, bool kSplitQ>
struct Bf16DotOps {
  static constexpr int kFull = HD / 32;
  static constexpr bool kHalf = HD % 32 == 16;
  static constexpr int kRegs = kFull + (kHalf ? 1 : 0);
  static_assert(HD % 16 == 0 && kRegs >= 1);

  // bf16(q) of 32 consecutive floats (the last 16 may be absent: zero) and the rounding residue.
  static void ToBf16Pair(const float* q, bool full, __m512bh* hi, __m512bh* lo) {
    const __m512 a = _mm512_loadu_ps(q);
    const __m512 b = full ? _mm512_loadu_ps(q + 16) : _mm512_setzero_ps();
    *hi = _mm512_cvtne2ps_pbh(b, a);  // lanes 0..15 from a, 16..31 from b
    const auto hi_bits = std::bit_cast<__m512i>(*hi);
    const __m512 a_hi = WidenBf16x16(_mm512_castsi512_si256(hi_bits));
    const __m512 b_hi = WidenBf16x16(_mm512_extracti64x4_epi64(hi_bits, 1));
    *lo = _mm512_cvtne2ps_pbh(_mm512_sub_ps(b, b_hi), _mm512_sub_ps(a, a_hi));
  }
  static __m512bh LoadKey(const std::uint16_t* k, int c) {
    if (c < kFull) return std::bit_cast<__m512bh>(_mm512_loadu_si512(k + 32 * c));
    return std::bit_cast<__m512bh>(_mm512_maskz_loadu_epi16(0x0000ffffu, k + 32 * c));
  }

  struct ScoreHead {
    __m512bh hi[kRegs];
    __m512bh lo[kRegs];
    void Begin(const float* qh, int /*hd*/) {
#pragma GCC unroll 8
      for (int c = 0; c < kRegs; ++c) ToBf16Pair(qh + 32 * c, c < kFull, &hi[c], &lo[c]);
    }
    [[nodiscard]] float Score(const std::uint16_t* k, int /*hd*/) const {
      __m512 acc_hi = _mm512_setzero_ps();
      __m512 acc_lo = _mm512_setzero_ps();
#pragma GCC unroll 8
      for (int c = 0; c < kRegs; ++c) {
        const __m512bh key = LoadKey(k, c);
        acc_hi = _mm512_dpbf16_ps(acc_hi, hi[c], key);
        if constexpr (kSplitQ) acc_lo = _mm512_dpbf16_ps(acc_lo, lo[c], key);
      }
      if constexpr (kSplitQ) acc_hi = _mm512_add_ps(acc_hi, acc_lo);
      return _mm512_reduce_add_ps(acc_hi);
    }
  };
  using OutHead = typename SimdOps<HD / 16>::OutHead;
};

template <bool kSplitQ>
bool Run(const AttentionShape& shape, const kv::PagedKvView& kv, const kv::KvPolicy& policy,
         const Rope& rope, int layer, int kv_head, TokenPos pos0, int n, const float* q, float* out,
         std::size_t q_stride, std::size_t out_stride, float* scratch) noexcept {
  switch (shape.head_dim) {
    case 16:
      AttendQueries<Bf16DotOps<16, kSplitQ>, std::uint16_t>(
          shape, kv, policy, rope, layer, kv_head, pos0, n, q, out, q_stride, out_stride, scratch);
      return true;
    case 32:
      AttendQueries<Bf16DotOps<32, kSplitQ>, std::uint16_t>(
          shape, kv, policy, rope, layer, kv_head, pos0, n, q, out, q_stride, out_stride, scratch);
      return true;
    case 64:
      AttendQueries<Bf16DotOps<64, kSplitQ>, std::uint16_t>(
          shape, kv, policy, rope, layer, kv_head, pos0, n, q, out, q_stride, out_stride, scratch);
      return true;
    case 128:
      AttendQueries<Bf16DotOps<128, kSplitQ>, std::uint16_t>(
          shape, kv, policy, rope, layer, kv_head, pos0, n, q, out, q_stride, out_stride, scratch);
      return true;
    default:
      return false;
  }
}
#endif

}  // namespace

namespace internal {

bool Bf16DotHeadDim(int head_dim) noexcept {
#if defined(MTR_HAVE_BF16_DOT)
  return head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128;
#else
  (void)head_dim;
  return false;
#endif
}

bool PagedAttentionBf16Dot(bool split_q, const AttentionShape& shape, const kv::PagedKvView& kv,
                           const kv::KvPolicy& policy, const Rope& rope, int layer, int kv_head,
                           TokenPos pos0, int n, const float* q, float* out, std::size_t q_stride,
                           std::size_t out_stride, float* scratch) noexcept {
#if defined(MTR_HAVE_BF16_DOT)
  MTR_DCHECK(kv.dtype == kv::KvDtype::kBF16, "bf16 dot kernel on an fp32 pool");
  return split_q ? Run<true>(shape, kv, policy, rope, layer, kv_head, pos0, n, q, out, q_stride,
                             out_stride, scratch)
                 : Run<false>(shape, kv, policy, rope, layer, kv_head, pos0, n, q, out, q_stride,
                              out_stride, scratch);
#else
  (void)split_q, (void)shape, (void)kv, (void)policy, (void)rope, (void)layer, (void)kv_head;
  (void)pos0, (void)n, (void)q, (void)out, (void)q_stride, (void)out_stride, (void)scratch;
  return false;
#endif
}

}  // namespace internal
}  // namespace metronome::kernels

#if defined(__x86_64__)
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif
