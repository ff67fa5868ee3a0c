// The resume token (docs/protocol.md, "Resuming a session"): what a client presents in
// session.resume to get its session back after a dropped connection, or on another replica after
// a move. Opaque to clients; to replicas it says where the session's state is and proves the
// bearer was given it:
//
//   "mtr1." origin "." session "." secret "." model [ "." seal ]
//
// origin: base64url (no padding) of the holding replica's --advertise-url ("" when it has none:
// the token resumes only there); session: its id there, decimal; secret: 32 lowercase hex digits,
// 128 random bits from the kernel (getrandom), compared in constant time; model: base64url of the
// holder's model identity (Backend::model_identity), so a replica of another model refuses before
// fetching; seal: on a replica with a cluster secret, 32 lowercase hex digits, the first 128 bits
// of HMAC-SHA256(cluster secret, the token up to the seal). A replica fetches state only from the
// origin of a token whose seal holds under its own secret: a client cannot make it send requests,
// let alone the cluster secret, to an address of the client's choosing.
// A token is good once: a resume issues a new one.
//
// Thread-safety: pure functions (NewResumeSecret reads the kernel's generator).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace metronome::server {

struct ResumeToken {
  std::string origin;  // the holding replica's advertise URL; empty: no other replica reaches it
  std::uint64_t session = 0;
  std::string secret;  // kResumeSecretHexDigits lowercase hex digits
  std::string model;   // the holder's model identity
  std::string seal{};  // empty (the issuer has no cluster secret) or kResumeSealHexDigits hex
};
inline constexpr std::size_t kResumeSecretHexDigits = 32;
inline constexpr std::size_t kResumeSealHexDigits = 32;
inline constexpr std::size_t kMaxResumeTokenBytes = 1024;

[[nodiscard]] std::string EncodeResumeToken(const ResumeToken& token);
// nullopt for anything EncodeResumeToken does not produce (a wrong prefix, field count, encoding,
// secret length, or longer than kMaxResumeTokenBytes).
[[nodiscard]] std::optional<ResumeToken> ParseResumeToken(std::string_view text);
// `token` with its seal under `cluster_secret` (none when the secret is empty).
[[nodiscard]] ResumeToken Sealed(ResumeToken token, std::string_view cluster_secret);
// Whether `token` carries the seal `cluster_secret` gives it (compared in constant time); false
// for an empty secret or an unsealed token.
[[nodiscard]] bool SealHolds(const ResumeToken& token, std::string_view cluster_secret);
// 128 bits from getrandom(2), as hex. Throws std::runtime_error if the kernel cannot give them.
[[nodiscard]] std::string NewResumeSecret();

}  // namespace metronome::server
