// The HTTP edge's access rules (server/http_access.h), table-driven: which Origins may upgrade
// under each policy, the --allowed-origins parser, the constant-time token comparison and RFC
// 6455's Sec-WebSocket-Key check.
#include "metronome/server/http_access.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "metronome/base/errors.h"

namespace metronome::server {
namespace {

struct OriginCase {
  std::string origin;  // "" : no Origin header
  std::string host;
  bool allowed;
};

TEST(OriginAllowedTest, DefaultWithoutATokenAllowsOnlyTheSameHostAndLoopbackNames) {
  const std::vector<OriginCase> cases = {
      {"", "127.0.0.1:8080", true},  // not a browser
      {"http://127.0.0.1:8080", "127.0.0.1:8080", true},
      {"http://127.0.0.1:3000", "127.0.0.1:8080", true},  // a loopback page, another port
      {"http://localhost:5173", "127.0.0.1:8080", true},
      {"http://app.localhost", "127.0.0.1:8080", true},
      {"http://127.1.2.3", "127.0.0.1:8080", true},
      {"http://[::1]:8080", "[::1]:8080", true},
      {"https://Box.Example:8443", "box.example:8080", true},  // same host, any case
      {"http://box.example", "box.example", true},
      {"https://evil.example", "127.0.0.1:8080", false},
      {"https://evil.example", "box.example:8080", false},
      {"http://127.0.0.1.evil.example", "127.0.0.1:8080", false},
      {"http://localhost.evil.example", "127.0.0.1:8080", false},
      {"http://127.0.0.x", "127.0.0.1:8080", false},
      {"null", "127.0.0.1:8080", false},  // sandboxed iframes, file:// pages
      {"http://evil.example", "", false},
  };
  for (const OriginCase& c : cases) {
    EXPECT_EQ(OriginAllowed(c.origin, c.host, std::nullopt, /*token_required=*/false), c.allowed)
        << "Origin '" << c.origin << "' Host '" << c.host << "'";
  }
}

TEST(OriginAllowedTest, DefaultWithATokenAllowsAnyOrigin) {
  EXPECT_TRUE(OriginAllowed("https://evil.example", "127.0.0.1:8080", std::nullopt, true));
  EXPECT_TRUE(OriginAllowed("null", "127.0.0.1:8080", std::nullopt, true));
}

TEST(OriginAllowedTest, AnExplicitListAllowsExactlyItsEntries) {
  const AllowedOrigins list = ParseAllowedOrigins("https://app.example, http://Localhost:3000");
  for (const bool token : {false, true}) {
    EXPECT_TRUE(OriginAllowed("https://app.example", "x:1", list, token));
    EXPECT_TRUE(OriginAllowed("HTTPS://APP.EXAMPLE", "x:1", list, token));
    EXPECT_TRUE(OriginAllowed("http://localhost:3000", "x:1", list, token));
    EXPECT_TRUE(OriginAllowed("", "x:1", list, token));
    EXPECT_FALSE(OriginAllowed("http://localhost:3001", "x:1", list, token));
    EXPECT_FALSE(OriginAllowed("http://app.example", "x:1", list, token));  // scheme differs
    // Same host is no longer enough once a list is given.
    EXPECT_FALSE(OriginAllowed("http://box.example", "box.example", list, token));
  }
  const AllowedOrigins any = ParseAllowedOrigins("*");
  EXPECT_TRUE(OriginAllowed("https://evil.example", "127.0.0.1", any, false));
}

TEST(ParseAllowedOriginsTest, EmptyIsTheDefaultRuleAndBadEntriesNameThemselves) {
  EXPECT_EQ(ParseAllowedOrigins(""), std::nullopt);
  EXPECT_EQ(ParseAllowedOrigins("  "), std::nullopt);
  EXPECT_EQ(ParseAllowedOrigins("https://A.example:8443"),
            (std::vector<std::string>{"https://a.example:8443"}));
  for (const std::string bad : {"app.example", "ftp://app.example", "https://", "https://a/b",
                                "https://a.example,", "://a"}) {
    try {
      (void)ParseAllowedOrigins(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("allowed_origins"), std::string::npos) << e.what();
    }
  }
}

TEST(ConstantTimeEqualsTest, EqualsExactlyWhenEveryByteAndTheLengthMatch) {
  EXPECT_TRUE(ConstantTimeEquals("Bearer sesame", "Bearer sesame"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_FALSE(ConstantTimeEquals("Bearer sesamE", "Bearer sesame"));   // last byte
  EXPECT_FALSE(ConstantTimeEquals("bearer sesame", "Bearer sesame"));   // first byte
  EXPECT_FALSE(ConstantTimeEquals("Bearer sesam", "Bearer sesame"));    // a prefix
  EXPECT_FALSE(ConstantTimeEquals("Bearer sesame!", "Bearer sesame"));  // longer
  EXPECT_FALSE(ConstantTimeEquals("", "Bearer sesame"));
  EXPECT_FALSE(ConstantTimeEquals("x", ""));
  // A NUL padded guess of the right length is still different.
  EXPECT_FALSE(ConstantTimeEquals(std::string("Bearer sesam\0", 13), "Bearer sesame"));
}

// The server's token: anything a request could match, nothing that silently opens or locks it.
TEST(AuthTokenTest, EmptyBlankPaddedAndControlTokensAreNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"sesame", ""},
      {"a b", ""},  // inner spaces travel in a header
      {"tok-EN_1.2~+/=", ""},
      {"", "is empty"},
      {" ", "is only whitespace"},
      {"\t \n", "is only whitespace"},
      {" sesame", "starts or ends with whitespace"},
      {"sesame\n", "starts or ends with whitespace"},
      {"ses\x01"
       "ame",
       "holds a control character (byte 1 at offset 3)"},
      {std::string("ses\0ame", 7), "holds a control character (byte 0 at offset 3)"},
      {"ses\x7f", "holds a control character (byte 127 at offset 3)"},
  };
  for (const auto& [token, problem] : cases) {
    const std::string got = AuthTokenProblem(token);
    if (problem.empty()) {
      EXPECT_EQ(got, "") << "'" << token << "'";
    } else {
      EXPECT_TRUE(got.starts_with(problem)) << "'" << token << "': " << got;
    }
  }
}

TEST(WebSocketKeyTest, OnlyTheBase64OfSixteenBytesIsAccepted) {
  const std::vector<std::pair<std::string, bool>> cases = {
      {"dGhlIHNhbXBsZSBub25jZQ==", true},  // RFC 6455's example
      {"AAAAAAAAAAAAAAAAAAAAAA==", true},
      {"/////////////////////w==", true},
      {"+++++++++++++++++++++g==", true},
      {"", false},
      {"x", false},
      {"dGhlIHNhbXBsZSBub25jZQ=", false},    // 23 characters
      {"dGhlIHNhbXBsZSBub25jZQ===", false},  // 25
      {"dGhlIHNhbXBsZSBub25jZR==", false},   // padding bits set
      {"dGhlIHNhbXBsZSBub25jZ===", false},
      {"dGhlIHNhbXBsZSBub25j!Q==", false},  // not base64
      {"dGhlIHNhbXBsZSBub25jZQAA", false},  // no padding
      {"dGhlIHNhbXBsZSBub25jZQ", false},
      {"dGhlIHNhbXBsZSBub25jZW9uY2U=", false},  // 20 bytes
  };
  for (const auto& [key, valid] : cases) {
    EXPECT_EQ(IsValidWebSocketKey(key), valid) << "'" << key << "'";
  }
}

}  // namespace
}  // namespace metronome::server
