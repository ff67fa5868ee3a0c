// Attention of a chunk of query tokens of one session over that session's paged KV, for one layer
// and one KV head (all query heads of its GQA group). Which keys each query sees is decided
// outside, by the session's KV policy (kv::KvPolicy::KeysOf, the window/sink rule), and comes in as
// one base::QueryKeys per query: its sink range, its window range and the sinks' query rotation.
// The kernels apply those ranges token-exactly and know nothing of windows, sinks or positions.
//
// Keys in the pool were rotated once, at their absolute positions, when written. For `rolling`
// positions the window scores are therefore already exact (they depend on p - j only); the sink
// scores use the query moved to position S + W - 1, obtained by rotating the (absolutely rotated)
// query by QueryKeys::sink_rotation = (S + W - 1) - p. No stored key is ever re-rotated.
//
// Implementations (AttentionImpl): a portable one for every CPU and head dim (the test reference;
// bf16 K/V widened to fp32 on load), an AVX-512 one with q and the output accumulator in registers
// (head dims 16/32/64/128; bf16 widened on load), and for bf16 KV on CPUs with AVX512_BF16 one that
// computes q.k with vdpbf16ps on the stored bf16 keys (q enters as a bf16 hi + lo pair, so the
// scores keep ~16 mantissa bits of q; V is widened, exactly). kAuto picks the last available one.
//
// Thread-safety: reentrant; callers run different (session, kv_head) pairs, or key slices, on
// different threads with separate scratch buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "metronome/base/paged_kv.h"
#include "metronome/base/types.h"
#include "metronome/kernels/rope.h"

