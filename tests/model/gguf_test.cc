// GGUF parser, dequantisation and model-loader tests. Hostile inputs are built by writing a valid
// file with GgufWriter and then damaging specific bytes; every damaged file must be rejected with
// a LoadError (never a crash, a hang or a giant allocation).
#include "metronome/model/gguf.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "metronome/base/errors.h"
#include "metronome/model/internal/gguf_loader.h"
#include "metronome/model/internal/gguf_schema.h"
#include "metronome/model/model.h"
#include "metronome/quant/codec.h"
#include "metronome/quant/row_layout.h"

namespace metronome::model {
namespace {

using Bytes = std::vector<std::uint8_t>;

// Position of the first occurrence of `s` in `buf`; fails the test when absent.
std::size_t FindBytes(const Bytes& buf, const std::string& s) {
  for (std::size_t i = 0; i + s.size() <= buf.size(); ++i) {
    if (std::memcmp(buf.data() + i, s.data(), s.size()) == 0) return i;
  }
  ADD_FAILURE() << "'" << s << "' not found";
  return 0;
}

template <typename T>
void Poke(Bytes& buf, std::size_t pos, T v) {
  ASSERT_LE(pos + sizeof(T), buf.size());
  std::memcpy(buf.data() + pos, &v, sizeof(T));
}

// Offset of a tensor info's fields, located by the tensor's name (which must appear only there).
struct TensorInfoPos {
  std::size_t n_dims, dims, type, offset;
};
TensorInfoPos LocateTensorInfo(const Bytes& buf, const std::string& name, std::uint32_t n_dims) {
  const std::size_t at = FindBytes(buf, name) + name.size();
  return {at, at + 4, at + 4 + 8 * n_dims, at + 4 + 8 * n_dims + 4};
}

std::string ErrorOf(const Bytes& buf) {
  try {
    const GgufFile f(buf, "test.gguf");
  } catch (const LoadError& e) {
    return e.what();
  }
  return "";
}

// Expects a LoadError whose message starts with the source and contains `needle`.
void ExpectRejected(const Bytes& buf, const std::string& needle) {
  const std::string msg = ErrorOf(buf);
  ASSERT_FALSE(msg.empty()) << "accepted a damaged file (wanted: " << needle << ")";
  EXPECT_EQ(msg.rfind("test.gguf: ", 0), 0u) << msg;
  EXPECT_NE(msg.find(needle), std::string::npos) << msg;
}

std::vector<float> Ramp(std::size_t n, float start, float step) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = start + step * static_cast<float>(i);
  return v;
}

// A small llama/qwen2 file whose tensor values are remembered for comparison.
struct TinySpec {
  std::string arch = "llama";
  int dim = 8, layers = 1, heads = 2, kv_heads = 1, ffn = 16, vocab = 6;
  bool tied = false;
  bool bias = false;     // write qwen2 attn_{q,k,v}.bias
  bool qk_norm = false;  // write qwen3 attn_{q,k}_norm
  int head_dim = 0;      // > 0: written as key_length / value_length (else dim / heads)
  int experts = 0, experts_used = 0, expert_ffn = 0;  // qwen3moe: 3-D expert tensors, no ffn_*
  GgmlType matrix_type = GgmlType::kF32;
  std::string skip_tensor;
  // Written as these raw bytes of this type instead (hostile-file tests).
  std::string raw_tensor;
  GgmlType raw_type = GgmlType::kF32;
  std::vector<std::uint8_t> raw_bytes;
};

struct TinyFile {
  GgufWriter writer;
  std::map<std::string, std::vector<float>> values;
};

TinyFile BuildTiny(const TinySpec& s) {
  TinyFile f;
  GgufWriter& w = f.writer;
  const std::string a = s.arch;
  w.SetString("general.architecture", a);
  w.SetUint32(a + ".embedding_length", static_cast<std::uint32_t>(s.dim));
  w.SetUint32(a + ".block_count", static_cast<std::uint32_t>(s.layers));
  w.SetUint32(a + ".feed_forward_length", static_cast<std::uint32_t>(s.ffn));
  w.SetUint32(a + ".attention.head_count", static_cast<std::uint32_t>(s.heads));
  w.SetUint32(a + ".attention.head_count_kv", static_cast<std::uint32_t>(s.kv_heads));
  w.SetUint32(a + ".context_length", 64);
  w.SetFloat32(a + ".attention.layer_norm_rms_epsilon", 1e-6f);
  w.SetFloat32(a + ".rope.freq_base", 500000.0f);
  const auto dim = static_cast<std::uint64_t>(s.dim);
  const auto hd = s.head_dim > 0 ? static_cast<std::uint64_t>(s.head_dim)
                                 : dim / static_cast<std::uint64_t>(s.heads);
  const auto q = hd * static_cast<std::uint64_t>(s.heads);
  const auto kv = hd * static_cast<std::uint64_t>(s.kv_heads);
  if (s.head_dim > 0) {
    w.SetUint32(a + ".attention.key_length", static_cast<std::uint32_t>(s.head_dim));
    w.SetUint32(a + ".attention.value_length", static_cast<std::uint32_t>(s.head_dim));
  }
  const auto experts = static_cast<std::uint64_t>(s.experts);
  const auto ffn_exp = static_cast<std::uint64_t>(s.expert_ffn);
  if (s.experts > 0) {
    w.SetUint32(a + ".expert_count", static_cast<std::uint32_t>(s.experts));
    w.SetUint32(a + ".expert_used_count", static_cast<std::uint32_t>(s.experts_used));
    w.SetUint32(a + ".expert_feed_forward_length", static_cast<std::uint32_t>(s.expert_ffn));
  }
  const auto ffn = static_cast<std::uint64_t>(s.ffn);
  const auto vocab = static_cast<std::uint64_t>(s.vocab);
  float start = 0.0f;
  const auto add = [&](const std::string& name, std::vector<std::uint64_t> shape, GgmlType type) {
    if (name == s.skip_tensor) return;
    if (name == s.raw_tensor) {
      w.AddEncodedTensor(name, shape, s.raw_type, s.raw_bytes);
      return;
    }
    std::uint64_t n = 1;
    for (auto d : shape) n *= d;
    // Small exact binary fractions: representable in F16 and distinct per tensor.
    start += 1.0f;
    auto v = Ramp(n, start, 1.0f / 1024.0f);
    w.AddTensor(name, shape, type, v);
    f.values[name] = std::move(v);
  };
  add("token_embd.weight", {dim, vocab}, s.matrix_type);
  add("output_norm.weight", {dim}, GgmlType::kF32);
  if (!s.tied) add("output.weight", {dim, vocab}, s.matrix_type);
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", {dim}, GgmlType::kF32);
    add(p + "attn_q.weight", {dim, q}, s.matrix_type);
    add(p + "attn_k.weight", {dim, kv}, s.matrix_type);
    add(p + "attn_v.weight", {dim, kv}, s.matrix_type);
    if (s.bias) {
      add(p + "attn_q.bias", {dim}, GgmlType::kF32);
      add(p + "attn_k.bias", {kv}, GgmlType::kF32);
      add(p + "attn_v.bias", {kv}, GgmlType::kF32);
    }
    if (s.qk_norm) {
      add(p + "attn_q_norm.weight", {hd}, GgmlType::kF32);
      add(p + "attn_k_norm.weight", {hd}, GgmlType::kF32);
    }
    add(p + "attn_output.weight", {q, dim}, s.matrix_type);
    add(p + "ffn_norm.weight", {dim}, GgmlType::kF32);
    if (s.experts > 0) {
      add(p + "ffn_gate_inp.weight", {dim, experts}, GgmlType::kF32);
      add(p + "ffn_gate_exps.weight", {dim, ffn_exp, experts}, s.matrix_type);
      add(p + "ffn_up_exps.weight", {dim, ffn_exp, experts}, s.matrix_type);
      add(p + "ffn_down_exps.weight", {ffn_exp, dim, experts}, s.matrix_type);
      continue;
    }
    add(p + "ffn_gate.weight", {dim, ffn}, s.matrix_type);
    add(p + "ffn_up.weight", {dim, ffn}, s.matrix_type);
    add(p + "ffn_down.weight", {ffn, dim}, s.matrix_type);
  }
  return f;
}

Bytes MinimalFile() {
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.SetStringArray("test.strings", {"alpha", "beta"});
  w.AddTensor("weights", {4, 2}, GgmlType::kF32, Ramp(8, 0.0f, 0.5f));
  return w.Serialize();
}

std::string TempPath(const std::string& name) {
  return (std::filesystem::path(::testing::TempDir()) / name).string();
}

std::string LoadErrorOf(const Bytes& buf) {
  try {
    (void)internal::LoadGgufModelFromBytes(buf, "model.gguf");
  } catch (const LoadError& e) {
    return e.what();
  }
  return "";
}

// ---------------------------------------------------------------------------------------------
// Parser: valid files

