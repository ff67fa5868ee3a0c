// Dense fp32 building blocks of the forward pass. Each has a SIMD path (AVX-512 or AVX2+FMA,
// chosen at compile time by -march) and a scalar reference in the `reference` namespace that the
// tests compare against. All functions are thread-safe (no shared state) and noexcept; pointers
// must not alias unless stated.
#pragma once

#include <cstdint>

namespace metronome::kernels {

// sum_i a[i] * b[i]
[[nodiscard]] float Dot(const float* a, const float* b, int n) noexcept;

// y[i] += alpha * x[i]
void Axpy(float alpha, const float* x, float* y, int n) noexcept;

// y[i] *= alpha
void Scale(float alpha, float* y, int n) noexcept;

// out[i] = x[i] / sqrt(mean(x^2) + eps) * weight[i]   (out may equal x)
void RmsNorm(const float* x, const float* weight, float eps, float* out, int n) noexcept;

// out[i] = silu(gate[i]) * up[i] with silu(v) = v / (1 + exp(-v))   (out may equal gate)
void SwiGlu(const float* gate, const float* up, float* out, int n) noexcept;

// In-place softmax over x[0..n); returns nothing. n >= 1.
void Softmax(float* x, int n) noexcept;

// Index of the largest element; the lowest index among equal maxima (llama2.c sample_argmax).
[[nodiscard]] int Argmax(const float* x, int n) noexcept;

namespace reference {
float Dot(const float* a, const float* b, int n) noexcept;
void Axpy(float alpha, const float* x, float* y, int n) noexcept;
void RmsNorm(const float* x, const float* weight, float eps, float* out, int n) noexcept;
void SwiGlu(const float* gate, const float* up, float* out, int n) noexcept;
void Softmax(float* x, int n) noexcept;
}  // namespace reference

}  // namespace metronome::kernels
