#include "metronome/wire/protocol.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <exception>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>

#include "metronome/base/check.h"

namespace metronome::wire {
namespace {

using Json = nlohmann::json;
// Output keeps insertion order so "type" comes first in every server message.
using OutJson = nlohmann::ordered_json;

constexpr std::array<std::string_view, kNumErrorCodes> kErrorNames = {
    "bad_json",          "too_large",    "unknown_type",    "unknown_field",      "missing_field",
    "bad_field",         "over_cap",     "unknown_session", "token_out_of_range", "frame_too_early",
    "too_many_sessions", "unauthorized", "internal",        "session_moving",
};

// Strings longer than this (bytes) are cut when an error message quotes them, so an error never
// echoes a megabyte back.
constexpr std::size_t kMaxQuotedBytes = 40;
// The longest error text taken from the JSON parser (it quotes the token it stopped at).
constexpr std::size_t kMaxParserMessageBytes = 200;
// Floats with an integer value are accepted where integers are required (Python writes 5.0),
// but only up to 2^53, where every integer is exact.
constexpr double kMaxExactInteger = 9007199254740992.0;  // 2^53

// The byte offset of the first invalid UTF-8 sequence (overlong forms, surrogates and code points
// above U+10FFFF are invalid), or npos when `s` is valid.
std::size_t FindInvalidUtf8(std::string_view s) {
  const std::size_t n = s.size();
  std::size_t i = 0;
  while (i < n) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len = 0;
    unsigned char lo = 0x80;  // allowed range of the second byte
    unsigned char hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c == 0xE0) {
      len = 3;
      lo = 0xA0;  // no overlong 3-byte forms
    } else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
      len = 3;
    } else if (c == 0xED) {
      len = 3;
      hi = 0x9F;  // no surrogates
    } else if (c == 0xF0) {
      len = 4;
      lo = 0x90;  // no overlong 4-byte forms
    } else if (c >= 0xF1 && c <= 0xF3) {
      len = 4;
    } else if (c == 0xF4) {
      len = 4;
      hi = 0x8F;  // nothing above U+10FFFF
    } else {
      return i;
    }
    if (n - i < len) return i;
    const auto b1 = static_cast<unsigned char>(s[i + 1]);
    if (b1 < lo || b1 > hi) return i;
    for (std::size_t k = 2; k < len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if (b < 0x80 || b > 0xBF) return i;
    }
    i += len;
  }
  return std::string_view::npos;
}

// The longest prefix of valid UTF-8 `s` with at most `max_bytes` bytes that ends on a character
// boundary.
std::string_view CutUtf8(std::string_view s, std::size_t max_bytes) {
  if (s.size() <= max_bytes) return s;
  std::size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return s.substr(0, cut);
}

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

// A value as an error message shows it: scalars as JSON (long strings cut), containers by kind.
std::string Describe(const Json& v) {
  if (v.is_string()) {
    const auto& s = v.get_ref<const std::string&>();
    if (s.size() <= kMaxQuotedBytes) return Dump(v);
    return Dump(Json(std::string(CutUtf8(s, kMaxQuotedBytes)))) + "... (" +
           std::to_string(s.size()) + " bytes)";
  }
  if (v.is_array()) return "an array of " + std::to_string(v.size());
  if (v.is_object()) return "an object";
  return Dump(v);
}

// Shortest text that reads back as `x` ("10", "12.5").
std::string FormatNumber(double x) {
  std::array<char, 32> buf{};
  const auto [end, ec] = std::to_chars(buf.data(), buf.data() + buf.size(), x);
  if (ec != std::errc()) return "?";
  return {buf.data(), end};
}