TEST(GgufFileTest, RoundTripsMetadataAndTensors) {
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.SetUint32("a.u32", 4000000000u);
  w.SetFloat32("a.f32", 0.25f);
  w.SetStringArray("a.strings", {"x", "", "\xe2\x96\x81hello"});
  w.SetFloat32Array("a.floats", {1.5f, -2.0f});
  w.SetInt32Array("a.ints", {-1, 7});
  w.SetUint32("a.replaced", 1);
  w.SetUint32("a.replaced", 2);  // setting a key again replaces it
  w.AddTensor("t.f32", {3, 2}, GgmlType::kF32, Ramp(6, -1.0f, 0.5f));
  w.AddTensor("t.f16", {5}, GgmlType::kF16, Ramp(5, 0.0f, 0.25f));
  w.AddTensor("t.bf16", {2, 1, 1, 2}, GgmlType::kBF16, Ramp(4, 1.0f, 1.0f));
  w.AddTensor("t.q8", {64}, GgmlType::kQ8_0, Ramp(64, -32.0f, 1.0f));
  const Bytes buf = w.Serialize();

  const GgufFile f(buf, "rt.gguf");
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.source(), "rt.gguf");
  EXPECT_EQ(f.metadata().size(), 7u);
  EXPECT_EQ(f.RequireString("general.architecture"), "llama");
  EXPECT_EQ(f.RequireInt("a.u32"), 4000000000LL);
  EXPECT_EQ(f.GetFloat("a.f32"), 0.25);
  EXPECT_EQ(f.GetInt("a.replaced"), 2);
  EXPECT_EQ(f.GetInt("a.absent"), std::nullopt);
  EXPECT_EQ(std::get<std::vector<std::string>>(*f.Find("a.strings")),
            (std::vector<std::string>{"x", "", "\xe2\x96\x81hello"}));
  EXPECT_EQ(std::get<std::vector<double>>(*f.Find("a.floats")), (std::vector<double>{1.5, -2.0}));
  EXPECT_EQ(std::get<std::vector<std::int64_t>>(*f.Find("a.ints")),
            (std::vector<std::int64_t>{-1, 7}));

  ASSERT_EQ(f.tensors().size(), 4u);
  const GgufTensorInfo* t = f.FindTensor("t.f32");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->shape, (std::vector<std::uint64_t>{3, 2}));
  EXPECT_EQ(t->num_elements(), 6u);
  EXPECT_EQ(t->data.size(), 24u);
  std::vector<float> out(6);
  DequantizeToF32(t->type, t->data, 6, out.data());
  EXPECT_EQ(out, Ramp(6, -1.0f, 0.5f));

  t = f.FindTensor("t.f16");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->type, GgmlType::kF16);
  out.resize(5);
  DequantizeToF32(t->type, t->data, 5, out.data());
  EXPECT_EQ(out, Ramp(5, 0.0f, 0.25f));

  t = f.FindTensor("t.bf16");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->shape, (std::vector<std::uint64_t>{2, 1, 1, 2}));
  out.resize(4);
  DequantizeToF32(t->type, t->data, 4, out.data());
  EXPECT_EQ(out, Ramp(4, 1.0f, 1.0f));

  t = f.FindTensor("t.q8");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->data.size(), 2u * 34u);
  out.resize(64);
  DequantizeToF32(t->type, t->data, 64, out.data());
  const auto expected = Ramp(64, -32.0f, 1.0f);
  for (std::size_t i = 0; i < 64; ++i) {
    EXPECT_NEAR(out[i], expected[i], 32.0f / 127.0f) << i;  // within one quantisation step
  }
  EXPECT_EQ(f.FindTensor("absent"), nullptr);

  // Tensor data is aligned to the default 32 bytes.
  for (const auto& ti : f.tensors()) {
    EXPECT_EQ(ti.offset % 32, 0u) << ti.name;
    EXPECT_EQ((ti.data.data() - buf.data()) % 32, 0) << ti.name;
  }
}

TEST(GgufFileTest, TypedAccessorsRejectWrongTypes) {
  const Bytes buf = MinimalFile();
  const GgufFile f(buf, "acc.gguf");
  EXPECT_THROW((void)f.RequireInt("general.architecture"), LoadError);
  EXPECT_THROW((void)f.GetFloat("test.strings"), LoadError);
  EXPECT_THROW((void)f.RequireString("test.strings"), LoadError);
  try {
    (void)f.RequireInt("llama.block_count");
    ADD_FAILURE() << "missing key accepted";
  } catch (const LoadError& e) {
    EXPECT_NE(std::string(e.what()).find("acc.gguf: missing metadata key 'llama.block_count'"),
              std::string::npos)
        << e.what();
  }
}

TEST(GgufFileTest, AcceptsVersion2) {
  Bytes buf = MinimalFile();
  Poke<std::uint32_t>(buf, 4, 2);
  const GgufFile f(buf, "v2.gguf");
  EXPECT_EQ(f.version(), 2u);
  EXPECT_EQ(f.tensors().size(), 1u);
}

TEST(GgufFileTest, HonoursGeneralAlignment) {
  GgufWriter w;
  w.SetUint32("general.alignment", 64);
  w.AddTensor("a", {3}, GgmlType::kF32, Ramp(3, 0.0f, 1.0f));
  w.AddTensor("b", {5}, GgmlType::kF32, Ramp(5, 0.0f, 1.0f));
  const Bytes buf = w.Serialize();
  const GgufFile f(buf, "align.gguf");
  EXPECT_EQ(f.FindTensor("b")->offset, 64u);
  for (const auto& t : f.tensors()) EXPECT_EQ((t.data.data() - buf.data()) % 64, 0) << t.name;
}

TEST(GgufFileTest, EmptyFileWithoutTensorsParses) {
  GgufWriter w;
  const GgufFile f(w.Serialize(), "empty.gguf");
  EXPECT_TRUE(f.metadata().empty());
  EXPECT_TRUE(f.tensors().empty());
}

// ---------------------------------------------------------------------------------------------
// Parser: hostile files

TEST(GgufFileTest, RejectsWrongMagic) {
  Bytes buf = MinimalFile();
  buf[0] = 'X';
  ExpectRejected(buf, "not a GGUF file");
  ExpectRejected(Bytes{}, "truncated");
  ExpectRejected(Bytes{'G', 'G'}, "truncated");
}

TEST(GgufFileTest, RejectsUnsupportedVersions) {
  for (std::uint32_t v : {0u, 1u, 4u, 0xffffffffu}) {
    Bytes buf = MinimalFile();
    Poke(buf, 4, v);
    ExpectRejected(buf, "unsupported GGUF version " + std::to_string(v));
  }
}

TEST(GgufFileTest, RejectsEveryTruncation) {
  TinySpec spec;
  spec.layers = 2;
  const Bytes buf = BuildTiny(spec).writer.Serialize();
  const GgufFile intact(buf, "intact.gguf");
  std::size_t data_end = 0;
  for (const auto& t : intact.tensors()) {
    data_end = std::max<std::size_t>(data_end, t.data.data() + t.data.size() - buf.data());
  }
  ASSERT_GT(data_end, 1000u);
  int rejected = 0;
  for (std::size_t cut = 0; cut < data_end; ++cut) {
    const Bytes part(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(cut));
    EXPECT_FALSE(ErrorOf(part).empty()) << "accepted truncation at " << cut;
    EXPECT_FALSE(LoadErrorOf(part).empty()) << "model accepted truncation at " << cut;
    ++rejected;
  }
  EXPECT_EQ(rejected, static_cast<int>(data_end));
  // Only trailing padding after the last tensor may be dropped.
  const Bytes padless(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(data_end));
  EXPECT_TRUE(ErrorOf(padless).empty());
}

TEST(GgufFileTest, RejectsHugeCounts) {
  {
    Bytes buf = MinimalFile();
    Poke<std::uint64_t>(buf, 8, std::uint64_t{1} << 60);
    ExpectRejected(buf, "tensor count 1152921504606846976");
  }
  {
    Bytes buf = MinimalFile();
    Poke<std::uint64_t>(buf, 16, ~std::uint64_t{0});
    ExpectRejected(buf, "metadata count");
  }
  {
    // Count just above what the file can hold: bounded before any allocation.
    Bytes buf = MinimalFile();
    Poke<std::uint64_t>(buf, 16, buf.size());
    ExpectRejected(buf, "metadata count");
  }
}

TEST(GgufFileTest, RejectsHugeStringLengths) {
  {
    Bytes buf = MinimalFile();
    Poke<std::uint64_t>(buf, 24, std::uint64_t{1} << 62);  // length of the first key
    ExpectRejected(buf, "string length 4611686018427387904");
  }
  {
    Bytes buf = MinimalFile();
    // "general.architecture" value string: its length sits after the key and the value type.
    const std::size_t at = FindBytes(buf, "general.architecture") + 20 + 4;
    Poke<std::uint64_t>(buf, at, 1000000);
    ExpectRejected(buf, "'general.architecture'");
  }
  {
    Bytes buf = MinimalFile();
    const std::size_t at = FindBytes(buf, "alpha") - 8;
    Poke<std::uint64_t>(buf, at, ~std::uint64_t{0});
    ExpectRejected(buf, "'test.strings'");
  }
  {
    Bytes buf = MinimalFile();
    const std::size_t at = FindBytes(buf, "weights") - 8;  // tensor name length
    Poke<std::uint64_t>(buf, at, std::uint64_t{1} << 40);
    ExpectRejected(buf, "string length");
  }
}

TEST(GgufFileTest, RejectsHugeArrayCount) {
  Bytes buf = MinimalFile();
  // key, value type (array), element type (string), count.
  const std::size_t count_at = FindBytes(buf, "test.strings") + 12 + 4 + 4;
  for (std::uint64_t count : {std::uint64_t{1} << 61, std::uint64_t{1000000}}) {
    Bytes b = buf;
    Poke(b, count_at, count);
    ExpectRejected(b, "'test.strings' has array count " + std::to_string(count));
  }
}

TEST(GgufFileTest, RejectsUnknownAndNestedValueTypes) {
  const Bytes buf = MinimalFile();
  const std::size_t type_at = FindBytes(buf, "test.strings") + 12;
  {
    Bytes b = buf;
    Poke<std::uint32_t>(b, type_at, 13);
    ExpectRejected(b, "'test.strings' has unknown value type 13");
  }
  {
    Bytes b = buf;
    Poke<std::uint32_t>(b, type_at + 4, 9);  // array of arrays
    ExpectRejected(b, "nested array");
  }
  {
    Bytes b = buf;
    Poke<std::uint32_t>(b, type_at + 4, 99);
    ExpectRejected(b, "unknown value type 99");
  }
}

