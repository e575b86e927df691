// The TcpStore handshake: the first frames of every connection (frames as in
// store_protocol.h), before any key is read or written.
//
//   server -> client  Challenge = u8 0x10 | u32 version | 16-byte server nonce
//   client -> server  Hello     = u8 0x11 | u32 version | u32 id_bytes | job id | u32 world size | u32 rank |
//                                 16-byte client nonce | 32-byte client proof
//   server -> client  Welcome   = u8 0x12 | 32-byte server proof
//                  or Refused   = u8 0x13 | u32 reason_bytes | reason (the connection then closes)
//
// Proofs are HMAC-SHA256 under the job's key (JobIdentity::mac_key: the
// token) over one transcript, with a different label each way:
//   transcript = version | job id | world size | rank | server nonce | client nonce
//   client proof = HMAC(key, "gradzip store hello\n" | transcript)
//   server proof = HMAC(key, "gradzip store welcome\n" | transcript)
// The server's fresh nonce makes a recorded hello useless on another
// connection; the client checks the server's proof before it sends a key or
// value, so a program squatting on MASTER_PORT learns nothing but one proof
// over nonces it chose (which is why tokens must be random: see
// kMinTokenBytes). Proofs are compared in constant time.
//
// The job id and world size travel in the clear so that a rank of another
// job is refused with a message naming the clash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "comm/security/job_identity.h"

namespace gz::store_hs {

inline constexpr std::uint32_t kVersion = 2;
inline constexpr std::size_t kNonceBytes = 16;
inline constexpr std::size_t kProofBytes = 32;
inline constexpr std::size_t kMaxJobId = 64;
inline constexpr std::size_t kMaxReason = 512;
/// Every handshake body fits: a refusal is the largest (1+4+512 bytes; a
/// hello is at most 1+4+4+64+4+4+16+32).
inline constexpr std::size_t kMaxBody = 1 + 4 + kMaxReason;

enum class Kind : std::uint8_t { Challenge = 0x10, Hello = 0x11, Welcome = 0x12, Refused = 0x13 };

struct Hello {
  std::uint32_t version = kVersion;
  std::string job_id;
  std::uint32_t world_size = 0, rank = 0;
  std::string nonce;  ///< the client's
  std::string proof;
};

/// The server's answer to a hello: admitted (with its proof) or refused.
struct Answer {
  bool admitted = false;
  std::string proof;   ///< admitted
  std::string reason;  ///< refused
};

std::string encode_challenge(std::string_view server_nonce);
/// The server nonce; nullopt unless a well-formed challenge of this version.
std::optional<std::string> parse_challenge(std::string_view body, std::uint32_t* version);

std::string encode_hello(const Hello& h);
std::optional<Hello> parse_hello(std::string_view body);

std::string encode_welcome(std::string_view server_proof);
std::string encode_refusal(std::string_view reason);
std::optional<Answer> parse_answer(std::string_view body);

/// A hello for `job`, as `rank` of `world_size`, answering `server_nonce`.
Hello make_hello(const JobIdentity& job, int rank, int world_size, std::string_view server_nonce);

/// The server's proof for a hello it admits.
std::string server_proof(const JobIdentity& job, const Hello& h, std::string_view server_nonce);
/// Whether `proof` is the server's proof for the hello the client sent.
bool server_proof_ok(const JobIdentity& job, const Hello& h, std::string_view server_nonce, std::string_view proof);

/// The server's verdict on a hello: "" to admit it, else why it is refused
/// (another version, another job, another world size, a bad proof, a rank out
/// of range). One connection per rank is the server's own check.
std::string check_hello(const Hello& h, const JobIdentity& job, int world_size, std::string_view server_nonce);

}  // namespace gz::store_hs