namespace metronome::kernels {

using base::KvDtype;
using base::PagedKvView;
using base::QueryKeys;

struct AttentionShape {
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  [[nodiscard]] int group() const { return num_heads / num_kv_heads; }
  [[nodiscard]] int q_dim() const { return num_heads * head_dim; }
};

enum class AttentionImpl : std::uint8_t {
  kAuto,      // the fastest available for the pool's dtype and the head dim (what the engine runs)
  kPortable,  // any CPU, any head dim: scalar / vector_ops, bf16 widened on load
  kAvx512,    // AVX-512F, head dims 16/32/64/128: q in registers, bf16 widened on load
  kAvx2,      // AVX2 + FMA (CPUs without AVX-512), the same head dims and loop as kAvx512
  kAvx512Bf16,  // AVX512_BF16, bf16 KV, head dims 16/32/64/128: q.k by vdpbf16ps, q as hi + lo
  kAvx512Bf16RoundedQ,  // as kAvx512Bf16 with q rounded to one bf16 (half the dot products; less
                        // accurate: kept for the accuracy/speed comparison in docs/performance.md)
};
[[nodiscard]] const char* ToString(AttentionImpl impl);

// Whether `impl` can run here for this shape and pool dtype (kAuto and kPortable always can).
[[nodiscard]] bool AttentionImplAvailable(AttentionImpl impl, const AttentionShape& shape,
                                          KvDtype dtype) noexcept;
// The implementation kAuto runs for this shape and pool dtype.
[[nodiscard]] AttentionImpl ResolveAttentionImpl(const AttentionShape& shape,
                                                 KvDtype dtype) noexcept;

// Floats of scratch PagedAttention (and PagedAttentionHeads over any kv heads) needs when no query
// sees more than `max_visible` keys.
[[nodiscard]] std::size_t AttentionScratchFloats(const AttentionShape& shape,
                                                 std::int64_t max_visible);

// One query per element of `queries` (its visible keys, kv::KvPolicy::KeysOf of its position;
// the queries of one call are tokens of the current step, so every key between the first and the
// last any of them sees is resident: the bf16 kernel walks that span once for all of them);
// q and out hold one row per query (row strides `q_stride` and `out_stride` floats, query heads
// first in each row); only the columns of `kv_head`'s group are read and written.
// `scratch` holds AttentionScratchFloats(shape, max count() of these queries) floats.
// An explicit `impl` must be AttentionImplAvailable (checked: a bug otherwise).
// `sink_angles` (optional): row i holds rope.Angles(queries[i].sink_rotation) for every query i
// with rotate_sinks (other rows are not read), the rotation that moves the query to the sinks'
// frame; callers running many layers and kv heads per step prepare it once per step. Without it
// the kernel evaluates those angles itself on every call. The result is the same either way.
void PagedAttention(const AttentionShape& shape, const PagedKvView& kv,
                    std::span<const QueryKeys> queries, const Rope& rope, int layer, int kv_head,
                    const float* q, float* out, std::size_t q_stride, std::size_t out_stride,
                    float* scratch, AttentionImpl impl = AttentionImpl::kAuto,
                    const RopeAngleRows* sink_angles = nullptr) noexcept;

// PagedAttention for kv heads [kv_head, kv_head + kv_heads) in one call: the outputs of one
// PagedAttention per kv head, bit for bit. With the AVX512_BF16 kernel, heads whose groups fit one
// register tile walk the blocks together: a block's rows of adjacent kv heads are contiguous
// ([token][kv_dim]), so they are used while in L1, and the next block's rows are prefetched as the
// walk goes (a session's blocks are scattered over the pool, which hardware prefetchers cannot
// follow). That is what a decode query wants; the other implementations loop over the heads.
void PagedAttentionHeads(const AttentionShape& shape, const PagedKvView& kv,
                         std::span<const QueryKeys> queries, const Rope& rope, int layer,
                         int kv_head, int kv_heads, const float* q, float* out,
                         std::size_t q_stride, std::size_t out_stride, float* scratch,
                         AttentionImpl impl = AttentionImpl::kAuto,
                         const RopeAngleRows* sink_angles = nullptr) noexcept;

// Flash-decoding: the visible keys of one query split into slices attended independently (on
// different threads), then merged exactly. A slice is the visible-key indices [key_begin, key_end)
// in sinks-then-window order (0 <= key_begin < key_end <= QueryKeys::count()) of one or more
// adjacent kv heads; its result is the softmax-weighted mean of V over those keys for each query
// head h of those kv heads' groups (h counted from the first kv head's group), written to
// out[h * head_dim ...], and the slice's maximum scaled score and sum of exp(score - maximum) to
// stats[2h] and stats[2h + 1].
struct AttentionKeySlice {
  std::int64_t key_begin = 0;
  std::int64_t key_end = 0;
  float* out = nullptr;    // kv_heads * group * head_dim floats
  float* stats = nullptr;  // 2 * kv_heads * group floats
};

// PagedAttentionHeads of the single query `keys` (row q_row: all query heads) over kv
// heads [kv_head, kv_head + kv_heads), restricted to `slice`. Several kv heads in one slice walk
// each block's rows of all of them together (see PagedAttentionHeads): that is what one long
// session wants, whose few kv heads alone cannot keep the threads busy. sink_angles: row 0 as in
// PagedAttention, for this query.
void PagedAttentionSlice(const AttentionShape& shape, const PagedKvView& kv, const QueryKeys& keys,
                         const Rope& rope, int layer, int kv_head, int kv_heads, const float* q_row,
                         const AttentionKeySlice& slice, float* scratch,
                         AttentionImpl impl = AttentionImpl::kAuto,
                         const RopeAngleRows* sink_angles = nullptr) noexcept;

// Merges `count` >= 1 slices of one query over the same `kv_heads` kv heads covering its visible
// keys: `outs` holds their outputs (count x kv_heads x group x head_dim floats), `stats` their
// statistics (count x 2 x kv_heads x group). Writes those kv heads' query heads (kv_heads x group x
// head_dim floats) to `out`: what PagedAttentionHeads writes, up to fp32 rounding.
void MergeAttentionSlices(const AttentionShape& shape, int kv_heads, const float* outs,
                          const float* stats, int count, float* out) noexcept;

}  // namespace metronome::kernels