TEST(GgufFileTest, RejectsDuplicateKeysAndTensors) {
  {
    GgufWriter w;
    w.SetUint32("dup.a", 1);
    w.SetUint32("dup.b", 2);
    Bytes buf = w.Serialize();
    buf[FindBytes(buf, "dup.b") + 4] = 'a';
    ExpectRejected(buf, "duplicate metadata key 'dup.a'");
  }
  {
    GgufWriter w;
    w.AddTensor("ta", {2}, GgmlType::kF32, Ramp(2, 0.0f, 1.0f));
    w.AddTensor("tb", {2}, GgmlType::kF32, Ramp(2, 0.0f, 1.0f));
    Bytes buf = w.Serialize();
    buf[FindBytes(buf, "tb")] = 't';
    buf[FindBytes(buf, "tb") + 1] = 'a';
    ExpectRejected(buf, "duplicate tensor 'ta'");
  }
}

TEST(GgufFileTest, RejectsBadShapes) {
  const Bytes buf = MinimalFile();
  const TensorInfoPos pos = LocateTensorInfo(buf, "weights", 2);
  for (std::uint32_t n_dims : {0u, 5u, 0xffffffffu}) {
    Bytes b = buf;
    Poke(b, pos.n_dims, n_dims);
    ExpectRejected(b, "tensor 'weights' has " + std::to_string(n_dims) + " dimensions");
  }
  {
    Bytes b = buf;
    Poke<std::uint64_t>(b, pos.dims + 8, 0);
    ExpectRejected(b, "tensor 'weights' has a zero dimension");
  }
  {
    // 2^32 x 2^32 overflows any byte-size computation.
    Bytes b = buf;
    Poke<std::uint64_t>(b, pos.dims, std::uint64_t{1} << 32);
    Poke<std::uint64_t>(b, pos.dims + 8, std::uint64_t{1} << 32);
    ExpectRejected(b, "tensor 'weights' has an absurd shape");
  }
  {
    Bytes b = buf;
    Poke<std::uint64_t>(b, pos.dims, ~std::uint64_t{0});
    ExpectRejected(b, "tensor 'weights'");
  }
  {
    // Plausible shape, but its data would lie beyond the end of the file.
    Bytes b = buf;
    Poke<std::uint64_t>(b, pos.dims, 1 << 20);
    ExpectRejected(b, "outside the file's data section");
  }
}

TEST(GgufFileTest, RejectsUnknownTensorTypes) {
  const Bytes buf = MinimalFile();
  const TensorInfoPos pos = LocateTensorInfo(buf, "weights", 2);
  // Ids ggml never defined or has retired.
  for (std::uint32_t type : {4u, 5u, 31u, 1000u}) {
    Bytes b = buf;
    Poke(b, pos.type, type);
    ExpectRejected(b, "tensor 'weights' has unknown ggml type id " + std::to_string(type));
  }
  // Known types are sized by their own blocks: Q4_K needs whole 256-element super-blocks.
  for (std::uint32_t type : {2u, 12u}) {
    Bytes b = buf;
    Poke(b, pos.type, type);
    ExpectRejected(b, "not a whole number of blocks");
  }
  // Q8_0 needs whole 32-element blocks.
  Bytes b = buf;
  Poke<std::uint32_t>(b, pos.type, 8);
  ExpectRejected(b, "not a whole number of blocks");
}

TEST(GgufFileTest, RejectsDataOutsideFileOrMisaligned) {
  const Bytes buf = MinimalFile();
  const TensorInfoPos pos = LocateTensorInfo(buf, "weights", 2);
  for (std::uint64_t offset : {std::uint64_t{1} << 20, ~std::uint64_t{0} - 31, std::uint64_t{32}}) {
    Bytes b = buf;
    Poke(b, pos.offset, offset);
    ExpectRejected(b, "tensor 'weights' has data at [" + std::to_string(offset));
  }
  Bytes b = buf;
  Poke<std::uint64_t>(b, pos.offset, 4);
  ExpectRejected(b, "not a multiple of the alignment 32");
}

TEST(GgufFileTest, RejectsOverlappingTensors) {
  GgufWriter w;
  w.AddTensor("ta", {8}, GgmlType::kF32, Ramp(8, 0.0f, 1.0f));
  w.AddTensor("tb", {8}, GgmlType::kF32, Ramp(8, 0.0f, 1.0f));
  Bytes buf = w.Serialize();
  Poke<std::uint64_t>(buf, LocateTensorInfo(buf, "tb", 1).offset, 0);
  ExpectRejected(buf, "overlapping");
}

TEST(GgufFileTest, RejectsBadAlignmentAndBools) {
  {
    GgufWriter w;
    w.SetUint32("general.alignment", 64);
    Bytes buf = w.Serialize();
    Poke<std::uint32_t>(buf, FindBytes(buf, "general.alignment") + 17 + 4, 48);
    ExpectRejected(buf, "'general.alignment' must be a power of two");
  }
  {
    GgufWriter w;
    w.SetUint32("general.alignment", 32);
    Bytes buf = w.Serialize();
    Poke<std::uint32_t>(buf, FindBytes(buf, "general.alignment") + 17, 6);  // now a float32
    ExpectRejected(buf, "'general.alignment' must be a power of two");
  }
  {
    GgufWriter w;
    w.SetUint32("flag", 0);
    Bytes buf = w.Serialize();
    const std::size_t type_at = FindBytes(buf, "flag") + 4;
    Poke<std::uint32_t>(buf, type_at, 7);  // bool
    Poke<std::uint8_t>(buf, type_at + 4, 2);
    ExpectRejected(buf, "invalid byte value 2");
  }
}

// ---------------------------------------------------------------------------------------------
// Dequantisation

std::vector<float> Dequant(GgmlType type, const Bytes& data, std::uint64_t count) {
  std::vector<float> out(static_cast<std::size_t>(count), -999.0f);
  DequantizeToF32(type, data, count, out.data());
  return out;
}

Bytes U16Bytes(std::initializer_list<std::uint16_t> v) {
  Bytes b;
  for (std::uint16_t x : v) {
    b.push_back(static_cast<std::uint8_t>(x & 0xff));
    b.push_back(static_cast<std::uint8_t>(x >> 8));
  }
  return b;
}

TEST(DequantizeTest, F16HandValues) {
  const Bytes data = U16Bytes(
      {0x3c00, 0xc000, 0x3555, 0x0001, 0x0400, 0x7bff, 0x8000, 0x7c00, 0xfc00, 0x03ff, 0x3c01});
  const auto out = Dequant(GgmlType::kF16, data, 11);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_EQ(out[2], 0.333251953125f);        // 0x3555 = 1365/4096
  EXPECT_EQ(out[3], std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(out[4], std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_EQ(out[5], 65504.0f);
  EXPECT_EQ(out[6], 0.0f);
  EXPECT_TRUE(std::signbit(out[6]));
  EXPECT_EQ(out[7], std::numeric_limits<float>::infinity());
  EXPECT_EQ(out[8], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(out[9], 1023.0f * std::ldexp(1.0f, -24));  // largest subnormal
  EXPECT_EQ(out[10], 1.0f + std::ldexp(1.0f, -10));
  EXPECT_TRUE(std::isnan(Dequant(GgmlType::kF16, U16Bytes({0x7e00}), 1)[0]));
}

TEST(DequantizeTest, Bf16HandValues) {
  const auto out = Dequant(GgmlType::kBF16, U16Bytes({0x3f80, 0xc0a0, 0x4049, 0x0000, 0x7f80}), 5);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -5.0f);
  EXPECT_EQ(out[2], 3.140625f);
  EXPECT_EQ(out[3], 0.0f);
  EXPECT_EQ(out[4], std::numeric_limits<float>::infinity());
}

TEST(DequantizeTest, Q8_0HandValues) {
  Bytes data = U16Bytes({0x3800});  // block 0 scale 0.5
  for (int j = 0; j < 32; ++j)
    data.push_back(static_cast<std::uint8_t>(static_cast<std::int8_t>(j - 16)));
  const Bytes scale1 = U16Bytes({0xc400});  // block 1 scale -4.0
  data.insert(data.end(), scale1.begin(), scale1.end());
  for (int j = 0; j < 32; ++j) {
    const std::int8_t q = j == 0 ? -128 : (j == 1 ? 127 : 0);
    data.push_back(static_cast<std::uint8_t>(q));
  }
  ASSERT_EQ(data.size(), 68u);
  const auto out = Dequant(GgmlType::kQ8_0, data, 64);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(out[static_cast<std::size_t>(j)], 0.5f * (j - 16)) << j;
  EXPECT_EQ(out[32], 512.0f);
  EXPECT_EQ(out[33], -508.0f);
  for (int j = 34; j < 64; ++j) EXPECT_EQ(out[static_cast<std::size_t>(j)], 0.0f) << j;
}

TEST(DequantizeTest, F32IsACopy) {
  const std::vector<float> v = {1.5f, -0.0f, 3e38f};
  Bytes data(v.size() * 4);
  std::memcpy(data.data(), v.data(), data.size());
  EXPECT_EQ(Dequant(GgmlType::kF32, data, 3), v);
}

TEST(DequantizeTest, RejectsShortDataAndUnknownTypes) {
  const Bytes two = U16Bytes({0x3c00, 0x3c00});
  std::vector<float> out(64);
  EXPECT_THROW(DequantizeToF32(GgmlType::kF16, two, 3, out.data()), LoadError);
  EXPECT_THROW(DequantizeToF32(GgmlType::kF32, two, 2, out.data()), LoadError);
  EXPECT_THROW(DequantizeToF32(GgmlType::kQ8_0, Bytes(34), 33, out.data()), LoadError);
  EXPECT_THROW(DequantizeToF32(GgmlType::kQ8_0, Bytes(33), 32, out.data()), LoadError);
  EXPECT_THROW(DequantizeToF32(static_cast<GgmlType>(2), Bytes(64), 1, out.data()), LoadError);
  EXPECT_THROW(DequantizeToF32(GgmlType::kF32, two, ~std::uint64_t{0}, out.data()), LoadError);
}

TEST(DequantizeTest, WriterRoundsToF16NearestEven) {
  const float one = 1.0f;
  const float ulp = std::ldexp(1.0f, -10);
  const std::vector<float> in = {
      one + ulp / 2,             // tie: rounds to even (1.0)
      one + 3 * ulp / 2,         // tie: rounds to even (1 + 2 ulp)
      one + ulp / 2 + ulp / 64,  // above the tie: rounds up
      65504.0f,
      65519.0f,
      65520.0f,               // max, still max, overflows to inf
      std::ldexp(1.0f, -25),  // exactly half the smallest subnormal: rounds to 0
      std::ldexp(1.5f, -25),  // rounds up to the smallest subnormal
      std::ldexp(3.0f, -24),  // exact subnormal
      -0.1f,
      std::numeric_limits<float>::quiet_NaN(),
  };
  GgufWriter w;
  w.AddTensor("t", {in.size()}, GgmlType::kF16, in);
  const Bytes buf = w.Serialize();
  const GgufFile f(buf, "f16.gguf");
  const GgufTensorInfo* t = f.FindTensor("t");
  std::vector<float> out(in.size());
  DequantizeToF32(t->type, t->data, in.size(), out.data());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], one + 2 * ulp);
  EXPECT_EQ(out[2], one + ulp);
  EXPECT_EQ(out[3], 65504.0f);
  EXPECT_EQ(out[4], 65504.0f);
  EXPECT_EQ(out[5], std::numeric_limits<float>::infinity());
  EXPECT_EQ(out[6], 0.0f);
  EXPECT_EQ(out[7], std::ldexp(1.0f, -24));
  EXPECT_EQ(out[8], std::ldexp(3.0f, -24));
  EXPECT_EQ(out[9], -0.0999755859375f);  // nearest half to -0.1
  EXPECT_TRUE(std::isnan(out[10]));
}

