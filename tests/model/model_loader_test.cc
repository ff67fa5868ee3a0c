// Model loaders against the real checkpoints in ../shared/models (skipped when absent), the
// synthetic presets and the GGUF export round trip.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "metronome/base/errors.h"
#include "metronome/base/mapped_file.h"
#include "metronome/model/gguf.h"
#include "metronome/model/internal/gguf_tensors.h"
#include "metronome/model/model.h"
#include "support/shared_data.h"

#ifdef _OPENMP
#endif

namespace metronome::model {
namespace {

// The fp32 data of a matrix of an fp32 model (llama2.c, synthetic).
const float* Floats(const quant::WeightMatrix& m) {
  EXPECT_EQ(m.type, quant::GgmlType::kF32);
  return reinterpret_cast<const float*>(m.data);
}

using metronome::testing::SharedModelPath;

std::string TempPath(const std::string& name) {
  return (std::filesystem::path(::testing::TempDir()) / name).string();
}

std::vector<char> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void WriteAll(const std::string& path, const char* data, std::size_t n) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data, static_cast<std::streamsize>(n));
  ASSERT_TRUE(out.good()) << path;
}

// Every weight of a model as fp32, in the runtime's layout order (matrices dequantised, groups
// concatenated, norms).
std::vector<float> Flatten(const ModelWeights& w, int dim) {
  std::vector<float> out;
  const auto add = [&out](const std::vector<float>& v) {
    out.insert(out.end(), v.begin(), v.end());
  };
  const auto all = [](const quant::WeightMatrix& m) { return DequantizeRows(m, 0, m.rows); };
  const auto norm = [&](const float* p) { out.insert(out.end(), p, p + dim); };
  add(all(w.token_embedding));
  for (const LayerWeights& l : w.layers) {
    norm(l.attn_norm);
    add(DequantizeRows(l.wqkv, 0, GroupRows(l.wqkv)));
    add(all(l.wo));
    norm(l.ffn_norm);
    add(DequantizeRows(l.w_gate_up, 0, GroupRows(l.w_gate_up)));
    add(all(l.w_down));
  }
  norm(w.final_norm);
  add(all(w.output));
  return out;
}

