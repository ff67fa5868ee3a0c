#include "metronome/server/resume_token.h"

#include <sys/random.h>

#include <array>
#include <cerrno>
#include <charconv>
#include <cstddef>
#include <stdexcept>
#include <vector>

namespace metronome::server {
namespace {

constexpr std::string_view kPrefix = "mtr1.";
constexpr std::string_view kBase64Url =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

std::string Base64Url(std::string_view in) {
  std::string out;
  std::uint32_t acc = 0;
  int bits = 0;
  for (const char c : in) {
    acc = (acc << 8) | static_cast<unsigned char>(c);
    bits += 8;
    while (bits >= 6) {
      bits -= 6;
      out.push_back(kBase64Url[(acc >> bits) & 63u]);
    }
  }
  if (bits > 0) out.push_back(kBase64Url[(acc << (6 - bits)) & 63u]);
  return out;
}

std::optional<std::string> FromBase64Url(std::string_view in) {
  std::string out;
  std::uint32_t acc = 0;
  int bits = 0;
  for (const char c : in) {
    const std::size_t v = kBase64Url.find(c);
    if (v == std::string_view::npos) return std::nullopt;
    acc = (acc << 6) | static_cast<std::uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFFu));
    }
  }
  // Leftover bits must be the zero padding of the last character, and fewer than a byte.
  if (bits >= 6 || (acc & ((1u << bits) - 1u)) != 0) return std::nullopt;
  return out;
}

bool IsLowerHex(std::string_view s) {
  for (const char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

std::string EncodeResumeToken(const ResumeToken& token) {
  return std::string(kPrefix) + Base64Url(token.origin) + "." + std::to_string(token.session) +
         "." + token.secret + "." + Base64Url(token.model);
}

std::optional<ResumeToken> ParseResumeToken(std::string_view text) {
  if (text.size() > kMaxResumeTokenBytes || !text.starts_with(kPrefix)) return std::nullopt;
  text.remove_prefix(kPrefix.size());
  std::array<std::string_view, 4> parts;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const std::size_t dot = text.find('.');
    if ((dot == std::string_view::npos) != (i == parts.size() - 1)) return std::nullopt;
    parts[i] = text.substr(0, dot);
    if (dot != std::string_view::npos) text.remove_prefix(dot + 1);
  }
  ResumeToken token;
  const auto origin = FromBase64Url(parts[0]);
  if (!origin) return std::nullopt;
  token.origin = *origin;
  const std::string_view id = parts[1];
  if (id.empty() || id.size() > 20 || (id.size() > 1 && id[0] == '0')) return std::nullopt;
  const auto [end, ec] = std::from_chars(id.data(), id.data() + id.size(), token.session);
  if (ec != std::errc() || end != id.data() + id.size()) return std::nullopt;
  if (parts[2].size() != kResumeSecretHexDigits || !IsLowerHex(parts[2])) return std::nullopt;
  token.secret = parts[2];
  const auto model = FromBase64Url(parts[3]);
  if (!model || model->empty()) return std::nullopt;
  token.model = *model;
  return token;
}

std::string NewResumeSecret() {
  std::array<unsigned char, kResumeSecretHexDigits / 2> bytes{};
  std::size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t n = getrandom(bytes.data() + got, bytes.size() - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error("getrandom failed: cannot make a resume token");
    }
    got += static_cast<std::size_t>(n);
  }
  static constexpr std::string_view kHex = "0123456789abcdef";
  std::string out;
  out.reserve(kResumeSecretHexDigits);
  for (const unsigned char b : bytes) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15u]);
  }
  return out;
}

}  // namespace metronome::server
