// Chat prompts: role + content messages formatted with the model file's chat template into token
// ids. The engine does not run Jinja: it recognises a template as one of the formats below the way
// llama.cpp's built-in (non-Jinja) chat formats do, and formats the messages as those do; any other
// template (or none) is refused, never guessed at.
//   ChatML (Qwen): the template contains <|im_start|> (and not Phi-4's <|im_sep|> nor SmolVLM's
//     <end_of_utterance>): "<|im_start|>{role}\n{content}<|im_end|>\n" per message, then
//     "<|im_start|>assistant\n".
//   Llama 3: the template contains <|start_header_id|> and <|end_header_id|>:
//     "<|start_header_id|>{role}<|end_header_id|>\n\n{content, trimmed}<|eot_id|>" per message,
//     then "<|start_header_id|>assistant<|end_header_id|>\n\n".
// Like llama.cpp's built-in formats these add nothing a Jinja template might compute on its own
// (Qwen2.5's default system message, Llama 3.1's date header). The markers become their control
// tokens; the text between them is tokenized as plain text (so a message cannot forge a marker),
// and BOS is prepended when the tokenizer prepends it to prompts.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "metronome/base/types.h"
#include "metronome/model/tokenizer.h"

namespace metronome::model {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", ...
  std::string content;
};

enum class ChatFormat : std::uint8_t { kChatMl, kLlama3 };

// The format of a GGUF tokenizer.chat_template; nullopt when it is none of the above.
[[nodiscard]] std::optional<ChatFormat> RecognizeChatTemplate(std::string_view chat_template);

// The conversation as prompt token ids, or why it cannot be formatted (`error` non-empty: the
// tokenizer has no chat template, an unrecognised one, or lacks a marker token; a message with
// an empty role).
struct ChatEncoding {
  std::vector<TokenId> ids;
  std::string error;
};
[[nodiscard]] ChatEncoding EncodeChat(const Tokenizer& tokenizer,
                                      std::span<const ChatMessage> messages);

}  // namespace metronome::model