bool SameFloats(const float* a, const float* b, std::size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

// Compares every tensor of two models with the same config; `tol` 0 means bit-identical.
void ExpectSameWeights(const Model& a, const Model& b, bool relative_f16 = false) {
  const ModelConfig& c = a.config;
  const auto dim = static_cast<std::size_t>(c.dim);
  const auto vocab = static_cast<std::size_t>(c.vocab_size);
  const auto qkv = static_cast<std::size_t>(c.qkv_dim());
  const auto q = static_cast<std::size_t>(c.q_dim());
  const auto ffn = static_cast<std::size_t>(c.ffn_dim);
  const auto check = [&](const float* x, const float* y, std::size_t n, const std::string& what) {
    if (!relative_f16) {
      EXPECT_TRUE(SameFloats(x, y, n)) << what;
      return;
    }
    for (std::size_t i = 0; i < n; ++i) {
      // Round-to-nearest F16: relative error <= 2^-11 for normals, 2^-25 absolute below.
      const float tol = std::fabs(x[i]) * std::ldexp(1.0f, -11) + std::ldexp(1.0f, -25);
      ASSERT_NEAR(x[i], y[i], tol) << what << "[" << i << "]";
    }
  };
  const ModelWeights& wa = *a.weights;
  const ModelWeights& wb = *b.weights;
  const auto all = [](const quant::WeightMatrix& m) { return DequantizeRows(m, 0, m.rows); };
  const auto group = [](const MatrixGroup& g) { return DequantizeRows(g, 0, GroupRows(g)); };
  check(all(wa.token_embedding).data(), all(wb.token_embedding).data(), vocab * dim,
        "token_embedding");
  check(all(wa.output).data(), all(wb.output).data(), vocab * dim, "output");
  EXPECT_TRUE(SameFloats(wa.final_norm, wb.final_norm, dim)) << "final_norm";
  ASSERT_EQ(wa.layers.size(), wb.layers.size());
  for (std::size_t l = 0; l < wa.layers.size(); ++l) {
    const LayerWeights& la = wa.layers[l];
    const LayerWeights& lb = wb.layers[l];
    const std::string p = "layer " + std::to_string(l) + " ";
    EXPECT_TRUE(SameFloats(la.attn_norm, lb.attn_norm, dim)) << p << "attn_norm";
    EXPECT_TRUE(SameFloats(la.ffn_norm, lb.ffn_norm, dim)) << p << "ffn_norm";
    ASSERT_EQ(GroupRows(la.wqkv), static_cast<int>(qkv));
    ASSERT_EQ(GroupRows(lb.wqkv), static_cast<int>(qkv));
    check(group(la.wqkv).data(), group(lb.wqkv).data(), qkv * dim, p + "wqkv");
    check(all(la.wo).data(), all(lb.wo).data(), dim * q, p + "wo");
    check(group(la.w_gate_up).data(), group(lb.w_gate_up).data(), 2 * ffn * dim, p + "w_gate_up");
    check(all(la.w_down).data(), all(lb.w_down).data(), dim * ffn, p + "w_down");
  }
}

void ExpectSameShape(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.architecture, b.architecture);
  EXPECT_EQ(a.dim, b.dim);
  EXPECT_EQ(a.num_layers, b.num_layers);
  EXPECT_EQ(a.num_heads, b.num_heads);
  EXPECT_EQ(a.num_kv_heads, b.num_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.ffn_dim, b.ffn_dim);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.rms_eps, b.rms_eps);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rotary_dim(), b.rotary_dim());
  EXPECT_EQ(a.rope_style, b.rope_style);
  EXPECT_EQ(a.has_qkv_bias, b.has_qkv_bias);
}

#define REQUIRE_SHARED(var, file)                \
  const std::string var = SharedModelPath(file); \
  if (var.empty()) GTEST_SKIP() << "shared model " file " not found"

// ---------------------------------------------------------------------------------------------
// llama2.c

TEST(Llama2cLoaderTest, LoadsStories260K) {
  REQUIRE_SHARED(bin, "stories260K.bin");
  REQUIRE_SHARED(tok, "tok512.bin");
  const Model m = LoadLlama2cModel(bin, tok);
  const ModelConfig& c = m.config;
  EXPECT_EQ(c.architecture, Architecture::kLlama);
  EXPECT_EQ(c.name, "stories260K.bin");
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.ffn_dim, 172);
  EXPECT_EQ(c.num_layers, 5);
  EXPECT_EQ(c.num_heads, 8);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.kv_dim(), 32);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.context_length, 512);
  EXPECT_EQ(c.rms_eps, 1e-5f);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.rope_style, RopeStyle::kInterleaved);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ(m.weights->output.data, m.weights->token_embedding.data);
  ASSERT_NE(m.tokenizer, nullptr);
  EXPECT_EQ(m.tokenizer->vocab_size(), 512);

  // Spot-check the layout against the raw file: the first float after the header is
  // token_embedding[0][0]; the first float after the embedding and rms_att is wq[0][0][0].
  const std::vector<char> raw = ReadAll(bin);
  float v;
  std::memcpy(&v, raw.data() + 28, 4);
  EXPECT_EQ(Floats(m.weights->token_embedding)[0], v);
  std::memcpy(&v, raw.data() + 28 + 4 * (512 * 64 + 5 * 64), 4);
  EXPECT_EQ(Floats(m.weights->layers[0].wqkv[0])[0], v);
  EXPECT_EQ(LoadLlama2cModel(bin, "").tokenizer, nullptr);
}

