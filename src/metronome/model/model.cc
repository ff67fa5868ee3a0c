#include "metronome/model/model.h"

#include <fstream>
#include <string>

namespace metronome::model {
namespace {

constexpr char kSyntheticPrefix[] = "synthetic:";

bool HasGgufMagic(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, sizeof(magic)) && std::string(magic, sizeof(magic)) == "GGUF";
}

}  // namespace

Model LoadModel(const std::string& spec, const std::string& tokenizer_path) {
  Model m;
  if (spec.starts_with(kSyntheticPrefix)) {
    m = MakeSyntheticModel(spec.substr(sizeof(kSyntheticPrefix) - 1));
  } else if (spec.ends_with(".gguf") || HasGgufMagic(spec)) {
    m = LoadGgufModel(spec);
  } else {
    return LoadLlama2cModel(spec, tokenizer_path);
  }
  // An explicit tokenizer file replaces the built-in vocabulary.
  if (!tokenizer_path.empty()) {
    m.tokenizer = LoadLlama2cTokenizer(tokenizer_path, m.config.vocab_size);
  }
  return m;
}

}  // namespace metronome::model
