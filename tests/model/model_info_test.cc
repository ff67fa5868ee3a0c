// DescribeModel / LoadTokenizer: a GGUF is described from its header alone (types the engine
// cannot compute with and architectures it cannot run are still listed, by ggml's names), and
// the other sources as the engine holds them; facts are checked against independent counts.
#include "metronome/model/model_info.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "metronome/model/gguf.h"
#include "metronome/model/model.h"
#include "metronome/model/model_config_json.h"

namespace metronome::model {
namespace {

using Bytes = std::vector<std::uint8_t>;

// A scratch file removed at scope exit.
class TempFile {
 public:
  explicit TempFile(const std::string& name)
      : path_((std::filesystem::temp_directory_path() /
               (name + "." + std::to_string(::testing::UnitTest::GetInstance()->random_seed())))
                  .string()) {}
  ~TempFile() { std::filesystem::remove(path_); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Rewrites the type id of tensor `name` (n_dims dims) in a serialized GGUF.
void SetTensorType(Bytes& buf, const std::string& name, std::uint32_t n_dims, std::uint32_t type) {
  const auto it = std::search(buf.begin(), buf.end(), name.begin(), name.end());
  ASSERT_NE(it, buf.end());
  const auto at = static_cast<std::size_t>(it - buf.begin()) + name.size() + 4 + 8 * n_dims;
  std::memcpy(buf.data() + at, &type, sizeof(type));
}

TEST(ModelInfoTest, ListsTypesTheEngineCannotComputeAndArchitecturesItCannotRun) {
  GgufWriter w;
  w.SetString("general.architecture", "gemma3");
  const std::vector<float> zeros(512, 0.0f);
  w.AddTensor("weights", {256, 2}, GgmlType::kF32, zeros);
  w.AddTensor("norm", {256}, GgmlType::kF32, std::span<const float>(zeros.data(), 256));
  Bytes buf = w.Serialize();
  SetTensorType(buf, "weights", 2, static_cast<std::uint32_t>(GgmlType::kQ4_K));
  SetTensorType(buf, "norm", 1, static_cast<std::uint32_t>(GgmlType::kIQ2_XXS));
  const TempFile file("metronome_info_test.gguf");
  std::ofstream(file.path(), std::ios::binary)
      .write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(buf.size()));

  const ModelInfo info = DescribeModel(file.path());
  EXPECT_EQ(info.format, ModelFormat::kGguf);
  EXPECT_EQ(info.gguf_version, 3u);
  EXPECT_EQ(info.architecture, "gemma3");
  EXPECT_FALSE(info.config.has_value());
  EXPECT_NE(info.config_error.find("unsupported architecture 'gemma3'"), std::string::npos)
      << info.config_error;
  ASSERT_EQ(info.tensors.size(), 2u);
  EXPECT_EQ(info.tensors[0].name, "weights");
  EXPECT_EQ(info.tensors[0].type, GgmlType::kQ4_K);
  EXPECT_EQ(info.tensors[0].shape, (std::vector<std::uint64_t>{256, 2}));
  EXPECT_EQ(info.tensors[0].bytes, 2u * 144u);  // two Q4_K super-blocks of 144 bytes
  EXPECT_EQ(info.tensors[1].type, GgmlType::kIQ2_XXS);
  EXPECT_EQ(info.tensors[1].bytes, 66u);  // one IQ2_XXS block of 256 elements
  EXPECT_EQ(info.tensor_bytes, 2u * 144u + 66u);
  EXPECT_EQ(info.tokenizer_kind, "none");
  ASSERT_EQ(info.special_tokens.size(), 4u);
  for (const SpecialToken& t : info.special_tokens) EXPECT_EQ(t.id, -1) << t.role;
}

std::uint64_t ExpectedParameters(const ModelConfig& c) {
  const auto dim = static_cast<std::uint64_t>(c.dim);
  const auto per_layer = 2 * dim + dim * static_cast<std::uint64_t>(c.qkv_dim()) +
                         static_cast<std::uint64_t>(c.q_dim()) * dim +
                         3 * dim * static_cast<std::uint64_t>(c.ffn_dim) +
                         (c.has_qkv_bias ? static_cast<std::uint64_t>(c.qkv_dim()) : 0);
  return dim * static_cast<std::uint64_t>(c.vocab_size) * (c.tied_embeddings ? 1 : 2) + dim +
         per_layer * static_cast<std::uint64_t>(c.num_layers);
}

TEST(ModelInfoTest, SyntheticModelIsDescribedAsTheEngineHoldsIt) {
  const ModelInfo info = DescribeModel("synthetic:tiny");
  EXPECT_EQ(info.format, ModelFormat::kSynthetic);
  ASSERT_TRUE(info.config.has_value());
  const ModelConfig& c = *info.config;
  EXPECT_EQ(info.tensor_bytes, ExpectedParameters(c) * 4);
  EXPECT_EQ(info.tensors.size(), (c.tied_embeddings ? 2u : 3u) + 9u * c.num_layers);
  for (const TensorSummary& t : info.tensors) EXPECT_EQ(t.type, GgmlType::kF32) << t.name;
  EXPECT_EQ(info.tokenizer_kind, "sentencepiece");
  EXPECT_EQ(info.vocab_size, c.vocab_size);
  EXPECT_TRUE(info.adds_bos);
  ASSERT_EQ(info.special_tokens.size(), 4u);
  EXPECT_EQ(info.special_tokens[0].role, "bos");
  EXPECT_EQ(info.special_tokens[0].piece, "<s>");
  EXPECT_EQ(info.special_tokens[1].piece, "</s>");
  EXPECT_EQ(info.special_tokens[2].piece, "<unk>");
  EXPECT_EQ(info.special_tokens[3].id, -1);
}

TEST(ModelInfoTest, ExportedGgufKeepsShapesVocabularyAndStoredTypes) {
  const Model m = LoadModel("synthetic:tiny");
  const TempFile file("metronome_info_export.gguf");
  ExportGguf(m, file.path(), GgmlType::kF16);
  const ModelInfo from_file = DescribeModel(file.path());
  const ModelInfo from_memory = DescribeModel("synthetic:tiny");
  ASSERT_TRUE(from_file.config.has_value());
  EXPECT_EQ(from_file.architecture, "llama");
  EXPECT_EQ(from_file.config->dim, from_memory.config->dim);
  EXPECT_EQ(from_file.config->num_layers, from_memory.config->num_layers);
  ASSERT_EQ(from_file.tensors.size(), from_memory.tensors.size());
  std::uint64_t sum = 0;
  for (const TensorSummary& t : from_file.tensors) {
    sum += t.bytes;
    // Matrices were written as F16, norms stay F32.
    EXPECT_EQ(t.type, t.shape.size() == 2 ? GgmlType::kF16 : GgmlType::kF32) << t.name;
  }
  EXPECT_EQ(sum, from_file.tensor_bytes);
  EXPECT_LT(from_file.tensor_bytes, std::filesystem::file_size(file.path()));
  EXPECT_EQ(from_file.vocab_size, from_memory.vocab_size);
  EXPECT_EQ(from_file.tokenizer_kind, "sentencepiece");
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(from_file.special_tokens[i].id, from_memory.special_tokens[i].id);
    EXPECT_EQ(from_file.special_tokens[i].piece, from_memory.special_tokens[i].piece);
  }
  // The tokenizer alone, without weights, encodes like the model's.
  const auto tokenizer = LoadTokenizer(file.path());
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->Encode("hello world", true), m.tokenizer->Encode("hello world", true));
}

// The plain hyper-parameters go to JSON under their field names with their values; the ones
// whose spelling is the caller's (rope_dim, rope_style, has_qkv_bias) and the free text stay out.
TEST(ModelConfigJsonTest, NamesThePlainFields) {
  const ModelConfig c = MakeSyntheticModel("tiny").config;
  const nlohmann::json j = c;
  EXPECT_EQ(j.size(), 15u);
  EXPECT_EQ(j.at("dim"), c.dim);
  EXPECT_EQ(j.at("num_kv_heads"), c.num_kv_heads);
  EXPECT_EQ(j.at("context_length"), c.context_length);
  EXPECT_EQ(j.at("rms_eps").get<float>(), c.rms_eps);
  EXPECT_EQ(j.at("rope_theta"), c.rope_theta);
  EXPECT_EQ(j.at("tied_embeddings"), c.tied_embeddings);
  EXPECT_EQ(j.at("num_experts"), 0);
  EXPECT_EQ(j.at("has_qk_norm"), false);
  EXPECT_FALSE(j.contains("rope_dim"));
  EXPECT_FALSE(j.contains("name"));
}

// What `metronome info` shows for the rope variants and for a file the engine refuses.
TEST(ModelInfoTest, ExportedRopeVariantsRoundTripAndRefusalsAreListed) {
  Model m = MakeSyntheticModel("tiny");
  m.config.rope_theta = 500000.0;
  m.config.rope_freq_factors =
      Llama3RopeFreqFactors(m.config.rope_theta, m.config.rotary_dim(), 8.0, 1.0, 4.0, 8192.0);
  m.config.rope_scaling = RopeScaling::kYarn;
  m.config.rope_scaling_factor = 4.0;
  m.config.rope_original_context = 512;
  const TempFile file("metronome_info_rope.gguf");
  ExportGguf(m, file.path(), GgmlType::kF32);
  const ModelInfo info = DescribeModel(file.path());
  ASSERT_TRUE(info.config) << info.config_error;
  EXPECT_TRUE(info.unsupported.empty());
  EXPECT_EQ(info.config->rope_freq_factors, m.config.rope_freq_factors);
  EXPECT_EQ(info.config->rope_scaling, RopeScaling::kYarn);
  EXPECT_EQ(info.config->rope_scaling_factor, 4.0);
  EXPECT_EQ(info.config->yarn_original_context(), 512);
}

TEST(ModelInfoTest, ListsWhatTheEngineWouldRefuseNamingEachKeyAndTensor) {
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.SetUint32("llama.embedding_length", 8);
  w.SetUint32("llama.block_count", 1);
  w.SetUint32("llama.feed_forward_length", 16);
  w.SetUint32("llama.attention.head_count", 2);
  w.SetUint32("llama.context_length", 64);
  w.SetFloat32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.SetFloat32("llama.attn_logit_softcapping", 50.0f);
  const std::vector<float> zeros(48, 0.0f);
  w.AddTensor("token_embd.weight", {8, 6}, GgmlType::kF32, zeros);
  w.AddTensor("blk.0.attn_sinks.weight", {2}, GgmlType::kF32,
              std::span<const float>(zeros.data(), 2));
  const TempFile file("metronome_info_refused.gguf");
  w.Write(file.path());
  const ModelInfo info = DescribeModel(file.path());
  ASSERT_TRUE(info.config) << info.config_error;
  ASSERT_EQ(info.unsupported.size(), 2U);
  EXPECT_NE(info.unsupported[0].find("'llama.attn_logit_softcapping'"), std::string::npos);
  EXPECT_NE(info.unsupported[1].find("'blk.0.attn_sinks.weight'"), std::string::npos);
}

// CheckWeights decodes every tensor in its stored type and names each one holding a NaN or an
// infinity, with the count and the first element's index; a NaN hidden in a quantised block's
// scale counts every element of the block. Types without a decoder are listed, not guessed at.
TEST(ModelInfoTest, CheckWeightsNamesEveryTensorHoldingNonFiniteValues) {
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  std::vector<float> values(512, 0.5f);
  w.AddTensor("clean", {256, 2}, GgmlType::kF32, values);
  values[300] = std::numeric_limits<float>::quiet_NaN();
  values[301] = -std::numeric_limits<float>::infinity();
  values[511] = std::numeric_limits<float>::quiet_NaN();
  w.AddTensor("nan_f32", {256, 2}, GgmlType::kF32, values);
  w.AddTensor("inf_f16", {256, 2}, GgmlType::kF16, values);
  // Q8_0: 3 blocks of 32; the second block's fp16 scale is NaN (0x7e00).
  Bytes q8(3 * 34, 0);
  for (int b = 0; b < 3; ++b) {
    const std::uint16_t d = b == 1 ? 0x7e00 : 0x3c00;  // NaN, 1.0
    std::memcpy(q8.data() + b * 34, &d, sizeof d);
  }
  w.AddEncodedTensor("nan_scale_q8", {96}, GgmlType::kQ8_0, q8);
  w.AddTensor("opaque", {256}, GgmlType::kF32, std::span<const float>(values.data(), 256));
  Bytes buf = w.Serialize();
  SetTensorType(buf, "opaque", 1, static_cast<std::uint32_t>(GgmlType::kIQ2_XXS));
  const TempFile file("metronome_check_weights_test.gguf");
  std::ofstream(file.path(), std::ios::binary)
      .write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(buf.size()));

