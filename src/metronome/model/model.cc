#include "metronome/model/model.h"

#include <array>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>

#include "metronome/base/enum_names.h"
#include "metronome/base/mapped_file.h"
#include "metronome/model/model_config_json.h"

namespace metronome::model {
namespace {

constexpr char kSyntheticPrefix[] = "synthetic:";

// Through MappedFile, like every model read: a FIFO or a device is refused before open() could
// block on it. (The mapping is lazy: only the first page is touched.)
bool HasGgufMagic(const std::string& path) {
  const MappedFile file(path);
  const auto bytes = file.bytes();
  return bytes.size() >= 4 && bytes[0] == 'G' && bytes[1] == 'G' && bytes[2] == 'U' &&
         bytes[3] == 'F';
}

}  // namespace

ModelFormat DetectModelFormat(const std::string& spec) {
  if (spec.starts_with(kSyntheticPrefix)) return ModelFormat::kSynthetic;
  if (spec.ends_with(".gguf") || HasGgufMagic(spec)) return ModelFormat::kGguf;
  return ModelFormat::kLlama2c;
}

const char* ToString(ModelFormat format) {
  static constexpr std::array<EnumName<ModelFormat>, 3> kNames = {
      {{ModelFormat::kSynthetic, "synthetic"},
       {ModelFormat::kGguf, "gguf"},
       {ModelFormat::kLlama2c, "llama2.c"}}};
  return NameOf(kNames, format, "?");
}

Model LoadModel(const std::string& spec, const std::string& tokenizer_path) {
  Model m;
  switch (DetectModelFormat(spec)) {
    case ModelFormat::kSynthetic:
      m = MakeSyntheticModel(spec.substr(sizeof(kSyntheticPrefix) - 1));
      break;
    case ModelFormat::kGguf:
      m = LoadGgufModel(spec);
      break;
    case ModelFormat::kLlama2c:
      return LoadLlama2cModel(spec, tokenizer_path);
  }
  // An explicit tokenizer file replaces the built-in vocabulary.
  if (!tokenizer_path.empty()) {
    m.tokenizer = LoadLlama2cTokenizer(tokenizer_path, m.config.vocab_size);
  }
  return m;
}

namespace {

// FNV-1a, 64 bits: an identity, not a defence against forgery (the cluster secret is that).
class IdentityHash {
 public:
  void Add(std::span<const std::byte> bytes) {
    for (const std::byte b : bytes) {
      hash_ = (hash_ ^ static_cast<std::uint64_t>(b)) * 0x100000001b3ULL;
    }
  }
  void Add(std::string_view s) { Add(std::as_bytes(std::span<const char>(s.data(), s.size()))); }
  template <typename T>
  void AddValue(const T& v) {
    Add(std::as_bytes(std::span<const T>(&v, 1)));
  }
  // The first and the last row of `w`, dequantised.
  void AddRows(const quant::WeightMatrix& w) {
    if (w.rows <= 0) return;
    for (const int r : {0, w.rows - 1}) {
      const std::vector<float> row = DequantizeRows(w, r, 1);
      Add(std::as_bytes(std::span<const float>(row)));
    }
  }
  [[nodiscard]] std::uint64_t value() const { return hash_; }

 private:
  std::uint64_t hash_ = 0xcbf29ce484222325ULL;
};

}  // namespace

std::string ModelIdentity(const Model& model) {
  const ModelConfig& c = model.config;
  IdentityHash h;
  h.Add(nlohmann::json(c).dump());
  h.AddValue(c.architecture);
  h.AddValue(c.rotary_dim());
  h.AddValue(c.rope_style);
  h.AddValue(c.rope_scaling);
  h.AddValue(c.rope_scaling_factor);
  h.AddValue(c.yarn_original_context());
  h.AddValue(c.yarn_beta_fast);
  h.AddValue(c.yarn_beta_slow);
  h.AddValue(c.rope_attn_factor);
  h.Add(std::as_bytes(std::span<const float>(c.rope_freq_factors)));
  h.AddValue(c.has_qkv_bias);
  if (model.weights != nullptr) {
    const ModelWeights& w = *model.weights;
    h.AddRows(w.token_embedding);
    for (const LayerWeights& layer : w.layers) h.AddRows(layer.wo);
    if (!c.tied_embeddings) h.AddRows(w.output);
  }
  char hex[24];
  std::snprintf(hex, sizeof hex, "m-%016llx", static_cast<unsigned long long>(h.value()));
  return hex;
}

}  // namespace metronome::model
