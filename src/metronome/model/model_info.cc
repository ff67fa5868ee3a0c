#include "metronome/model/model_info.h"

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
    info.tensors.push_back({t.name, t.type, t.shape, t.data.size()});
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

}  // namespace

ModelInfo DescribeModel(const std::string& spec, const std::string& tokenizer_path) {
  const ModelFormat format = DetectModelFormat(spec);
  if (format == ModelFormat::kGguf) return DescribeGguf(spec, tokenizer_path);
  const Model m = LoadModel(spec, tokenizer_path);
  ModelInfo info;
  info.format = format;
  info.architecture = m.config.architecture == Architecture::kQwen2 ? "qwen2" : "llama";
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