TEST(Llama2cLoaderTest, RejectsTruncatedAndPaddedCopies) {
  REQUIRE_SHARED(bin, "stories260K.bin");
  const std::vector<char> raw = ReadAll(bin);
  ASSERT_EQ(raw.size(), 1056540u);
  const std::string path = TempPath("stories_damaged.bin");
  for (const std::size_t cut :
       {std::size_t{0}, std::size_t{3}, std::size_t{27}, std::size_t{28}, std::size_t{1000},
        raw.size() / 2, raw.size() - 16384, raw.size() - 4, raw.size() - 1}) {
    WriteAll(path, raw.data(), cut);
    EXPECT_THROW((void)LoadLlama2cModel(path, ""), LoadError) << "cut at " << cut;
  }
  std::vector<char> padded = raw;
  padded.resize(raw.size() + 4, 0);
  WriteAll(path, padded.data(), padded.size());
  try {
    (void)LoadLlama2cModel(path, "");
    ADD_FAILURE() << "accepted trailing data";
  } catch (const LoadError& e) {
    EXPECT_NE(std::string(e.what()).find("trailing"), std::string::npos) << e.what();
  }
}

TEST(Llama2cLoaderTest, RejectsBadHeaders) {
  REQUIRE_SHARED(bin, "stories260K.bin");
  const std::vector<char> raw = ReadAll(bin);
  const std::string path = TempPath("stories_header.bin");
  // {field index, value}: zero/negative sizes, heads not dividing, absurd sizes.
  const std::pair<int, std::int32_t> cases[] = {
      {0, 0}, {0, -64},       {1, 0}, {2, -1},      {3, 7},       {4, 3},       {4, 16},
      {5, 0}, {5, INT32_MIN}, {6, 0}, {0, 1 << 30}, {2, 1 << 20}, {5, 1 << 30}, {1, INT32_MAX}};
  for (const auto& [field, value] : cases) {
    std::vector<char> b = raw;
    std::memcpy(b.data() + 4 * field, &value, 4);
    WriteAll(path, b.data(), b.size());
    EXPECT_THROW((void)LoadLlama2cModel(path, ""), LoadError)
        << "field " << field << " = " << value;
  }
  EXPECT_THROW((void)LoadLlama2cModel(TempPath("does_not_exist.bin"), ""), LoadError);
}

TEST(Llama2cLoaderTest, LoadsUnsharedClassifier) {
  // dim 4, hidden 6, 1 layer, 2 heads, 1 kv head, vocab -3 (unshared), seq_len 2.
  const std::int32_t header[7] = {4, 6, 1, 2, 1, -3, 2};
  const std::size_t floats = 3 * 4 + 4 + 16 + 8 + 8 + 16 + 4 + 24 + 24 + 24 + 4 + 2 * 2 + 3 * 4;
  std::vector<char> b(28 + 4 * floats);
  std::memcpy(b.data(), header, sizeof(header));
  for (std::size_t i = 0; i < floats; ++i) {
    const auto v = static_cast<float>(i);
    std::memcpy(b.data() + 28 + 4 * i, &v, 4);
  }
  const std::string path = TempPath("unshared.bin");
  WriteAll(path, b.data(), b.size());
  const Model m = LoadLlama2cModel(path, "");
  EXPECT_FALSE(m.config.tied_embeddings);
  EXPECT_EQ(m.config.vocab_size, 3);
  EXPECT_EQ(m.config.head_dim, 2);
  const ModelWeights& w = *m.weights;
  EXPECT_EQ(Floats(w.token_embedding)[0], 0.0f);
  EXPECT_EQ(w.layers[0].attn_norm[0], 12.0f);
  EXPECT_EQ(Floats(w.layers[0].wqkv[0])[0], 16.0f);   // wq
  EXPECT_EQ(Floats(w.layers[0].wqkv[0])[16], 32.0f);  // wk follows wq
  EXPECT_EQ(Floats(w.layers[0].wqkv[0])[24], 40.0f);  // wv follows wk
  EXPECT_EQ(Floats(w.layers[0].wo)[0], 48.0f);
  EXPECT_EQ(w.layers[0].ffn_norm[0], 64.0f);
  EXPECT_EQ(Floats(w.layers[0].w_gate_up[0])[0], 68.0f);    // w1
  EXPECT_EQ(Floats(w.layers[0].w_down)[0], 92.0f);          // w2
  EXPECT_EQ(Floats(w.layers[0].w_gate_up[0])[24], 116.0f);  // w3 follows w1
  EXPECT_EQ(w.final_norm[0], 140.0f);
  EXPECT_EQ(Floats(w.output)[0], 148.0f);  // after the 4 freq_cis floats
  EXPECT_EQ(Floats(w.output)[11], 159.0f);
}