// Field lookup without copying the key.
const Json* Find(const Json& object, std::string_view key) {
  const auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

std::string JoinNames(std::span<const std::string_view> names) {
  std::string out;
  for (const auto name : names) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

// Reads fields of one message, and on the first problem records a ProtocolError (every method
// returns false then; the caller returns at once). Context fields (session, frame, client_ref)
// are set on error() by the parsers as soon as they are read.
class Reader {
 public:
  explicit Reader(std::string_view type) : type_(type) {}

  ProtocolError& error() { return error_; }
  ProtocolError TakeError() { return std::move(error_); }

  bool Fail(ErrorCode code, std::string_view detail) {
    error_.code = code;
    error_.message.assign(type_).append(": ").append(detail);
    return false;
  }
  bool FailValue(ErrorCode code, std::string_view path, const Json& v, std::string_view what) {
    return Fail(code, std::string(path) + " = " + Describe(v) + " " + std::string(what));
  }
  bool Missing(std::string_view path) {
    return Fail(ErrorCode::kMissingField, std::string(path) + " is required");
  }

  // Every key of `object` is one of `allowed` (a typo is an error, not a silent default).
  bool OnlyKnownFields(const Json& object, std::string_view prefix,
                       std::span<const std::string_view> allowed) {
    for (const auto& [key, value] : object.items()) {
      bool known = false;
      for (const auto name : allowed) known = known || key == name;
      if (!known) {
        return Fail(
            ErrorCode::kUnknownField,
            "unknown field " +
                Dump(Json(std::string(prefix) + std::string(CutUtf8(key, kMaxQuotedBytes)))) +
                " (fields: " + JoinNames(allowed) + ")");
      }
    }
    return true;
  }

  bool Object(const Json& v, std::string_view path) {
    return v.is_object() || FailValue(ErrorCode::kBadField, path, v, "must be an object");
  }

  bool String(const Json& v, std::string_view path, const std::string** out) {
    if (!v.is_string()) return FailValue(ErrorCode::kBadField, path, v, "must be a string");
    *out = &v.get_ref<const std::string&>();
    return true;
  }

  bool Number(const Json& v, std::string_view path, double* out) {
    if (!v.is_number()) return FailValue(ErrorCode::kBadField, path, v, "must be a number");
    const double x = v.get<double>();
    if (!std::isfinite(x)) return FailValue(ErrorCode::kBadField, path, v, "must be finite");
    *out = x;
    return true;
  }

  // An integer in [type_lo, type_hi] (the C++ type's range, named `type_name`). Integral floats
  // up to 2^53 count as integers.
  bool Integer(const Json& v, std::string_view path, std::int64_t type_lo, std::int64_t type_hi,
               std::string_view type_name, std::int64_t* out) {
    std::int64_t x = 0;
    switch (v.type()) {
      case Json::value_t::number_integer:
        x = v.get<std::int64_t>();
        break;
      case Json::value_t::number_unsigned: {
        const auto u = v.get<std::uint64_t>();
        if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
          return OutsideType(path, v, type_name);
        }
        x = static_cast<std::int64_t>(u);
        break;
      }
      case Json::value_t::number_float: {
        const double d = v.get<double>();
        if (!std::isfinite(d) || std::trunc(d) != d) {
          return FailValue(ErrorCode::kBadField, path, v, "must be an integer");
        }
        if (std::fabs(d) > kMaxExactInteger) {
          return FailValue(ErrorCode::kBadField, path, v,
                           "is not an exact integer (above 2^53 as a float, or above 2^64)");
        }
        x = static_cast<std::int64_t>(d);
        break;
      }
      default:
        return FailValue(ErrorCode::kBadField, path, v, "must be an integer");
    }
    if (x < type_lo || x > type_hi) return OutsideType(path, v, type_name);
    *out = x;
    return true;
  }

  bool Int64(const Json& v, std::string_view path, std::int64_t* out) {
    return Integer(v, path, std::numeric_limits<std::int64_t>::min(),
                   std::numeric_limits<std::int64_t>::max(), "int64", out);
  }
  bool Int32(const Json& v, std::string_view path, std::int64_t* out) {
    return Integer(v, path, std::numeric_limits<std::int32_t>::min(),
                   std::numeric_limits<std::int32_t>::max(), "int32", out);
  }

  // A session id: an integer in [0, 2^64).
  bool Uint64(const Json& v, std::string_view path, std::uint64_t* out) {
    if (v.is_number_unsigned()) {
      *out = v.get<std::uint64_t>();
      return true;
    }
    std::int64_t x = 0;
    if (!Int64(v, path, &x)) return false;
    if (x < 0) return FailValue(ErrorCode::kBadField, path, v, "must be >= 0");
    *out = static_cast<std::uint64_t>(x);
    return true;
  }

  // An integer in [lo, cap]: a non-integer or one below lo is bad_field, one above the server's
  // cap (named `cap_name`) over_cap. `int32` selects the field's C++ type (range: bad_field).
  bool Capped(const Json& v, std::string_view path, bool int32, std::int64_t lo, std::int64_t cap,
              std::string_view cap_name, std::int64_t* out) {
    std::int64_t x = 0;
    if (!(int32 ? Int32(v, path, &x) : Int64(v, path, &x))) return false;
    const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(cap) + "]";
    if (x < lo) return FailValue(ErrorCode::kBadField, path, v, "must be in " + range);
    if (x > cap) {
      return FailValue(ErrorCode::kOverCap, path, v,
                       "must be in " + range + " (server cap " + std::string(cap_name) + ")");
    }
    *out = x;
    return true;
  }

  // An array of token ids with [min_count, cap] entries, each in [0, vocab_size) (only >= 0 when
  // vocab_size is 0).
  bool Ids(const Json& v, std::string_view path, std::size_t min_count, std::size_t cap,
           std::string_view cap_name, int vocab_size, TokenIds* out) {
    if (!v.is_array()) return FailValue(ErrorCode::kBadField, path, v, "must be an array of ids");
    const std::size_t n = v.size();
    const std::string counts =
        " entries, must have " + std::to_string(min_count) + " to " + std::to_string(cap);
    if (n < min_count) {
      return Fail(ErrorCode::kBadField, std::string(path) + " has " + std::to_string(n) + counts);
    }
    if (n > cap) {
      return Fail(ErrorCode::kOverCap, std::string(path) + " has " + std::to_string(n) + counts +
                                           " (server cap " + std::string(cap_name) + ")");
    }
    out->clear();
    out->reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      const std::string item = std::string(path) + "[" + std::to_string(i) + "]";
      std::int64_t id = 0;
      if (!Int32(v[i], item, &id)) return false;
      if (id < 0 || (vocab_size > 0 && id >= vocab_size)) {
        return FailValue(ErrorCode::kTokenOutOfRange, item, v[i],
                         vocab_size > 0 ? "must be in [0, " + std::to_string(vocab_size) + ")"
                                        : std::string("must be >= 0"));
      }
      out->push_back(static_cast<TokenId>(id));
    }
    return true;
  }

  // A string of [min_bytes, cap] bytes (UTF-8 was checked for the whole message).
  bool Text(const Json& v, std::string_view path, std::size_t min_bytes, std::size_t cap,
            std::string* out) {
    const std::string* s = nullptr;
    if (!String(v, path, &s)) return false;
    if (s->size() < min_bytes) return FailValue(ErrorCode::kBadField, path, v, "must not be empty");
    if (s->size() > cap) {
      return Fail(ErrorCode::kOverCap, std::string(path) + " has " + std::to_string(s->size()) +
                                           " bytes, must have at most " + std::to_string(cap) +
                                           " (server cap max_text_bytes)");
    }
    *out = *s;
    return true;
  }

 private:
  bool OutsideType(std::string_view path, const Json& v, std::string_view type_name) {
    return FailValue(ErrorCode::kBadField, path, v,
                     "is outside the " + std::string(type_name) + " range");
  }

  std::string_view type_;
  ProtocolError error_;
};

