// metronome tokenize: the token ids of a text under a model's tokenizer, as llama.cpp tokenizes a
// plain text: BOS per the model's convention (Tokenizer::adds_bos) unless --no-bos, EOS appended
// when the file asks for it (Tokenizer::adds_eos), control tokens never produced from the text.
#include <cstdio>
#include <memory>
#include <string>

#include "metronome/base/errors.h"
#include "metronome/cli/commands.h"
#include "metronome/cli/common.h"
#include "metronome/model/model_info.h"

namespace metronome::cli {
namespace {

struct TokenizeFlags {
  ModelFlags model;
  std::string text;
  bool no_bos = false;
  bool show_pieces = false;
  void Register(CLI::App* sub);
};

void TokenizeFlags::Register(CLI::App* sub) {
  model.Register(sub, true);
  sub->add_option("--text", text, "Text to tokenize")->required();
  sub->add_flag("--no-bos", no_bos, "Never prepend BOS");
  sub->add_flag("--show-pieces", show_pieces,
                "Print one token a line: id, a tab, its spelling in the vocabulary");
}

int RunTokenize(const TokenizeFlags& f) {
  const std::unique_ptr<model::Tokenizer> tokenizer =
      model::LoadTokenizer(f.model.model, f.model.tokenizer);
  if (tokenizer == nullptr) {
    throw ConfigError("--model " + f.model.model +
                      " has no tokenizer (a llama2.c checkpoint needs --tokenizer)");
  }
  const bool add_bos = tokenizer->adds_bos() && !f.no_bos;
  std::vector<TokenId> ids = tokenizer->Encode(f.text, add_bos);
  if (tokenizer->adds_eos()) ids.push_back(tokenizer->eos_id());
  if (f.show_pieces) {
    // One token a line: id, then its vocabulary spelling.
    for (const TokenId id : ids) {
      const std::string piece(tokenizer->Piece(id));
      std::printf("%d\t%s\n", id, piece.c_str());
    }
  } else {
    for (std::size_t i = 0; i < ids.size(); ++i) std::printf(i == 0 ? "%d" : " %d", ids[i]);
    std::printf("\n");
  }
  std::fprintf(stderr, "[tokenize] %zu tokens (%s, BOS %s%s)\n", ids.size(),
               std::string(tokenizer->kind()).c_str(), add_bos ? "prepended" : "not prepended",
               tokenizer->adds_eos() ? ", EOS appended" : "");
  return 0;
}

}  // namespace

const AddCommandFlags kAddTokenizeFlags = &AddFlagsAndRun<TokenizeFlags, RunTokenize>;

}  // namespace metronome::cli