// ---------------------------------------------------------------------------------------------
// Model loader

TEST(GgufLoaderTest, LoadsLlamaIntoFusedLayout) {
  TinySpec spec;
  spec.layers = 2;
  TinyFile tf = BuildTiny(spec);
  const std::string path = TempPath("tiny_llama.gguf");
  tf.writer.Write(path);
  const Model m = LoadGgufModel(path);
  const ModelConfig& c = m.config;
  EXPECT_EQ(c.architecture, Architecture::kLlama);
  EXPECT_EQ(c.rope_style, RopeStyle::kInterleaved);
  EXPECT_EQ(c.name, "tiny_llama.gguf");
  EXPECT_EQ(c.dim, 8);
  EXPECT_EQ(c.num_layers, 2);
  EXPECT_EQ(c.num_heads, 2);
  EXPECT_EQ(c.num_kv_heads, 1);
  EXPECT_EQ(c.head_dim, 4);
  EXPECT_EQ(c.ffn_dim, 16);
  EXPECT_EQ(c.vocab_size, 6);
  EXPECT_EQ(c.context_length, 64);
  EXPECT_EQ(c.rms_eps, 1e-6f);
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_FALSE(c.has_qkv_bias);
  EXPECT_EQ(m.tokenizer, nullptr);  // no tokenizer.ggml.* keys

  const auto expect_eq = [&](const float* got, const std::string& name) {
    const auto& want = tf.values.at(name);
    EXPECT_EQ(std::memcmp(got, want.data(), want.size() * sizeof(float)), 0) << name;
  };
  const auto expect_rows = [&](const std::vector<float>& got, const std::string& name) {
    ASSERT_EQ(got.size(), tf.values.at(name).size()) << name;
    expect_eq(got.data(), name);
  };
  const auto all = [](const quant::WeightMatrix& mat) { return DequantizeRows(mat, 0, mat.rows); };
  const ModelWeights& w = *m.weights;
  expect_rows(all(w.token_embedding), "token_embd.weight");
  expect_rows(all(w.output), "output.weight");
  expect_eq(w.final_norm, "output_norm.weight");
  for (int l = 0; l < 2; ++l) {
    const LayerWeights& lw = w.layers[static_cast<std::size_t>(l)];
    const std::string p = "blk." + std::to_string(l) + ".";
    expect_eq(lw.attn_norm, p + "attn_norm.weight");
    expect_rows(DequantizeRows(lw.wqkv, 0, 8), p + "attn_q.weight");
    expect_rows(DequantizeRows(lw.wqkv, 8, 4), p + "attn_k.weight");
    expect_rows(DequantizeRows(lw.wqkv, 12, 4), p + "attn_v.weight");
    expect_rows(all(lw.wo), p + "attn_output.weight");
    expect_eq(lw.ffn_norm, p + "ffn_norm.weight");
    expect_rows(DequantizeRows(lw.w_gate_up, 0, 16), p + "ffn_gate.weight");
    expect_rows(DequantizeRows(lw.w_gate_up, 16, 16), p + "ffn_up.weight");
    expect_rows(all(lw.w_down), p + "ffn_down.weight");
    EXPECT_EQ(lw.bqkv, nullptr);
  }
}

TEST(GgufLoaderTest, LoadsQwen2WithBiasesAndTiedOutput) {
  TinySpec spec;
  spec.arch = "qwen2";
  spec.bias = true;
  spec.tied = true;
  TinyFile tf = BuildTiny(spec);
  const Model m = internal::LoadGgufModelFromBytes(tf.writer.Serialize(), "dir/q.gguf");
  EXPECT_EQ(m.config.architecture, Architecture::kQwen2);
  EXPECT_EQ(m.config.rope_style, RopeStyle::kNeox);
  EXPECT_TRUE(m.config.has_qkv_bias);
  EXPECT_TRUE(m.config.tied_embeddings);
  EXPECT_EQ(m.config.name, "q.gguf");
  const LayerWeights& lw = m.weights->layers[0];
  ASSERT_NE(lw.bqkv, nullptr);
  EXPECT_EQ(lw.bqkv[0], tf.values.at("blk.0.attn_q.bias")[0]);
  EXPECT_EQ(lw.bqkv[8], tf.values.at("blk.0.attn_k.bias")[0]);
  EXPECT_EQ(lw.bqkv[12], tf.values.at("blk.0.attn_v.bias")[0]);
  EXPECT_EQ(lw.bqkv[15], tf.values.at("blk.0.attn_v.bias")[3]);
  EXPECT_EQ(m.weights->output.data, m.weights->token_embedding.data);
}

// ---- hostile quantised tensors: a clear LoadError naming the tensor ----

std::string ModelErrorOf(const std::vector<std::uint8_t>& bytes) {
  try {
    (void)internal::LoadGgufModelFromBytes(bytes, "hostile.gguf");
  } catch (const LoadError& e) {
    return e.what();
  }
  return "";
}