// Exactly one of "ids" and "text" in `object` (a frame or a prompt).
bool ReadTokensOrText(Reader& r, const Json& object, std::string_view prefix, std::size_t min_count,
                      std::size_t max_ids, std::string_view ids_cap_name, const ServerCaps& caps,
                      TokensOrText* out) {
  const Json* ids = Find(object, "ids");
  const Json* text = Find(object, "text");
  const std::string p(prefix);
  if (ids != nullptr && text != nullptr) {
    return r.Fail(ErrorCode::kBadField, p + "ids and " + p + "text are exclusive: send one");
  }
  if (ids == nullptr && text == nullptr) {
    return r.Fail(ErrorCode::kMissingField, p + "ids or " + p + "text is required");
  }
  if (ids != nullptr) {
    TokenIds v;
    if (!r.Ids(*ids, p + "ids", min_count, max_ids, ids_cap_name, caps.vocab_size, &v)) {
      return false;
    }
    *out = std::move(v);
    return true;
  }
  std::string v;
  if (!r.Text(*text, p + "text", min_count, caps.max_text_bytes, &v)) return false;
  *out = std::move(v);
  return true;
}

// "prompt.messages": 1..kMaxPromptMessages objects {"role": non-empty string of at most
// kMaxRoleBytes, "content": string}; the contents together at most max_text_bytes.
bool ReadPromptMessages(Reader& r, const Json& v, const ServerCaps& caps,
                        std::vector<PromptMessage>* out) {
  if (!v.is_array())
    return r.FailValue(ErrorCode::kBadField, "prompt.messages", v, "must be an array");
  if (v.empty())
    return r.FailValue(ErrorCode::kBadField, "prompt.messages", v, "must not be empty");
  if (v.size() > kMaxPromptMessages) {
    return r.Fail(ErrorCode::kOverCap, "prompt.messages has " + std::to_string(v.size()) +
                                           " messages, must have at most " +
                                           std::to_string(kMaxPromptMessages));
  }
  constexpr std::array<std::string_view, 2> kMessageFields = {"role", "content"};
  std::size_t total_bytes = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::string path = "prompt.messages[" + std::to_string(i) + "]";
    const Json& m = v[i];
    if (!r.Object(m, path) || !r.OnlyKnownFields(m, path + ".", kMessageFields)) return false;
    const Json* role = Find(m, "role");
    const Json* content = Find(m, "content");
    if (role == nullptr) return r.Missing(path + ".role");
    if (content == nullptr) return r.Missing(path + ".content");
    PromptMessage pm;
    if (!r.Text(*role, path + ".role", 1, caps.max_text_bytes, &pm.role)) return false;
    if (pm.role.size() > kMaxRoleBytes) {
      return r.FailValue(ErrorCode::kBadField, path + ".role", *role,
                         "is longer than " + std::to_string(kMaxRoleBytes) + " bytes");
    }
    if (!r.Text(*content, path + ".content", 0, caps.max_text_bytes, &pm.content)) return false;
    total_bytes += pm.content.size();
    if (total_bytes > caps.max_text_bytes) {
      return r.Fail(ErrorCode::kOverCap, "prompt.messages hold more than " +
                                             std::to_string(caps.max_text_bytes) +
                                             " bytes of content (server cap max_text_bytes)");
    }
    out->push_back(std::move(pm));
  }
  return true;
}

