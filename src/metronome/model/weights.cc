#include "metronome/model/weights.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace metronome::model {
namespace {

constexpr std::size_t kAlignFloats = 16;  // 64 bytes: one cache line, one AVX-512 vector

std::size_t RoundUp(std::size_t n) { return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }

}  // namespace

void ModelWeights::FreeDeleter::operator()(float* p) const { std::free(p); }

ModelWeights::ModelWeights(const ModelConfig& c) {
  const auto dim = static_cast<std::size_t>(c.dim);
  const auto vocab = static_cast<std::size_t>(c.vocab_size);
  const auto ffn = static_cast<std::size_t>(c.ffn_dim);
  const auto qkv = static_cast<std::size_t>(c.qkv_dim());
  const auto qd = static_cast<std::size_t>(c.q_dim());

  // Two passes over the same layout: the first sizes the arena, the second hands out pointers.
  std::size_t cursor = 0;
  float* base = nullptr;
  auto take = [&](std::size_t n) -> float* {
    float* p = base == nullptr ? nullptr : base + cursor;
    cursor += RoundUp(n);
    return p;
  };
  for (int pass = 0; pass < 2; ++pass) {
    cursor = 0;
    layers.assign(static_cast<std::size_t>(c.num_layers), LayerWeights{});
    token_embedding = take(vocab * dim);
    for (auto& l : layers) {
      l.attn_norm = take(dim);
      l.wqkv = take(qkv * dim);
      l.bqkv = c.has_qkv_bias ? take(qkv) : nullptr;
      l.wo = take(dim * qd);
      l.ffn_norm = take(dim);
      l.w_gate_up = take(2 * ffn * dim);
      l.w_down = take(dim * ffn);
    }
    final_norm = take(dim);
    output = c.tied_embeddings ? token_embedding : take(vocab * dim);
    if (pass == 0) {
      num_floats_ = cursor;
      void* mem = std::aligned_alloc(kAlignFloats * sizeof(float), cursor * sizeof(float));
      if (mem == nullptr) {
        throw std::bad_alloc();
      }
      std::memset(mem, 0, cursor * sizeof(float));
      storage_.reset(static_cast<float*>(mem));
      base = storage_.get();
    }
  }
}

}  // namespace metronome::model
