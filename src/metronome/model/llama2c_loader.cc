// llama2.c checkpoints (karpathy/llama2.c run.c layout): a 7 x int32 header, then fp32 tensors
// grouped by kind across layers (all wq, then all wk, ...), matrices row-major [out, in].
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
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

}  // namespace

Model LoadLlama2cModel(const std::string& path, const std::string& tokenizer_path) {
  const MappedFile file(path);
  const auto bytes = file.bytes();
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
  // A negative vocab_size is llama2.c's flag for an unshared classifier stored at the end.
  const bool shared_classifier = h.vocab_size > 0;
  const std::int64_t vocab =
      shared_classifier ? h.vocab_size : -static_cast<std::int64_t>(h.vocab_size);

  Model m;
  ModelConfig& c = m.config;
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
  c.tied_embeddings = shared_classifier;
  try {
    c.Validate(path);
  } catch (const ConfigError& e) {
    throw LoadError(std::string(e.what()) + " (llama2.c header: " + HeaderString(h) + ")");
  }

  // Validate has bounded every factor, so these products cannot overflow 64 bits.
  const auto dim = static_cast<std::uint64_t>(c.dim);
  const auto hidden = static_cast<std::uint64_t>(c.ffn_dim);
  const auto layers = static_cast<std::uint64_t>(c.num_layers);
  const auto kv_dim = static_cast<std::uint64_t>(c.kv_dim());
  const auto nvocab = static_cast<std::uint64_t>(c.vocab_size);
  const auto head = static_cast<std::uint64_t>(c.head_dim);
  const auto seq = static_cast<std::uint64_t>(h.seq_len);
  const auto q_dim = static_cast<std::uint64_t>(c.q_dim());

  // Offsets in floats from the end of the header, in file order.
  std::uint64_t cursor = 0;
  const auto take = [&cursor](std::uint64_t n) {
    const std::uint64_t at = cursor;
    cursor += n;
    return at;
  };
  const std::uint64_t emb = take(nvocab * dim);
  const std::uint64_t rms_att = take(layers * dim);
  const std::uint64_t wq = take(layers * q_dim * dim);
  const std::uint64_t wk = take(layers * kv_dim * dim);
  const std::uint64_t wv = take(layers * kv_dim * dim);
  const std::uint64_t wo = take(layers * dim * q_dim);
  const std::uint64_t rms_ffn = take(layers * dim);
  const std::uint64_t w1 = take(layers * hidden * dim);
  const std::uint64_t w2 = take(layers * dim * hidden);
  const std::uint64_t w3 = take(layers * hidden * dim);
  const std::uint64_t rms_final = take(dim);
  take(seq * head);  // legacy freq_cis_real and freq_cis_imag tables (seq x head/2 each): unused
  const std::uint64_t wcls = shared_classifier ? emb : take(nvocab * dim);
  const std::uint64_t expected = sizeof(Header) + cursor * sizeof(float);
  if (bytes.size() != expected) {
    throw LoadError(path + ": file is " + std::to_string(bytes.size()) + " bytes but a llama2.c " +
                    (shared_classifier ? "shared" : "unshared") + "-classifier checkpoint with " +
                    HeaderString(h) + " is " + std::to_string(expected) + " bytes" +
                    (bytes.size() < expected ? " (truncated)" : " (trailing data)"));
  }

  m.weights = std::make_unique<ModelWeights>(c);
  ModelWeights& w = *m.weights;
  // The payload starts at byte 28, so it is not float-aligned: copy bytes, never cast.
  const std::uint8_t* payload = bytes.data() + sizeof(Header);
  const auto copy = [payload](float* dst, std::uint64_t at, std::uint64_t n) {
    std::memcpy(dst, payload + at * sizeof(float), static_cast<std::size_t>(n * sizeof(float)));
  };
  copy(w.MutableFloats(w.token_embedding), emb, nvocab * dim);
  for (std::uint64_t l = 0; l < layers; ++l) {
    LayerWeights& lw = w.layers[static_cast<std::size_t>(l)];
    copy(lw.attn_norm, rms_att + l * dim, dim);
    float* wqkv_f = w.MutableFloats(lw.wqkv[0]);
    copy(wqkv_f, wq + l * q_dim * dim, q_dim * dim);
    copy(wqkv_f + q_dim * dim, wk + l * kv_dim * dim, kv_dim * dim);
    copy(wqkv_f + (q_dim + kv_dim) * dim, wv + l * kv_dim * dim, kv_dim * dim);
    copy(w.MutableFloats(lw.wo), wo + l * dim * q_dim, dim * q_dim);
    copy(lw.ffn_norm, rms_ffn + l * dim, dim);
    float* gate_up = w.MutableFloats(lw.w_gate_up[0]);
    copy(gate_up, w1 + l * hidden * dim, hidden * dim);
    copy(gate_up + hidden * dim, w3 + l * hidden * dim, hidden * dim);
    copy(w.MutableFloats(lw.w_down), w2 + l * dim * hidden, dim * hidden);
  }
  copy(w.final_norm, rms_final, dim);
  if (!shared_classifier) copy(w.MutableFloats(w.output), wcls, nvocab * dim);

  if (!tokenizer_path.empty()) {
    m.tokenizer = LoadLlama2cTokenizer(tokenizer_path, c.vocab_size);
  }
  return m;
}

}  // namespace metronome::model