bool ReadKv(Reader& r, const Json& kv, const ServerCaps& caps, KvRequest* out) {
  constexpr std::array<std::string_view, 4> kFields = {"policy", "window", "sinks", "positions"};
  if (!r.Object(kv, "kv") || !r.OnlyKnownFields(kv, "kv.", kFields)) return false;
  if (const Json* v = Find(kv, "policy")) {
    const std::string* s = nullptr;
    if (!r.String(*v, "kv.policy", &s)) return false;
    const std::optional<KvPolicyKind> mode = kv::ParseKvMode(*s);
    if (!mode) {
      return r.FailValue(ErrorCode::kBadField, "kv.policy", *v, R"(must be "full" or "window")");
    }
    if (*mode == KvPolicyKind::kFull && !caps.allow_full_kv) {
      return r.FailValue(ErrorCode::kOverCap, "kv.policy", *v,
                         "is disabled on this server (server cap allow_full_kv = false)");
    }
    out->policy = *mode;
  }
  const bool full = out->policy == KvPolicyKind::kFull;
  if (const Json* v = Find(kv, "window")) {
    if (full) return r.Fail(ErrorCode::kBadField, R"(kv.window needs kv.policy "window")");
    std::int64_t w = 0;
    if (!r.Capped(*v, "kv.window", false, 1, caps.max_window, "max_window", &w)) return false;
    out->window = w;
  }
  if (const Json* v = Find(kv, "sinks")) {
    if (full) return r.Fail(ErrorCode::kBadField, R"(kv.sinks needs kv.policy "window")");
    std::int64_t s = 0;
    if (!r.Capped(*v, "kv.sinks", false, 0, caps.max_sinks, "max_sinks", &s)) return false;
    out->sinks = s;
  }
  if (const Json* v = Find(kv, "positions")) {
    const std::string* s = nullptr;
    if (!r.String(*v, "kv.positions", &s)) return false;
    const std::optional<KvPositions> positions = kv::ParsePositionMode(*s);
    if (!positions) {
      return r.FailValue(ErrorCode::kBadField, "kv.positions", *v,
                         R"(must be "absolute" or "rolling")");
    }
    if (*positions == KvPositions::kRolling && full) {
      return r.Fail(ErrorCode::kBadField, R"(kv.positions = "rolling" needs kv.policy "window")");
    }
    out->positions = *positions;
  }
  return true;
}

// client_ref, when given: at most kMaxClientRefBytes; every later error carries it.
bool ReadClientRef(Reader& r, const Json& msg, std::optional<std::string>* out) {
  const Json* v = Find(msg, "client_ref");
  if (v == nullptr) return true;
  const std::string* s = nullptr;
  if (!r.String(*v, "client_ref", &s)) return false;
  if (s->size() > kMaxClientRefBytes) {
    return r.FailValue(ErrorCode::kBadField, "client_ref", *v,
                       "must have at most " + std::to_string(kMaxClientRefBytes) + " bytes");
  }
  *out = *s;
  r.error().client_ref = *s;
  return true;
}

bool ReadStart(Reader& r, const Json& msg, const ServerCaps& caps, StartRequest* out) {
  constexpr std::array<std::string_view, 8> kFields = {
      "type", "period_ms", "deadline_ms", "tokens_per_frame", "output_tokens_per_frame",
      "kv",   "prompt",    "client_ref"};
  // client_ref first, so every later error carries it.
  if (!r.OnlyKnownFields(msg, "", kFields) || !ReadClientRef(r, msg, &out->client_ref)) {
    return false;
  }

  const std::string period_range =
      "[" + FormatNumber(caps.min_period_ms) + ", " + FormatNumber(caps.max_period_ms) + "]";
  const Json* period = Find(msg, "period_ms");
  if (period == nullptr) return r.Missing("period_ms");
  if (!r.Number(*period, "period_ms", &out->period_ms)) return false;
  if (!(out->period_ms > 0.0))
    return r.FailValue(ErrorCode::kBadField, "period_ms", *period, "must be > 0");
  if (out->period_ms < caps.min_period_ms || out->period_ms > caps.max_period_ms) {
    return r.FailValue(
        ErrorCode::kOverCap, "period_ms", *period,
        "must be in " + period_range + " (server caps min_period_ms, max_period_ms)");
  }

  if (const Json* v = Find(msg, "deadline_ms")) {
    double deadline_ms = 0.0;
    if (!r.Number(*v, "deadline_ms", &deadline_ms)) return false;
    if (!(deadline_ms > 0.0)) {
      return r.FailValue(ErrorCode::kBadField, "deadline_ms", *v, "must be > 0");
    }
    out->deadline_ms = deadline_ms;
    if (deadline_ms > caps.max_period_ms) {
      return r.FailValue(
          ErrorCode::kOverCap, "deadline_ms", *v,
          "must be in (0, " + FormatNumber(caps.max_period_ms) + "] (server cap max_period_ms)");
    }
  }

  const Json* tokens = Find(msg, "tokens_per_frame");
  if (tokens == nullptr) return r.Missing("tokens_per_frame");
  std::int64_t n = 0;
  if (!r.Capped(*tokens, "tokens_per_frame", true, 1, caps.max_tokens_per_frame,
                "max_tokens_per_frame", &n)) {
    return false;
  }
  out->tokens_per_frame = static_cast<int>(n);

  if (const Json* v = Find(msg, "output_tokens_per_frame")) {
    if (!r.Capped(*v, "output_tokens_per_frame", true, 0, caps.max_output_tokens_per_frame,
                  "max_output_tokens_per_frame", &n)) {
      return false;
    }
    out->output_tokens_per_frame = static_cast<int>(n);
  }

  if (const Json* v = Find(msg, "kv")) {
    if (!ReadKv(r, *v, caps, &out->kv)) return false;
  }

  if (const Json* v = Find(msg, "prompt")) {
    constexpr std::array<std::string_view, 3> kPromptFields = {"ids", "text", "messages"};
    if (!r.Object(*v, "prompt") || !r.OnlyKnownFields(*v, "prompt.", kPromptFields)) return false;
    if (const Json* messages = Find(*v, "messages")) {
      if (Find(*v, "ids") != nullptr || Find(*v, "text") != nullptr) {
        return r.Fail(ErrorCode::kBadField,
                      "prompt.messages, prompt.ids and prompt.text are exclusive: send one");
      }
      std::vector<PromptMessage> list;
      if (!ReadPromptMessages(r, *messages, caps, &list)) return false;
      out->prompt_messages = std::move(list);
      return true;
    }
    TokensOrText prompt;
    // An empty prompt is allowed and means none.
    if (!ReadTokensOrText(r, *v, "prompt.", 0, static_cast<std::size_t>(caps.max_prompt_tokens),
                          "max_prompt_tokens", caps, &prompt)) {
      return false;
    }
    out->prompt = std::move(prompt);
  }
  return true;
}

