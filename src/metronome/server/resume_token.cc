#include "metronome/server/resume_token.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
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

std::string ToHex(const unsigned char* bytes, std::size_t n) {
  static constexpr std::string_view kHex = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    out.push_back(kHex[bytes[i] >> 4]);
    out.push_back(kHex[bytes[i] & 15u]);
  }
  return out;
}

// The token's text before the seal: what the seal covers.
std::string Unsealed(const ResumeToken& token) {
  return std::string(kPrefix) + Base64Url(token.origin) + "." + std::to_string(token.session) +
         "." + token.secret + "." + Base64Url(token.model);
}

std::string SealOf(const ResumeToken& token, std::string_view cluster_secret) {
  const std::string text = Unsealed(token);
  std::array<unsigned char, EVP_MAX_MD_SIZE> mac{};
  unsigned int mac_bytes = 0;
  if (HMAC(EVP_sha256(), cluster_secret.data(), static_cast<int>(cluster_secret.size()),
           reinterpret_cast<const unsigned char*>(text.data()), text.size(), mac.data(),
           &mac_bytes) == nullptr ||
      mac_bytes < kResumeSealHexDigits / 2) {
    throw std::runtime_error("HMAC-SHA256 failed: cannot seal a resume token");
  }
  return ToHex(mac.data(), kResumeSealHexDigits / 2);
}

}  // namespace

std::string EncodeResumeToken(const ResumeToken& token) {
  std::string text = Unsealed(token);
  if (!token.seal.empty()) text += "." + token.seal;
  return text;
}

ResumeToken Sealed(ResumeToken token, std::string_view cluster_secret) {
  token.seal = cluster_secret.empty() ? std::string() : SealOf(token, cluster_secret);
  return token;
}

bool SealHolds(const ResumeToken& token, std::string_view cluster_secret) {
  if (cluster_secret.empty() || token.seal.size() != kResumeSealHexDigits) return false;
  const std::string want = SealOf(token, cluster_secret);
  return CRYPTO_memcmp(want.data(), token.seal.data(), want.size()) == 0;
}

std::optional<ResumeToken> ParseResumeToken(std::string_view text) {
  if (text.size() > kMaxResumeTokenBytes || !text.starts_with(kPrefix)) return std::nullopt;
  text.remove_prefix(kPrefix.size());
  // Four fields, or five with the seal.
  std::array<std::string_view, 5> parts;
  std::size_t fields = 0;
  for (bool more = true; more;) {
    if (fields == parts.size()) return std::nullopt;
    const std::size_t dot = text.find('.');
    more = dot != std::string_view::npos;
    parts[fields++] = text.substr(0, dot);
    if (more) text.remove_prefix(dot + 1);
  }
  if (fields < 4) return std::nullopt;
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
  if (fields == 5) {
    if (parts[4].size() != kResumeSealHexDigits || !IsLowerHex(parts[4])) return std::nullopt;
    token.seal = parts[4];
  }
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
  return ToHex(bytes.data(), bytes.size());
}

}  // namespace metronome::server
