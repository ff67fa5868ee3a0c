// Synthetic models: real shapes with seeded random weights, for benchmarks and tests that need a
// model of a given size but not its outputs.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "metronome/base/errors.h"
#include "metronome/base/thread_pool.h"
#include "metronome/model/internal/gguf_tensors.h"
#include "metronome/model/internal/synthetic_values.h"
#include "metronome/model/model.h"

namespace metronome::model {
namespace {

struct Preset {
  const char* name;
  int dim, num_layers, num_heads, num_kv_heads, head_dim, ffn_dim, vocab_size, context_length;
  bool tied_embeddings;
  Architecture architecture = Architecture::kLlama;
  int num_experts = 0, num_experts_used = 0, expert_ffn_dim = 0;
};

// smol-135m has the shape of SmolLM-135M. The qwen3 presets have Qwen3's traits at a small size:
// head_dim != dim / heads (q has 2 dim rows), every matrix's rows whole 256-element blocks (so
// q4_k_m quantises them all as K-quants); the qwen3moe one 8 experts, 2 used per token.
// qwen3-8b and qwen3-30b-a3b have the shapes of Qwen3-8B and Qwen3-30B-A3B (their GGUFs' keys;
// the MoE's feed_forward_length is unused), qwen3moe-mid a 2.5B-parameter MoE of 8 such layers
// with 64 experts; they are for `metronome synth-gguf`, which writes them without holding them
// (as a model they need 4 bytes a parameter). qwen3moe-tiny is the same kind at test size.
constexpr Preset kPresets[] = {
    {"tiny", 64, 2, 4, 2, 16, 128, 512, 4096, false},
    {"smol-135m", 576, 30, 9, 3, 64, 1536, 49152, 8192, true},
    {"small", 256, 4, 8, 4, 32, 768, 4096, 4096, false},
    {"qwen3-small", 256, 4, 8, 2, 64, 768, 4096, 4096, true, Architecture::kQwen3},
    {"qwen3moe-small", 256, 4, 8, 4, 64, 768, 4096, 4096, false, Architecture::kQwen3Moe, 8, 2,
     256},
    {"qwen3moe-tiny", 256, 2, 4, 2, 128, 512, 1024, 4096, false, Architecture::kQwen3Moe, 8, 2,
     256},
    {"qwen3-8b", 4096, 36, 32, 8, 128, 12288, 151936, 40960, false, Architecture::kQwen3},
    {"qwen3-30b-a3b", 2048, 48, 32, 4, 128, 6144, 151936, 40960, false, Architecture::kQwen3Moe,
     128, 8, 768},
    {"qwen3moe-mid", 2048, 8, 16, 4, 128, 6144, 151936, 40960, false, Architecture::kQwen3Moe, 64,
     8, 768},
};

// splitmix64's output function: a bijective 64-bit mixer with good avalanche.
constexpr std::uint64_t Mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

constexpr std::uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

// Element i of a tensor is a pure function of (seed, tensor id, i): the splitmix64 stream keyed by
// the tensor, evaluated at position i. That makes generation order- and thread-count-independent.
std::uint64_t TensorKey(std::uint64_t seed, std::uint64_t tensor_id) {
  return Mix(seed ^ Mix(tensor_id * kGolden + 0x632be59bd9b4e019ULL));
}

// Elements [begin, begin + n) of the stream `key`, uniform in [-amplitude, amplitude) (std =
// amplitude / sqrt(3)), into dst[0, n). Each 64-bit draw feeds two elements (bits 40..63 and
// 8..31): elements 2k and 2k+1 share draw k.
void UniformValues(std::uint64_t key, float amplitude, std::uint64_t begin, std::size_t n,
                   float* dst) {
  // 24 random bits map exactly onto the float grid of [0, 1).
  const float scale = 2.0f * amplitude / static_cast<float>(1 << 24);
  const auto to_float = [scale, amplitude](std::uint64_t bits24) {
    // Through int32: a signed conversion is one instruction, an unsigned 64-bit one is not.
    return static_cast<float>(static_cast<std::int32_t>(bits24)) * scale - amplitude;
  };
  const auto draw = [key](std::uint64_t i) { return Mix(key + (i / 2 + 1) * kGolden); };
  std::uint64_t i = begin;
  const std::uint64_t end = begin + n;
  if (i < end && i % 2 == 1) {
    *dst++ = to_float((draw(i) >> 8) & 0xffffffu);
    ++i;
  }
  for (; i + 1 < end; i += 2) {
    const std::uint64_t r = draw(i);
    dst[0] = to_float(r >> 40);
    dst[1] = to_float((r >> 8) & 0xffffffu);
    dst += 2;
  }
  if (i < end) *dst = to_float(draw(i) >> 40);
}

// A tensor to fill uniformly in [-amplitude, amplitude).
struct UniformJob {
  float* dst;
  std::size_t n;
  std::uint64_t key;
  float amplitude;
};

// Fills all jobs in fixed-size chunks on `pool` (chunks claimed one by one: on a
// shared, oversubscribed machine a descheduled thread then delays only its current chunk).
void FillUniform(base::ThreadPool& pool, const std::vector<UniformJob>& jobs) {
  constexpr std::size_t kChunk = 1 << 16;
  struct Chunk {
    const UniformJob* job;
    std::size_t begin;
  };
  std::vector<Chunk> chunks;
  for (const UniformJob& j : jobs) {
    for (std::size_t b = 0; b < j.n; b += kChunk) chunks.push_back({&j, b});
  }
  pool.ParallelFor(static_cast<std::int64_t>(chunks.size()), 1,
                   [&chunks](std::int64_t c0, std::int64_t c1) {
                     for (std::int64_t c = c0; c < c1; ++c) {
                       const UniformJob& j = *chunks[static_cast<std::size_t>(c)].job;
                       const std::size_t begin = chunks[static_cast<std::size_t>(c)].begin;
                       const std::size_t end = std::min(j.n, begin + kChunk);
                       UniformValues(j.key, j.amplitude, begin, end - begin, j.dst + begin);
                     }
                   });
}

void FillConstant(float* dst, std::size_t n, float v) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = v;
}

// Uniform amplitude giving std 1/sqrt(fan_in): keeps each projection's output at the scale of its
// (RMS-normalised, std ~1) input.
float MatrixAmplitude(int fan_in) { return std::sqrt(3.0f / static_cast<float>(fan_in)); }

// Where the values of a tensor come from: the uniform stream `key` in [-amplitude, amplitude),
// plus `offset`. The stream is laid out as the tensor's fused storage in ModelWeights (wqkv's q,
// k, v rows; w_gate_up's gate, up rows; each expert's gate, up rows), so ggml row r of the
// tensor is stream row (r / block_rows) * block_stride + first_row + r % block_rows.
// Tensor ids are part of the output's definition: changing them changes every synthetic model.
struct Stream {
  std::uint64_t key = 0;
  float amplitude = 0.0f;
  float offset = 0.0f;
  std::uint64_t first_row = 0;
  std::uint64_t block_rows = ~std::uint64_t{0};
  std::uint64_t block_stride = 0;
};

Stream StreamOf(const ModelConfig& c, std::uint64_t seed, internal::TensorPart part, int layer) {
  constexpr std::uint64_t kEmbeddingId = 0;
  constexpr std::uint64_t kOutputId = 1;
  constexpr std::uint64_t kFirstLayerId = 16;
  constexpr std::uint64_t kIdsPerLayer = 8;
  // The qwen3 tensors take ids of their own, so the llama presets' weights stay what they were.
  constexpr std::uint64_t kFirstExtraId = std::uint64_t{1} << 32;
  const std::uint64_t id = kFirstLayerId + static_cast<std::uint64_t>(layer) * kIdsPerLayer;
  const std::uint64_t extra = kFirstExtraId + static_cast<std::uint64_t>(layer) * kIdsPerLayer;
  const auto u = [](int v) { return static_cast<std::uint64_t>(v); };
  const auto uniform = [seed](std::uint64_t tensor_id, float amplitude) {
    return Stream{TensorKey(seed, tensor_id), amplitude};
  };
  const auto rows_from = [](Stream s, std::uint64_t first_row) {
    s.first_row = first_row;
    return s;
  };
  // Each expert's gate and up rows are one block of 2 * expert_ffn_dim stream rows.
  const auto expert_rows = [&c, &u](Stream s, std::uint64_t first_row) {
    s.first_row = first_row;
    s.block_rows = u(c.expert_ffn_dim);
    s.block_stride = 2 * u(c.expert_ffn_dim);
    return s;
  };
  using internal::TensorPart;
  switch (part) {
    case TensorPart::kTokenEmbedding:
      return uniform(kEmbeddingId, std::sqrt(3.0f));
    case TensorPart::kOutput:
      return uniform(kOutputId, MatrixAmplitude(c.dim));
    case TensorPart::kOutputNorm:
    case TensorPart::kAttnNorm:
    case TensorPart::kFfnNorm:
      return Stream{0, 0.0f, 1.0f};
    case TensorPart::kAttnQ:
      return uniform(id + 0, MatrixAmplitude(c.dim));
    case TensorPart::kAttnK:
      return rows_from(uniform(id + 0, MatrixAmplitude(c.dim)), u(c.q_dim()));
    case TensorPart::kAttnV:
      return rows_from(uniform(id + 0, MatrixAmplitude(c.dim)), u(c.q_dim() + c.kv_dim()));
    case TensorPart::kAttnOutput:
      return uniform(id + 1, MatrixAmplitude(c.q_dim()));
    case TensorPart::kFfnGate:
      return uniform(id + 2, MatrixAmplitude(c.dim));
    case TensorPart::kFfnUp:
      return rows_from(uniform(id + 2, MatrixAmplitude(c.dim)), u(c.ffn_dim));
    case TensorPart::kFfnDown:
      return uniform(id + 3, MatrixAmplitude(c.ffn_dim));
    case TensorPart::kAttnQNorm:
    case TensorPart::kAttnKNorm: {
      // Around 1 but not 1, so that a norm applied to the wrong head or not at all shows.
      Stream s = uniform(extra + (part == TensorPart::kAttnQNorm ? 0 : 1), 0.5f);
      s.offset = 1.0f;
      return s;
    }
    case TensorPart::kFfnRouter:
      return uniform(extra + 2, MatrixAmplitude(c.dim));
    case TensorPart::kFfnGateExps:
      return expert_rows(uniform(extra + 3, MatrixAmplitude(c.dim)), 0);
    case TensorPart::kFfnUpExps:
      return expert_rows(uniform(extra + 3, MatrixAmplitude(c.dim)), u(c.expert_ffn_dim));
    case TensorPart::kFfnDownExps:
      return uniform(extra + 4, MatrixAmplitude(c.expert_ffn_dim));
    default:
      throw ConfigError(c.name + ": a synthetic model has no tensor of part " +
                        std::to_string(static_cast<int>(part)));
  }
}

}  // namespace

