#include "metronome/model/model.h"

#include <array>
#include <string>

#include "metronome/base/enum_names.h"
#include "metronome/base/mapped_file.h"

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

}  // namespace metronome::model
