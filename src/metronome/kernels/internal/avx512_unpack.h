// Block unpackers shared by the AVX-512 weight kernels (quant_matmul_avx512.cc: the batched
// kernels' dequantisation for prefill; quant_gemv_avx512.cc: the decode kernels). One definition
// of how each ggml block becomes unsigned bytes for vpdpbusd (quant_matmul_avx512.h: u = q +
// offset, or q with a min term) and per-lane fp32 scales:
//   - 32-element types: two blocks at a time as 64 bytes (UnpackedPair: 8 int32 lanes per block);
//   - K-quants: a 256-element super-block as four 64-byte chunks with the per-lane scale of each
//     chunk's vpdpbusd and the coefficient of each of Q8_K's 16 bsums (UnpackedSuper);
//   - VisitBlockDecoder: the one type -> decoder map.
// Include only from translation units compiled with AVX-512 flags. Internal linkage on purpose
// (each such translation unit gets its own copy; see attention_loop.h).
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "metronome/quant/blocks.h"
#include "metronome/quant/ggml_type.h"
#include "metronome/quant/unpack.h"

namespace metronome::kernels::avx512 {
namespace {  // internal linkage per translation unit, see above

[[maybe_unused]] inline float Half(std::uint16_t h) noexcept { return _cvtsh_ss(h); }

// Lanes 0-7 = a, lanes 8-15 = b: the per-lane scale of two 32-element blocks in one vector (the
// 16 int32 lanes of a vpdpbusd over 64 bytes are 8 per block).
[[maybe_unused]] inline __m512 Halves(float a, float b) noexcept {
  return _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(a), _mm512_set1_ps(b));
}

[[maybe_unused]] inline __m512i LoadPair256(const std::int8_t* a, const std::int8_t* b) noexcept {
  return _mm512_inserti64x4(
      _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a))),
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)), 1);
}

// The 16 nibble bytes of two blocks as 64 bytes [lo(a), hi(a), lo(b), hi(b)]: element i of a
// 32-element block is the low nibble of qs[i] for i < 16 and the high nibble of qs[i - 16] after.
[[maybe_unused]] inline __m512i Nibbles2(const std::uint8_t* a, const std::uint8_t* b) noexcept {
  const __m128i qa = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a));
  const __m128i qb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
  __m512i v = _mm512_castsi128_si512(qa);
  v = _mm512_inserti32x4(v, qa, 1);
  v = _mm512_inserti32x4(v, qb, 2);
  v = _mm512_inserti32x4(v, qb, 3);
  v = _mm512_mask_srli_epi16(v, 0xFF00FF00u, v, 4);  // 16-bit words 8-15 and 24-31
  return _mm512_and_si512(v, _mm512_set1_epi8(15));
}

[[maybe_unused]] inline std::uint64_t HighBits2(const std::uint8_t* a,
                                                const std::uint8_t* b) noexcept {
  std::uint32_t ha = 0;
  std::uint32_t hb = 0;
  std::memcpy(&ha, a, 4);
  std::memcpy(&hb, b, 4);
  return static_cast<std::uint64_t>(ha) | static_cast<std::uint64_t>(hb) << 32;
}

// ---- 4- and 5-bit 32-element types, four blocks at a time (the decode kernels): 128 weights as
// two 64-byte vectors, lo = elements 0-15 of blocks 0..3 (16 bytes each, in block order), hi =
// elements 16-31, from one and / shift / and for all four blocks. Lane l of a vpdpbusd over lo or
// hi is in block l / 4, so both accumulate into one int32 vector. The blocks are given one by one
// (a row's last quad repeats its last block; the kernel's activations for it are zero).
struct UnpackedQuad {
  __m512i lo;
  __m512i hi;
};

// 16 bytes from each of four places, in order.
[[maybe_unused]] inline __m512i Load4x16(const void* q0, const void* q1, const void* q2,
                                         const void* q3) noexcept {
  __m512i v = _mm512_castsi128_si512(_mm_loadu_si128(static_cast<const __m128i*>(q0)));
  v = _mm512_inserti32x4(v, _mm_loadu_si128(static_cast<const __m128i*>(q1)), 1);
  v = _mm512_inserti32x4(v, _mm_loadu_si128(static_cast<const __m128i*>(q2)), 2);
  return _mm512_inserti32x4(v, _mm_loadu_si128(static_cast<const __m128i*>(q3)), 3);
}

