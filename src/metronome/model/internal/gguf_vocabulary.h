// What the tokenizer implementations share about a GGUF vocabulary (internal to model/): the
// tokenizer.ggml.token_type values, SentencePiece's space marker, and the transparent string hash
// their piece -> id maps use (lookups by string_view without a copy).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>

namespace metronome::model::internal {

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
inline constexpr std::int32_t kTypeNormal = 1;
inline constexpr std::int32_t kTypeUnknown = 2;
inline constexpr std::int32_t kTypeControl = 3;
inline constexpr std::int32_t kTypeUserDefined = 4;
inline constexpr std::int32_t kTypeUnused = 5;
inline constexpr std::int32_t kTypeByte = 6;

inline constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";  // U+2581, SentencePiece's space

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept {
    return std::hash<std::string_view>{}(s);
  }
};

}  // namespace metronome::model::internal