bool ReadSession(Reader& r, const Json& msg, std::uint64_t* out) {
  const Json* v = Find(msg, "session");
  if (v == nullptr) return r.Missing("session");
  if (!r.Uint64(*v, "session", out)) return false;
  r.error().session = *out;
  return true;
}

bool ReadFrame(Reader& r, const Json& msg, const ServerCaps& caps, FrameRequest* out) {
  constexpr std::array<std::string_view, 5> kFields = {"type", "session", "index", "ids", "text"};
  if (!r.OnlyKnownFields(msg, "", kFields) || !ReadSession(r, msg, &out->session)) return false;
  if (const Json* v = Find(msg, "index")) {
    std::int64_t index = 0;
    if (!r.Int64(*v, "index", &index)) return false;
    if (index < 0) return r.FailValue(ErrorCode::kBadField, "index", *v, "must be >= 0");
    out->index = index;
    r.error().frame = index;
  }
  return ReadTokensOrText(r, msg, "", 1, static_cast<std::size_t>(caps.max_tokens_per_frame),
                          "max_tokens_per_frame", caps, &out->input);
}

bool ReadEnd(Reader& r, const Json& msg, EndRequest* out) {
  constexpr std::array<std::string_view, 2> kFields = {"type", "session"};
  return r.OnlyKnownFields(msg, "", kFields) && ReadSession(r, msg, &out->session);
}

bool ReadResume(Reader& r, const Json& msg, ResumeRequest* out) {
  constexpr std::array<std::string_view, 3> kFields = {"type", "resume_token", "client_ref"};
  if (!r.OnlyKnownFields(msg, "", kFields) || !ReadClientRef(r, msg, &out->client_ref)) {
    return false;
  }
  const Json* v = Find(msg, "resume_token");
  if (v == nullptr) return r.Missing("resume_token");
  const std::string* token = nullptr;
  if (!r.String(*v, "resume_token", &token)) return false;
  if (token->empty() || token->size() > kMaxResumeTokenBytes) {
    return r.FailValue(ErrorCode::kBadField, "resume_token", *v,
                       "must have 1 to " + std::to_string(kMaxResumeTokenBytes) + " bytes");
  }
  out->resume_token = *token;
  return true;
}

bool ReadPing(Reader& r, const Json& msg, PingRequest* out) {
  constexpr std::array<std::string_view, 2> kFields = {"type", "nonce"};
  if (!r.OnlyKnownFields(msg, "", kFields)) return false;
  if (const Json* v = Find(msg, "nonce")) {
    double nonce = 0.0;
    if (!r.Number(*v, "nonce", &nonce)) return false;
    out->nonce = nonce;
  }
  return true;
}

ProtocolError MakeError(ErrorCode code, std::string message) {
  ProtocolError error;
  error.code = code;
  error.message = std::move(message);
  return error;
}

