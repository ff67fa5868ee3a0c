// The loop of PagedAttention shared by its translation units: visible key ranges, the walk over
// the block table, rolling sink rotation, softmax and the V accumulation, parameterised by the
// per-head score/accumulate operations (`Ops`) and the pool's element type E (float, or uint16_t
// holding bf16).
//
// Everything here has internal linkage on purpose: paged_attention_bf16.cc includes this header
// under an AVX512_BF16 target pragma, so each translation unit must get its own copy of every
// function (no inline function compiled for a wider ISA may be picked by the linker for callers
// running on CPUs without it).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "metronome/base/check.h"
#include "metronome/base/types.h"
#include "metronome/kernels/internal/avx2_sum.h"
#include "metronome/kernels/paged_attention.h"
#include "metronome/kernels/rope.h"
#include "metronome/kernels/vector_ops.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace metronome::kernels {
namespace {  // internal linkage per translation unit, see above

// One contiguous run of visible keys [begin, end).
struct KeyRange {
  TokenPos begin;
  TokenPos end;
  bool sinks;  // the pinned range [0, S)
};

// The (at most two) non-empty visible ranges of a query, sinks first.
inline int VisibleRanges(const QueryKeys& keys, KeyRange out[2]) {
  int n = 0;
  if (keys.sink_end > 0) out[n++] = {0, keys.sink_end, true};
  if (keys.window_begin < keys.window_end) out[n++] = {keys.window_begin, keys.window_end, false};
  return n;
}

// The head dims the SIMD kernels are instantiated for: calls fn(std::integral_constant<int, HD>)
// for HD = head_dim if it is one of them and returns whether it was (the one list of them).
template <typename Fn, int... kHeadDims>
inline bool WithHeadDimOf(int head_dim, Fn&& fn, std::integer_sequence<int, kHeadDims...>) {
  return ((head_dim == kHeadDims && (fn(std::integral_constant<int, kHeadDims>{}), true)) || ...);
}
template <typename Fn>
inline bool WithSimdHeadDim(int head_dim, Fn&& fn) {
  return WithHeadDimOf(head_dim, fn, std::integer_sequence<int, 16, 32, 64, 128>{});
}

// Keeps of `ranges` only the visible keys with index [key_begin, key_end) in the order the ranges
// list them (sinks first); returns how many ranges remain (empty ones are dropped).
inline int ClipRanges(KeyRange ranges[2], int num_ranges, std::int64_t key_begin,
                      std::int64_t key_end) {
  int kept = 0;
  std::int64_t first = 0;  // visible-key index of the current range's first key
  for (int r = 0; r < num_ranges; ++r) {
    const KeyRange range = ranges[r];
    const std::int64_t len = range.end - range.begin;
    const std::int64_t lo = std::max<std::int64_t>(key_begin - first, 0);
    const std::int64_t hi = std::min<std::int64_t>(key_end - first, len);
    if (lo < hi) ranges[kept++] = {range.begin + lo, range.begin + hi, range.sinks};
    first += len;
  }
  return kept;
}

// The visible ranges of a query (VisibleRanges), restricted to `slice`'s keys when not null.
inline int SliceRanges(const QueryKeys& keys, const AttentionKeySlice* slice, KeyRange out[2]) {
  const int n = VisibleRanges(keys, out);
  return slice != nullptr ? ClipRanges(out, n, slice->key_begin, slice->key_end) : n;
}

// What the kernels need of query i of a call: its visible ranges (restricted to `slice` when not
// null), its q row and its output row, both from the column group_off on (the slice's own output
// for a key slice).
struct QueryRow {
  KeyRange ranges[2];
  int num_ranges;
  const float* q;
  float* out;
};
inline QueryRow RowOfQuery(const QueryKeys* queries, int i, const AttentionKeySlice* slice,
                           const float* q, std::size_t q_stride, float* out, std::size_t out_stride,
                           std::size_t group_off) {
  QueryRow row;
  row.num_ranges = SliceRanges(queries[i], slice, row.ranges);
  row.q = q + static_cast<std::size_t>(i) * q_stride + group_off;
  row.out =
      slice != nullptr ? slice->out : out + static_cast<std::size_t>(i) * out_stride + group_off;
  return row;
}

#if defined(__AVX512F__)
// 16 bf16 values widened to fp32 (exact: bf16 is the top half of an fp32).
inline __m512 WidenBf16x16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline __m512 LoadBf16x16(const std::uint16_t* p) {
  return WidenBf16x16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 Load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 Load16(const std::uint16_t* p) { return LoadBf16x16(p); }

// The 16-lane operations VecHead runs on (Avx2Vec below names the same ones); q.k in one FMA
// chain.
struct Avx512Vec {
  using Reg = __m512;
  static constexpr int kLanes = 16;
  static constexpr int kDotChains = 1;
  static Reg Load(const float* p) { return Load16(p); }
  static Reg Load(const std::uint16_t* p) { return Load16(p); }
  static Reg Zero() { return _mm512_setzero_ps(); }
  static Reg Set1(float a) { return _mm512_set1_ps(a); }
  static Reg Mul(Reg a, Reg b) { return _mm512_mul_ps(a, b); }
  static Reg Add(Reg a, Reg b) { return _mm512_add_ps(a, b); }
  static Reg Fma(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  static void Store(float* p, Reg v) { _mm512_storeu_ps(p, v); }
  static float Sum(Reg v) { return _mm512_reduce_add_ps(v); }
};
#endif

#if defined(__AVX2__) && defined(__FMA__)
// The 8-lane operations, for CPUs without AVX-512; q.k alternates two FMA chains so their latency
// is paid once per two vectors.
struct Avx2Vec {
  using Reg = __m256;
  static constexpr int kLanes = 8;
  static constexpr int kDotChains = 2;
  static Reg Load(const float* p) { return _mm256_loadu_ps(p); }
  static Reg Load(const std::uint16_t* p) {  // 8 bf16 widened to fp32 (exact)
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static Reg Zero() { return _mm256_setzero_ps(); }
  static Reg Set1(float a) { return _mm256_set1_ps(a); }
  static Reg Mul(Reg a, Reg b) { return _mm256_mul_ps(a, b); }
  static Reg Add(Reg a, Reg b) { return _mm256_add_ps(a, b); }
  static Reg Fma(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
  static void Store(float* p, Reg v) { _mm256_storeu_ps(p, v); }
  static float Sum(Reg v) { return internal::HorizontalSum(v); }
};
#endif

// One head of C = head_dim / V::kLanes vector registers (V: Avx512Vec or Avx2Vec; the head dims of
// WithSimdHeadDim): the query or the output accumulator held in registers. Heads are the outer
// loop: each walk over the visible blocks serves one head, and the group's other heads re-read the
// same K/V from L1/L2, not DRAM.
template <class V, int C>
struct VecHead {
  typename V::Reg v[C];
  void Load(const float* p) {
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) v[c] = V::Load(p + V::kLanes * c);
  }
  // The dot with a key row, in V::kDotChains interleaved FMA chains.
  template <typename E>
  [[nodiscard]] float DotWith(const E* k) const {
    typename V::Reg chains[V::kDotChains];
    chains[0] = V::Mul(v[0], V::Load(k));
#pragma GCC unroll 2
    for (int c = 1; c < V::kDotChains; ++c) chains[c] = V::Zero();
#pragma GCC unroll 16
    for (int c = 1; c < C; ++c) {
      auto& chain = chains[c % V::kDotChains];
      chain = V::Fma(v[c], V::Load(k + V::kLanes * c), chain);
    }
#pragma GCC unroll 2
    for (int c = 1; c < V::kDotChains; ++c) chains[0] = V::Add(chains[0], chains[c]);
    return V::Sum(chains[0]);
  }
  void Zero() {
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) v[c] = V::Zero();
  }
  template <typename E>
  void AddScaled(float a, const E* x) {
    const typename V::Reg va = V::Set1(a);
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) v[c] = V::Fma(va, V::Load(x + V::kLanes * c), v[c]);
  }
  void Store(float* p) const {
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) V::Store(p + V::kLanes * c, v[c]);
  }
};

// The per-head operations AttendQueries takes (`Ops`) on V's registers: q fp32 in registers; K
// and V read as fp32 or widened from bf16 (exact).
template <class V, int C>
struct VecOps {
  struct ScoreHead {
    VecHead<V, C> q;
    void Begin(const float* qh, int /*hd*/) { q.Load(qh); }
    template <typename E>
    [[nodiscard]] float Score(const E* k, int /*hd*/) const {
      return q.DotWith(k);
    }
  };
  struct OutHead {
    VecHead<V, C> acc;
    void Begin(int /*hd*/) { acc.Zero(); }
    template <typename E>
    void Add(float a, const E* v, int /*hd*/) {
      acc.AddScaled(a, v);
    }
    void Finish(float* out, int /*hd*/) const { acc.Store(out); }
  };
};

// Calls fn(key_pointer, column) for every visible key of `range`, walking the block table once.
template <typename E, typename Fn>
inline void ForEachKey(const PagedKvView& kv, int layer, std::size_t plane_offset,
                       std::size_t head_off, const KeyRange& range, std::int64_t col, Fn&& fn) {
  const int bt = kv.block_tokens;
  for (TokenPos j = range.begin; j < range.end;) {
    const std::int64_t b = j / bt;
    const auto* base = reinterpret_cast<const E*>(kv.BlockKeys(layer, b));
    MTR_DCHECK(base != nullptr, "visible key in a freed block");
    base += plane_offset + head_off;
    const TokenPos block_end = std::min<TokenPos>((b + 1) * bt, range.end);
    // One division per block, none per key: walk the slots with a pointer.
    const auto stride = static_cast<std::size_t>(kv.kv_dim);
    const E* key = base + static_cast<std::size_t>(j - b * bt) * stride;
    for (; j < block_end; ++j, ++col, key += stride) fn(key, col);
  }
}

// Rolling positions (keys.rotate_sinks): sinks are scored against the query moved to S + W - 1,
// so copies the group's `heads` query heads of q_row to sink_q and rotates them by
// keys.sink_rotation; returns whether it did. The angles of that delta come from `sink_angles`
// row i when the caller prepared them (once per query and step, not per layer and kv head), else
// they are evaluated here.
inline bool MoveQueryToSinkPosition(const Rope& rope, const QueryKeys& keys,
                                    const RopeAngleRows* sink_angles, int i, const float* q_row,
                                    int heads, int hd, float* sink_q) noexcept {
  if (!keys.rotate_sinks) return false;
  std::memcpy(sink_q, q_row, sizeof(float) * static_cast<std::size_t>(heads * hd));
  if (sink_angles != nullptr) {
    const std::size_t row = static_cast<std::size_t>(i) * sink_angles->stride;
    rope.Apply(sink_q, heads, sink_angles->cos + row, sink_angles->sin + row);
  } else {
    rope.Rotate(sink_q, heads, keys.sink_rotation);
  }
  return true;
}

// The part of `slice` (over kv heads from some first one on) that belongs to the kv head `index`
// places after the first: its group's outputs and statistics, for code run kv head by kv head.
inline AttentionKeySlice KvHeadSlice(const AttentionKeySlice& slice, const AttentionShape& shape,
                                     int index) {
  const int group = shape.group();
  return {slice.key_begin, slice.key_end,
          slice.out + static_cast<std::ptrdiff_t>(index) * group * shape.head_dim,
          slice.stats + static_cast<std::ptrdiff_t>(2 * index * group)};
}

// Queries queries[0 .. n) of kv_head's group, restricted to `slice` when not null (then n == 1).
template <typename Ops, typename E>
void AttendQueries(const AttentionShape& shape, const PagedKvView& kv, const QueryKeys* queries,
                   int n, const Rope& rope, int layer, int kv_head, const float* q, float* out,
                   std::size_t q_stride, std::size_t out_stride, float* scratch,
                   const RopeAngleRows* sink_angles, const AttentionKeySlice* slice) noexcept {
  MTR_DCHECK(slice == nullptr || n == 1, "a key slice belongs to one query");
  const int hd = shape.head_dim;
  const int group = shape.group();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const std::size_t head_off = static_cast<std::size_t>(kv_head) * static_cast<std::size_t>(hd);
  const std::size_t group_off =
      static_cast<std::size_t>(kv_head * group) * static_cast<std::size_t>(hd);

  for (int i = 0; i < n; ++i) {
    const QueryRow row = RowOfQuery(queries, i, slice, q, q_stride, out, out_stride, group_off);
    const KeyRange* ranges = row.ranges;
    const int num_ranges = row.num_ranges;
    std::int64_t visible = 0;
    for (int r = 0; r < num_ranges; ++r) visible += ranges[r].end - ranges[r].begin;
    MTR_DCHECK(visible >= 1, "a query always sees itself");

    const float* q_row = row.q;
    float* out_row = row.out;
    float* sink_q = scratch + static_cast<std::size_t>(group) * static_cast<std::size_t>(visible);

    const bool rolling =
        MoveQueryToSinkPosition(rope, queries[i], sink_angles, i, q_row, group, hd, sink_q);

    for (int h = 0; h < group; ++h) {
      float* scores = scratch + static_cast<std::size_t>(h) * static_cast<std::size_t>(visible);
      std::int64_t col = 0;
      for (int r = 0; r < num_ranges; ++r) {
        const bool is_sink_range = rolling && ranges[r].sinks;
        typename Ops::ScoreHead sh;
        sh.Begin((is_sink_range ? sink_q : q_row) + static_cast<std::ptrdiff_t>(h) * hd, hd);
        ForEachKey<E>(kv, layer, 0, head_off, ranges[r], col,
                      [&](const E* k, std::int64_t c) { scores[c] = sh.Score(k, hd) * scale; });
        col += ranges[r].end - ranges[r].begin;
      }
      std::int64_t arg_max = 0;
      if (slice != nullptr) {
        for (std::int64_t c = 1; c < visible; ++c)
          arg_max = scores[c] > scores[arg_max] ? c : arg_max;
        slice->stats[2 * h] = scores[arg_max];
      }
      Softmax(scores, static_cast<int>(visible));
      // The top key's weight is exp(0) / sum: the slice's sum to within one rounding.
      if (slice != nullptr) slice->stats[2 * h + 1] = 1.0f / scores[arg_max];

      typename Ops::OutHead oh;
      oh.Begin(hd);
      if constexpr (requires { oh.Bind(out_row, hd); }) {
        oh.Bind(out_row + static_cast<std::ptrdiff_t>(h) * hd, hd);
      }
      col = 0;
      for (int r = 0; r < num_ranges; ++r) {
        ForEachKey<E>(kv, layer, kv.plane_elements, head_off, ranges[r], col,
                      [&](const E* v, std::int64_t c) { oh.Add(scores[c], v, hd); });
        col += ranges[r].end - ranges[r].begin;
      }
      oh.Finish(out_row + static_cast<std::ptrdiff_t>(h) * hd, hd);
    }
  }
}

}  // namespace

namespace internal {
// The AVX512_BF16 kernel for bf16 KV (paged_attention_bf16.cc). `split_q`: q enters vdpbf16ps as
// two bf16 terms (hi + lo, ~16 mantissa bits) instead of one rounded bf16 (8 bits). kv heads
// [kv_head, kv_head + kv_heads) for queries[0 .. n), restricted to `slice` when not null (then
// n == 1). Returns false, doing nothing, when this build has no such kernel or head_dim has no
// instantiation; callers check CpuHasAvx512Bf16() first.
bool PagedAttentionBf16Dot(bool split_q, const AttentionShape& shape, const PagedKvView& kv,
                           const QueryKeys* queries, int n, const Rope& rope, int layer,
                           int kv_head, int kv_heads, const float* q, float* out,
                           std::size_t q_stride, std::size_t out_stride, float* scratch,
                           const RopeAngleRows* sink_angles,
                           const AttentionKeySlice* slice) noexcept;
// Whether PagedAttentionBf16Dot has an instantiation for head_dim in this build.
bool Bf16DotHeadDim(int head_dim) noexcept;
}  // namespace internal

}  // namespace metronome::kernels