std::string SyntheticPresetNames() {
  std::string names;
  for (const Preset& p : kPresets) {
    if (!names.empty()) names += ", ";
    names += p.name;
  }
  return names;
}

ModelConfig SyntheticPresetConfig(const std::string& preset) {
  for (const Preset& p : kPresets) {
    if (preset != p.name) continue;
    ModelConfig c;
    c.architecture = Architecture::kLlama;
    c.name = "synthetic:" + preset;
    c.dim = p.dim;
    c.num_layers = p.num_layers;
    c.num_heads = p.num_heads;
    c.num_kv_heads = p.num_kv_heads;
    c.head_dim = p.head_dim;
    c.ffn_dim = p.ffn_dim;
    c.vocab_size = p.vocab_size;
    c.context_length = p.context_length;
    c.rms_eps = 1e-5f;
    c.rope_theta = 10000.0;
    c.rope_style = RopeStyle::kInterleaved;
    c.tied_embeddings = p.tied_embeddings;
    if (p.architecture != Architecture::kLlama) {
      // Qwen3's conventions (its config.json: rms_norm_eps 1e-6, rope_theta 1e6).
      c.architecture = p.architecture;
      c.rms_eps = 1e-6f;
      c.rope_theta = 1e6;
      c.rope_style = RopeStyle::kNeox;
      c.has_qk_norm = true;
      c.num_experts = p.num_experts;
      c.num_experts_used = p.num_experts_used;
      c.expert_ffn_dim = p.expert_ffn_dim;
    }
    return c;
  }
  throw ConfigError("unknown synthetic preset '" + preset + "' (known: " + SyntheticPresetNames() +
                    ")");
}

