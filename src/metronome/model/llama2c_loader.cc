// llama2.c checkpoints (karpathy/llama2.c run.c layout): a 7 x int32 header, then fp32 tensors
// grouped by kind across layers (all wq, then all wk, ...), matrices row-major [out, in].
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <string>

#include "metronome/base/errors.h"
#include "metronome/base/mapped_file.h"
#include "metronome/model/model.h"

namespace metronome::model {
namespace {

struct Header {
  std::int32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
};
static_assert(sizeof(Header) == 7 * sizeof(std::int32_t));

std::string HeaderString(const Header& h) {
  return "dim=" + std::to_string(h.dim) + " hidden_dim=" + std::to_string(h.hidden_dim) +
         " n_layers=" + std::to_string(h.n_layers) + " n_heads=" + std::to_string(h.n_heads) +
         " n_kv_heads=" + std::to_string(h.n_kv_heads) +
         " vocab_size=" + std::to_string(h.vocab_size) + " seq_len=" + std::to_string(h.seq_len);
}

// The header of the checkpoint at `path`, its fields checked for sign and divisibility.
Header ReadHeader(const std::string& path, std::span<const std::uint8_t> bytes) {
  Header h{};
  if (bytes.size() < sizeof(Header)) {
    throw LoadError(path + ": file of " + std::to_string(bytes.size()) +
                    " bytes is too short for a llama2.c header (28 bytes)");
  }
  std::memcpy(&h, bytes.data(), sizeof(Header));
  if (h.dim <= 0 || h.hidden_dim <= 0 || h.n_layers <= 0 || h.n_heads <= 0 || h.n_kv_heads <= 0 ||
      h.vocab_size == 0 || h.seq_len <= 0) {
    throw LoadError(path + ": invalid llama2.c header (" + HeaderString(h) + ")");
  }
  if (h.dim % h.n_heads != 0) {
    throw LoadError(path + ": dim " + std::to_string(h.dim) + " is not a multiple of n_heads " +
                    std::to_string(h.n_heads));
  }
  return h;
}

// A negative vocab_size is llama2.c's flag for an unshared classifier stored at the end.
bool SharedClassifier(const Header& h) { return h.vocab_size > 0; }

// The configuration the header describes (llama2.c's fixed eps, theta and interleaved RoPE),
// validated.
ModelConfig ConfigOf(const Header& h, const std::string& path) {
  const std::int64_t vocab =
      SharedClassifier(h) ? h.vocab_size : -static_cast<std::int64_t>(h.vocab_size);
  ModelConfig c;
  c.architecture = Architecture::kLlama;
  c.name = std::filesystem::path(path).filename().string();
  c.dim = h.dim;
  c.num_layers = h.n_layers;
  c.num_heads = h.n_heads;
  c.num_kv_heads = h.n_kv_heads;
  c.head_dim = h.dim / h.n_heads;
  c.ffn_dim = h.hidden_dim;
  c.vocab_size = vocab > INT32_MAX ? INT32_MAX : static_cast<int>(vocab);
  c.context_length = h.seq_len;
  c.rms_eps = 1e-5f;
  c.rope_theta = 10000.0;
  c.rope_style = RopeStyle::kInterleaved;
  c.tied_embeddings = SharedClassifier(h);
  try {
    c.Validate(path);
  } catch (const ConfigError& e) {
    throw LoadError(std::string(e.what()) + " (llama2.c header: " + HeaderString(h) + ")");
  }
  return c;
}

// Where each tensor kind starts, in floats from the end of the header (file order: every layer's
// tensors of one kind together), and the floats of the whole payload.
struct Layout {
  std::uint64_t emb, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, wcls;
  std::uint64_t total_floats;
};

// Validate has bounded every factor of `c`, so these products cannot overflow 64 bits.
Layout LayoutOf(const ModelConfig& c, const Header& h) {
  const auto dim = static_cast<std::uint64_t>(c.dim);
  const auto hidden = static_cast<std::uint64_t>(c.ffn_dim);
  const auto layers = static_cast<std::uint64_t>(c.num_layers);
  const auto kv_dim = static_cast<std::uint64_t>(c.kv_dim());
  const auto nvocab = static_cast<std::uint64_t>(c.vocab_size);
  const auto q_dim = static_cast<std::uint64_t>(c.q_dim());
  std::uint64_t cursor = 0;
  const auto take = [&cursor](std::uint64_t n) {
    const std::uint64_t at = cursor;
    cursor += n;
    return at;
  };
  Layout f{};
  f.emb = take(nvocab * dim);
  f.rms_att = take(layers * dim);
  f.wq = take(layers * q_dim * dim);
  f.wk = take(layers * kv_dim * dim);
  f.wv = take(layers * kv_dim * dim);
  f.wo = take(layers * dim * q_dim);
  f.rms_ffn = take(layers * dim);
  f.w1 = take(layers * hidden * dim);
  f.w2 = take(layers * dim * hidden);
  f.w3 = take(layers * hidden * dim);
  f.rms_final = take(dim);
  // Legacy freq_cis_real and freq_cis_imag tables (seq x head/2 each): unused.
  take(static_cast<std::uint64_t>(h.seq_len) * static_cast<std::uint64_t>(c.head_dim));
  f.wcls = SharedClassifier(h) ? f.emb : take(nvocab * dim);
  f.total_floats = cursor;
  return f;
}

// Copies every tensor of the payload (after the header) into the model's fp32 weights: wq|wk|wv
// into one fused matrix, w1|w3 into gate|up.
void CopyWeights(const ModelConfig& c, const Layout& f, bool shared_classifier,
                 const std::uint8_t* payload, ModelWeights& w) {
  const auto dim = static_cast<std::uint64_t>(c.dim);
  const auto hidden = static_cast<std::uint64_t>(c.ffn_dim);
  const auto kv_dim = static_cast<std::uint64_t>(c.kv_dim());
  const auto nvocab = static_cast<std::uint64_t>(c.vocab_size);
  const auto q_dim = static_cast<std::uint64_t>(c.q_dim());
  // The payload starts at byte 28, so it is not float-aligned: copy bytes, never cast.
  const auto copy = [payload](float* dst, std::uint64_t at, std::uint64_t n) {
    std::memcpy(dst, payload + at * sizeof(float), static_cast<std::size_t>(n * sizeof(float)));
  };
  copy(w.MutableFloats(w.token_embedding), f.emb, nvocab * dim);
  for (std::uint64_t l = 0; l < static_cast<std::uint64_t>(c.num_layers); ++l) {
    LayerWeights& lw = w.layers[static_cast<std::size_t>(l)];
    copy(lw.attn_norm, f.rms_att + l * dim, dim);
    float* wqkv_f = w.MutableFloats(lw.wqkv[0]);
    copy(wqkv_f, f.wq + l * q_dim * dim, q_dim * dim);
    copy(wqkv_f + q_dim * dim, f.wk + l * kv_dim * dim, kv_dim * dim);
    copy(wqkv_f + (q_dim + kv_dim) * dim, f.wv + l * kv_dim * dim, kv_dim * dim);
    copy(w.MutableFloats(lw.wo), f.wo + l * dim * q_dim, dim * q_dim);
    copy(lw.ffn_norm, f.rms_ffn + l * dim, dim);
    float* gate_up = w.MutableFloats(lw.w_gate_up[0]);
    copy(gate_up, f.w1 + l * hidden * dim, hidden * dim);
    copy(gate_up + hidden * dim, f.w3 + l * hidden * dim, hidden * dim);
    copy(w.MutableFloats(lw.w_down), f.w2 + l * dim * hidden, dim * hidden);
  }
  copy(w.final_norm, f.rms_final, dim);
  if (!shared_classifier) copy(w.MutableFloats(w.output), f.wcls, nvocab * dim);
}

}  // namespace

Model LoadLlama2cModel(const std::string& path, const std::string& tokenizer_path) {
  const MappedFile file(path);
  const auto bytes = file.bytes();
  const Header h = ReadHeader(path, bytes);
  const bool shared_classifier = SharedClassifier(h);
  Model m;
  m.config = ConfigOf(h, path);
  const ModelConfig& c = m.config;
  const Layout layout = LayoutOf(c, h);
  const std::uint64_t expected = sizeof(Header) + layout.total_floats * sizeof(float);
  if (bytes.size() != expected) {
    throw LoadError(path + ": file is " + std::to_string(bytes.size()) + " bytes but a llama2.c " +
                    (shared_classifier ? "shared" : "unshared") + "-classifier checkpoint with " +
                    HeaderString(h) + " is " + std::to_string(expected) + " bytes" +
                    (bytes.size() < expected ? " (truncated)" : " (trailing data)"));
  }
  m.weights = std::make_unique<ModelWeights>(c);
  CopyWeights(c, layout, shared_classifier, bytes.data() + sizeof(Header), *m.weights);
  if (!tokenizer_path.empty()) {
    m.tokenizer = LoadLlama2cTokenizer(tokenizer_path, c.vocab_size);
  }
  return m;
}

}  // namespace metronome::model
