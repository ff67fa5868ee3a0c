// metronome tokenize: the token ids of a text under a model's tokenizer, as llama.cpp tokenizes a
// plain text: BOS per the model's convention (Tokenizer::adds_bos) unless --no-bos, EOS appended
// when the file asks for it (Tokenizer::adds_eos), control tokens never produced from the text.
// With --chat: the prompt a session.start's prompt.messages becomes (model::EncodeChat).
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "metronome/base/errors.h"
#include "metronome/cli/commands.h"
#include "metronome/cli/common.h"
#include "metronome/model/chat_template.h"
#include "metronome/model/model_info.h"

namespace metronome::cli {
namespace {

struct TokenizeFlags {
  ModelFlags model;
  std::optional<std::string> text;
  std::optional<std::string> chat;
  bool no_bos = false;
  bool show_pieces = false;
  void Register(CLI::App* sub);
};

void TokenizeFlags::Register(CLI::App* sub) {
  model.Register(sub, true);
  auto* text_opt = sub->add_option("--text", text, "Text to tokenize");
  auto* chat_opt = sub->add_option(
      "--chat", chat,
      "A chat as JSON, [{\"role\": ..., \"content\": ...}, ...]: the prompt the server makes "
      "of it with the model's chat template (session.start prompt.messages)");
  text_opt->excludes(chat_opt);
  chat_opt->excludes(text_opt);
  sub->add_flag("--no-bos", no_bos, "Never prepend BOS");
  sub->add_flag("--show-pieces", show_pieces,
                "Print one token a line: id, a tab, its spelling in the vocabulary");
}

// --chat's JSON: an array of {"role": string, "content": string}.
std::vector<model::ChatMessage> ParseChat(const std::string& json_text) {
  const nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_array()) throw ConfigError("--chat: not a JSON array of {role, content} objects");
  std::vector<model::ChatMessage> out;
  for (std::size_t i = 0; i < j.size(); ++i) {
    const nlohmann::json& m = j[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
        !m["content"].is_string()) {
      throw ConfigError("--chat: element " + std::to_string(i) +
                        " is not {\"role\": string, \"content\": string}");
    }
    out.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  return out;
}

int RunTokenize(const TokenizeFlags& f) {
  const std::unique_ptr<model::Tokenizer> tokenizer =
      model::LoadTokenizer(f.model.model, f.model.tokenizer);
  if (tokenizer == nullptr) {
    throw ConfigError("--model " + f.model.model +
                      " has no tokenizer (a llama2.c checkpoint needs --tokenizer)");
  }
  if (f.text.has_value() == f.chat.has_value()) throw ConfigError("give one of --text and --chat");
  const bool add_bos = tokenizer->adds_bos() && !f.no_bos;
  std::vector<TokenId> ids;
  if (f.chat) {
    const std::vector<model::ChatMessage> messages = ParseChat(*f.chat);
    model::ChatEncoding chat = model::EncodeChat(*tokenizer, messages);
    if (!chat.error.empty()) throw ConfigError("--chat: " + chat.error);
    ids = std::move(chat.ids);
    if (f.no_bos && tokenizer->adds_bos() && !ids.empty()) ids.erase(ids.begin());
  } else {
    ids = tokenizer->Encode(*f.text, add_bos);
    if (tokenizer->adds_eos()) ids.push_back(tokenizer->eos_id());
  }
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