// JSON syntax plus the structural limits nlohmann does not enforce: nesting depth and duplicate
// keys (which it would silently resolve to the last value). Returns a bad_json error or the value.
std::variant<Json, ProtocolError> ParseJson(std::string_view text) {
  std::string problem;
  std::vector<std::set<std::string, std::less<>>> keys;  // one set per open object
  const Json::parser_callback_t callback = [&](int depth, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        // `depth` counts the containers around this one.
        if (depth >= kMaxJsonDepth && problem.empty()) {
          problem = "nesting deeper than " + std::to_string(kMaxJsonDepth) + " levels";
        }
        if (event == Json::parse_event_t::object_start) keys.emplace_back();
        break;
      case Json::parse_event_t::key:
        if (!keys.empty() && parsed.is_string() &&
            !keys.back().insert(parsed.get<std::string>()).second && problem.empty()) {
          problem = "duplicate key " + Describe(parsed);
        }
        break;
      case Json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      default:
        break;
    }
    return true;
  };
  Json root;
  try {
    root = Json::parse(text.begin(), text.end(), callback);
  } catch (const Json::exception& e) {
    // e.what() is "[json.exception.parse_error.101] parse error at line 1, column 5: ...".
    std::string_view what = e.what();
    if (const auto pos = what.find("] "); pos != std::string_view::npos)
      what.remove_prefix(pos + 2);
    return MakeError(ErrorCode::kBadJson,
                     "message is not JSON: " + std::string(CutUtf8(what, kMaxParserMessageBytes)));
  }
  if (!problem.empty()) return MakeError(ErrorCode::kBadJson, "message has " + problem);
  return root;
}

std::variant<ClientMessage, ProtocolError> ParseClientMessageImpl(std::string_view text,
                                                                  const ServerCaps& caps) {
  if (text.size() > caps.max_message_bytes) {
    return MakeError(ErrorCode::kTooLarge, "message has " + std::to_string(text.size()) +
                                               " bytes, more than max_message_bytes = " +
                                               std::to_string(caps.max_message_bytes));
  }
  if (const auto bad = FindInvalidUtf8(text); bad != std::string_view::npos) {
    return MakeError(ErrorCode::kBadJson,
                     "message is not valid UTF-8 (byte " + std::to_string(bad) + ")");
  }
  // nlohmann's lexer takes a NUL byte for the end of the input, so "{...}\0garbage" would parse
  // as its first part. JSON allows a NUL nowhere (inside a string it must be escaped as \u0000).
  if (const auto nul = text.find('\0'); nul != std::string_view::npos) {
    return MakeError(ErrorCode::kBadJson, "message is not JSON: a NUL byte at byte " +
                                              std::to_string(nul) + " (JSON allows none)");
  }
  auto parsed = ParseJson(text);
  if (auto* error = std::get_if<ProtocolError>(&parsed)) return std::move(*error);
  const Json& msg = std::get<Json>(parsed);
  if (!msg.is_object()) {
    return MakeError(ErrorCode::kBadJson, "message must be a JSON object, not " + Describe(msg));
  }

  Reader r("message");
  const Json* type_value = Find(msg, "type");
  if (type_value == nullptr) {
    r.Missing("type");
    return r.TakeError();
  }
  const std::string* type = nullptr;
  if (!r.String(*type_value, "type", &type)) return r.TakeError();

  if (*type == "session.start") {
    Reader start("session.start");
    StartRequest req;
    if (!ReadStart(start, msg, caps, &req)) return start.TakeError();
    return ClientMessage(std::move(req));
  }
  if (*type == "frame") {
    Reader frame("frame");
    FrameRequest req;
    if (!ReadFrame(frame, msg, caps, &req)) return frame.TakeError();
    return ClientMessage(std::move(req));
  }
  if (*type == "session.end") {
    Reader end("session.end");
    EndRequest req;
    if (!ReadEnd(end, msg, &req)) return end.TakeError();
    return ClientMessage(req);
  }
  if (*type == "session.resume") {
    Reader resume("session.resume");
    ResumeRequest req;
    if (!ReadResume(resume, msg, &req)) return resume.TakeError();
    return ClientMessage(std::move(req));
  }
  if (*type == "ping") {
    Reader ping("ping");
    PingRequest req;
    if (!ReadPing(ping, msg, &req)) return ping.TakeError();
    return ClientMessage(req);
  }
  r.FailValue(ErrorCode::kUnknownType, "type", *type_value,
              "is not a client message (session.start, frame, session.end, session.resume, "
              "ping)");
  return r.TakeError();
}

// Little-endian loads and stores, independent of the host's byte order and alignment.
template <typename T>
T LoadLe(std::span<const std::byte> bytes, std::size_t offset) {
  static_assert(std::is_integral_v<T>);
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    v |= std::to_integer<std::uint64_t>(bytes[offset + i]) << (8 * i);
  }
  // Unsigned to signed is two's complement (C++20).
  return static_cast<T>(static_cast<std::make_unsigned_t<T>>(v));
}

template <typename T>
void StoreLe(std::vector<std::byte>* out, T value) {
  static_assert(std::is_integral_v<T>);
  const auto v = static_cast<std::uint64_t>(static_cast<std::make_unsigned_t<T>>(value));
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    out->push_back(static_cast<std::byte>((v >> (8 * i)) & 0xFF));
  }
}

std::string Hex(unsigned value) {
  constexpr std::string_view kDigits = "0123456789abcdef";
  std::string out = "0x";
  out += kDigits[(value >> 4) & 0xF];
  out += kDigits[value & 0xF];
  return out;
}

