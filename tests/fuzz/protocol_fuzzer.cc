// libFuzzer target for the wire protocol (src/metronome/wire/protocol.h): the same bytes go to
// the JSON parser (as one text message) and to the binary frame parser, each under default caps
// and under tight caps with a vocabulary, so both the accept and the over_cap paths are reached.
// Every input must come back as a message or a ProtocolError; crashes, sanitizer reports, hangs
// and exceptions are bugs. Whatever parses is serialised back through the server messages too, and
// every parsed session.start goes through the server's resolver (server/session_start.h): it must
// come back as a valid resolved spec (SessionSpec::Validate passes, the deadline is set, the caps
// hold) or as an error that serialises.
// Seeds: tests/fuzz/protocol_corpus (valid messages, one per file; *.bin are binary frames).
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>

#include "metronome/base/check.h"
#include "metronome/server/session_start.h"
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

// A parsed start resolves to a spec within the caps, or to an error that serialises (no
// tokenizer here, so a text prompt is an error).
void CheckResolved(const metronome::wire::StartRequest& start, const ServerCaps& caps) {
  const auto resolved = metronome::server::ResolveStart(
      start,
      metronome::server::ServerSessionDefaults(/*window=*/64, /*sinks=*/4,
                                               metronome::wire::KvPositions::kAbsolute),
      caps, /*tokenizer=*/nullptr);
  if (const auto* error = std::get_if<ProtocolError>(&resolved)) {
    MTR_CHECK(!ErrorMessage{*error}.Serialize().empty(), "resolver error did not serialise");
    return;
  }
  const auto& spec = std::get<metronome::realtime::SessionSpec>(resolved);
  spec.Validate();  // throws (a fuzzer finding) for an invalid resolved spec
  MTR_CHECK(spec.deadline_ms > 0.0 && spec.deadline_ms <= caps.max_period_ms,
            "resolved deadline outside (0, max_period_ms]");
  MTR_CHECK(spec.input_tokens_per_frame <= caps.max_tokens_per_frame, "a over the cap");
  MTR_CHECK(static_cast<std::int64_t>(spec.prompt.size()) <= caps.max_prompt_tokens,
            "prompt over the cap");
  MTR_CHECK(spec.policy.mode == metronome::kv::KvMode::kWindow || caps.allow_full_kv,
            "full KV although the caps forbid it");
}

// Round-trips what parsed: an accepted binary-encodable frame must re-encode and parse to the
// same ids; every error must serialise.
void Check(const std::variant<ClientMessage, ProtocolError>& result, const ServerCaps& caps) {
  if (const auto* error = std::get_if<ProtocolError>(&result)) {
    MTR_CHECK(!ErrorMessage{*error}.Serialize().empty(), "error did not serialise");
    return;
  }
  if (const auto* start =
          std::get_if<metronome::wire::StartRequest>(&std::get<ClientMessage>(result))) {
    CheckResolved(*start, caps);
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