  const WeightCheck check = CheckWeights(file.path());
  EXPECT_EQ(check.tensors_checked, 4u);
  EXPECT_EQ(check.elements_checked, 512u * 3 + 96u);
  EXPECT_EQ(check.unchecked, (std::vector<std::string>{"opaque (IQ2_XXS)"}));
  ASSERT_EQ(check.non_finite.size(), 3u);
  EXPECT_EQ(check.non_finite[0].name, "nan_f32");
  EXPECT_EQ(check.non_finite[0].count, 3u);
  EXPECT_EQ(check.non_finite[0].first_index, 300u);
  EXPECT_EQ(check.non_finite[1].name, "inf_f16");
  EXPECT_EQ(check.non_finite[1].count, 3u);
  EXPECT_EQ(check.non_finite[1].first_index, 300u);
  EXPECT_EQ(check.non_finite[2].name, "nan_scale_q8");
  EXPECT_EQ(check.non_finite[2].count, 32u);
  EXPECT_EQ(check.non_finite[2].first_index, 32u);

  // The tensors' data offsets point at their bytes in the file.
  const ModelInfo info = DescribeModel(file.path());
  ASSERT_EQ(info.tensors.size(), 5u);
  float first = 0.0f;
  std::memcpy(&first, buf.data() + info.tensors[1].file_offset + 300 * sizeof(float), sizeof first);
  EXPECT_TRUE(std::isnan(first));
}

TEST(ModelInfoTest, CheckWeightsFindsNothingInASyntheticModel) {
  const WeightCheck check = CheckWeights("synthetic:tiny");
  EXPECT_TRUE(check.non_finite.empty());
  EXPECT_TRUE(check.unchecked.empty());
  EXPECT_GT(check.tensors_checked, 0u);
  const Model m = LoadModel("synthetic:tiny");
  EXPECT_GE(check.elements_checked, static_cast<std::uint64_t>(m.config.vocab_size) *
                                        static_cast<std::uint64_t>(m.config.dim));
}

}  // namespace
}  // namespace metronome::model
