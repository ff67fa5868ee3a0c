// PagedAttention for bf16 KV on CPUs with AVX512_BF16: q.k by vdpbf16ps straight on the stored
// bf16 keys, 16 keys per score vector; online softmax per chunk of keys; V widened to fp32 (exact)
// and accumulated with FMAs, each V row once for a tile of the group's heads.
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
#include <limits>

#include "metronome/base/check.h"
#include "metronome/base/types.h"
#include "metronome/kernels/internal/stream_prefetch.h"
#include "metronome/kernels/paged_attention.h"
#include "metronome/kernels/rope.h"
#include "metronome/kernels/vector_ops.h"

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
#include "metronome/kernels/internal/simd_exp.h"

#if defined(__x86_64__) && defined(__AVX512BF16__) && defined(__AVX512F__)
#define MTR_HAVE_BF16_DOT 1
#endif

namespace metronome::kernels {
namespace {

#if defined(MTR_HAVE_BF16_DOT)
// Blockwise kernel. For one query and a tile of NH heads of the kv head's group, the visible keys
// are walked once, in chunks of up to 16 keys (never across a block): the chunk's K rows feed NH
// score vectors (16 keys in the lanes of one register: no per-key horizontal sum), an online
// softmax (running max m, running sum l) turns them into weights with one vector exp per head and
// chunk, and each V row is widened once and accumulated into all NH heads' outputs. So each K/V
// byte comes from memory once per tile (the whole group for head dims up to 64), and the next
// block's rows are prefetched while the current one is computed. Several queries in one call (a
// prefill chunk), or one query whose group spans several tiles, share the walk: each chunk of keys
// is computed for all of them and all their tiles (QueryBlock), so a K/V byte comes from memory
// once per block of queries.
//
// Head dims 32k (+16): each key register holds 32 bf16 = 16 pairs; a trailing half register is
// loaded with a 16-lane mask (its upper lanes are zero in q and in the key load).
template <int HD, bool kSplitQ>
struct Blockwise {
  static constexpr int kFull = HD / 32;
  static constexpr bool kHalf = HD % 32 == 16;
  static constexpr int kPairRegs = kFull + (kHalf ? 1 : 0);
  static constexpr int kOutRegs = HD / 16;  // fp32 registers of one head's output
  static constexpr int kChunk = 16;         // keys per score vector
  // Heads per tile: NH output accumulators of kOutRegs registers stay in the 32 zmm registers.
  static constexpr int kMaxTile = HD <= 64 ? 4 : 2;
  static_assert(HD % 16 == 0 && kPairRegs >= 1);

  struct Query {
    __m512bh hi[kPairRegs];
    __m512bh lo[kPairRegs];
  };

  // bf16(q) of 32 consecutive floats (the last 16 may be absent: zero) and the rounding residue.
  static void LoadQuery(const float* q, Query* out) {
#pragma GCC unroll 8
    for (int c = 0; c < kPairRegs; ++c) {
      const __m512 a = _mm512_loadu_ps(q + 32 * c);
      const __m512 b = c < kFull ? _mm512_loadu_ps(q + 32 * c + 16) : _mm512_setzero_ps();
      out->hi[c] = _mm512_cvtne2ps_pbh(b, a);  // lanes 0..15 from a, 16..31 from b
      const auto hi_bits = std::bit_cast<__m512i>(out->hi[c]);
      const __m512 a_hi = WidenBf16x16(_mm512_castsi512_si256(hi_bits));
      const __m512 b_hi = WidenBf16x16(_mm512_extracti64x4_epi64(hi_bits, 1));
      out->lo[c] = _mm512_cvtne2ps_pbh(_mm512_sub_ps(b, b_hi), _mm512_sub_ps(a, a_hi));
    }
  }
  static __m512bh LoadKey(const std::uint16_t* k, int c) {
    if (c < kFull) return std::bit_cast<__m512bh>(_mm512_loadu_si512(k + 32 * c));
    return std::bit_cast<__m512bh>(_mm512_maskz_loadu_epi16(0x0000ffffu, k + 32 * c));
  }