std::variant<FrameRequest, ProtocolError> ParseBinaryFrameImpl(std::span<const std::byte> bytes,
                                                               const ServerCaps& caps) {
  Reader r("binary frame");
  const std::size_t size = bytes.size();
  if (size > caps.max_message_bytes) {
    r.Fail(ErrorCode::kTooLarge, std::to_string(size) + " bytes, more than max_message_bytes = " +
                                     std::to_string(caps.max_message_bytes));
    return r.TakeError();
  }
  if (size < kBinaryFrameHeaderBytes) {
    r.Fail(ErrorCode::kBadField, std::to_string(size) + " bytes, shorter than the " +
                                     std::to_string(kBinaryFrameHeaderBytes) + "-byte header");
    return r.TakeError();
  }
  const auto magic = LoadLe<std::uint8_t>(bytes, 0);
  if (magic != kBinaryFrameMagic) {
    r.Fail(ErrorCode::kBadField, "magic = " + Hex(magic) + " must be 0x4d ('M')");
    return r.TakeError();
  }
  const auto version = LoadLe<std::uint8_t>(bytes, 1);
  if (version != kBinaryFrameVersion) {
    r.Fail(ErrorCode::kBadField, "version = " + std::to_string(version) + " is not supported (1)");
    return r.TakeError();
  }
  const auto reserved = LoadLe<std::uint16_t>(bytes, 2);
  if (reserved != 0) {
    r.Fail(ErrorCode::kBadField, "reserved = " + std::to_string(reserved) + " must be 0");
    return r.TakeError();
  }
  FrameRequest frame;
  frame.session = LoadLe<std::uint64_t>(bytes, 4);
  r.error().session = frame.session;
  const auto index = LoadLe<std::int64_t>(bytes, 12);
  if (index < -1) {
    r.Fail(ErrorCode::kBadField, "index = " + std::to_string(index) + " must be >= 0, or -1: none");
    return r.TakeError();
  }
  if (index >= 0) {
    frame.index = index;
    r.error().frame = index;
  }
  const auto count = LoadLe<std::uint32_t>(bytes, 20);
  const std::size_t payload = size - kBinaryFrameHeaderBytes;
  // count < 2^32, so 4 * count cannot overflow a 64-bit size_t.
  if (payload != std::size_t{4} * count) {
    r.Fail(ErrorCode::kBadField, "count = " + std::to_string(count) + " needs " +
                                     std::to_string(std::size_t{4} * count) + " bytes of ids, " +
                                     std::to_string(payload) + " present");
    return r.TakeError();
  }
  const auto cap = static_cast<std::uint32_t>(std::max(caps.max_tokens_per_frame, 0));
  if (count < 1 || count > cap) {
    r.Fail(count < 1 ? ErrorCode::kBadField : ErrorCode::kOverCap,
           "count = " + std::to_string(count) + " must be in [1, " + std::to_string(cap) + "]" +
               (count < 1 ? "" : " (server cap max_tokens_per_frame)"));
    return r.TakeError();
  }
  TokenIds ids(count);
  for (std::uint32_t i = 0; i < count; ++i) {
    const auto id = LoadLe<std::int32_t>(bytes, kBinaryFrameHeaderBytes + std::size_t{4} * i);
    if (id < 0 || (caps.vocab_size > 0 && id >= caps.vocab_size)) {
      r.Fail(ErrorCode::kTokenOutOfRange,
             "ids[" + std::to_string(i) + "] = " + std::to_string(id) +
                 (caps.vocab_size > 0 ? " must be in [0, " + std::to_string(caps.vocab_size) + ")"
                                      : std::string(" must be >= 0")));
      return r.TakeError();
    }
    ids[i] = id;
  }
  frame.input = std::move(ids);
  return frame;
}

std::string ToText(const OutJson& j) {
  // `replace`: invalid UTF-8 in a field (e.g. decoded text) becomes U+FFFD instead of throwing.
  return j.dump(-1, ' ', false, OutJson::error_handler_t::replace);
}

OutJson Message(std::string_view type) {
  OutJson j = OutJson::object();
  j["type"] = type;
  return j;
}

}  // namespace

std::string_view ToString(ErrorCode code) {
  const auto i = static_cast<std::size_t>(code);
  return i < kErrorNames.size() ? kErrorNames[i] : std::string_view("internal");
}

std::optional<ErrorCode> ErrorCodeFromString(std::string_view name) {
  for (std::size_t i = 0; i < kErrorNames.size(); ++i) {
    if (kErrorNames[i] == name) return static_cast<ErrorCode>(i);
  }
  return std::nullopt;
}

std::variant<ClientMessage, ProtocolError> ParseClientMessage(std::string_view text,
                                                              const ServerCaps& caps) {
  try {
    return ParseClientMessageImpl(text, caps);
  } catch (const std::exception& e) {  // std::bad_alloc; the parser itself reports by value
    return MakeError(ErrorCode::kInternal, std::string("parsing the message failed: ") + e.what());
  }
}