TEST(Llama2cLoaderTest, LoadsAidreamsMha) {
  REQUIRE_SHARED(bin, "aidreams260K.bin");
  REQUIRE_SHARED(tok, "aidreams260K.tok512.bin");
  const Model m = LoadLlama2cModel(bin, tok);
  EXPECT_EQ(m.config.dim, 64);
  EXPECT_EQ(m.config.ffn_dim, 172);
  EXPECT_EQ(m.config.num_layers, 4);
  EXPECT_EQ(m.config.num_heads, 4);
  EXPECT_EQ(m.config.num_kv_heads, 4);
  EXPECT_EQ(m.config.head_dim, 16);
  EXPECT_EQ(m.config.vocab_size, 512);
  EXPECT_EQ(m.config.context_length, 128);
  ASSERT_NE(m.tokenizer, nullptr);
}

// ---------------------------------------------------------------------------------------------
// GGUF (real file)

TEST(GgufModelTest, Stories260KMatchesTheCheckpoint) {
  REQUIRE_SHARED(gguf, "stories260K.gguf");
  REQUIRE_SHARED(bin, "stories260K.bin");
  const Model g = LoadGgufModel(gguf);
  const Model b = LoadLlama2cModel(bin, "");
  const ModelConfig& c = g.config;
  EXPECT_EQ(c.name, "stories260K.gguf");
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.ffn_dim, 172);
  EXPECT_EQ(c.num_layers, 5);
  EXPECT_EQ(c.num_heads, 8);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.rotary_dim(), 8);
  EXPECT_EQ(c.context_length, 2048);
  EXPECT_FALSE(c.tied_embeddings);  // the file carries output.weight as a separate copy
  ExpectSameShape(c, b.config);
  ExpectSameWeights(g, b);  // includes output (GGUF) == token_embedding (tied .bin)
  ASSERT_NE(g.tokenizer, nullptr);
  EXPECT_EQ(g.tokenizer->vocab_size(), 512);
  EXPECT_EQ(g.tokenizer->bos_id(), 1);
  EXPECT_EQ(g.tokenizer->eos_id(), 2);
}

TEST(GgufModelTest, LoadModelDispatches) {
  REQUIRE_SHARED(gguf, "stories260K.gguf");
  REQUIRE_SHARED(bin, "stories260K.bin");
  REQUIRE_SHARED(tok, "tok512.bin");
  EXPECT_EQ(LoadModel(gguf).config.context_length, 2048);
  const Model b = LoadModel(bin, tok);
  EXPECT_EQ(b.config.context_length, 512);
  EXPECT_NE(b.tokenizer, nullptr);
  // Content, not the extension, decides: a GGUF under another name still loads as GGUF.
  const std::vector<char> raw = ReadAll(gguf);
  const std::string renamed = TempPath("stories_gguf_renamed.bin");
  WriteAll(renamed, raw.data(), raw.size());
  EXPECT_EQ(LoadModel(renamed).config.context_length, 2048);
  EXPECT_EQ(LoadModel("synthetic:tiny").config.name, "synthetic:tiny");
  EXPECT_THROW((void)LoadModel("synthetic:nope"), ConfigError);
  EXPECT_THROW((void)LoadModel(TempPath("nothing_here.gguf")), LoadError);
}

// ---------------------------------------------------------------------------------------------
// Synthetic presets