// The low and high nibbles of 64 packed bytes (16 of each of four blocks).
[[maybe_unused]] inline UnpackedQuad NibblesOf(__m512i v) noexcept {
  const __m512i low4 = _mm512_set1_epi8(15);
  return {_mm512_and_si512(v, low4), _mm512_and_si512(_mm512_srli_epi16(v, 4), low4)};
}

[[maybe_unused]] inline UnpackedQuad NibblesQuad(const std::uint8_t* q0, const std::uint8_t* q1,
                                                 const std::uint8_t* q2,
                                                 const std::uint8_t* q3) noexcept {
  return NibblesOf(Load4x16(q0, q1, q2, q3));
}

// The fifth bits of four Q5 blocks (qh: bit e of block t's 32-bit word is element e) added to a
// quad as 16: bits 0-15 of block t mark bytes 16 t .. 16 t + 15 of lo, bits 16-31 those of hi.
// Built in scalar registers (the vector ports are the kernels' limit).
template <class Block>
[[maybe_unused]] inline UnpackedQuad AddHighBitsQuad(UnpackedQuad q,
                                                     const Block* const (&b)[4]) noexcept {
  std::uint64_t lo = 0;
  std::uint64_t hi = 0;
#pragma GCC unroll 4
  for (int t = 0; t < 4; ++t) {
    std::uint32_t h = 0;
    std::memcpy(&h, b[t]->qh, 4);
    lo |= static_cast<std::uint64_t>(h & 0xFFFFu) << (16 * t);
    hi |= static_cast<std::uint64_t>(h >> 16) << (16 * t);
  }
  const __m512i sixteen = _mm512_set1_epi8(16);
  return {_mm512_mask_add_epi8(q.lo, lo, q.lo, sixteen),
          _mm512_mask_add_epi8(q.hi, hi, q.hi, sixteen)};
}

template <class Block>
[[maybe_unused]] inline UnpackedQuad NibblesQuad(const Block* const (&b)[4]) noexcept {
  return NibblesQuad(b[0]->qs, b[1]->qs, b[2]->qs, b[3]->qs);
}

// ---- Four consecutive 32-element blocks of at most 128 bytes (a "run", as a row stores them)
// from two 64-byte loads, at byte 0 (a) and at byte 4 S - 64 (b; S = the block's bytes, so b ends
// where the run does), and 16-bit permutes (vpermt2w) of those two loads: the quants, the fp16
// scales and the Q5 high bits of all four blocks without a load per block or a gather. Every
// field of these blocks starts at an even byte, so word lanes reach it.
struct alignas(64) RunWords {
  std::int16_t index[32];
};
// vpermt2w's index of word g of the run (bytes 2 g, 2 g + 1): a's word g while g < 32, else b's.
constexpr std::int16_t RunWordIndex(int g, int b_offset) {
  return static_cast<std::int16_t>(g < 32 ? g : 32 + g - b_offset / 2);
}
template <int kBlockBytes>
constexpr int RunBOffset() {
  static_assert(kBlockBytes % 2 == 0 && 4 * kBlockBytes > 64 && 4 * kBlockBytes <= 128,
                "a run is two overlapping 64-byte loads");
  return 4 * kBlockBytes - 64;
}
// The index table whose first `count` words are the run's words word_of(0 .. count - 1).
template <int kBlockBytes, class WordOf>
constexpr RunWords MakeRunWords(int count, WordOf word_of) {
  RunWords r{};
  for (int e = 0; e < count; ++e) r.index[e] = RunWordIndex(word_of(e), RunBOffset<kBlockBytes>());
  return r;
}
// Words 8 t + w: quants bytes 2 w, 2 w + 1 of block t (its 16 bytes at kQsOffset).
template <int kBlockBytes, int kQsOffset>
constexpr RunWords QuantWords() {
  return MakeRunWords<kBlockBytes>(
      32, [](int e) { return (kBlockBytes * (e / 8) + kQsOffset) / 2 + e % 8; });
}
// Words 4 t .. 4 t + 3: the fp16 at kFieldOffset of block t (words 16-31: word 0, unused).
template <int kBlockBytes, int kFieldOffset>
constexpr RunWords FieldWords() {
  return MakeRunWords<kBlockBytes>(
      16, [](int e) { return (kBlockBytes * (e / 4) + kFieldOffset) / 2; });
}
// Words t and 4 + t: the low and the high 16 bits of block t's qh (at kQhOffset).
template <int kBlockBytes, int kQhOffset>
constexpr RunWords HighBitWords() {
  return MakeRunWords<kBlockBytes>(
      8, [](int e) { return (kBlockBytes * (e % 4) + kQhOffset) / 2 + e / 4; });
}