TEST(GgufLoaderTest, RejectsATypeItDoesNotComputeWithNamingTheTensor) {
  TinySpec spec;
  spec.dim = 32;
  spec.heads = 4;
  spec.kv_heads = 2;
  spec.ffn = 64;
  spec.raw_tensor = "blk.0.ffn_down.weight";  // [64, 32]: 2048 elements, 8 Q2_K blocks
  spec.raw_type = GgmlType::kQ2_K;
  spec.raw_bytes.assign(8 * 84, 0);
  const std::string msg = ModelErrorOf(BuildTiny(spec).writer.Serialize());
  EXPECT_NE(msg.find("'blk.0.ffn_down.weight'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Q2_K"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Q4_K"), std::string::npos) << msg;  // the supported list
}

TEST(GgufLoaderTest, RejectsRowsThatAreNotWholeBlocksNamingTheTensor) {
  TinySpec spec;
  spec.dim = 48;  // attn_q is [48, 48]: 72 Q8_0 blocks in all, but a row is 1.5 blocks
  spec.heads = 2;
  spec.kv_heads = 1;
  spec.ffn = 64;
  spec.raw_tensor = "blk.0.attn_q.weight";
  spec.raw_type = GgmlType::kQ8_0;
  spec.raw_bytes.assign(72 * 34, 0);
  const std::string msg = ModelErrorOf(BuildTiny(spec).writer.Serialize());
  EXPECT_NE(msg.find("'blk.0.attn_q.weight'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rows of 48"), std::string::npos) << msg;
}

TEST(GgufLoaderTest, RejectsTruncatedQuantisedData) {
  TinySpec spec;
  spec.dim = 32;
  spec.heads = 4;
  spec.kv_heads = 2;
  spec.ffn = 64;
  spec.matrix_type = GgmlType::kQ4_1;
  auto bytes = BuildTiny(spec).writer.Serialize();
  ASSERT_TRUE(ModelErrorOf(bytes).empty()) << ModelErrorOf(bytes);
  bytes.resize(bytes.size() - 7);  // into the last tensor, blk.0.ffn_down.weight
  const std::string msg = ModelErrorOf(bytes);
  EXPECT_NE(msg.find("blk.0.ffn_down.weight"), std::string::npos) << msg;
}

// Every computable type loads, keeps its type and decodes to the values it was written from.
TEST(GgufLoaderTest, KeepsEveryComputableTypeAsStored) {
  for (const GgmlType type :
       {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0,
        GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kF16, GgmlType::kBF16}) {
    TinySpec spec;
    spec.dim = 256;
    spec.heads = 4;
    spec.kv_heads = 2;
    spec.ffn = 256;
    spec.matrix_type = type;
    TinyFile tf = BuildTiny(spec);
    const Model m = internal::LoadGgufModelFromBytes(tf.writer.Serialize(), "typed.gguf");
    const quant::WeightMatrix& down = m.weights->layers[0].w_down;
    ASSERT_EQ(down.type, type) << quant::Name(type);
    EXPECT_EQ(m.weights->layers[0].wqkv.size(), 3u);
    EXPECT_EQ(m.weights->layers[0].wqkv[1].type, type);
    // Decodes to what the writer's quantiser produced from the written values.
    const auto& want = tf.values.at("blk.0.ffn_down.weight");
    std::vector<std::uint8_t> enc(*quant::TensorBytes(type, want.size()));
    quant::QuantizeRow(type, want.data(), static_cast<std::int64_t>(want.size()), enc.data());
    std::vector<float> expected(want.size());
    quant::DequantizeRow(type, enc.data(), static_cast<std::int64_t>(want.size()), expected.data());
    EXPECT_EQ(DequantizeRows(down, 0, down.rows), expected) << quant::Name(type);
  }
}

// Views need aligned bytes: a mapped image whose tensors are not 2-byte aligned is copied into
// the arena and gives the same weights.
TEST(GgufLoaderTest, MisalignedBackingIsCopiedNotViewed) {
  TinySpec spec;
  spec.dim = 32;
  spec.heads = 4;
  spec.kv_heads = 2;
  spec.ffn = 64;
  spec.matrix_type = GgmlType::kQ8_0;
  const auto bytes = BuildTiny(spec).writer.Serialize();
  auto aligned = std::make_shared<std::vector<std::uint8_t>>(bytes);
  auto shifted = std::make_shared<std::vector<std::uint8_t>>(bytes.size() + 1);
  std::memcpy(shifted->data() + 1, bytes.data(), bytes.size());
  const std::span<const std::uint8_t> odd(shifted->data() + 1, bytes.size());
  ASSERT_EQ(reinterpret_cast<std::uintptr_t>(aligned->data()) % 2, 0u);
  const Model a = internal::LoadGgufModelFromBytes(*aligned, "a.gguf", aligned);
  const Model b = internal::LoadGgufModelFromBytes(odd, "b.gguf", shifted);
  const auto* lo = reinterpret_cast<const std::byte*>(aligned->data());
  const quant::WeightMatrix& va = a.weights->layers[0].w_down;
  EXPECT_TRUE(va.data >= lo && va.data < lo + aligned->size()) << "aligned: a view";
  const auto* slo = reinterpret_cast<const std::byte*>(shifted->data());
  const quant::WeightMatrix& vb = b.weights->layers[0].w_down;
  EXPECT_FALSE(vb.data >= slo && vb.data < slo + shifted->size()) << "misaligned: a copy";
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(vb.data) % 2, 0u);
  EXPECT_EQ(DequantizeRows(va, 0, va.rows), DequantizeRows(vb, 0, vb.rows));
}

// The placement tests' file: one layer whose matrices are whole 16-row groups of whole blocks.
TinySpec PlacementSpec(GgmlType type, bool tied) {
  TinySpec spec;
  spec.dim = 64;
  spec.heads = 4;
  spec.kv_heads = 2;
  spec.ffn = 128;
  spec.vocab = 48;
  spec.tied = tied;
  spec.matrix_type = type;
  return spec;
}

// Bytes of the one layer's matrices, the embedding and the output (once when tied): what
// placement moves out of the file.
std::size_t PlacedMatrixBytes(const ModelWeights& w) {
  const LayerWeights& l = w.layers.at(0);
  std::size_t bytes = w.token_embedding.Bytes() + l.w_down.Bytes() + l.wo.Bytes();
  if (w.output.data != w.token_embedding.data) bytes += w.output.Bytes();
  for (const auto& part : l.wqkv) bytes += part.Bytes();
  for (const auto& part : l.w_gate_up) bytes += part.Bytes();
  return bytes;
}

// The file bytes a page-release hook was handed, each byte once (placement hands a matrix's
// chunks as they are copied, then the whole matrix for the pages the chunks shared), and how many
// times it was called.
class ReleasedBytes {
 public:
  ModelWeights::PageRelease Hook() {
    return [this](const std::byte* p, std::size_t n) {
      spans_.emplace_back(reinterpret_cast<std::uintptr_t>(p), n);
    };
  }
  [[nodiscard]] std::size_t size() const {
    std::vector<std::pair<std::uintptr_t, std::size_t>> spans = spans_;
    std::sort(spans.begin(), spans.end());
    std::size_t covered = 0;
    std::uintptr_t end = 0;
    for (const auto& [begin, n] : spans) {
      const std::uintptr_t from = std::max(begin, end);
      if (begin + n > from) covered += begin + n - from;
      end = std::max(end, begin + n);
    }
    return covered;
  }
  [[nodiscard]] std::size_t calls() const { return spans_.size(); }
  void clear() { spans_.clear(); }

 private:
  std::vector<std::pair<std::uintptr_t, std::size_t>> spans_;
};

// PlaceForKernels: the matrices a choice names are reordered (views into the file copied out, the
// file's pages handed to the release hook; arena copies in place), tied matrices stay one, every
// weight reads back the same, and the bytes are the same.
TEST(GgufLoaderTest, RowLayoutsKeepEveryWeight) {
  const TinySpec spec = PlacementSpec(GgmlType::kQ8_0, /*tied=*/true);
  const auto bytes = BuildTiny(spec).writer.Serialize();
  auto aligned = std::make_shared<std::vector<std::uint8_t>>(bytes);
  auto shifted = std::make_shared<std::vector<std::uint8_t>>(bytes.size() + 1);
  std::memcpy(shifted->data() + 1, bytes.data(), bytes.size());
  const std::span<const std::uint8_t> odd(shifted->data() + 1, bytes.size());
  const auto interleave = [](const quant::WeightMatrix& w) {
    return quant::CanInterleave(w.type, w.rows, w.cols) ? quant::RowLayout::kInterleaved16
                                                        : quant::RowLayout::kRowMajor;
  };
  const Model ref = internal::LoadGgufModelFromBytes(*aligned, "ref.gguf", aligned);
  // The default chunk (each matrix in one piece here) and one 16-row group per chunk.
  for (const std::size_t chunk : {ModelWeights::kPlaceChunkBytes, std::size_t{1}}) {
    for (const bool view : {true, false}) {
      Model m = view ? internal::LoadGgufModelFromBytes(*aligned, "a.gguf", aligned)
                     : internal::LoadGgufModelFromBytes(odd, "b.gguf", shifted);
      ReleasedBytes released;
      m.weights->SetPageRelease(released.Hook(), chunk);
      const std::byte* down_before = m.weights->layers[0].w_down.data;
      // token_embedding (= output), q, k, v, o, gate, up, down.
      EXPECT_EQ(m.weights->PlaceForKernels(interleave), 8) << "view " << view;
      EXPECT_EQ(m.weights->PlaceForKernels(interleave), 0) << "already in that layout";
      const quant::WeightMatrix& down = m.weights->layers[0].w_down;
      EXPECT_EQ(down.layout, quant::RowLayout::kInterleaved16);
      EXPECT_EQ(down.data == down_before, !view) << "arena copies are reordered in place";
      EXPECT_EQ(m.weights->output.data, m.weights->token_embedding.data);
      EXPECT_EQ(m.weights->output.layout, quant::RowLayout::kInterleaved16);
      EXPECT_EQ(released.size(), view ? PlacedMatrixBytes(*m.weights) : 0u);
      if (view && chunk == 1) {
        EXPECT_GT(released.calls(), 2u * 8u) << "released chunk by chunk";
      }
      EXPECT_EQ(m.weights->WeightBytes(), ref.weights->WeightBytes());
      EXPECT_NE(m.weights->Summary().find("8 in 16-row interleaved layout"), std::string::npos)
          << m.weights->Summary();
      const LayerWeights& a = m.weights->layers[0];
      const LayerWeights& r = ref.weights->layers[0];
      EXPECT_EQ(DequantizeRows(a.w_down, 0, a.w_down.rows),
                DequantizeRows(r.w_down, 0, r.w_down.rows));
      EXPECT_EQ(DequantizeRows(a.wqkv, 0, GroupRows(a.wqkv)),
                DequantizeRows(r.wqkv, 0, GroupRows(r.wqkv)));
      EXPECT_EQ(DequantizeRows(a.w_gate_up, 0, GroupRows(a.w_gate_up)),
                DequantizeRows(r.w_gate_up, 0, GroupRows(r.w_gate_up)));
      EXPECT_EQ(DequantizeRows(m.weights->output, 0, spec.vocab),
                DequantizeRows(ref.weights->output, 0, spec.vocab));
    }
  }
}

// PlaceForKernels with nothing to relay (every choice row-major, an F16 and a Q8_0 file): every
// matrix still leaves the file for streamed memory (the file's pages handed to the release hook,
// the data no longer in the file's bytes), in the same layout, reading back the same; a second
// call moves nothing.
TEST(GgufLoaderTest, PlacingCopiesViewsOutOfTheFile) {
  for (const GgmlType type : {GgmlType::kF16, GgmlType::kQ8_0}) {
    const TinySpec spec = PlacementSpec(type, /*tied=*/false);
    auto bytes = std::make_shared<std::vector<std::uint8_t>>(BuildTiny(spec).writer.Serialize());
    const auto* lo = reinterpret_cast<const std::byte*>(bytes->data());
    const auto in_file = [&](const quant::WeightMatrix& w) {
      return w.data >= lo && w.data < lo + bytes->size();
    };
    const Model ref = internal::LoadGgufModelFromBytes(*bytes, "ref.gguf", bytes);
    Model m = internal::LoadGgufModelFromBytes(*bytes, "a.gguf", bytes);
    ASSERT_TRUE(in_file(m.weights->layers[0].w_down)) << "a view before placing";
    ReleasedBytes released;
    m.weights->SetPageRelease(released.Hook());
    const auto row_major = [](const quant::WeightMatrix&) { return quant::RowLayout::kRowMajor; };
    EXPECT_EQ(m.weights->PlaceForKernels(row_major), 0) << Name(type);
    const LayerWeights& a = m.weights->layers[0];
    const LayerWeights& r = ref.weights->layers[0];
    EXPECT_EQ(released.size(), PlacedMatrixBytes(*m.weights)) << Name(type);
    EXPECT_FALSE(in_file(a.w_down)) << Name(type);
    EXPECT_FALSE(in_file(m.weights->output)) << Name(type);
    EXPECT_EQ(a.w_down.layout, quant::RowLayout::kRowMajor);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a.w_down.data) % 64, 0u);
    EXPECT_EQ(m.weights->WeightBytes(), ref.weights->WeightBytes());
    EXPECT_EQ(DequantizeRows(a.w_down, 0, a.w_down.rows),
              DequantizeRows(r.w_down, 0, r.w_down.rows));
    EXPECT_EQ(DequantizeRows(a.wqkv, 0, GroupRows(a.wqkv)),
              DequantizeRows(r.wqkv, 0, GroupRows(r.wqkv)));
    EXPECT_EQ(DequantizeRows(m.weights->output, 0, spec.vocab),
              DequantizeRows(ref.weights->output, 0, spec.vocab));
    const std::byte* placed = a.w_down.data;
    released.clear();
    EXPECT_EQ(m.weights->PlaceForKernels(row_major), 0);
    EXPECT_EQ(released.size(), 0u) << "nothing left in the file";
    EXPECT_EQ(a.w_down.data, placed);
  }
}