TEST(SyntheticModelTest, PresetShapes) {
  EXPECT_NE(SyntheticPresetNames().find("tiny"), std::string::npos);
  EXPECT_NE(SyntheticPresetNames().find("smol-135m"), std::string::npos);
  EXPECT_NE(SyntheticPresetNames().find("small"), std::string::npos);
  const ModelConfig tiny = SyntheticPresetConfig("tiny");
  EXPECT_EQ(tiny.name, "synthetic:tiny");
  EXPECT_EQ(tiny.dim, 64);
  EXPECT_EQ(tiny.num_layers, 2);
  EXPECT_EQ(tiny.num_heads, 4);
  EXPECT_EQ(tiny.num_kv_heads, 2);
  EXPECT_EQ(tiny.head_dim, 16);
  EXPECT_EQ(tiny.ffn_dim, 128);
  EXPECT_EQ(tiny.vocab_size, 512);
  EXPECT_EQ(tiny.context_length, 4096);
  EXPECT_EQ(tiny.rope_theta, 10000.0);
  const ModelConfig smol = SyntheticPresetConfig("smol-135m");
  EXPECT_EQ(smol.dim, 576);
  EXPECT_EQ(smol.num_layers, 30);
  EXPECT_EQ(smol.num_heads, 9);
  EXPECT_EQ(smol.num_kv_heads, 3);
  EXPECT_EQ(smol.head_dim, 64);
  EXPECT_EQ(smol.ffn_dim, 1536);
  EXPECT_EQ(smol.vocab_size, 49152);
  EXPECT_EQ(smol.context_length, 8192);
  EXPECT_TRUE(smol.tied_embeddings);
  smol.Validate("smol");
  const ModelConfig small = SyntheticPresetConfig("small");
  EXPECT_EQ(small.dim, 256);
  EXPECT_EQ(small.num_layers, 4);
  EXPECT_EQ(small.num_heads, 8);
  EXPECT_EQ(small.num_kv_heads, 4);
  EXPECT_EQ(small.ffn_dim, 768);
  EXPECT_EQ(small.vocab_size, 4096);
  small.Validate("small");
  try {
    (void)SyntheticPresetConfig("huge");
    ADD_FAILURE() << "accepted an unknown preset";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'huge'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tiny"), std::string::npos) << msg;
    EXPECT_NE(msg.find("smol-135m"), std::string::npos) << msg;
  }
  EXPECT_THROW((void)MakeSyntheticModel("huge"), ConfigError);
}

TEST(SyntheticModelTest, DeterministicFromSeed) {
  const Model a = MakeSyntheticModel("tiny", 7);
  const Model b = MakeSyntheticModel("tiny", 7);
  const Model c = MakeSyntheticModel("tiny", 8);
  const int dim = a.config.dim;
  const std::vector<float> fa = Flatten(*a.weights, dim);
  ASSERT_EQ(fa.size(), Flatten(*b.weights, dim).size());
  EXPECT_EQ(fa, Flatten(*b.weights, dim));
  EXPECT_NE(fa, Flatten(*c.weights, dim));
  EXPECT_FALSE(SameFloats(Floats(a.weights->layers[1].w_down), Floats(c.weights->layers[1].w_down),
                          64 * 128));
  ASSERT_NE(a.tokenizer, nullptr);
  EXPECT_EQ(a.tokenizer->vocab_size(), 512);
  // Identical regardless of the thread count of the pool that fills it.
  const Model d = MakeSyntheticModel("tiny", 7, /*num_threads=*/1);
  const Model e = MakeSyntheticModel("tiny", 7, /*num_threads=*/3);
  EXPECT_EQ(fa, Flatten(*d.weights, dim));
  EXPECT_EQ(fa, Flatten(*e.weights, dim));
}