template <class Block>
struct ConsecutiveRun {
  static constexpr int kBytes = static_cast<int>(sizeof(Block));
  __m512i a;
  __m512i b;
  explicit ConsecutiveRun(const Block* first) noexcept
      : a(_mm512_loadu_si512(first)),
        b(_mm512_loadu_si512(reinterpret_cast<const char*>(first) + RunBOffset<kBytes>())) {}
  [[nodiscard]] __m512i Words(const RunWords& w) const noexcept {
    return _mm512_permutex2var_epi16(a, _mm512_load_si512(w.index), b);
  }
  // The quants as nibbles (lo: elements 0-15 of each block, hi: 16-31).
  template <int kQsOffset>
  [[nodiscard]] UnpackedQuad Nibbles() const noexcept {
    static constexpr RunWords kWords = QuantWords<kBytes, kQsOffset>();
    return NibblesOf(Words(kWords));
  }
  // The fp16 field at kFieldOffset of block t in fp32 lanes 4 t .. 4 t + 3.
  template <int kFieldOffset>
  [[nodiscard]] __m512 Field() const noexcept {
    static constexpr RunWords kWords = FieldWords<kBytes, kFieldOffset>();
    return _mm512_cvtph_ps(_mm512_castsi512_si256(Words(kWords)));
  }
  // The fifth bits (qh at kQhOffset) added to a quad as 16, as AddHighBitsQuad.
  template <int kQhOffset>
  [[nodiscard]] UnpackedQuad AddHighBits(UnpackedQuad q) const noexcept {
    static constexpr RunWords kWords = HighBitWords<kBytes, kQhOffset>();
    const __m128i bits = _mm512_castsi512_si128(Words(kWords));
    const auto lo = static_cast<__mmask64>(_mm_cvtsi128_si64(bits));
    const auto hi = static_cast<__mmask64>(_mm_extract_epi64(bits, 1));
    const __m512i sixteen = _mm512_set1_epi8(16);
    return {_mm512_mask_add_epi8(q.lo, lo, q.lo, sixteen),
            _mm512_mask_add_epi8(q.hi, hi, q.hi, sixteen)};
  }
};

// The consecutive-run decoders of a 4/5-bit 32-element block type, read from its layout: the
// quants (plus the fifth bits where the block has qh), the scales, and the mins where it has m.
template <class Block>
struct NibbleRunDecoders {
  static UnpackedQuad UnpackConsecutiveQuad(const Block* first) noexcept {
    const ConsecutiveRun<Block> run(first);
    const UnpackedQuad q = run.template Nibbles<offsetof(Block, qs)>();
    if constexpr (requires { &Block::qh; }) {
      return run.template AddHighBits<offsetof(Block, qh)>(q);
    } else {
      return q;
    }
  }
  static __m512 ConsecutiveQuadScales(const Block* first) noexcept {
    return ConsecutiveRun<Block>(first).template Field<offsetof(Block, d)>();
  }
  static __m512 ConsecutiveQuadMins(const Block* first) noexcept requires requires { &Block::m; }
  { return ConsecutiveRun<Block>(first).template Field<offsetof(Block, m)>(); }
};

