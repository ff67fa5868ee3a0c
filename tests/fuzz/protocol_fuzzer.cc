// libFuzzer target for the wire protocol (src/metronome/wire/protocol.h): the same bytes go to
// the JSON parser (as one text message) and to the binary frame parser, each under default caps
// and under tight caps with a vocabulary, so both the accept and the over_cap paths are reached.
// Every input must come back as a message or a ProtocolError; crashes, sanitizer reports, hangs
// and exceptions are bugs. Whatever parses is serialised back through the server messages too.
// Seeds: tests/fuzz/protocol_corpus (valid messages, one per file; *.bin are binary frames).
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>

#include "metronome/base/check.h"
#include "metronome/wire/protocol.h"

namespace {

using metronome::wire::ClientMessage;
using metronome::wire::ErrorMessage;
using metronome::wire::FrameRequest;
using metronome::wire::ProtocolError;
using metronome::wire::ServerCaps;

ServerCaps TightCaps() {
  ServerCaps caps;
  caps.max_tokens_per_frame = 8;
  caps.max_output_tokens_per_frame = 4;
  caps.max_window = 512;
  caps.max_sinks = 8;
  caps.allow_full_kv = false;
  caps.max_message_bytes = 4096;
  caps.max_prompt_tokens = 16;
  caps.vocab_size = 1000;
  caps.max_text_bytes = 64;
  return caps;
}

// Round-trips what parsed: an accepted binary-encodable frame must re-encode and parse to the
// same ids; every error must serialise.
void Check(const std::variant<ClientMessage, ProtocolError>& result, const ServerCaps& caps) {
  if (const auto* error = std::get_if<ProtocolError>(&result)) {
    MTR_CHECK(!ErrorMessage{*error}.Serialize().empty(), "error did not serialise");
    return;
  }
  const auto* frame = std::get_if<FrameRequest>(&std::get<ClientMessage>(result));
  if (frame == nullptr || !std::holds_alternative<metronome::wire::TokenIds>(frame->input)) {
    return;
  }
  const auto again =
      metronome::wire::ParseBinaryFrame(metronome::wire::EncodeBinaryFrame(*frame), caps);
  const auto* back = std::get_if<FrameRequest>(&again);
  MTR_CHECK(back != nullptr, "a parsed JSON frame failed as a binary frame");
  MTR_CHECK(
      back->session == frame->session && back->index == frame->index && back->input == frame->input,
      "binary round trip changed the frame");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const ServerCaps kDefault;
  static const ServerCaps kTight = TightCaps();
  // libFuzzer hands out raw bytes; both parsers take a view of them.
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  for (const ServerCaps* caps : {&kDefault, &kTight}) {
    Check(metronome::wire::ParseClientMessage(text, *caps), *caps);
    const auto binary = metronome::wire::ParseBinaryFrame(bytes, *caps);
    if (const auto* frame = std::get_if<FrameRequest>(&binary)) {
      const auto encoded = metronome::wire::EncodeBinaryFrame(*frame);
      MTR_CHECK(encoded.size() == size, "binary frame re-encoded to a different size");
    }
  }
  return 0;
}