TEST(GgufLoaderTest, DequantisesQ8AndF16Tensors) {
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kF16, GgmlType::kBF16}) {
    TinySpec spec;
    spec.dim = 32;
    spec.heads = 4;
    spec.kv_heads = 2;
    spec.ffn = 64;
    spec.matrix_type = type;
    TinyFile tf = BuildTiny(spec);
    const Model m = internal::LoadGgufModelFromBytes(tf.writer.Serialize(), "quant.gguf");
    const auto& want = tf.values.at("blk.0.ffn_down.weight");
    const quant::WeightMatrix& down = m.weights->layers[0].w_down;
    EXPECT_EQ(down.type, type);  // kept in its stored type
    const std::vector<float> got_rows = DequantizeRows(down, 0, down.rows);
    const float* got = got_rows.data();
    for (std::size_t i = 0; i < want.size(); ++i) {
      // Q8_0: half a step of max|x|/127 per block; F16/BF16 relative rounding.
      const float tol = type == GgmlType::kQ8_0  ? 0.5f * std::fabs(want[i] + 1.0f) / 127.0f + 1e-3f
                        : type == GgmlType::kF16 ? std::fabs(want[i]) * 1e-3f
                                                 : std::fabs(want[i]) * 8e-3f;
      ASSERT_NEAR(got[i], want[i], tol) << static_cast<int>(type) << " at " << i;
    }
  }
}

TEST(GgufLoaderTest, LoadsEmbeddedTokenizer) {
  TinySpec spec;
  spec.vocab = 300;
  TinyFile tf = BuildTiny(spec);
  const Vocabulary v = MakeSyntheticVocabulary(300);
  tf.writer.SetString("tokenizer.ggml.model", "llama");
  tf.writer.SetStringArray("tokenizer.ggml.tokens", v.tokens);
  tf.writer.SetFloat32Array("tokenizer.ggml.scores", v.scores);
  tf.writer.SetInt32Array("tokenizer.ggml.token_type", v.token_types);
  tf.writer.SetUint32("tokenizer.ggml.bos_token_id", static_cast<std::uint32_t>(v.bos_id));
  tf.writer.SetUint32("tokenizer.ggml.eos_token_id", static_cast<std::uint32_t>(v.eos_id));
  tf.writer.SetUint32("tokenizer.ggml.padding_token_id", 0xffffffffu);
  const Model m = internal::LoadGgufModelFromBytes(tf.writer.Serialize(), "tok.gguf");
  ASSERT_NE(m.tokenizer, nullptr);
  EXPECT_EQ(m.tokenizer->vocab_size(), 300);
  EXPECT_EQ(m.tokenizer->bos_id(), v.bos_id);
  EXPECT_EQ(m.tokenizer->eos_id(), v.eos_id);

  // A token list that disagrees with the embedding matrix is rejected.
  tf.writer.SetStringArray("tokenizer.ggml.tokens", {"a", "b"});
  EXPECT_NE(LoadErrorOf(tf.writer.Serialize()).find("token_embd.weight"), std::string::npos);
  tf.writer.SetStringArray("tokenizer.ggml.tokens", v.tokens);
  tf.writer.SetUint32("tokenizer.ggml.bos_token_id", 300);
  EXPECT_NE(LoadErrorOf(tf.writer.Serialize()).find("bos_token_id"), std::string::npos);
  tf.writer.SetUint32("tokenizer.ggml.bos_token_id", 1);
  tf.writer.SetString("tokenizer.ggml.model", "bert");
  EXPECT_NE(LoadErrorOf(tf.writer.Serialize()).find("'bert'"), std::string::npos);
}

TEST(GgufLoaderTest, RejectsUnknownArchitecture) {
  TinyFile tf = BuildTiny({});
  tf.writer.SetString("general.architecture", "mamba");
  const std::string path = TempPath("mamba.gguf");
  tf.writer.Write(path);
  try {
    (void)LoadGgufModel(path);
    ADD_FAILURE() << "accepted architecture mamba";
  } catch (const LoadError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << msg;
    EXPECT_NE(msg.find("unsupported architecture 'mamba'"), std::string::npos) << msg;
  }
}

TEST(GgufLoaderTest, RejectsMissingTensors) {
  for (const std::string name :
       {"token_embd.weight", "output_norm.weight", "blk.0.attn_k.weight", "blk.1.ffn_down.weight",
        "blk.1.attn_norm.weight", "blk.0.ffn_up.weight"}) {
    TinySpec spec;
    spec.layers = 2;
    spec.skip_tensor = name;
    const std::string path = TempPath("missing.gguf");
    BuildTiny(spec).writer.Write(path);
    try {
      (void)LoadGgufModel(path);
      ADD_FAILURE() << "accepted a file without " << name;
    } catch (const LoadError& e) {
      EXPECT_NE(std::string(e.what()).find("missing tensor '" + name + "'"), std::string::npos)
          << e.what();
    }
  }
  TinySpec spec;
  spec.arch = "qwen2";
  EXPECT_NE(LoadErrorOf(BuildTiny(spec).writer.Serialize()).find("'blk.0.attn_q.bias'"),
            std::string::npos);
}

TEST(GgufLoaderTest, RejectsShapeAndMetadataMismatches) {
  {
    TinyFile tf = BuildTiny({});
    tf.writer.SetUint32("llama.feed_forward_length", 17);
    EXPECT_NE(LoadErrorOf(tf.writer.Serialize()).find("tensor 'blk.0.ffn_gate.weight' has shape"),
              std::string::npos);
  }
  {
    TinyFile tf = BuildTiny({});
    tf.writer.SetUint32("llama.attention.head_count_kv", 2);
    EXPECT_NE(LoadErrorOf(tf.writer.Serialize()).find("'blk.0.attn_k.weight'"), std::string::npos);
  }
  {
    TinyFile tf = BuildTiny({});
    tf.writer.SetUint32("llama.attention.head_count_kv", 3);  // 2 heads not a multiple of 3
    EXPECT_NE(LoadErrorOf(tf.writer.Serialize()).find("num_kv_heads"), std::string::npos);
  }
  {
    TinyFile tf = BuildTiny({});
    tf.writer.SetUint32("llama.block_count", 0);
    EXPECT_NE(LoadErrorOf(tf.writer.Serialize()).find("num_layers"), std::string::npos);
  }
  {
    TinyFile tf = BuildTiny({});
    tf.writer.SetUint32("llama.block_count", 1000);  // tensors for 999 layers are missing
    EXPECT_NE(LoadErrorOf(tf.writer.Serialize()).find("missing tensor 'blk.1."), std::string::npos);
  }
  {
    TinyFile tf = BuildTiny({});
    tf.writer.SetUint32("llama.embedding_length", 0xffffffffu);
    EXPECT_NE(LoadErrorOf(tf.writer.Serialize()).find("'llama.embedding_length'"),
              std::string::npos);
  }
  {
    TinyFile tf = BuildTiny({});
    tf.writer.SetString("llama.block_count", "one");
    EXPECT_NE(LoadErrorOf(tf.writer.Serialize()).find("'llama.block_count'"), std::string::npos);
  }
  {
    // Missing required key: a fresh writer without the epsilon.
    GgufWriter w;
    w.SetString("general.architecture", "llama");
    w.SetUint32("llama.embedding_length", 8);
    w.SetUint32("llama.block_count", 1);
    w.SetUint32("llama.feed_forward_length", 16);
    w.SetUint32("llama.attention.head_count", 2);
    w.SetUint32("llama.context_length", 64);
    EXPECT_NE(LoadErrorOf(w.Serialize()).find("layer_norm_rms_epsilon"), std::string::npos);
  }
  {
    TinyFile tf = BuildTiny({});
    tf.writer.SetFloat32("llama.attention.layer_norm_rms_epsilon", -1.0f);
    EXPECT_NE(LoadErrorOf(tf.writer.Serialize()).find("rms_eps"), std::string::npos);
  }
}