// ---- 32-element weight types: unpack two blocks into 64 unsigned bytes, with per-lane scales.
// dw: d_w per lane; mw (types with a min, kMin): the min m per lane, the coefficient of the
// activation block sum. Offset types (kOffset) fold -offset into the activations' ActPair::ca.
struct UnpackedPair {
  __m512i u;
  __m512 dw;
  __m512 mw;
};

struct Q8_0W {
  using Block = quant::BlockQ8_0;
  static constexpr bool kSuperBlock = false;
  static constexpr bool kMin = false;
  static constexpr float kOffset = 128.0f;
  static UnpackedPair Unpack(const Block* a, const Block* b) noexcept {
    const __m512i u = _mm512_xor_si512(LoadPair256(a->qs, b->qs), _mm512_set1_epi8(-128));
    return {u, Halves(Half(a->d), Half(b->d)), _mm512_setzero_ps()};
  }
  // Elements 0-15 and 16-31 of four blocks as u = q + 128.
  static UnpackedQuad UnpackQuad(const Block* const (&b)[4]) noexcept {
    const __m512i flip = _mm512_set1_epi8(-128);
    return {_mm512_xor_si512(Load4x16(b[0]->qs, b[1]->qs, b[2]->qs, b[3]->qs), flip),
            _mm512_xor_si512(Load4x16(b[0]->qs + 16, b[1]->qs + 16, b[2]->qs + 16, b[3]->qs + 16),
                             flip)};
  }
  // The same for four consecutive blocks (the 136 bytes from `first`): four 64-byte loads inside
  // them and two 16-bit permutes (block t's qs start at byte 34 t + 2, an even offset, so word
  // lanes can gather them) instead of eight 16-byte loads and six inserts.
  static UnpackedQuad UnpackConsecutiveQuad(const Block* first) noexcept {
    static_assert(sizeof(Block) == 34, "the word indices below assume 17 words a block");
    // Word e of lo is word 17 t + 1 + w of the first 128 bytes, of hi word 17 t + 5 + w of the
    // 128 bytes from byte 8 (t = e / 8, w = e % 8: elements 2w, 2w + 1 of block t, and 16 on).
    const __m512i lo_words =
        _mm512_set_epi16(59, 58, 57, 56, 55, 54, 53, 52, 42, 41, 40, 39, 38, 37, 36, 35, 25, 24, 23,
                         22, 21, 20, 19, 18, 8, 7, 6, 5, 4, 3, 2, 1);
    const __m512i hi_words = _mm512_add_epi16(lo_words, _mm512_set1_epi16(4));
    const auto* p = reinterpret_cast<const char*>(first);
    const __m512i flip = _mm512_set1_epi8(-128);
    const __m512i lo =
        _mm512_permutex2var_epi16(_mm512_loadu_si512(p), lo_words, _mm512_loadu_si512(p + 64));
    const __m512i hi =
        _mm512_permutex2var_epi16(_mm512_loadu_si512(p + 8), hi_words, _mm512_loadu_si512(p + 72));
    return {_mm512_xor_si512(lo, flip), _mm512_xor_si512(hi, flip)};
  }
  // d of block t of the same 136 bytes in lanes 4 t .. 4 t + 3 (words 17 t: 0, 17 of the first
  // 64 bytes, 34, 51 of the next; the loads are UnpackConsecutiveQuad's), so a kernel walking
  // consecutive quads needs no gather of the scales.
  static __m512 ConsecutiveQuadScales(const Block* first) noexcept {
    const __m512i words = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 51, 51,
                                           51, 51, 34, 34, 34, 34, 17, 17, 17, 17, 0, 0, 0, 0);
    const auto* p = reinterpret_cast<const char*>(first);
    return _mm512_cvtph_ps(_mm512_castsi512_si256(
        _mm512_permutex2var_epi16(_mm512_loadu_si512(p), words, _mm512_loadu_si512(p + 64))));
  }
};
// The four 32-element nibble types: u = the 4-bit quants, plus 16 where qh's fifth bit is set
// (Q5_x); d per lane, and the min m for the types that have one (kMin), else the offset kOffset.
// The offset is an integer template argument (a float one needs C++20 support clang 14 lacks).
template <class B, int kOffsetValue>
struct NibbleW : NibbleRunDecoders<B> {
  using Block = B;
  static constexpr bool kSuperBlock = false;
  static constexpr bool kMin = requires { &Block::m; };
  static constexpr bool kHighBit = requires { &Block::qh; };
  static constexpr float kOffset = static_cast<float>(kOffsetValue);
  static UnpackedPair Unpack(const Block* a, const Block* b) noexcept {
    __m512i u = Nibbles2(a->qs, b->qs);
    if constexpr (kHighBit) {
      u = _mm512_mask_add_epi8(u, HighBits2(a->qh, b->qh), u, _mm512_set1_epi8(16));
    }
    __m512 mw = _mm512_setzero_ps();
    if constexpr (kMin) mw = Halves(Half(a->m), Half(b->m));
    return {u, Halves(Half(a->d), Half(b->d)), mw};
  }
  static UnpackedQuad UnpackQuad(const Block* const (&b)[4]) noexcept {
    if constexpr (kHighBit) {
      return AddHighBitsQuad(NibblesQuad(b), b);
    } else {
      return NibblesQuad(b);
    }
  }
};
using Q4_0W = NibbleW<quant::BlockQ4_0, 8>;
using Q4_1W = NibbleW<quant::BlockQ4_1, 0>;
using Q5_0W = NibbleW<quant::BlockQ5_0, 16>;
using Q5_1W = NibbleW<quant::BlockQ5_1, 0>;