TEST(SyntheticModelTest, WeightStatistics) {
  const Model m = MakeSyntheticModel("small");
  const ModelConfig& c = m.config;
  const auto stats = [](const float* p, std::size_t n) {
    double sum = 0, sq = 0;
    for (std::size_t i = 0; i < n; ++i) {
      sum += p[i];
      sq += static_cast<double>(p[i]) * p[i];
    }
    const double mean = sum / static_cast<double>(n);
    return std::pair{mean, std::sqrt(sq / static_cast<double>(n) - mean * mean)};
  };
  const auto [emb_mean, emb_std] =
      stats(Floats(m.weights->token_embedding), static_cast<std::size_t>(c.vocab_size * c.dim));
  EXPECT_NEAR(emb_mean, 0.0, 0.01);
  EXPECT_NEAR(emb_std, 1.0, 0.01);
  const LayerWeights& l = m.weights->layers[0];
  const auto [qkv_mean, qkv_std] =
      stats(Floats(l.wqkv[0]), static_cast<std::size_t>(c.qkv_dim() * c.dim));
  EXPECT_NEAR(qkv_mean, 0.0, 0.002);
  EXPECT_NEAR(qkv_std, 1.0 / std::sqrt(c.dim), 0.002);
  const auto [down_mean, down_std] =
      stats(Floats(l.w_down), static_cast<std::size_t>(c.dim * c.ffn_dim));
  EXPECT_NEAR(down_std, 1.0 / std::sqrt(c.ffn_dim), 0.002);
  (void)down_mean;
  for (int i = 0; i < c.dim; ++i) {
    ASSERT_EQ(l.attn_norm[i], 1.0f);
    ASSERT_EQ(l.ffn_norm[i], 1.0f);
    ASSERT_EQ(m.weights->final_norm[i], 1.0f);
  }
}

// ---------------------------------------------------------------------------------------------
// GGUF export round trip

TEST(ExportGgufTest, F32RoundTripIsBitIdentical) {
  const Model m = MakeSyntheticModel("tiny", 99);
  const std::string path = TempPath("tiny_f32.gguf");
  ExportGguf(m, path, GgmlType::kF32);
  const Model r = LoadGgufModel(path);
  ExpectSameShape(r.config, m.config);
  EXPECT_EQ(r.config.context_length, m.config.context_length);
  EXPECT_FALSE(r.config.tied_embeddings);
  ExpectSameWeights(r, m);
  ASSERT_NE(r.tokenizer, nullptr);
  EXPECT_EQ(r.tokenizer->vocab_size(), 512);
  EXPECT_EQ(r.tokenizer->bos_id(), m.tokenizer->bos_id());
  EXPECT_EQ(r.tokenizer->eos_id(), m.tokenizer->eos_id());
  const std::string text = "hello world, a synthetic test";
  EXPECT_EQ(r.tokenizer->Encode(text, true), m.tokenizer->Encode(text, true));
}

TEST(ExportGgufTest, F16RoundTripWithinRounding) {
  const Model m = MakeSyntheticModel("tiny", 5);
  const std::string path = TempPath("tiny_f16.gguf");
  ExportGguf(m, path, GgmlType::kF16);
  const Model r = LoadGgufModel(path);
  ExpectSameShape(r.config, m.config);
  ExpectSameWeights(r, m, /*relative_f16=*/true);  // norms stay F32 and exact
  EXPECT_LT(std::filesystem::file_size(path), m.weights->WeightBytes() * 3 / 4);
}