  // Lane k = the sum of the 16 lanes of acc[k]: a transposing reduction tree (15 adds and 30
  // shuffles for 16 keys instead of 16 full horizontal sums).
  static __m512 SumLanes16(const __m512* acc) {
    __m512 t[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {  // per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3]
      t[i] = _mm512_add_ps(_mm512_unpacklo_ps(acc[2 * i], acc[2 * i + 1]),
                           _mm512_unpackhi_ps(acc[2 * i], acc[2 * i + 1]));
    }
    __m512 u[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {  // per 128-bit lane: [a, b, c, d] partial sums
      const __m512d x = _mm512_castps_pd(t[2 * i]);
      const __m512d y = _mm512_castps_pd(t[2 * i + 1]);
      u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                           _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    // Sum the four 128-bit lanes of each u[i] into 128-bit lane i of the result.
    const __m512 v0 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512 v1 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(v0, v1, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(v0, v1, _MM_SHUFFLE(3, 1, 3, 1)));
  }

  // q.k for the `count` (1..16) keys at rows[0], rows[stride], ...; lanes >= count repeat the last
  // key (valid memory; the caller masks them).
  static __m512 Scores16(const Query& q, const std::uint16_t* rows, std::size_t stride, int count) {
    __m512 acc[kChunk];
#pragma GCC unroll 16
    for (int k = 0; k < kChunk; ++k) {
      const std::uint16_t* row = rows + static_cast<std::size_t>(std::min(k, count - 1)) * stride;
      __m512 a = _mm512_setzero_ps();
#pragma GCC unroll 8
      for (int c = 0; c < kPairRegs; ++c) {
        const __m512bh key = LoadKey(row, c);
        a = _mm512_dpbf16_ps(a, q.hi[c], key);
        if constexpr (kSplitQ) a = _mm512_dpbf16_ps(a, q.lo[c], key);
      }
      acc[k] = a;
    }
    return SumLanes16(acc);
  }

  // Prefetches the K and V rows of `head_off` in the block holding key j (up to 16 rows). Always
  // inlined: GCC finds a function whose only effect is prefetching to be pure and deletes its calls
  // (it did: until this was inlined, no prefetch instruction was in the object file).
  [[gnu::always_inline]] static inline void PrefetchBlock(const PagedKvView& kv, int layer,
                                                          std::size_t head_off, TokenPos j) {
    const std::int64_t b = j / kv.block_tokens;
    const std::byte* base = kv.BlockKeys(layer, b);
    if (base == nullptr) return;
    const std::size_t row_bytes = static_cast<std::size_t>(kv.kv_dim) * sizeof(std::uint16_t);
    const std::size_t v_bytes = kv.plane_elements * sizeof(std::uint16_t);
    const char* k = reinterpret_cast<const char*>(base) + head_off * sizeof(std::uint16_t);
    const int rows = std::min(kv.block_tokens, kChunk);
    for (int t = 0; t < rows; ++t, k += row_bytes) {
#pragma GCC unroll 4
      for (int line = 0; line < HD * 2; line += 64) {
        _mm_prefetch(k + line, internal::kStreamPrefetchHint);
        _mm_prefetch(k + v_bytes + line, internal::kStreamPrefetchHint);
      }
    }
  }

  // What a tile accumulates over the keys: per head the running maximum m, the running sum l of
  // exp(score - m) (one lane per key of a chunk, summed at the end) and the output accumulator.
  template <int NH>
  struct Acc {
    float m[NH];
    __m512 l[NH];
    __m512 acc[NH][kOutRegs];

    // Copies member by member: an aggregate copy of the struct becomes a memcpy that keeps the copy
    // out of registers, several times slower per chunk.
    [[gnu::always_inline]] inline void CopyFrom(const Acc& src) {
#pragma GCC unroll 4
      for (int h = 0; h < NH; ++h) {
        m[h] = src.m[h];
        l[h] = src.l[h];
#pragma GCC unroll 8
        for (int c = 0; c < kOutRegs; ++c) acc[h][c] = src.acc[h][c];
      }
    }

    void Reset() {
#pragma GCC unroll 4
      for (int h = 0; h < NH; ++h) {
        m[h] = -std::numeric_limits<float>::infinity();
        l[h] = _mm512_setzero_ps();
#pragma GCC unroll 8
        for (int c = 0; c < kOutRegs; ++c) acc[h][c] = _mm512_setzero_ps();
      }
    }

    // One chunk of `count` (1..16) keys whose K rows start at k_rows, `stride` elements apart, for
    // the NH heads whose queries are q[0..NH). V rows start at v_rows, v_stride elements apart:
    // the stored bf16 rows (widened here), or fp32 rows a walk widened once for all its tiles.
    // pf (optional): where the same rows of one head in the next block start (K; V pf_v bytes
    // later), prefetched one K and one V row per key of the V loop.
    template <typename VT>
    [[gnu::always_inline]] inline void Chunk(const Query* q, const std::uint16_t* k_rows,
                                             std::size_t stride, const VT* v_rows,
                                             std::size_t v_stride, int count, __m512 vscale,
                                             const char* pf = nullptr, std::size_t pf_v = 0) {
      const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
      const auto valid = static_cast<__mmask16>((1u << count) - 1u);
      alignas(64) float weights[NH][kChunk];
#pragma GCC unroll 4
      for (int h = 0; h < NH; ++h) {
        __m512 s = _mm512_mul_ps(Scores16(q[h], k_rows, stride, count), vscale);
        s = _mm512_mask_mov_ps(neg_inf, valid, s);
        const float chunk_max = _mm512_reduce_max_ps(s);
        if (chunk_max > m[h]) {  // rescale what was accumulated under the old maximum
          const __m512 corr = _mm512_set1_ps(std::exp(m[h] - chunk_max));
          l[h] = _mm512_mul_ps(l[h], corr);
#pragma GCC unroll 8
          for (int c = 0; c < kOutRegs; ++c) acc[h][c] = _mm512_mul_ps(acc[h][c], corr);
          m[h] = chunk_max;
        }
        const __m512 e = _mm512_maskz_mov_ps(valid, Exp(_mm512_sub_ps(s, _mm512_set1_ps(m[h]))));
        l[h] = _mm512_add_ps(l[h], e);
        _mm512_store_ps(weights[h], e);
      }
      for (int k = 0; k < count; ++k) {
        if (pf != nullptr) {
          const char* row = pf + static_cast<std::size_t>(k) * stride * sizeof(std::uint16_t);
#pragma GCC unroll 4
          for (int line = 0; line < HD * 2; line += 64) {
            _mm_prefetch(row + line, internal::kStreamPrefetchHint);
            _mm_prefetch(row + pf_v + line, internal::kStreamPrefetchHint);
          }
        }
        const VT* v = v_rows + static_cast<std::size_t>(k) * v_stride;
        __m512 vr[kOutRegs];
#pragma GCC unroll 8
        for (int c = 0; c < kOutRegs; ++c) vr[c] = Load16(v + 16 * c);
#pragma GCC unroll 4
        for (int h = 0; h < NH; ++h) {
          const __m512 w = _mm512_set1_ps(weights[h][k]);
#pragma GCC unroll 8
          for (int c = 0; c < kOutRegs; ++c) acc[h][c] = _mm512_fmadd_ps(w, vr[c], acc[h][c]);
        }
      }
    }

    // Normalised outputs of the NH heads to out_row (head h at h * HD); for a key slice (stats not
    // null) also each head's maximum and sum, for the merge.
    void Finish(float* out_row, float* stats) const {
#pragma GCC unroll 4
      for (int h = 0; h < NH; ++h) {
        const float sum = _mm512_reduce_add_ps(l[h]);
        if (stats != nullptr) {
          stats[2 * h] = m[h];
          stats[2 * h + 1] = sum;
        }
        const __m512 inv = _mm512_set1_ps(1.0f / sum);
        float* o = out_row + static_cast<std::ptrdiff_t>(h) * HD;
#pragma GCC unroll 8
        for (int c = 0; c < kOutRegs; ++c)
          _mm512_storeu_ps(o + 16 * c, _mm512_mul_ps(acc[h][c], inv));
      }
    }
  };

  // Calls fn(k_rows, from, to) for each chunk [from, to) of up to kChunk keys of [begin, end),
  // never across a block (k_rows: the K rows of `head_off` from key `from` on; V rows
  // kv.plane_elements later), prefetching the next block's rows as each block is entered.
  template <typename Fn>
  [[gnu::always_inline]] static inline void ForEachChunk(const PagedKvView& kv, int layer,
                                                         std::size_t head_off, TokenPos begin,
                                                         TokenPos end, Fn&& fn) {
    const int bt = kv.block_tokens;
    const auto stride = static_cast<std::size_t>(kv.kv_dim);
    for (TokenPos j = begin; j < end;) {
      const std::int64_t b = j / bt;
      const auto* k_base = reinterpret_cast<const std::uint16_t*>(kv.BlockKeys(layer, b));
      MTR_DCHECK(k_base != nullptr, "visible key in a freed block");
      k_base += head_off;
      const TokenPos block_end = std::min<TokenPos>((b + 1) * bt, end);
      if (block_end < end) PrefetchBlock(kv, layer, head_off, block_end);
      for (; j < block_end;) {
        const TokenPos chunk_end = std::min<TokenPos>(j + kChunk, block_end);
        fn(k_base + static_cast<std::size_t>(j - b * bt) * stride, j, chunk_end);
        j = chunk_end;
      }
    }
  }

  // The keys of `range` into `a` for the NH heads whose queries are qr[0..NH).
  template <int NH>
  [[gnu::always_inline]] static inline void WalkRange(const PagedKvView& kv, int layer,
                                                      std::size_t head_off, const KeyRange& range,
                                                      const Query* qr, __m512 vscale, Acc<NH>& a) {
    const auto stride = static_cast<std::size_t>(kv.kv_dim);
    ForEachChunk(kv, layer, head_off, range.begin, range.end,
                 [&](const std::uint16_t* k_rows, TokenPos from, TokenPos to) {
                   a.Chunk(qr, k_rows, stride, k_rows + kv.plane_elements, stride,
                           static_cast<int>(to - from), vscale);
                 });
  }

  // Heads [h0, h0 + NH) of the group for the query at row q_row / sink_q (rolling sinks).
  template <int NH>
  static void Tile(const PagedKvView& kv, int layer, std::size_t head_off, const KeyRange* ranges,
                   int num_ranges, bool rolling, const float* q_row, const float* sink_q,
                   float scale, float* out_row, float* stats) {
    Acc<NH> a;
    a.Reset();
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int r = 0; r < num_ranges; ++r) {
      const KeyRange& range = ranges[r];
      const float* qsrc = rolling && range.sinks ? sink_q : q_row;
      Query qr[NH];
#pragma GCC unroll 4
      for (int h = 0; h < NH; ++h) LoadQuery(qsrc + static_cast<std::ptrdiff_t>(h) * HD, &qr[h]);
      WalkRange<NH>(kv, layer, head_off, range, qr, vscale, a);
    }
    a.Finish(out_row, stats);
  }

  // ---- A chunk's queries together (prefill) ----
  // Tiles of the group's heads a block of queries keeps on the stack (queries x tiles): ~1.2 KiB
  // of running state and 1 KiB of query a tile of two heads at head dim 128, ~140 KiB in all.
  static constexpr int kMaxChunkTiles = 64;
  static constexpr int kMaxChunkQueries = 16;

  // The heads per tile of the chunk walk: every tile the same size (one state array), the largest
  // divisor of the group a tile holds.
  static int ChunkTileHeads(int group) {
    for (int nh = std::min(kMaxTile, group); nh > 1; --nh) {
      if (group % nh == 0) return nh;
    }
    return 1;
  }

  // `count` (1..16) bf16 rows of HD elements, `stride` apart, to fp32 rows packed in out.
  static void WidenRows(const std::uint16_t* rows, std::size_t stride, int count, float* out) {
    for (int k = 0; k < count; ++k) {
      const std::uint16_t* row = rows + static_cast<std::size_t>(k) * stride;
#pragma GCC unroll 8
      for (int c = 0; c < kOutRegs; ++c) {
        _mm512_store_ps(out + static_cast<std::size_t>(k) * HD + 16 * c, LoadBf16x16(row + 16 * c));
      }
    }
  }

  // One query of QueryBlock: its `tiles` states reset, its sink range (if any) walked with the
  // heads of sink_src (the query moved to the sinks' frame when rolling), its window queries
  // loaded into qs; returns the index of its window range, -1 if it has none.
  template <int NH>
  static int BeginChunkQuery(const PagedKvView& kv, int layer, std::size_t head_off, int tiles,
                             const QueryRow& row, const float* sink_src, __m512 vscale,
                             Acc<NH>* states, Query (*qs)[NH]) {
    int window = -1;
    for (int t = 0; t < tiles; ++t) states[t].Reset();
    for (int r = 0; r < row.num_ranges; ++r) {
      if (!row.ranges[r].sinks) {
        window = r;
        continue;
      }
      for (int t = 0; t < tiles; ++t) {
        Query qr[NH];
#pragma GCC unroll 4
        for (int h = 0; h < NH; ++h) {
          LoadQuery(sink_src + static_cast<std::ptrdiff_t>(t * NH + h) * HD, &qr[h]);
        }
        Acc<NH> a;
        a.CopyFrom(states[t]);
        WalkRange<NH>(kv, layer, head_off, row.ranges[r], qr, vscale, a);
        states[t].CopyFrom(a);
      }
    }
    for (int t = 0; t < tiles; ++t) {
#pragma GCC unroll 4
      for (int h = 0; h < NH; ++h) {
        LoadQuery(row.q + static_cast<std::ptrdiff_t>(t * NH + h) * HD, &qs[t][h]);
      }
    }
    return window;
  }

  // Queries [i0, i0 + count) of one kv head (count <= kMaxChunkQueries, count x group / NH <=
  // kMaxChunkTiles). Each query's sink range is walked on its own (a few keys, scored with the
  // query's own rotation); then each chunk of keys of the union of their window ranges is
  // computed for every query that sees any of it, and every tile of heads, while its K/V rows are
  // in L1: a prefill chunk's queries, or one decode query whose group needs several tiles, read
  // each K/V row from memory once, not once per query and tile (at a long window the K/V of one
  // kv head does not fit L2, and a chunk of 13 queries with groups of 8 in tiles of 2 read it 52
  // times, a decode query 4). Each query sees a contiguous part of a chunk of keys: its window
  // range cut to the chunk. With a key slice (count == 1) its statistics go to the slice.
  template <int NH>
  static void QueryBlock(const AttentionShape& shape, const PagedKvView& kv,
                         const QueryKeys* queries, int i0, int count, const Rope& rope, int layer,
                         int kv_head, const float* q, float* out, std::size_t q_stride,
                         std::size_t out_stride, float* sink_q, const RopeAngleRows* sink_angles,
                         const AttentionKeySlice* slice) {
    const int group = shape.group();
    const int tiles = group / NH;
    const std::size_t head_off = static_cast<std::size_t>(kv_head) * HD;
    const std::size_t group_off = static_cast<std::size_t>(kv_head * group) * HD;
    const __m512 vscale = _mm512_set1_ps(1.0f / std::sqrt(static_cast<float>(HD)));
    Acc<NH> states[kMaxChunkTiles];
    Query qs[kMaxChunkTiles][NH];
    QueryRow rows[kMaxChunkQueries];
    int window[kMaxChunkQueries];  // index of the query's window range, -1 if none
    TokenPos lo = std::numeric_limits<TokenPos>::max();
    TokenPos hi = std::numeric_limits<TokenPos>::min();
    for (int i = 0; i < count; ++i) {
      const QueryRow& row = rows[i] =
          RowOfQuery(queries, i0 + i, slice, q, q_stride, out, out_stride, group_off);
      const bool rolling = MoveQueryToSinkPosition(rope, queries[i0 + i], sink_angles, i0 + i,
                                                   row.q, group, HD, sink_q);
      window[i] = BeginChunkQuery<NH>(kv, layer, head_off, tiles, row, rolling ? sink_q : row.q,
                                      vscale, &states[i * tiles], &qs[i * tiles]);
      if (window[i] >= 0) {
        lo = std::min(lo, row.ranges[window[i]].begin);
        hi = std::max(hi, row.ranges[window[i]].end);
      }
    }
    const auto stride = static_cast<std::size_t>(kv.kv_dim);
    // The chunk's V rows widened to fp32 once for all its queries and tiles (exact: the same
    // values the per-tile widening gave), read by the FMAs straight from L1.
    alignas(64) float v_wide[kChunk * HD];
    // The union of contiguous windows of consecutive positions is contiguous and each of its keys
    // is visible to some query, so every block it touches is resident.
    ForEachChunk(
        kv, layer, head_off, lo, hi,
        [&](const std::uint16_t* k_rows, TokenPos j, TokenPos chunk_end) {
          WidenRows(k_rows + kv.plane_elements, stride, static_cast<int>(chunk_end - j), v_wide);
          for (int i = 0; i < count; ++i) {
            if (window[i] < 0) continue;
            const KeyRange& w = rows[i].ranges[window[i]];
            const TokenPos from = std::max(j, w.begin);
            const TokenPos to = std::min(chunk_end, w.end);
            if (from >= to) continue;
            const std::uint16_t* kr = k_rows + static_cast<std::size_t>(from - j) * stride;
            const float* vr = v_wide + static_cast<std::size_t>(from - j) * HD;
            for (int t = 0; t < tiles; ++t) {
              Acc<NH> a;
              a.CopyFrom(states[i * tiles + t]);
              a.Chunk(qs[i * tiles + t], kr, stride, vr, HD, static_cast<int>(to - from), vscale);
              states[i * tiles + t].CopyFrom(a);
            }
          }
        });
    for (int i = 0; i < count; ++i) {
      for (int t = 0; t < tiles; ++t) {
        states[i * tiles + t].Finish(rows[i].out + static_cast<std::ptrdiff_t>(t * NH) * HD,
                                     slice != nullptr ? slice->stats + 2 * t * NH : nullptr);
      }
    }
  }

  // Whether AttendChunk takes n queries of this group (within the stack's tiles): several queries;
  // or one whose group needs several tiles of more than one head (each tile's own walk would read
  // the keys again). A group with no divisor that fits a tile (7 at head dim 128) would walk one
  // head at a time, widening each V row once per head instead of once per 2-4: one such query
  // keeps the per-tile walks.
  static bool ChunkWalks(int n, int group) {
    const int nh = ChunkTileHeads(group);
    const int tiles = group / nh;
    return tiles <= kMaxChunkTiles && (n > 1 || (tiles > 1 && nh > 1));
  }

  // Queries [0, n) of one kv head in blocks of QueryBlock (restricted to `slice` when not null:
  // then n == 1).
  static void AttendChunk(const AttentionShape& shape, const PagedKvView& kv,
                          const QueryKeys* queries, int n, const Rope& rope, int layer, int kv_head,
                          const float* q, float* out, std::size_t q_stride, std::size_t out_stride,
                          float* scratch, const RopeAngleRows* sink_angles,
                          const AttentionKeySlice* slice) {
    const int group = shape.group();
    WithTileHeads(ChunkTileHeads(group), [&]<int NH>() {
      const int tiles = group / NH;
      const int per_block = std::max(1, std::min(kMaxChunkQueries, kMaxChunkTiles / tiles));
      for (int i0 = 0; i0 < n; i0 += per_block) {
        QueryBlock<NH>(shape, kv, queries, i0, std::min(per_block, n - i0), rope, layer, kv_head, q,
                       out, q_stride, out_stride, scratch, sink_angles, slice);
      }
    });
  }

  // A walk over the blocks serves at most this many kv heads (their tiles' state lives on the
  // stack: ~2.3 KiB per kv head at head dim 64).
  static constexpr int kMaxWalkHeads = 8;
  // Rows of a block whose lines a walk requests at once when it enters a key range.
  static constexpr int kPrefetchRows = 32;

  // Prefetches the K and V rows of the `span` elements from `head_off` on (kv heads side by side)
  // of logical block b's first rows: one run of lines per plane when the span is whole rows.
  // Written out here, not through a lambda or helper: GCC finds a function whose only effect is
  // prefetching to be pure and deletes its calls (see PrefetchBlock). Into L1 (T0), unlike the
  // next-block prefetches (internal::kStreamPrefetchHint): these rows are loaded right after.
  [[gnu::always_inline]] static inline void PrefetchSpan(const PagedKvView& kv, int layer,
                                                         std::int64_t b, std::size_t head_off,
                                                         std::size_t span) {
    const std::byte* base = kv.BlockKeys(layer, b);
    if (base == nullptr) return;
    const std::size_t row_bytes = static_cast<std::size_t>(kv.kv_dim) * sizeof(std::uint16_t);
    const std::size_t v_bytes = kv.plane_elements * sizeof(std::uint16_t);
    const std::size_t rows = static_cast<std::size_t>(std::min(kv.block_tokens, kPrefetchRows));
    const char* k = reinterpret_cast<const char*>(base) + head_off * sizeof(std::uint16_t);
    const std::size_t span_bytes = span * sizeof(std::uint16_t);
    const bool whole_rows = span_bytes == row_bytes;
    const std::size_t runs = whole_rows ? 1 : rows;
    const std::size_t run_bytes = whole_rows ? rows * row_bytes : span_bytes;
    for (std::size_t r = 0; r < runs; ++r) {
      const char* p = k + r * row_bytes;
      const char* first = p - (reinterpret_cast<std::uintptr_t>(p) & 63u);
      for (const char* line = first; line < p + run_bytes; line += 64) {
        _mm_prefetch(line, _MM_HINT_T0);
        _mm_prefetch(line + v_bytes, _MM_HINT_T0);
      }
    }
  }

  // kv heads [kv_head0, kv_head0 + kv_heads) for one query, each group one tile of NH heads (q_row
  // / sink_q / out_row: the first head of kv_head0's group, the others follow). The heads walk the
  // blocks together: each chunk of keys is computed for every kv head before the next, so a block's
  // rows of all those heads (adjacent in memory: [token][kv_dim]) are used while they are in L1,
  // and the next block's rows are prefetched spread over the chunk's V loop of each head, a K and a
  // V row per key: the whole next block requested at once (192 lines) stalls on the core's miss
  // buffers (bench/kernels_benchmark BM_PagedAttentionDecodeStep).
  template <int NH>
  static void Walk(const PagedKvView& kv, int layer, int kv_head0, int kv_heads,
                   const KeyRange* ranges, int num_ranges, bool rolling, const float* q_row,
                   const float* sink_q, float scale, float* out_row, float* stats) {
    Acc<NH> accs[kMaxWalkHeads];
    Query qs[kMaxWalkHeads][NH];
    for (int g = 0; g < kv_heads; ++g) accs[g].Reset();
    const int bt = kv.block_tokens;
    const auto stride = static_cast<std::size_t>(kv.kv_dim);
    const std::size_t head_off = static_cast<std::size_t>(kv_head0) * HD;
    const std::size_t span = static_cast<std::size_t>(kv_heads) * HD;
    const std::size_t v_bytes = kv.plane_elements * sizeof(std::uint16_t);
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int r = 0; r < num_ranges; ++r) {
      const KeyRange& range = ranges[r];
      const float* qsrc = rolling && range.sinks ? sink_q : q_row;
      for (int g = 0; g < kv_heads; ++g) {
#pragma GCC unroll 4
        for (int h = 0; h < NH; ++h) {
          LoadQuery(qsrc + static_cast<std::ptrdiff_t>(g * NH + h) * HD, &qs[g][h]);
        }
      }
      const std::int64_t last_block = (range.end - 1) / bt;
      // The range's first block: all its lines requested at once, not one demand miss after another
      // (nothing computed before it could hide them).
      PrefetchSpan(kv, layer, range.begin / bt, head_off, span);
      for (TokenPos j = range.begin; j < range.end;) {
        const std::int64_t b = j / bt;
        const auto* k_base = reinterpret_cast<const std::uint16_t*>(kv.BlockKeys(layer, b));
        MTR_DCHECK(k_base != nullptr, "visible key in a freed block");
        k_base += head_off;
        // The same rows of the next block (resident: it holds visible keys of this range).
        const char* next = nullptr;
        if (b < last_block) {
          next = reinterpret_cast<const char*>(kv.BlockKeys(layer, b + 1)) +
                 head_off * sizeof(std::uint16_t);
        }
        const TokenPos block_end = std::min<TokenPos>((b + 1) * bt, range.end);
        for (; j < block_end;) {
          const int count = static_cast<int>(std::min<TokenPos>(kChunk, block_end - j));
          const std::size_t row_off = static_cast<std::size_t>(j - b * bt) * stride;
          const std::uint16_t* k_rows = k_base + row_off;
          for (int g = 0; g < kv_heads; ++g) {
            // A copy in registers for the chunk: the array lives on the stack.
            Acc<NH> a;
            a.CopyFrom(accs[g]);
            const std::size_t g_off = static_cast<std::size_t>(g) * HD;
            const std::uint16_t* kg = k_rows + g_off;
            const char* pf =
                next != nullptr ? next + (row_off + g_off) * sizeof(std::uint16_t) : nullptr;
            a.Chunk(qs[g], kg, stride, kg + kv.plane_elements, stride, count, vscale, pf, v_bytes);
            accs[g].CopyFrom(a);
          }
          j += count;
        }
      }
    }
    for (int g = 0; g < kv_heads; ++g) {
      accs[g].Finish(out_row + static_cast<std::ptrdiff_t>(g * NH) * HD,
                     stats != nullptr ? stats + 2 * g * NH : nullptr);
    }
  }

  // Calls fn.template operator()<NH>() for NH = nh, a tile of 1 to kMaxTile heads (the tile sizes
  // this head dim instantiates).
  template <typename Fn>
  [[gnu::always_inline]] static inline void WithTileHeads(int nh, Fn&& fn) {
    switch (nh) {
      case 1:
        fn.template operator()<1>();
        break;
      case 2:
        fn.template operator()<2>();
        break;
      case 3:
        if constexpr (kMaxTile >= 3) fn.template operator()<3>();
        break;
      default:
        if constexpr (kMaxTile >= 4) fn.template operator()<4>();
        break;
    }
  }

  // Queries queries[0 .. n) over kv heads [kv_head0, kv_head0 + kv_heads), restricted to `slice`
  // when not null (n == 1): one walk per query when every group fits one tile, else kv head after
  // kv head.
  static void AttendHeads(const AttentionShape& shape, const PagedKvView& kv,
                          const QueryKeys* queries, int n, const Rope& rope, int layer,
                          int kv_head0, int kv_heads, const float* q, float* out,
                          std::size_t q_stride, std::size_t out_stride, float* scratch,
                          const RopeAngleRows* sink_angles, const AttentionKeySlice* slice) {
    const int group = shape.group();
    // Chunks, and queries of groups wider than a tile, go kv head by kv head (AttendChunk); a
    // decode query whose group fits one tile walks the kv heads together.
    if (kv_heads == 1 || group > kMaxTile || kv_heads > kMaxWalkHeads || ChunkWalks(n, group)) {
      for (int g = kv_head0; g < kv_head0 + kv_heads; ++g) {
        AttentionKeySlice head_slice{};
        if (slice != nullptr) head_slice = KvHeadSlice(*slice, shape, g - kv_head0);
        Attend(shape, kv, queries, n, rope, layer, g, q, out, q_stride, out_stride, scratch,
               sink_angles, slice != nullptr ? &head_slice : nullptr);
      }
      return;
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
    const std::size_t group_off = static_cast<std::size_t>(kv_head0 * group) * HD;
    float* sink_q = scratch;  // kv_heads * group * HD floats
    for (int i = 0; i < n; ++i) {
      const QueryRow row = RowOfQuery(queries, i, slice, q, q_stride, out, out_stride, group_off);
      float* stats = slice != nullptr ? slice->stats : nullptr;
      const bool rolling = MoveQueryToSinkPosition(rope, queries[i], sink_angles, i, row.q,
                                                   group * kv_heads, HD, sink_q);
      WithTileHeads(group, [&]<int NH>() {
        Walk<NH>(kv, layer, kv_head0, kv_heads, row.ranges, row.num_ranges, rolling, row.q, sink_q,
                 scale, row.out, stats);
      });
    }
  }

  static void Attend(const AttentionShape& shape, const PagedKvView& kv, const QueryKeys* queries,
                     int n, const Rope& rope, int layer, int kv_head, const float* q, float* out,
                     std::size_t q_stride, std::size_t out_stride, float* scratch,
                     const RopeAngleRows* sink_angles, const AttentionKeySlice* slice) {
    const int group = shape.group();
    if (ChunkWalks(n, group)) {
      AttendChunk(shape, kv, queries, n, rope, layer, kv_head, q, out, q_stride, out_stride,
                  scratch, sink_angles, slice);
      return;
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
    const std::size_t head_off = static_cast<std::size_t>(kv_head) * HD;
    const std::size_t group_off = static_cast<std::size_t>(kv_head * group) * HD;
    float* sink_q = scratch;  // group * HD floats
    for (int i = 0; i < n; ++i) {
      const QueryRow row = RowOfQuery(queries, i, slice, q, q_stride, out, out_stride, group_off);
      const bool rolling =
          MoveQueryToSinkPosition(rope, queries[i], sink_angles, i, row.q, group, HD, sink_q);
      for (int h0 = 0; h0 < group;) {
        const int nh = std::min(kMaxTile, group - h0);
        const auto off = static_cast<std::ptrdiff_t>(h0) * HD;
        const float* sq = sink_q + off;
        float* st = slice != nullptr ? slice->stats + 2 * h0 : nullptr;
        WithTileHeads(nh, [&]<int NH>() {
          Tile<NH>(kv, layer, head_off, row.ranges, row.num_ranges, rolling, row.q + off, sq, scale,
                   row.out + off, st);
        });
        h0 += nh;
      }
    }
  }
};

template <bool kSplitQ>
bool Run(const AttentionShape& shape, const PagedKvView& kv, const QueryKeys* queries, int n,
         const Rope& rope, int layer, int kv_head, int kv_heads, const float* q, float* out,
         std::size_t q_stride, std::size_t out_stride, float* scratch,
         const RopeAngleRows* sink_angles, const AttentionKeySlice* slice) noexcept {
  return WithSimdHeadDim(shape.head_dim, [&](auto hd) {
    Blockwise<decltype(hd)::value, kSplitQ>::AttendHeads(shape, kv, queries, n, rope, layer,
                                                         kv_head, kv_heads, q, out, q_stride,
                                                         out_stride, scratch, sink_angles, slice);
  });
}
#endif

}  // namespace

namespace internal {

bool Bf16DotHeadDim(int head_dim) noexcept {
#if defined(MTR_HAVE_BF16_DOT)
  return WithSimdHeadDim(head_dim, [](auto /*hd*/) {});
#else
  (void)head_dim;
  return false;
#endif
}

bool PagedAttentionBf16Dot(bool split_q, const AttentionShape& shape, const PagedKvView& kv,
                           const QueryKeys* queries, int n, const Rope& rope, int layer,
                           int kv_head, int kv_heads, const float* q, float* out,
                           std::size_t q_stride, std::size_t out_stride, float* scratch,
                           const RopeAngleRows* sink_angles,
                           const AttentionKeySlice* slice) noexcept {
#if defined(MTR_HAVE_BF16_DOT)
  MTR_DCHECK(kv.dtype == KvDtype::kBF16, "bf16 dot kernel on an fp32 pool");
  return split_q ? Run<true>(shape, kv, queries, n, rope, layer, kv_head, kv_heads, q, out,
                             q_stride, out_stride, scratch, sink_angles, slice)
                 : Run<false>(shape, kv, queries, n, rope, layer, kv_head, kv_heads, q, out,
                              q_stride, out_stride, scratch, sink_angles, slice);
#else
  (void)split_q, (void)shape, (void)kv, (void)queries, (void)rope, (void)layer, (void)kv_head;
  (void)kv_heads;
  (void)n, (void)q, (void)out, (void)q_stride, (void)out_stride, (void)scratch;
  (void)sink_angles, (void)slice;
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