Model MakeSyntheticModel(const std::string& preset, std::uint64_t seed, int num_threads) {
  if (num_threads < 0) {
    throw ConfigError("num_threads = " + std::to_string(num_threads) + " must be >= 0");
  }
  Model m;
  m.config = SyntheticPresetConfig(preset);
  const ModelConfig& c = m.config;
  c.Validate(c.name);
  m.weights = std::make_unique<ModelWeights>(c);
  ModelWeights& w = *m.weights;
  const ModelConfig::Extents size = c.extents();

  std::vector<UniformJob> jobs;
  struct Span {
    float* data;
    std::size_t n;
  };
  std::vector<Span> offset_by_one;  // filled in [-a, a), then moved to [1 - a, 1 + a)
  using internal::TensorPart;
  // One job per stream: a fused matrix (wqkv, w_gate_up, a layer's experts in one arena matrix)
  // is one stream, which StreamOf names by its first part.
  const auto job = [&](float* dst, std::size_t n, TensorPart part, int layer) {
    const Stream s = StreamOf(c, seed, part, layer);
    jobs.push_back({dst, n, s.key, s.amplitude});
  };
  job(w.MutableFloats(w.token_embedding), size.vocab * size.dim, TensorPart::kTokenEmbedding, -1);
  for (std::size_t l = 0; l < w.layers.size(); ++l) {
    LayerWeights& lw = w.layers[l];
    const int layer = static_cast<int>(l);
    FillConstant(lw.attn_norm, size.dim, 1.0f);
    FillConstant(lw.ffn_norm, size.dim, 1.0f);
    job(w.MutableFloats(lw.wqkv[0]), size.qkv * size.dim, TensorPart::kAttnQ, layer);
    job(w.MutableFloats(lw.wo), size.dim * size.q, TensorPart::kAttnOutput, layer);
    if (!c.is_moe()) {
      job(w.MutableFloats(lw.w_gate_up[0]), 2 * size.ffn * size.dim, TensorPart::kFfnGate, layer);
      job(w.MutableFloats(lw.w_down), size.dim * size.ffn, TensorPart::kFfnDown, layer);
    }
    if (c.has_qk_norm) {
      job(lw.q_norm, size.head, TensorPart::kAttnQNorm, layer);
      job(lw.k_norm, size.head, TensorPart::kAttnKNorm, layer);
      offset_by_one.push_back({lw.q_norm, size.head});
      offset_by_one.push_back({lw.k_norm, size.head});
    }
    if (c.is_moe()) {
      job(w.MutableFloats(lw.router), size.experts * size.dim, TensorPart::kFfnRouter, layer);
      job(w.MutableFloats(lw.expert_gate_up[0][0]), size.experts * 2 * size.expert_ffn * size.dim,
          TensorPart::kFfnGateExps, layer);
      job(w.MutableFloats(lw.expert_down[0]), size.experts * size.dim * size.expert_ffn,
          TensorPart::kFfnDownExps, layer);
    }
  }
  FillConstant(w.final_norm, size.dim, 1.0f);
  if (!c.tied_embeddings) {
    job(w.MutableFloats(w.output), size.vocab * size.dim, TensorPart::kOutput, -1);
  }
  base::ThreadPool pool(base::ThreadPoolOptions{.num_threads = num_threads});
  FillUniform(pool, jobs);
  for (const Span& sp : offset_by_one) {
    for (std::size_t i = 0; i < sp.n; ++i) sp.data[i] += 1.0f;
  }
  m.tokenizer = MakeSentencePieceTokenizer(MakeSyntheticVocabulary(c.vocab_size));
  return m;
}

}  // namespace metronome::model

namespace metronome::model::internal {

void SyntheticTensorRows(const ModelConfig& c, std::uint64_t seed, const TensorSpec& t,
                         std::uint64_t row0, std::uint64_t num_rows, float* out) {
  const Stream s = StreamOf(c, seed, t.part, t.layer);
  const std::uint64_t cols = t.shape[0];
  const auto n = static_cast<std::size_t>(cols);
  for (std::uint64_t r = row0; r < row0 + num_rows; ++r, out += n) {
    if (s.amplitude == 0.0f) {
      FillConstant(out, n, s.offset);
      continue;
    }
    const std::uint64_t block = s.block_rows == ~std::uint64_t{0} ? 0 : r / s.block_rows;
    const std::uint64_t within = s.block_rows == ~std::uint64_t{0} ? r : r % s.block_rows;
    const std::uint64_t stream_row = block * s.block_stride + s.first_row + within;
    UniformValues(s.key, s.amplitude, stream_row * cols, n, out);
    if (s.offset != 0.0f) {
      for (std::size_t i = 0; i < n; ++i) out[i] += s.offset;
    }
  }
}

}  // namespace metronome::model::internal
