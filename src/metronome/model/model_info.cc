#include "metronome/model/model_info.h"

#include <algorithm>
#include <bit>
#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "metronome/base/errors.h"
#include "metronome/base/mapped_file.h"
#include "metronome/model/chat_template.h"
#include "metronome/model/gguf.h"
#include "metronome/model/internal/gguf_loader.h"
#include "metronome/model/internal/gguf_schema.h"
#include "metronome/model/internal/gguf_tensors.h"
#include "metronome/quant/codec.h"

namespace metronome::model {
namespace {

void DescribeTokenizer(const Tokenizer* t, ModelInfo* info) {
  const auto special = [&](const char* role, TokenId id) {
    info->special_tokens.push_back(
        {role, id, t != nullptr && id >= 0 ? std::string(t->Piece(id)) : std::string()});
  };
  if (t != nullptr) {
    info->tokenizer_kind = std::string(t->kind());
    info->vocab_size = t->vocab_size();
    info->adds_bos = t->adds_bos();
    info->adds_eos = t->adds_eos();
    const std::string& tmpl = t->vocabulary().chat_template;
    if (!tmpl.empty()) {
      const std::optional<ChatFormat> f = RecognizeChatTemplate(tmpl);
      info->chat_format = !f ? "unrecognised" : (*f == ChatFormat::kChatMl ? "chatml" : "llama3");
    }
    if (t->ggml_model() == "gpt2") {
      info->pre_tokenizer = std::string(PreTokenizerName(t->vocabulary().pre));
    }
  }
  special("bos", t != nullptr ? t->bos_id() : -1);
  special("eos", t != nullptr ? t->eos_id() : -1);
  special("unk", t != nullptr ? t->unk_id() : -1);
  special("pad", t != nullptr ? t->pad_id() : -1);
}

ModelInfo DescribeGguf(const std::string& path, const std::string& tokenizer_path) {
  const MappedFile file(path);
  const GgufFile g(file.bytes(), path);
  ModelInfo info;
  info.format = ModelFormat::kGguf;
  info.gguf_version = g.version();
  info.metadata_entries = g.metadata().size();
  if (const GgufValue* arch = g.Find("general.architecture")) {
    if (const auto* s = std::get_if<std::string>(arch)) info.architecture = *s;
  }
  for (const GgufTensorInfo& t : g.tensors()) {
    info.tensors.push_back({t.name, t.type, t.shape, t.data.size(),
                            static_cast<std::uint64_t>(t.data.data() - file.bytes().data())});
    info.tensor_bytes += t.data.size();
  }
  std::unique_ptr<Tokenizer> tokenizer;
  try {
    info.config = internal::ReadGgufConfig(g);
    tokenizer = tokenizer_path.empty()
                    ? internal::ReadGgufTokenizer(g, *info.config)
                    : LoadLlama2cTokenizer(tokenizer_path, info.config->vocab_size);
  } catch (const LoadError& e) {
    info.config_error = e.what();
  }
  info.unsupported = internal::UnsupportedInGguf(g, info.config ? &*info.config : nullptr);
  DescribeTokenizer(tokenizer.get(), &info);
  if (info.config && info.vocab_size == 0) info.vocab_size = info.config->vocab_size;
  return info;
}

// Counts the non-finite values of one tensor, fed in order a span of decoded values at a time.
class FiniteScan {
 public:
  void Add(std::span<const float> values) {
    constexpr std::uint32_t kExponent = 0x7f800000u;  // all ones: NaN or infinite
    for (std::size_t i = 0; i < values.size(); ++i) {
      if ((std::bit_cast<std::uint32_t>(values[i]) & kExponent) == kExponent) {
        if (count_ == 0) first_ = seen_ + i;
        ++count_;
      }
    }
    seen_ += values.size();
  }
  // Records the tensor in `check` (and its elements), under `name`.
  void Finish(const std::string& name, WeightCheck* check) const {
    ++check->tensors_checked;
    check->elements_checked += seen_;
    if (count_ > 0) check->non_finite.push_back({name, count_, first_});
  }

