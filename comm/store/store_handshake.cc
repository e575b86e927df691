#include "comm/store/store_handshake.h"

#include "comm/security/crypto.h"
#include "common/bytes.h"

namespace gz::store_hs {
namespace {

std::string transcript(std::string_view label, const Hello& h, std::string_view server_nonce) {
  std::string t(label);
  bytes::Writer w(t);
  w.put(h.version);
  w.str(h.job_id);
  w.put(h.world_size);
  w.put(h.rank);
  w.raw(server_nonce);
  w.raw(h.nonce);
  return t;
}

std::string proof(const JobIdentity& job, std::string_view label, const Hello& h, std::string_view server_nonce) {
  return std::string(crypto::as_bytes(crypto::hmac_sha256(job.mac_key(), transcript(label, h, server_nonce))));
}

constexpr std::string_view kHelloLabel = "gradzip store hello\n";
constexpr std::string_view kWelcomeLabel = "gradzip store welcome\n";

std::string with_kind(Kind k) {
  std::string s;
  bytes::Writer(s).put(static_cast<std::uint8_t>(k));
  return s;
}

}  // namespace

std::string encode_challenge(std::string_view server_nonce) {
  std::string s = with_kind(Kind::Challenge);
  bytes::Writer w(s);
  w.put(kVersion);
  w.raw(server_nonce);
  return s;
}

std::optional<std::string> parse_challenge(std::string_view body, std::uint32_t* version) {
  bytes::Reader r(body);
  const auto kind = r.get<std::uint8_t>();
  *version = r.get<std::uint32_t>();
  const std::string_view nonce = r.raw(kNonceBytes);
  if (!r.ok() || !r.at_end() || kind != static_cast<std::uint8_t>(Kind::Challenge)) return std::nullopt;
  return std::string(nonce);
}

std::string encode_hello(const Hello& h) {
  std::string s = with_kind(Kind::Hello);
  bytes::Writer w(s);
  w.put(h.version);
  w.str(h.job_id);
  w.put(h.world_size);
  w.put(h.rank);
  w.raw(h.nonce);
  w.raw(h.proof);
  return s;
}

std::optional<Hello> parse_hello(std::string_view body) {
  bytes::Reader r(body);
  Hello h;
  const auto kind = r.get<std::uint8_t>();
  h.version = r.get<std::uint32_t>();
  h.job_id = std::string(r.str(kMaxJobId, "job id"));
  h.world_size = r.get<std::uint32_t>();
  h.rank = r.get<std::uint32_t>();
  h.nonce = std::string(r.raw(kNonceBytes));
  h.proof = std::string(r.raw(kProofBytes));
  if (!r.ok() || !r.at_end() || kind != static_cast<std::uint8_t>(Kind::Hello)) return std::nullopt;
  return h;
}

std::string encode_welcome(std::string_view server_proof) {
  std::string s = with_kind(Kind::Welcome);
  bytes::Writer(s).raw(server_proof);
  return s;
}

std::string encode_refusal(std::string_view reason) {
  std::string s = with_kind(Kind::Refused);
  bytes::Writer(s).str(reason.substr(0, kMaxReason));
  return s;
}

std::optional<Answer> parse_answer(std::string_view body) {
  bytes::Reader r(body);
  Answer a;
  const auto kind = r.get<std::uint8_t>();
  if (kind == static_cast<std::uint8_t>(Kind::Welcome)) {
    a.admitted = true;
    a.proof = std::string(r.raw(kProofBytes));
  } else if (kind == static_cast<std::uint8_t>(Kind::Refused)) {
    a.reason = std::string(r.str(kMaxReason, "reason"));
  } else {
    return std::nullopt;
  }
  if (!r.ok() || !r.at_end()) return std::nullopt;
  return a;
}

Hello make_hello(const JobIdentity& job, int rank, int world_size, std::string_view server_nonce) {
  Hello h;
  h.job_id = job.id.substr(0, kMaxJobId);
  h.world_size = static_cast<std::uint32_t>(world_size);
  h.rank = static_cast<std::uint32_t>(rank);
  h.nonce = crypto::random_bytes(kNonceBytes);
  h.proof = proof(job, kHelloLabel, h, server_nonce);
  return h;
}

std::string server_proof(const JobIdentity& job, const Hello& h, std::string_view server_nonce) {
  return proof(job, kWelcomeLabel, h, server_nonce);
}

bool server_proof_ok(const JobIdentity& job, const Hello& h, std::string_view server_nonce, std::string_view p) {
  return crypto::equal_constant_time(server_proof(job, h, server_nonce), p);
}

std::string check_hello(const Hello& h, const JobIdentity& job, int world_size, std::string_view server_nonce) {
  const auto world = static_cast<std::uint32_t>(world_size);
  if (h.version != kVersion)
    return "the client speaks store protocol version " + std::to_string(h.version) + ", this store " +
           std::to_string(kVersion) + " (ranks from different gradzip versions?)";
  if (h.job_id != job.id.substr(0, kMaxJobId) || h.world_size != world)
    return "this store belongs to another job: job '" + job.id + "' with " + std::to_string(world) +
           " ranks, and the client is of job '" + h.job_id + "' with " + std::to_string(h.world_size) +
           " ranks (two jobs on one MASTER_ADDR:MASTER_PORT? give each job its own MASTER_PORT)";
  if (!crypto::equal_constant_time(proof(job, kHelloLabel, h, server_nonce), h.proof))
    return "the client's proof of the job token is wrong (is GRADZIP_JOB_TOKEN the same on every rank?)";
  if (h.rank >= world)
    return "rank " + std::to_string(h.rank) + " is not in [0, " + std::to_string(world) + ")";
  return {};
}

}  // namespace gz::store_hs