std::variant<FrameRequest, ProtocolError> ParseBinaryFrame(std::span<const std::byte> bytes,
                                                           const ServerCaps& caps) {
  try {
    return ParseBinaryFrameImpl(bytes, caps);
  } catch (const std::exception& e) {  // std::bad_alloc
    return MakeError(ErrorCode::kInternal,
                     std::string("parsing the binary frame failed: ") + e.what());
  }
}

std::vector<std::byte> EncodeBinaryFrame(const FrameRequest& frame) {
  const auto* ids = std::get_if<TokenIds>(&frame.input);
  MTR_CHECK(ids != nullptr, "EncodeBinaryFrame: text frames have no binary encoding");
  MTR_CHECK(ids->size() <= std::numeric_limits<std::uint32_t>::max(),
            "EncodeBinaryFrame: more than 2^32 - 1 ids");
  std::vector<std::byte> out;
  out.reserve(kBinaryFrameHeaderBytes + 4 * ids->size());
  StoreLe<std::uint8_t>(&out, kBinaryFrameMagic);
  StoreLe<std::uint8_t>(&out, kBinaryFrameVersion);
  StoreLe<std::uint16_t>(&out, 0);
  StoreLe<std::uint64_t>(&out, frame.session);
  StoreLe<std::int64_t>(&out, frame.index.value_or(-1));
  StoreLe<std::uint32_t>(&out, static_cast<std::uint32_t>(ids->size()));
  for (const TokenId id : *ids) StoreLe<std::int32_t>(&out, id);
  return out;
}

namespace {
// The session's terms, as session.started and session.resumed both state them.
template <class SessionMessage>
void AddTerms(const SessionMessage& m, OutJson& j) {
  j["period_ms"] = m.period_ms;
  j["deadline_ms"] = m.deadline_ms;
  j["tokens_per_frame"] = m.tokens_per_frame;
  j["output_tokens_per_frame"] = m.output_tokens_per_frame;
}
}  // namespace

std::string SessionStarted::Serialize() const {
  OutJson j = Message("session.started");
  j["session"] = session;
  if (client_ref) j["client_ref"] = *client_ref;
  AddTerms(*this, j);
  OutJson k = OutJson::object();
  k["policy"] = ToString(kv.policy);
  if (kv.policy == KvPolicyKind::kWindow) {
    k["window"] = kv.window;
    k["sinks"] = kv.sinks;
  }
  k["positions"] = ToString(kv.positions);
  j["kv"] = std::move(k);
  j["max_context"] = max_context ? OutJson(*max_context) : OutJson(nullptr);
  if (replica) j["replica"] = *replica;
  if (resume_token) j["resume_token"] = *resume_token;
  return ToText(j);
}

std::string SessionResumed::Serialize() const {
  OutJson j = Message("session.resumed");
  j["session"] = session;
  if (client_ref) j["client_ref"] = *client_ref;
  j["next_frame"] = next_frame;
  j["missed_frames"] = missed_frames;
  j["resume_token"] = resume_token;
  AddTerms(*this, j);
  if (replica) j["replica"] = *replica;
  return ToText(j);
}

std::string SessionMoving::Serialize() const {
  OutJson j = Message("session.moving");
  j["session"] = session;
  j["resume_token"] = resume_token;
  j["reason"] = reason;
  j["next_frame"] = next_frame;
  return ToText(j);
}

std::string SessionRejected::Serialize() const {
  OutJson j = Message("session.rejected");
  if (client_ref) j["client_ref"] = *client_ref;
  j["reason"] = reason;
  j["detail"] = detail;
  j["retry_after_ms"] = retry_after_ms;
  return ToText(j);
}

std::string FrameResult::Serialize() const {
  OutJson j = Message("frame.result");
  j["session"] = session;
  j["frame"] = frame;
  j["ids"] = ids;
  if (text) j["text"] = *text;
  j["latency_ms"] = latency_ms;
  j["outcome"] = ToString(outcome);
  return ToText(j);
}

std::string SessionEnded::Serialize() const {
  OutJson j = Message("session.ended");
  j["session"] = session;
  j["reason"] = ToString(reason);
  j["frames"] = frames;
  return ToText(j);
}

std::string Alarm::Serialize() const {
  OutJson j = Message("alarm");
  j["session"] = session;
  j["kind"] = kind;
  j["detail"] = detail;
  return ToText(j);
}

std::string Pong::Serialize() const {
  OutJson j = Message("pong");
  if (nonce) {
    // Echo an integer as an integer (a client compares what it sent), anything else as a double.
    const double n = *nonce;
    if (std::isfinite(n) && std::trunc(n) == n && std::fabs(n) <= kMaxExactInteger) {
      j["nonce"] = static_cast<std::int64_t>(n);
    } else {
      j["nonce"] = n;
    }
  }
  return ToText(j);
}

std::string ErrorMessage::Serialize() const {
  OutJson j = Message("error");
  j["code"] = ToString(error.code);
  j["message"] = error.message;
  if (error.session) j["session"] = *error.session;
  if (error.frame) j["frame"] = *error.frame;
  if (error.client_ref) j["client_ref"] = *error.client_ref;
  return ToText(j);
}

}  // namespace metronome::wire