 private:
  std::uint64_t seen_ = 0;
  std::uint64_t count_ = 0;
  std::uint64_t first_ = 0;
};

WeightCheck CheckGguf(const std::string& path) {
  const MappedFile file(path);
  const GgufFile g(file.bytes(), path);
  WeightCheck check;
  // Blocks decoded per call: a few KiB of fp32, whatever the tensor's size.
  constexpr std::uint64_t kChunkElems = 8192;
  std::vector<float> buf(kChunkElems);
  for (const GgufTensorInfo& t : g.tensors()) {
    const quant::GgmlTypeTraits& traits = quant::Traits(t.type);
    if (!traits.computable) {
      check.unchecked.push_back(t.name + " (" + std::string(traits.name) + ")");
      continue;
    }
    // The parser validated that data holds num_elements() in whole blocks of the type.
    const std::uint64_t n = t.num_elements();
    const std::uint64_t chunk = kChunkElems / traits.block_elems * traits.block_elems;
    FiniteScan scan;
    for (std::uint64_t begin = 0; begin < n; begin += chunk) {
      const std::uint64_t len = std::min(chunk, n - begin);
      const std::uint8_t* blocks = t.data.data() + begin / traits.block_elems * traits.block_bytes;
      quant::DequantizeRow(t.type, blocks, static_cast<std::int64_t>(len), buf.data());
      scan.Add({buf.data(), static_cast<std::size_t>(len)});
    }
    scan.Finish(t.name, &check);
  }
  return check;
}

void CheckMatrix(const std::string& name, const quant::WeightMatrix& w, WeightCheck* check) {
  FiniteScan scan;
  for (int r = 0; r < w.rows; ++r) scan.Add(DequantizeRows(w, r, 1));
  scan.Finish(name, check);
}

void CheckGroup(const std::string& name, const MatrixGroup& group, WeightCheck* check) {
  FiniteScan scan;
  for (int r = 0; r < GroupRows(group); ++r) scan.Add(DequantizeRows(group, r, 1));
  scan.Finish(name, check);
}

void CheckVector(const std::string& name, const float* v, int n, WeightCheck* check) {
  if (v == nullptr) return;
  FiniteScan scan;
  scan.Add({v, static_cast<std::size_t>(n)});
  scan.Finish(name, check);
}

}  // namespace

WeightCheck CheckWeights(const std::string& spec, const std::string& tokenizer_path) {
  if (DetectModelFormat(spec) == ModelFormat::kGguf) return CheckGguf(spec);
  const Model m = LoadModel(spec, tokenizer_path);
  const ModelConfig& c = m.config;
  const ModelWeights& w = *m.weights;
  WeightCheck check;
  CheckMatrix("token_embd.weight", w.token_embedding, &check);
  for (std::size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& lw = w.layers[l];
    const std::string blk = "blk." + std::to_string(l) + ".";
    CheckVector(blk + "attn_norm.weight", lw.attn_norm, c.dim, &check);
    CheckGroup(blk + "attn_qkv", lw.wqkv, &check);
    CheckVector(blk + "attn_qkv.bias", lw.bqkv, GroupRows(lw.wqkv), &check);
    CheckMatrix(blk + "attn_output.weight", lw.wo, &check);
    CheckVector(blk + "ffn_norm.weight", lw.ffn_norm, c.dim, &check);
    CheckVector(blk + "attn_q_norm.weight", lw.q_norm, c.head_dim, &check);
    CheckVector(blk + "attn_k_norm.weight", lw.k_norm, c.head_dim, &check);
    CheckGroup(blk + "ffn_gate_up", lw.w_gate_up, &check);
    CheckMatrix(blk + "ffn_down.weight", lw.w_down, &check);
    CheckMatrix(blk + "ffn_gate_inp.weight", lw.router, &check);
    for (std::size_t e = 0; e < lw.expert_gate_up.size(); ++e) {
      const std::string expert = blk + "expert." + std::to_string(e) + ".";
      CheckGroup(expert + "ffn_gate_up", lw.expert_gate_up[e], &check);
      CheckMatrix(expert + "ffn_down", lw.expert_down[e], &check);
    }
  }
  CheckVector("output_norm.weight", w.final_norm, c.dim, &check);
  if (!c.tied_embeddings) CheckMatrix("output.weight", w.output, &check);
  return check;
}

ModelInfo DescribeModel(const std::string& spec, const std::string& tokenizer_path) {
  const ModelFormat format = DetectModelFormat(spec);
  if (format == ModelFormat::kGguf) return DescribeGguf(spec, tokenizer_path);
  const Model m = LoadModel(spec, tokenizer_path);
  ModelInfo info;
  info.format = format;
  info.architecture = ArchitectureName(m.config.architecture);
  info.config = m.config;
  for (const internal::TensorSpec& t : internal::RequiredTensors(m.config)) {
    std::uint64_t elems = 1;
    for (const std::uint64_t d : t.shape) elems *= d;
    const std::uint64_t bytes = elems * sizeof(float);
    info.tensors.push_back({t.name, quant::GgmlType::kF32, t.shape, bytes});
    info.tensor_bytes += bytes;
  }
  DescribeTokenizer(m.tokenizer.get(), &info);
  if (info.vocab_size == 0) info.vocab_size = m.config.vocab_size;
  return info;
}

std::unique_ptr<Tokenizer> LoadTokenizer(const std::string& spec,
                                         const std::string& tokenizer_path) {
  if (DetectModelFormat(spec) == ModelFormat::kGguf) {
    const MappedFile file(spec);
    const GgufFile g(file.bytes(), spec);
    const ModelConfig c = internal::ReadGgufConfig(g);
    if (!tokenizer_path.empty()) return LoadLlama2cTokenizer(tokenizer_path, c.vocab_size);
    return internal::ReadGgufTokenizer(g, c);
  }
  Model m = LoadModel(spec, tokenizer_path);
  return std::move(m.tokenizer);
}

}  // namespace metronome::model