// Writes the seed corpus of tests/fuzz/corpus/gguf. Run by hand:
//   gguf_test --gtest_also_run_disabled_tests --gtest_filter='*WriteFuzzSeeds*'
TEST(GgufLoaderTest, DISABLED_WriteFuzzSeeds) {
  const std::filesystem::path dir =
      std::filesystem::path(METRONOME_SOURCE_DIR) / "tests/fuzz/corpus/gguf";
  std::filesystem::create_directories(dir);
  TinySpec tiny;
  tiny.dim = 4;
  tiny.heads = 2;
  tiny.ffn = 4;
  tiny.vocab = 3;
  BuildTiny(tiny).writer.Write((dir / "tiny_llama.gguf").string());
  TinySpec qwen = tiny;
  qwen.arch = "qwen2";
  qwen.bias = true;
  qwen.tied = true;
  qwen.matrix_type = GgmlType::kF16;
  BuildTiny(qwen).writer.Write((dir / "tiny_qwen2_f16.gguf").string());
  TinySpec q8;
  q8.dim = 32;
  q8.heads = 4;
  q8.kv_heads = 2;
  q8.ffn = 32;
  q8.vocab = 2;
  q8.matrix_type = GgmlType::kQ8_0;
  BuildTiny(q8).writer.Write((dir / "q8_llama.gguf").string());
  // Quantised seeds: a mixed-type file that loads, and one whose Q4_K rows are not whole blocks.
  TinySpec mixed = q8;
  mixed.matrix_type = GgmlType::kQ4_0;
  mixed.raw_tensor = "blk.0.attn_v.weight";  // [32, 16]: 16 Q5_1 blocks
  mixed.raw_type = GgmlType::kQ5_1;
  mixed.raw_bytes.assign(16 * 24, 0x11);
  BuildTiny(mixed).writer.Write((dir / "q4_0_q5_1_mixed.gguf").string());
  TinySpec k_rows = q8;
  k_rows.matrix_type = GgmlType::kQ4_1;
  k_rows.raw_tensor = "blk.0.ffn_down.weight";  // [32, 32]: 4 Q4_K super-blocks, rows of 32
  k_rows.raw_type = GgmlType::kQ4_K;
  k_rows.raw_bytes.assign(4 * 144, 0x3c);
  BuildTiny(k_rows).writer.Write((dir / "q4_k_rows_rejected.gguf").string());
  TinySpec tok = tiny;
  tok.vocab = 260;
  tok.dim = 2;
  tok.heads = 1;
  tok.ffn = 2;
  TinyFile tf = BuildTiny(tok);
  Vocabulary v = MakeSyntheticVocabulary(260);
  tf.writer.SetString("tokenizer.ggml.model", "llama");
  tf.writer.SetStringArray("tokenizer.ggml.tokens", v.tokens);
  tf.writer.SetFloat32Array("tokenizer.ggml.scores", v.scores);
  tf.writer.SetInt32Array("tokenizer.ggml.token_type", v.token_types);
  tf.writer.SetUint32("tokenizer.ggml.bos_token_id", 1);
  tf.writer.Write((dir / "tokenizer_llama.gguf").string());
  GgufWriter w;
  w.SetUint32("general.alignment", 64);
  w.SetStringArray("a.strings", {"x", "yy"});
  w.SetFloat32Array("a.floats", {1.0f});
  w.SetInt32Array("a.ints", {1, -2});
  w.AddTensor("bf16", {2, 2}, GgmlType::kBF16, Ramp(4, 0.0f, 1.0f));
  w.AddTensor("q8", {32}, GgmlType::kQ8_0, Ramp(32, 0.0f, 1.0f));
  w.Write((dir / "metadata_only.gguf").string());
}

// ---------------------------------------------------------------------------------------------
// Rope metadata and the table of what the loader understands (gguf_schema.h)

ModelConfig ConfigOf(const TinyFile& tf) {
  return internal::LoadGgufModelFromBytes(tf.writer.Serialize(), "rope.gguf").config;
}

TEST(GgufRopeTest, ReadsScalingAsLlamaCppDoes) {
  {
    TinyFile tf = BuildTiny({});
    const ModelConfig c = ConfigOf(tf);
    EXPECT_EQ(c.rope_scaling, RopeScaling::kNone);
    EXPECT_EQ(c.rope_scaling_factor, 1.0);
    EXPECT_TRUE(c.rope_freq_factors.empty());
  }
  {
    TinyFile tf = BuildTiny({});
    tf.writer.SetString("llama.rope.scaling.type", "yarn");
    tf.writer.SetFloat32("llama.rope.scaling.factor", 4.0f);
    tf.writer.SetUint32("llama.rope.scaling.original_context_length", 16);
    tf.writer.SetFloat32("llama.rope.scaling.yarn_beta_fast", 32.0f);  // the default: fine
    const ModelConfig c = ConfigOf(tf);
    EXPECT_EQ(c.rope_scaling, RopeScaling::kYarn);
    EXPECT_EQ(c.rope_scaling_factor, 4.0);
    EXPECT_EQ(c.yarn_original_context(), 16);
  }
  {
    // No type: llama.cpp's default type is linear, so a factor alone scales linearly.
    TinyFile tf = BuildTiny({});
    tf.writer.SetFloat32("llama.rope.scaling.factor", 2.0f);
    const ModelConfig c = ConfigOf(tf);
    EXPECT_EQ(c.rope_scaling, RopeScaling::kLinear);
    EXPECT_EQ(c.rope_scaling_factor, 2.0);
  }
  {
    // "none" never scales, whatever factor is also there; YaRN's original context defaults to
    // the trained one.
    TinyFile tf = BuildTiny({});
    tf.writer.SetString("llama.rope.scaling.type", "none");
    tf.writer.SetFloat32("llama.rope.scaling.factor", 8.0f);
    EXPECT_EQ(ConfigOf(tf).rope_scaling, RopeScaling::kNone);
    tf.writer.SetString("llama.rope.scaling.type", "yarn");
    EXPECT_EQ(ConfigOf(tf).yarn_original_context(), 64);
  }
}

TEST(GgufRopeTest, ReadsLlama3RopeFreqs) {
  TinyFile tf = BuildTiny({});  // head dim 4: two rotary pairs
  tf.writer.AddTensor("rope_freqs.weight", {2}, GgmlType::kF32, std::vector<float>{1.0f, 8.0f});
  const ModelConfig c = ConfigOf(tf);
  EXPECT_EQ(c.rope_freq_factors, (std::vector<float>{1.0f, 8.0f}));

  TinyFile wrong = BuildTiny({});
  wrong.writer.AddTensor("rope_freqs.weight", {3}, GgmlType::kF32, std::vector<float>{1, 2, 3});
  EXPECT_NE(ModelErrorOf(wrong.writer.Serialize()).find("rope_freq_factors has 3 values"),
            std::string::npos);
  TinyFile zero = BuildTiny({});
  zero.writer.AddTensor("rope_freqs.weight", {2}, GgmlType::kF32, std::vector<float>{1, 0});
  EXPECT_NE(ModelErrorOf(zero.writer.Serialize()).find("rope_freq_factors[1]"), std::string::npos);
}

TEST(GgufRopeTest, Llama3RecipeMatchesItsDefinition) {
  // theta 500000, 8 pairs of a 16-dim head: wavelengths 2 pi * 500000^(2i/16). Pairs below
  // 8192 / 4 keep 1, above 8192 get 8, between blend 1 / ((1 - s) / 8 + s), s = (8192 / wl - 1)
  // / 3.
  const std::vector<float> f = Llama3RopeFreqFactors(500000.0, 16, 8.0, 1.0, 4.0, 8192.0);
  ASSERT_EQ(f.size(), 8U);
  for (int i = 0; i < 8; ++i) {
    const double wl = 2.0 * 3.14159265358979323846 * std::pow(500000.0, 2.0 * i / 16.0);
    double want = 1.0;
    if (wl > 8192.0) {
      want = 8.0;
    } else if (wl >= 2048.0) {
      const double sm = (8192.0 / wl - 1.0) / 3.0;
      want = 1.0 / ((1.0 - sm) / 8.0 + sm);
    }
    EXPECT_NEAR(f[static_cast<std::size_t>(i)], want, 1e-5 * want) << i;
  }
  EXPECT_EQ(f[0], 1.0f);
  EXPECT_EQ(f[7], 8.0f);
}

// One file per thing the engine does not compute: each must be refused with the key or tensor
// named, and `UnsupportedInGguf` (what `metronome info` lists) must name it too.
struct Refusal {
  const char* what;  // the name the message must contain
  void (*damage)(TinyFile&);
};

const Refusal kRefusals[] = {
    {"llama.rope.scaling.type",
     [](TinyFile& f) { f.writer.SetString("llama.rope.scaling.type", "longrope"); }},
    {"llama.attn_logit_softcapping",
     [](TinyFile& f) { f.writer.SetFloat32("llama.attn_logit_softcapping", 50.0f); }},
    {"llama.final_logit_softcapping",
     [](TinyFile& f) { f.writer.SetFloat32("llama.final_logit_softcapping", 30.0f); }},
    {"llama.attention.sliding_window",
     [](TinyFile& f) { f.writer.SetUint32("llama.attention.sliding_window", 4096); }},
    {"llama.expert_count", [](TinyFile& f) { f.writer.SetUint32("llama.expert_count", 8); }},
    {"llama.attention.causal",
     [](TinyFile& f) { f.writer.SetBool("llama.attention.causal", false); }},
    {"llama.attention.value_length",
     [](TinyFile& f) { f.writer.SetUint32("llama.attention.value_length", 8); }},
    {"llama.rope.scaling.yarn_beta_fast",
     [](TinyFile& f) { f.writer.SetFloat32("llama.rope.scaling.yarn_beta_fast", 16.0f); }},
    {"llama.rope.scaling.yarn_log_multiplier",
     [](TinyFile& f) { f.writer.SetFloat32("llama.rope.scaling.yarn_log_multiplier", 0.1f); }},
    {"tokenizer.ggml.precompiled_charsmap",
     [](TinyFile& f) { f.writer.SetString("tokenizer.ggml.precompiled_charsmap", "x"); }},
    {"blk.0.attn_sinks.weight",
     [](TinyFile& f) {
       f.writer.AddTensor("blk.0.attn_sinks.weight", {2}, GgmlType::kF32, std::vector<float>{0, 0});
     }},
    {"blk.0.attn_q_norm.weight",
     [](TinyFile& f) {
       f.writer.AddTensor("blk.0.attn_q_norm.weight", {4}, GgmlType::kF32,
                          std::vector<float>{1, 1, 1, 1});
     }},
};

