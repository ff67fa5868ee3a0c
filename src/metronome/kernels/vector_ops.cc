#include "metronome/kernels/vector_ops.h"

#include <cmath>
#include <limits>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "metronome/kernels/internal/simd_exp.h"

namespace metronome::kernels {

namespace reference {

float Dot(const float* a, const float* b, int n) noexcept {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void Axpy(float alpha, const float* x, float* y, int n) noexcept {
  for (int i = 0; i < n; ++i) y[i] += alpha * x[i];
}

void RmsNorm(const float* x, const float* weight, float eps, float* out, int n) noexcept {
  float ss = 0.0f;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int i = 0; i < n; ++i) out[i] = x[i] * inv * weight[i];
}

void SwiGlu(const float* gate, const float* up, float* out, int n) noexcept {
  for (int i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void Softmax(float* x, int n) noexcept {
  float m = x[0];
  for (int i = 1; i < n; ++i) m = x[i] > m ? x[i] : m;
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    sum += x[i];
  }
  const float inv = 1.0f / sum;
  for (int i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace reference

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))

namespace {
#if defined(__AVX512F__)
inline __mmask16 TailMask(int r) { return static_cast<__mmask16>((1u << r) - 1u); }

// The fp32 vector of the build (the one body of Dot and Axpy below serves both widths): 16 lanes,
// the tail through a lane mask.
struct Lanes {
  using Vec = __m512;
  static constexpr int kWidth = 16;
  static Vec Zero() noexcept { return _mm512_setzero_ps(); }
  static Vec Set1(float v) noexcept { return _mm512_set1_ps(v); }
  static Vec Load(const float* p) noexcept { return _mm512_loadu_ps(p); }
  static void Store(float* p, Vec v) noexcept { _mm512_storeu_ps(p, v); }
  static Vec Fma(Vec a, Vec b, Vec c) noexcept { return _mm512_fmadd_ps(a, b, c); }
  static Vec Add(Vec a, Vec b) noexcept { return _mm512_add_ps(a, b); }
  static float Sum(Vec v) noexcept { return _mm512_reduce_add_ps(v); }
  // Lanes [0, count) of p, zeros above; count in [1, kWidth). The load does not fault past them.
  struct Tail {
    __mmask16 mask;
    explicit Tail(int count) noexcept : mask(TailMask(count)) {}
    [[nodiscard]] Vec Load(const float* p) const noexcept { return _mm512_maskz_loadu_ps(mask, p); }
    void Store(float* p, Vec v) const noexcept { _mm512_mask_storeu_ps(p, mask, v); }
  };
};
#else
// 8 lanes; the tail through vmaskmovps (lanes whose mask sign bit is clear are neither read nor
// written).
struct Lanes {
  using Vec = __m256;
  static constexpr int kWidth = 8;
  static Vec Zero() noexcept { return _mm256_setzero_ps(); }
  static Vec Set1(float v) noexcept { return _mm256_set1_ps(v); }
  static Vec Load(const float* p) noexcept { return _mm256_loadu_ps(p); }
  static void Store(float* p, Vec v) noexcept { _mm256_storeu_ps(p, v); }
  static Vec Fma(Vec a, Vec b, Vec c) noexcept { return _mm256_fmadd_ps(a, b, c); }
  static Vec Add(Vec a, Vec b) noexcept { return _mm256_add_ps(a, b); }
  static float Sum(Vec v) noexcept {
    const __m128 lo = _mm256_castps256_ps128(v);
    const __m128 hi = _mm256_extractf128_ps(v, 1);
    __m128 s = _mm_add_ps(lo, hi);
    s = _mm_hadd_ps(s, s);
    s = _mm_hadd_ps(s, s);
    return _mm_cvtss_f32(s);
  }
  struct Tail {
    __m256i mask;
    explicit Tail(int count) noexcept
        : mask(_mm256_cmpgt_epi32(_mm256_set1_epi32(count),
                                  _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))) {}
    [[nodiscard]] Vec Load(const float* p) const noexcept { return _mm256_maskload_ps(p, mask); }
    void Store(float* p, Vec v) const noexcept { _mm256_maskstore_ps(p, mask, v); }
  };
};
#endif
}  // namespace

// Two accumulators over pairs of vectors, then one vector at a time, then the masked tail.
float Dot(const float* a, const float* b, int n) noexcept {
  using L = Lanes;
  constexpr int kW = L::kWidth;
  L::Vec acc0 = L::Zero();
  L::Vec acc1 = L::Zero();
  int i = 0;
  for (; i + 2 * kW <= n; i += 2 * kW) {
    acc0 = L::Fma(L::Load(a + i), L::Load(b + i), acc0);
    acc1 = L::Fma(L::Load(a + i + kW), L::Load(b + i + kW), acc1);
  }
  for (; i + kW <= n; i += kW) acc0 = L::Fma(L::Load(a + i), L::Load(b + i), acc0);
  if (i < n) {
    const L::Tail tail(n - i);
    acc1 = L::Fma(tail.Load(a + i), tail.Load(b + i), acc1);
  }
  return L::Sum(L::Add(acc0, acc1));
}

void Axpy(float alpha, const float* x, float* y, int n) noexcept {
  using L = Lanes;
  const L::Vec va = L::Set1(alpha);
  int i = 0;
  for (; i + L::kWidth <= n; i += L::kWidth) {
    L::Store(y + i, L::Fma(va, L::Load(x + i), L::Load(y + i)));
  }
  if (i < n) {
    const L::Tail tail(n - i);
    tail.Store(y + i, L::Fma(va, tail.Load(x + i), tail.Load(y + i)));
  }
}

#else

float Dot(const float* a, const float* b, int n) noexcept { return reference::Dot(a, b, n); }
void Axpy(float alpha, const float* x, float* y, int n) noexcept {
  reference::Axpy(alpha, x, y, n);
}

#endif

void Scale(float alpha, float* y, int n) noexcept {
  for (int i = 0; i < n; ++i) y[i] *= alpha;
}

void RmsNorm(const float* x, const float* weight, float eps, float* out, int n) noexcept {
  const float ss = Dot(x, x, n);
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int i = 0; i < n; ++i) out[i] = x[i] * inv * weight[i];
}

#if defined(__AVX512F__)
void Softmax(float* x, int n) noexcept {
  __m512 vmax = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  int i = 0;
  for (; i + 16 <= n; i += 16) vmax = _mm512_max_ps(vmax, _mm512_loadu_ps(x + i));
  if (i < n)
    vmax = _mm512_mask_max_ps(vmax, TailMask(n - i), vmax,
                              _mm512_maskz_loadu_ps(TailMask(n - i), x + i));
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
  __m512 vsum = _mm512_setzero_ps();
  for (i = 0; i + 16 <= n; i += 16) {
    const __m512 e = Exp(_mm512_sub_ps(_mm512_loadu_ps(x + i), m));
    _mm512_storeu_ps(x + i, e);
    vsum = _mm512_add_ps(vsum, e);
  }
  if (i < n) {
    const __mmask16 k = TailMask(n - i);
    const __m512 e = _mm512_maskz_mov_ps(k, Exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), m)));
    _mm512_mask_storeu_ps(x + i, k, e);
    vsum = _mm512_add_ps(vsum, e);
  }
  const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(vsum));
  for (i = 0; i + 16 <= n; i += 16)
    _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), inv));
  if (i < n) {
    const __mmask16 k = TailMask(n - i);
    _mm512_mask_storeu_ps(x + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), inv));
  }
}
void SwiGlu(const float* gate, const float* up, float* out, int n) noexcept {
  const __m512 one = _mm512_set1_ps(1.0f);
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 silu =
        _mm512_div_ps(g, _mm512_add_ps(one, Exp(_mm512_sub_ps(_mm512_setzero_ps(), g))));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(silu, _mm512_loadu_ps(up + i)));
  }
  if (i < n) reference::SwiGlu(gate + i, up + i, out + i, n - i);
}
#else
void Softmax(float* x, int n) noexcept { reference::Softmax(x, n); }
void SwiGlu(const float* gate, const float* up, float* out, int n) noexcept {
  reference::SwiGlu(gate, up, out, n);
}
#endif

int Argmax(const float* x, int n) noexcept {
  int best = 0;
  for (int i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return best;
}

}  // namespace metronome::kernels
