#include "metronome/model/chat_template.h"

#include <cstddef>
#include <string>
#include <utility>

namespace metronome::model {
namespace {

bool Contains(std::string_view s, std::string_view needle) {
  return s.find(needle) != std::string_view::npos;
}

// ASCII whitespace off both ends (llama.cpp trims Llama 3 contents so).
std::string_view Trim(std::string_view s) {
  const auto space = [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
  };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

// The conversation as alternating text fragments and markers: a marker is a control token,
// each fragment is tokenized on its own (as llama.cpp splits text at special tokens first).
class Builder {
 public:
  explicit Builder(const Tokenizer& t) : t_(t) {}

  void Text(std::string_view s) { fragment_ += s; }
  void Marker(std::string_view spelling) {
    Flush();
    const TokenId id = Find(spelling);
    if (id < 0) {
      if (error_.empty()) {
        error_ = "the vocabulary has no token '" + std::string(spelling) + "' its template needs";
      }
      return;
    }
    ids_.push_back(id);
  }
  ChatEncoding Finish() {
    Flush();
    if (!error_.empty()) return {{}, error_};
    return {std::move(ids_), {}};
  }

 private:
  void Flush() {
    if (fragment_.empty()) return;
    const std::vector<TokenId> part = t_.Encode(fragment_, /*add_bos=*/false);
    ids_.insert(ids_.end(), part.begin(), part.end());
    fragment_.clear();
  }
  [[nodiscard]] TokenId Find(std::string_view spelling) const {
    const std::vector<std::string>& tokens = t_.vocabulary().tokens;
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] == spelling) return static_cast<TokenId>(i);
    }
    return -1;
  }

  const Tokenizer& t_;
  std::vector<TokenId> ids_;
  std::string fragment_;
  std::string error_;
};

}  // namespace

std::optional<ChatFormat> RecognizeChatTemplate(std::string_view chat_template) {
  if (Contains(chat_template, "<|im_start|>")) {
    if (Contains(chat_template, "<|im_sep|>") || Contains(chat_template, "<end_of_utterance>")) {
      return std::nullopt;  // Phi-4 and SmolVLM use the marker in other formats
    }
    return ChatFormat::kChatMl;
  }
  if (Contains(chat_template, "<|start_header_id|>") &&
      Contains(chat_template, "<|end_header_id|>")) {
    return ChatFormat::kLlama3;
  }
  return std::nullopt;
}

ChatEncoding EncodeChat(const Tokenizer& tokenizer, std::span<const ChatMessage> messages) {
  const std::string& tmpl = tokenizer.vocabulary().chat_template;
  if (tmpl.empty()) return {{}, "the model file has no chat template (tokenizer.chat_template)"};
  const std::optional<ChatFormat> format = RecognizeChatTemplate(tmpl);
  if (!format) {
    return {{},
            "the model's chat template is not a format this engine implements (ChatML, Llama 3)"};
  }
  for (std::size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role.empty()) {
      return {{}, "message " + std::to_string(i) + " has an empty role"};
    }
  }
  Builder b(tokenizer);
  if (*format == ChatFormat::kChatMl) {
    for (const ChatMessage& m : messages) {
      b.Marker("<|im_start|>");
      b.Text(m.role);
      b.Text("\n");
      b.Text(m.content);
      b.Marker("<|im_end|>");
      b.Text("\n");
    }
    b.Marker("<|im_start|>");
    b.Text("assistant\n");
  } else {
    for (const ChatMessage& m : messages) {
      b.Marker("<|start_header_id|>");
      b.Text(m.role);
      b.Marker("<|end_header_id|>");
      b.Text("\n\n");
      b.Text(Trim(m.content));
      b.Marker("<|eot_id|>");
    }
    b.Marker("<|start_header_id|>");
    b.Text("assistant");
    b.Marker("<|end_header_id|>");
    b.Text("\n\n");
  }
  ChatEncoding out = b.Finish();
  if (out.error.empty() && tokenizer.adds_bos()) {
    out.ids.insert(out.ids.begin(), tokenizer.bos_id());
  }
  return out;
}

}  // namespace metronome::model