TEST(GgufSchemaTest, EachUnsupportedKeyOrTensorIsRefusedByName) {
  for (const Refusal& r : kRefusals) {
    TinyFile tf = BuildTiny({});
    r.damage(tf);
    const Bytes bytes = tf.writer.Serialize();
    const std::string msg = ModelErrorOf(bytes);
    EXPECT_NE(msg.find(std::string("'") + r.what + "'"), std::string::npos)
        << r.what << ": " << msg;
    const GgufFile g(bytes, "x.gguf");
    std::optional<ModelConfig> c;
    try {
      c = internal::ReadGgufConfig(g);
    } catch (const LoadError&) {
      // e.g. longrope: no configuration, as `metronome info` sees it; the keys are still listed
    }
    const std::vector<std::string> listed = internal::UnsupportedInGguf(g, c ? &*c : nullptr);
    ASSERT_EQ(listed.size(), 1U) << r.what;
    EXPECT_NE(listed[0].find(r.what), std::string::npos) << listed[0];
  }
}

TEST(GgufSchemaTest, UnknownPreTokenizerIsRefusedNamingKeyAndValue) {
  TinyFile tf = BuildTiny({});
  tf.writer.SetString("tokenizer.ggml.model", "gpt2");
  tf.writer.SetString("tokenizer.ggml.pre", "deepseek-llm");
  const Bytes bytes = tf.writer.Serialize();
  const GgufFile g(bytes, "x.gguf");
  const std::vector<std::string> listed = internal::UnsupportedInGguf(g, nullptr);
  ASSERT_EQ(listed.size(), 1U);
  EXPECT_NE(listed[0].find("'tokenizer.ggml.pre'"), std::string::npos) << listed[0];
  EXPECT_NE(listed[0].find("'deepseek-llm'"), std::string::npos) << listed[0];
  EXPECT_NE(ModelErrorOf(bytes).find("'tokenizer.ggml.pre'"), std::string::npos);
}

TEST(GgufSchemaTest, HarmlessMetadataIsIgnored) {
  TinyFile tf = BuildTiny({});
  tf.writer.SetString("general.name", "Llama 3.2 1B");
  tf.writer.SetString("general.license", "llama3.2");
  tf.writer.SetUint32("general.quantization_version", 2);
  tf.writer.SetUint32("llama.vocab_size", 6);
  tf.writer.SetUint32("llama.attention.value_length", 4);  // = the head dim: fine
  tf.writer.SetUint32("llama.expert_count", 0);
  tf.writer.SetBool("llama.attention.causal", true);
  tf.writer.SetString("tokenizer.chat_template", "{{ messages }}");
  tf.writer.SetUint32("tokenizer.ggml.eot_token_id", 2);
  tf.writer.SetString("quantize.imatrix.file", "imatrix.dat");
  tf.writer.SetUint32("qwen2.block_count", 99);  // another architecture's namespace
  const Bytes bytes = tf.writer.Serialize();
  EXPECT_EQ(ModelErrorOf(bytes), "");
  const GgufFile g(bytes, "x.gguf");
  EXPECT_TRUE(internal::UnsupportedInGguf(g, nullptr).empty());
}

TEST(GgufSchemaTest, RopeFreqsIsALlamaTensorOnly) {
  TinySpec spec;
  spec.arch = "qwen2";
  spec.bias = true;
  TinyFile tf = BuildTiny(spec);
  tf.writer.AddTensor("rope_freqs.weight", {2}, GgmlType::kF32, std::vector<float>{1, 2});
  EXPECT_NE(ModelErrorOf(tf.writer.Serialize()).find("'rope_freqs.weight'"), std::string::npos);
}

TinySpec TinyQwen3Moe() {
  TinySpec spec;
  spec.arch = "qwen3moe";
  spec.qk_norm = true;
  spec.head_dim = 8;  // q: 2 heads x 8 = 16 rows over dim 8
  spec.experts = 4;
  spec.experts_used = 2;
  spec.expert_ffn = 8;
  return spec;
}

// A qwen3moe file: the configuration from its keys, q/k norms, the router, and each expert a
// slice of its 3-D tensors (expert e's rows at e x rows-per-expert), read in place.
TEST(GgufLoaderTest, Qwen3MoeLoadsNormsRouterAndExpertSlices) {
  const TinySpec spec = TinyQwen3Moe();
  TinyFile tf = BuildTiny(spec);
  const Bytes bytes = tf.writer.Serialize();
  const Model m = internal::LoadGgufModelFromBytes(bytes, "q.gguf");
  const ModelConfig& c = m.config;
  EXPECT_EQ(c.architecture, Architecture::kQwen3Moe);
  EXPECT_EQ(c.rope_style, RopeStyle::kNeox);
  EXPECT_TRUE(c.has_qk_norm);
  EXPECT_FALSE(c.has_qkv_bias);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.q_dim(), 16);
  EXPECT_EQ(c.num_experts, 4);
  EXPECT_EQ(c.num_experts_used, 2);
  EXPECT_EQ(c.expert_ffn_dim, 8);
  const LayerWeights& lw = m.weights->layers[0];
  ASSERT_NE(lw.q_norm, nullptr);
  EXPECT_EQ(lw.q_norm[3], tf.values["blk.0.attn_q_norm.weight"][3]);
  EXPECT_EQ(lw.k_norm[5], tf.values["blk.0.attn_k_norm.weight"][5]);
  EXPECT_TRUE(lw.w_gate_up.empty());
  EXPECT_EQ(lw.router.rows, 4);
  ASSERT_EQ(lw.expert_gate_up.size(), 4U);
  ASSERT_EQ(lw.expert_down.size(), 4U);
  const std::size_t dim = 8;
  const std::size_t ffe = 8;
  for (std::size_t e = 0; e < 4; ++e) {
    const std::vector<float> gu = DequantizeRows(lw.expert_gate_up[e], 0, 16);
    EXPECT_EQ(gu[1], tf.values["blk.0.ffn_gate_exps.weight"][e * ffe * dim + 1]) << e;
    EXPECT_EQ(gu[ffe * dim + 2], tf.values["blk.0.ffn_up_exps.weight"][e * ffe * dim + 2]) << e;
    const std::vector<float> down = DequantizeRows(lw.expert_down[e], 0, 8);
    EXPECT_EQ(down[9], tf.values["blk.0.ffn_down_exps.weight"][e * dim * ffe + 9]) << e;
  }
  // A qwen3 file (dense) loads with its norms and without experts.
  TinySpec dense = TinyQwen3Moe();
  dense.arch = "qwen3";
  dense.experts = 0;
  TinyFile df = BuildTiny(dense);
  const Model d = internal::LoadGgufModelFromBytes(df.writer.Serialize(), "d.gguf");
  EXPECT_EQ(d.config.architecture, Architecture::kQwen3);
  EXPECT_TRUE(d.config.has_qk_norm);
  EXPECT_FALSE(d.config.is_moe());
}

// What qwen3moe files may say about their experts: llama.cpp's qwen3moe values are accepted, the
// others refused by name.
TEST(GgufSchemaTest, Qwen3MoeExpertKeysAcceptedAndRefused) {
  {
    TinyFile tf = BuildTiny(TinyQwen3Moe());
    tf.writer.SetBool("qwen3moe.expert_weights_norm", true);
    tf.writer.SetUint32("qwen3moe.expert_gating_func", 1);
    tf.writer.SetFloat32("qwen3moe.expert_weights_scale", 1.0f);
    tf.writer.SetUint32("qwen3moe.expert_shared_count", 0);
    tf.writer.SetUint32("qwen3moe.expert_group_count", 0);
    EXPECT_EQ(ModelErrorOf(tf.writer.Serialize()), "");
  }
  const Refusal refusals[] = {
      {"qwen3moe.expert_weights_norm",
       [](TinyFile& f) { f.writer.SetBool("qwen3moe.expert_weights_norm", false); }},
      {"qwen3moe.expert_gating_func",
       [](TinyFile& f) { f.writer.SetUint32("qwen3moe.expert_gating_func", 2); }},
      {"qwen3moe.expert_weights_scale",
       [](TinyFile& f) { f.writer.SetFloat32("qwen3moe.expert_weights_scale", 2.5f); }},
      {"qwen3moe.expert_shared_count",
       [](TinyFile& f) { f.writer.SetUint32("qwen3moe.expert_shared_count", 1); }},
      {"qwen3moe.expert_group_count",
       [](TinyFile& f) { f.writer.SetUint32("qwen3moe.expert_group_count", 2); }},
      {"blk.0.ffn_gate_shexp.weight",
       [](TinyFile& f) {
         f.writer.AddTensor("blk.0.ffn_gate_shexp.weight", {8, 2}, GgmlType::kF32,
                            std::vector<float>(16, 0.0f));
       }},
  };
  for (const Refusal& r : refusals) {
    TinyFile tf = BuildTiny(TinyQwen3Moe());
    r.damage(tf);
    const Bytes bytes = tf.writer.Serialize();
    EXPECT_NE(ModelErrorOf(bytes).find(std::string("'") + r.what + "'"), std::string::npos)
        << r.what;
    const GgufFile g(bytes, "x.gguf");
    const ModelConfig c = internal::ReadGgufConfig(g);
    const std::vector<std::string> listed = internal::UnsupportedInGguf(g, &c);
    ASSERT_EQ(listed.size(), 1U) << r.what;
    EXPECT_NE(listed[0].find(r.what), std::string::npos) << listed[0];
  }
  // Experts in a dense architecture's namespace stay refused.
  TinySpec dense = TinyQwen3Moe();
  dense.arch = "qwen3";
  dense.experts = 0;
  TinyFile tf = BuildTiny(dense);
  tf.writer.SetUint32("qwen3.expert_count", 8);
  EXPECT_NE(ModelErrorOf(tf.writer.Serialize()).find("'qwen3.expert_count'"), std::string::npos);
}

TEST(GgufSchemaTest, EveryRuleIsUnderAKnownNamespace) {
  for (const internal::GgufKeyRule& r : internal::GgufKeyRules()) {
    const std::string_view k = r.key;
    EXPECT_TRUE(k.starts_with("{arch}.") || k.starts_with("tokenizer.") ||
                k.starts_with("general."))
        << k;
    EXPECT_FALSE(r.meaning.empty()) << k;
  }
}

}  // namespace
}  // namespace metronome::model
