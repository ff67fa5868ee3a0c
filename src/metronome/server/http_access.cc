#include "metronome/server/http_access.h"

#include <cstddef>
#include <cstdint>
#include <string>

#include "metronome/base/errors.h"

namespace metronome::server {
namespace {

char Lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

std::string LowerCase(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = Lower(c);
  return out;
}

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (Lower(a[i]) != Lower(b[i])) return false;
  }
  return true;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The host of "host[:port]" or "[v6]:port" (brackets kept, so "[::1]" stays recognisable).
std::string_view HostOfAuthority(std::string_view authority) {
  if (authority.starts_with('[')) {
    const std::size_t close = authority.find(']');
    return close == std::string_view::npos ? authority : authority.substr(0, close + 1);
  }
  return authority.substr(0, authority.find(':'));
}

// The authority part of "scheme://authority" (nullopt if `origin` has no "://" or a path).
std::optional<std::string_view> AuthorityOfOrigin(std::string_view origin) {
  const std::size_t sep = origin.find("://");
  if (sep == std::string_view::npos || sep == 0) return std::nullopt;
  const std::string_view authority = origin.substr(sep + 3);
  if (authority.empty() || authority.find('/') != std::string_view::npos) return std::nullopt;
  return authority;
}

bool IsLoopbackName(std::string_view host) {
  const std::string h = LowerCase(host);
  if (h == "localhost" || h.ends_with(".localhost") || h == "[::1]") return true;
  // 127.0.0.0/8 as a dotted quad.
  if (!h.starts_with("127.")) return false;
  int dots = 0;
  for (const char c : h) {
    if (c == '.') {
      ++dots;
    } else if (c < '0' || c > '9') {
      return false;
    }
  }
  return dots == 3;
}

bool IsBase64Char(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' ||
         c == '/';
}

}  // namespace

AllowedOrigins ParseAllowedOrigins(std::string_view text) {
  text = Trim(text);
  if (text.empty()) return std::nullopt;
  std::vector<std::string> list;
  while (true) {
    const std::size_t comma = text.find(',');
    const std::string_view item = Trim(text.substr(0, comma));
    if (item != "*") {
      const auto authority = AuthorityOfOrigin(item);
      const std::string_view scheme = item.substr(0, item.find("://"));
      if (!authority || !(EqualsIgnoreCase(scheme, "http") || EqualsIgnoreCase(scheme, "https")) ||
          HostOfAuthority(*authority).empty()) {
        throw ConfigError("allowed_origins: '" + std::string(item) +
                          "' is not an origin (http(s)://host[:port], or * for any)");
      }
    }
    list.push_back(LowerCase(item));
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return list;
}

bool OriginAllowed(std::string_view origin, std::string_view host, const AllowedOrigins& allowed,
                   bool token_required) {
  origin = Trim(origin);
  if (origin.empty()) return true;
  if (allowed) {
    for (const std::string& a : *allowed) {
      if (a == "*" || EqualsIgnoreCase(origin, a)) return true;
    }
    return false;
  }
  if (token_required) return true;
  const auto authority = AuthorityOfOrigin(origin);  // "null" (sandboxed pages) has none
  if (!authority) return false;
  const std::string_view origin_host = HostOfAuthority(*authority);
  if (IsLoopbackName(origin_host)) return true;
  const std::string_view host_host = HostOfAuthority(Trim(host));
  return !host_host.empty() && EqualsIgnoreCase(origin_host, host_host);
}

std::string AuthTokenProblem(std::string_view token) {
  if (token.empty()) return "is empty";
  const auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  bool all_blank = true;
  for (const char c : token) all_blank = all_blank && blank(c);
  if (all_blank) return "is only whitespace";
  if (blank(token.front()) || blank(token.back())) {
    return "starts or ends with whitespace (a request's header value is trimmed: it could never "
           "match)";
  }
  for (std::size_t i = 0; i < token.size(); ++i) {
    const auto c = static_cast<unsigned char>(token[i]);
    if (c < 0x20 || c == 0x7f) {
      return "holds a control character (byte " + std::to_string(c) + " at offset " +
             std::to_string(i) + ") that no HTTP header can carry";
    }
  }
  return "";
}

bool ConstantTimeEquals(std::string_view given, std::string_view expected) {
  // No early exit: every byte of `expected` is compared, whatever matched before.
  std::uint32_t diff = given.size() == expected.size() ? 0U : 1U;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const auto g = static_cast<unsigned char>(i < given.size() ? given[i] : 0);
    diff |= static_cast<std::uint32_t>(g ^ static_cast<unsigned char>(expected[i]));
  }
  return diff == 0U;
}

bool IsValidWebSocketKey(std::string_view key) {
  if (key.size() != 24 || key[22] != '=' || key[23] != '=') return false;
  for (std::size_t i = 0; i < 22; ++i) {
    if (!IsBase64Char(key[i])) return false;
  }
  const char last = key[21];  // 2 data bits and 4 zero padding bits
  return last == 'A' || last == 'Q' || last == 'g' || last == 'w';
}

}  // namespace metronome::server