TEST(ExportGgufTest, TiedEmbeddingsRoundTrip) {
  const Model src = MakeSyntheticModel("tiny", 3);
  Model tied;
  tied.config = src.config;
  tied.config.tied_embeddings = true;
  tied.weights = std::make_unique<ModelWeights>(tied.config);
  // The source's weights, without its output matrix (the tied layout does not have one).
  ModelWeights& t = *tied.weights;
  const ModelWeights& s = *src.weights;
  const auto copy = [&t](const quant::WeightMatrix& to, const quant::WeightMatrix& from) {
    std::memcpy(t.MutableFloats(to), from.data, from.Bytes());
  };
  const auto dim = static_cast<std::size_t>(src.config.dim);
  copy(t.token_embedding, s.token_embedding);
  for (std::size_t l = 0; l < t.layers.size(); ++l) {
    copy(t.layers[l].wqkv[0], s.layers[l].wqkv[0]);
    copy(t.layers[l].wo, s.layers[l].wo);
    copy(t.layers[l].w_gate_up[0], s.layers[l].w_gate_up[0]);
    copy(t.layers[l].w_down, s.layers[l].w_down);
    std::memcpy(t.layers[l].attn_norm, s.layers[l].attn_norm, dim * sizeof(float));
    std::memcpy(t.layers[l].ffn_norm, s.layers[l].ffn_norm, dim * sizeof(float));
  }
  std::memcpy(t.final_norm, s.final_norm, dim * sizeof(float));
  const std::string path = TempPath("tiny_tied.gguf");
  ExportGguf(tied, path, GgmlType::kF32);
  const Model r = LoadGgufModel(path);
  EXPECT_TRUE(r.config.tied_embeddings);
  EXPECT_EQ(r.weights->output.data, r.weights->token_embedding.data);
  ExpectSameWeights(r, tied);
}

// The exporter writes the loader's one tensor list: same names, shapes and order, each tensor from
// the part of the weights the list names (the F32 round trip above checks the values).
TEST(ExportGgufTest, WritesTheRequiredTensorsInTheirOrder) {
  const Model m = MakeSyntheticModel("tiny", 7);
  const std::string path = TempPath("tiny_q8.gguf");
  const std::vector<ExportedTensor> table =
      ExportGguf(m, path, ExportTypes{GgmlType::kQ8_0, GgmlType::kQ8_0, 7});
  const std::vector<internal::TensorSpec> specs = internal::RequiredTensors(m.config);
  const MappedFile file(path);
  const GgufFile g(file.bytes(), path);
  ASSERT_EQ(table.size(), specs.size());
  ASSERT_EQ(g.tensors().size(), specs.size());
  for (std::size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(table[i].name, specs[i].name);
    EXPECT_EQ(table[i].shape, specs[i].shape);
    EXPECT_EQ(g.tensors()[i].name, specs[i].name);
    EXPECT_EQ(table[i].type == GgmlType::kF32, !specs[i].matrix) << specs[i].name;
  }
}

TEST(GgufTensorsTest, ListsEveryPartOnceALayer) {
  ModelConfig c = MakeSyntheticModel("tiny").config;
  c.has_qkv_bias = true;
  c.tied_embeddings = true;
  const std::vector<internal::TensorSpec> specs = internal::RequiredTensors(c);
  // token_embd and output_norm (tied: no output), then 12 tensors a layer with the biases.
  ASSERT_EQ(specs.size(), 2 + 12 * static_cast<std::size_t>(c.num_layers));
  EXPECT_EQ(specs[0].part, internal::TensorPart::kTokenEmbedding);
  EXPECT_EQ(specs[1].part, internal::TensorPart::kOutputNorm);
  for (std::size_t i = 2; i < specs.size(); ++i) {
    const auto layer = static_cast<int>((i - 2) / 12);
    EXPECT_EQ(specs[i].layer, layer) << specs[i].name;
    EXPECT_TRUE(specs[i].name.starts_with("blk." + std::to_string(layer) + ".")) << specs[i].name;
  }
  EXPECT_EQ(specs[6].name, "blk.0.attn_q.bias");
  EXPECT_EQ(specs[6].shape, std::vector<std::uint64_t>{static_cast<std::uint64_t>(c.q_dim())});
  EXPECT_FALSE(specs[6].matrix);
}

TEST(ExportGgufTest, RejectsUnsupportedRequests) {
  const Model m = MakeSyntheticModel("tiny");
  EXPECT_THROW(ExportGguf(m, "/nonexistent-dir/x.gguf", GgmlType::kF32), LoadError);
  Model renamed;
  renamed.config = m.config;
  renamed.config.name = "something.bin";
  renamed.weights = std::make_unique<ModelWeights>(renamed.config);
  EXPECT_THROW(ExportGguf(renamed, TempPath("r.gguf"), GgmlType::kF32), ConfigError);
}

}  // namespace
}  // namespace metronome::model