// ---- K-quants: a 256-element super-block unpacked into four 64-byte chunks of unsigned values
// (chunk c = elements [64 c, 64 c + 64)), the fp32 scale of each int32 lane of a chunk's
// vpdpbusd (lane l covers elements 64 c + 4 l .. + 3), and the coefficient of each of Q8_K's 16
// bsums (elements [16 g, 16 g + 16)), all with the super-block's d / dmin folded in.
struct alignas(64) UnpackedSuper {
  std::uint8_t u[4][64];
  float ws[4][16];
  float wm[16];
};

// quant::UnpackKScaleWords's reading of the 12 packed 6-bit scale bytes, its SWAR steps done on
// the three words as vector lanes: bytes 0-7 sc[j], bytes 8-15 mn[j]. The scalar words' round
// trip into a vector register (two vmovq and an unpack after a dozen integer operations) would be
// about half of the K-quant decode kernels' time (BM_GemvResident, m = 1, Q4_K and Q5_K). The
// kernel tests compare every K-quant kernel with the scalar one, which reads the scales through
// quant::UnpackKScaleWords.
[[maybe_unused]] inline __m128i KScaleBytes(
    const std::uint8_t (&scales)[quant::kKScaleBytes]) noexcept {
  std::uint32_t s2 = 0;
  std::memcpy(&s2, scales + 8, sizeof s2);
  // Lanes (32-bit): s0 = bytes 0-3, s1 = bytes 4-7, s2 = bytes 8-11.
  const __m128i v = _mm_insert_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(scales)),
                                     static_cast<int>(s2), 2);
  // Lane 0: sc[4..7] = low nibbles of s2 | bits 6-7 of s0 as bits 4-5; lane 1: mn[4..7] = high
  // nibbles of s2 | bits 6-7 of s1.
  const __m128i nibbles = _mm_and_si128(
      _mm_srlv_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(2, 2, 2, 2)), _mm_setr_epi32(0, 4, 0, 0)),
      _mm_set1_epi8(0x0F));
  const __m128i high =
      _mm_or_si128(nibbles, _mm_and_si128(_mm_srli_epi32(v, 2), _mm_set1_epi8(0x30)));
  // Lane 0: sc[0..3] = low 6 bits of s0; lane 1: mn[0..3] of s1.
  const __m128i low = _mm_and_si128(v, _mm_set1_epi8(0x3F));
  return _mm_unpacklo_epi32(low, high);  // sc[0..3], sc[4..7], mn[0..3], mn[4..7]
}

