// The resume token's form (resume_token.h) and the origin URLs a replica fetches from
// (state_fetch.h): round trips, and every malformed input refused.
#include "metronome/server/resume_token.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "metronome/server/state_fetch.h"

namespace metronome::server {
namespace {

TEST(ResumeTokenTest, RoundTripsEveryField) {
  for (const std::string origin : {"", "http://10.0.0.7:8080", "http://[::1]:9", "a"}) {
    const ResumeToken t{.origin = origin,
                        .session = 18446744073709551615ULL,
                        .secret = NewResumeSecret(),
                        .model = "sim:0.001,0.5e-6,1"};
    const auto parsed = ParseResumeToken(EncodeResumeToken(t));
    ASSERT_TRUE(parsed) << EncodeResumeToken(t);
    EXPECT_EQ(parsed->origin, origin);
    EXPECT_EQ(parsed->session, t.session);
    EXPECT_EQ(parsed->secret, t.secret);
    EXPECT_EQ(parsed->model, t.model);
  }
}

// The seal is HMAC-SHA256 (RFC 2104) of the unsealed token, its first 16 bytes in hex; the
// expected value is Python's hmac.new(b"correct horse", token, hashlib.sha256).hexdigest()[:32].
TEST(ResumeTokenTest, TheSealIsTheHmacOfTheToken) {
  const ResumeToken t = Sealed({.origin = "http://10.0.0.7:8080",
                                .session = 42,
                                .secret = "0123456789abcdef0123456789abcdef",
                                .model = "m-1"},
                               "correct horse");
  EXPECT_EQ(t.seal, "a019461453be1ebd4b4c852d5f1fdb60");
  EXPECT_EQ(EncodeResumeToken(t),
            "mtr1.aHR0cDovLzEwLjAuMC43OjgwODA.42.0123456789abcdef0123456789abcdef.bS0x."
            "a019461453be1ebd4b4c852d5f1fdb60");
  const auto parsed = ParseResumeToken(EncodeResumeToken(t));
  ASSERT_TRUE(parsed);
  EXPECT_EQ(parsed->seal, t.seal);
  EXPECT_TRUE(SealHolds(*parsed, "correct horse"));
}

TEST(ResumeTokenTest, TheSealHoldsOnlyForItsSecretAndItsFields) {
  const ResumeToken t = Sealed(
      {.origin = "http://a:1", .session = 7, .secret = NewResumeSecret(), .model = "m"}, "k");
  EXPECT_TRUE(SealHolds(t, "k"));
  EXPECT_FALSE(SealHolds(t, "K"));
  EXPECT_FALSE(SealHolds(t, "")) << "no secret: nothing holds";
  EXPECT_FALSE(SealHolds(Sealed(t, ""), "k")) << "unsealed";
  EXPECT_TRUE(Sealed(t, "").seal.empty());
  ResumeToken other_origin = t;
  other_origin.origin = "http://attacker:1";
  EXPECT_FALSE(SealHolds(other_origin, "k"));
  ResumeToken other_session = t;
  other_session.session = 8;
  EXPECT_FALSE(SealHolds(other_session, "k"));
  ResumeToken other_model = t;
  other_model.model = "n";
  EXPECT_FALSE(SealHolds(other_model, "k"));
}

TEST(ResumeTokenTest, SecretsAre128RandomBits) {
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    const std::string s = NewResumeSecret();
    EXPECT_EQ(s.size(), kResumeSecretHexDigits);
    EXPECT_TRUE(seen.insert(s).second) << "a repeated secret";
  }
}

TEST(ResumeTokenTest, MalformedTokensAreRefused) {
  const std::string secret(32, 'a');
  const std::string good = "mtr1.aHR0cDovL3g.7." + secret + ".bS0x";
  ASSERT_TRUE(ParseResumeToken(good));
  for (const std::string& bad : {
           std::string(""),
           std::string("mtr2.aHR0cDovL3g.7." + secret + ".bS0x"),
           std::string("mtr1.aHR0cDovL3g.7." + secret),              // a field short
           std::string("mtr1.aHR0cDovL3g.7." + secret + ".bS0x.x"),  // not a seal
           std::string("mtr1.aHR0cDovL3g.7." + secret + ".bS0x." + std::string(31, 'a')),
           std::string("mtr1.aHR0cDovL3g.7." + secret + ".bS0x." + std::string(32, 'A')),
           std::string("mtr1.aHR0cDovL3g.7." + secret + ".bS0x." + secret + ".x"),  // a field more
           std::string("mtr1.aHR0cDovL3g.7." + secret + ".bS0x."),                  // an empty seal
           std::string("mtr1.a*b.7." + secret + ".bS0x"),                           // not base64url
           std::string("mtr1.aHR0cDovL3g.07." + secret + ".bS0x"),  // a leading zero
           std::string("mtr1.aHR0cDovL3g.-7." + secret + ".bS0x"),  // negative
           std::string("mtr1.aHR0cDovL3g.99999999999999999999." + secret + ".bS0x"),  // > 2^64
           std::string("mtr1.aHR0cDovL3g.7." + std::string(31, 'a') + ".bS0x"),       // short
           std::string("mtr1.aHR0cDovL3g.7." + std::string(32, 'A') + ".bS0x"),       // not lower
           std::string("mtr1.aHR0cDovL3g.7." + secret + "."),                         // no model
           std::string("mtr1.aHR0cDovL3g.7." + secret + ".m 1"),                      // a space
           std::string("mtr1.aHR0cDovL3g.7." + secret + ".bS0" + std::string(1100, 'x')),
       }) {
    EXPECT_FALSE(ParseResumeToken(bad)) << bad;
  }
}

TEST(StateFetchTest, OriginsAreHttpHostAndPortOnly) {
  const auto o = ParseHttpOrigin("http://10.0.0.7:8080");
  ASSERT_TRUE(o);
  EXPECT_EQ(o->host, "10.0.0.7");
  EXPECT_EQ(o->port, "8080");
  EXPECT_EQ(ParseHttpOrigin("http://replica-a/")->port, "80");
  EXPECT_EQ(ParseHttpOrigin("http://[::1]:9")->host, "::1");
  for (const char* bad : {"https://a:1", "http://", "http://a:0", "http://a:65536", "http://a:x",
                          "http://a/b", "http://u@a:1", "ftp://a", "http://[::1", "a:1"}) {
    EXPECT_FALSE(ParseHttpOrigin(bad)) << bad;
  }
}

}  // namespace
}  // namespace metronome::server