// The same super-block held in registers for the decode kernels: the four chunks, the integer
// scale of every int32 lane of each chunk's vpdpbusd (exact: sum over a chunk of scale x dot stays
// far inside int32), the super-block's d (applied once, in fp32) and the bsum coefficients as
// UnpackedSuper::wm.
struct SuperRegs {
  __m512i u[4];
  __m512i scale[4];
  __m512 wm;
  float d;
};

// The memory form (UnpackedSuper, for the GEMM-form kernels and dequantisation) of a K-quant W,
// derived from its register form: ws = scale x d lane by lane, the same values, so the lane spread
// of the scales is written once per type (in UnpackRegs).
template <class W>
struct SuperMemoryForm {
  template <class Block>
  static void Unpack(const Block& b, UnpackedSuper* out) noexcept {
    SuperRegs r;
    W::UnpackRegs(b, &r);
    const __m512 d = _mm512_set1_ps(r.d);
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      _mm512_store_si512(out->u[c], r.u[c]);
      _mm512_store_ps(out->ws[c], _mm512_mul_ps(_mm512_cvtepi32_ps(r.scale[c]), d));
    }
    _mm512_store_ps(out->wm, r.wm);
  }
};

// Q4_K / Q5_K: lane l of chunk c is in sub-block 2 c + l / 8; wm lane g = -dmin mn[g / 2].
[[maybe_unused]] inline void ScalesK4Int(const std::uint8_t (&scales)[quant::kKScaleBytes], float d,
                                         float dmin, SuperRegs* out) noexcept {
  const __m512i v = _mm512_cvtepu8_epi32(KScaleBytes(scales));
  const __m512i half = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    out->scale[c] = _mm512_permutexvar_epi32(_mm512_add_epi32(half, _mm512_set1_epi32(2 * c)), v);
  }
  const __m512i mins =
      _mm512_setr_epi32(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
  out->wm =
      _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_permutexvar_epi32(mins, v)), _mm512_set1_ps(-dmin));
  out->d = d;
}

// qs[32 c .. 32 c + 32): low nibbles are elements [64 c, 64 c + 32), high nibbles the next 32.
[[maybe_unused]] inline __m512i NibblesK(const std::uint8_t* qs32) noexcept {
  __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs32)));
  v = _mm512_mask_srli_epi16(v, 0xFFFF0000u, v, 4);
  return _mm512_and_si512(v, _mm512_set1_epi8(15));
}

// kSubBlock: the elements one scale covers; kOffset / kMin as for the 32-element types (the
// GEMM form removes an offset in integers; wm holds the same term as a bsum coefficient).
struct Q4_KW : SuperMemoryForm<Q4_KW> {
  using Block = quant::BlockQ4_K;
  static constexpr bool kSuperBlock = true;
  static constexpr int kSubBlock = 32;
  static constexpr bool kMin = true;
  static constexpr float kOffset = 0.0f;
  static __m512i Chunk(const Block& b, int c) noexcept { return NibblesK(b.qs + 32 * c); }
  static void UnpackRegs(const Block& b, SuperRegs* out) noexcept {
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) out->u[c] = Chunk(b, c);
    ScalesK4Int(b.scales, Half(b.d), Half(b.dmin), out);
  }
};

struct Q5_KW : SuperMemoryForm<Q5_KW> {
  using Block = quant::BlockQ5_K;
  static constexpr bool kSuperBlock = true;
  static constexpr int kSubBlock = 32;
  static constexpr bool kMin = true;
  static constexpr float kOffset = 0.0f;
  static __m512i Chunk(const Block& b, int c) noexcept {
    const __m512i qh =
        _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh)));
    // Element 64 c + l takes bit 2 c of qh[l]; element 64 c + 32 + l bit 2 c + 1.
    const __m512i bit = _mm512_mask_blend_epi8(0xFFFFFFFF00000000ull,
                                               _mm512_set1_epi8(static_cast<char>(1 << (2 * c))),
                                               _mm512_set1_epi8(static_cast<char>(2 << (2 * c))));
    const __mmask64 high = _mm512_test_epi8_mask(qh, bit);
    const __m512i lo = NibblesK(b.qs + 32 * c);
    return _mm512_mask_add_epi8(lo, high, lo, _mm512_set1_epi8(16));
  }
  static void UnpackRegs(const Block& b, SuperRegs* out) noexcept {
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) out->u[c] = Chunk(b, c);
    ScalesK4Int(b.scales, Half(b.d), Half(b.dmin), out);
  }
};

struct Q6_KW : SuperMemoryForm<Q6_KW> {  // bytes q + 32; wm = -32 * scale
  using Block = quant::BlockQ6_K;
  static constexpr bool kSuperBlock = true;
  static constexpr int kSubBlock = 16;
  static constexpr bool kMin = false;
  static constexpr float kOffset = 32.0f;
  static void UnpackRegs(const Block& b, SuperRegs* out) noexcept {
    Chunks(b, out->u);
    const __m512i is = IntScales(b);
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) out->scale[c] = _mm512_permutexvar_epi32(LaneScales(c), is);
    out->d = Half(b.d);
    out->wm = _mm512_mul_ps(_mm512_cvtepi32_ps(is), _mm512_set1_ps(-32.0f * out->d));
  }

 private:
  // The 16 signed scales (sub-blocks of 16 elements) as int32.
  static __m512i IntScales(const Block& b) noexcept {
    return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales)));
  }
  // Lane l of chunk c is in sub-block 4 c + l / 4.
  static __m512i LaneScales(int c) noexcept {
    return _mm512_add_epi32(
        _mm512_set1_epi32(4 * c),
        _mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                          2));
  }
  static void Chunks(const Block& b, __m512i (&u)[4]) noexcept {
    const __m512i low4 = _mm512_set1_epi8(15);
    const __m512i low2 = _mm512_set1_epi8(3);
    for (int h = 0; h < 2; ++h) {
      // Half h: elements [128 h, 128 h + 128) from ql[64 h ..], qh[32 h ..] (quant/blocks.h).
      const __m512i ql = _mm512_loadu_si512(b.ql + 64 * h);
      __m512i qh = _mm512_broadcast_i64x4(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 32 * h)));
      qh = _mm512_mask_srli_epi16(qh, 0xFFFF0000u, qh, 2);  // bytes 32-63 take bits 2-3
      const __m512i hi0 = _mm512_slli_epi16(_mm512_and_si512(qh, low2), 4);
      const __m512i hi1 = _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, 4), low2), 4);
      u[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, low4), hi0);
      u[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4), hi1);
    }
  }
};

// The one map from an integer ggml type to its decoder: f.template operator()<W>() for the W of
// `type` (W::kSuperBlock tells the two families apart); false, without calling f, for a type
// with no decoder here (F32, F16, BF16).
template <quant::GgmlType kType, class W>
struct DecoderFor {
  static constexpr quant::GgmlType type = kType;
  using Decoder = W;
};
template <class... Entry, class F>
bool VisitDecoderOf(quant::GgmlType type, F& f) noexcept {
  return ((type == Entry::type && (f.template operator()<typename Entry::Decoder>(), true)) || ...);
}
template <class F>
[[maybe_unused]] bool VisitBlockDecoder(quant::GgmlType type, F&& f) noexcept {
  using quant::GgmlType;
  return VisitDecoderOf<DecoderFor<GgmlType::kQ8_0, Q8_0W>, DecoderFor<GgmlType::kQ4_0, Q4_0W>,
                        DecoderFor<GgmlType::kQ4_1, Q4_1W>, DecoderFor<GgmlType::kQ5_0, Q5_0W>,
                        DecoderFor<GgmlType::kQ5_1, Q5_1W>, DecoderFor<GgmlType::kQ4_K, Q4_KW>,
                        DecoderFor<GgmlType::kQ5_K, Q5_KW>, DecoderFor<GgmlType::kQ6_K, Q6_KW>>(
      type, f);
}

}  // namespace
}  // namespace metronome::kernels::avx512
