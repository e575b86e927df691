// Writes the seed corpora of rendezvous_fuzzer (one valid input per parser,
// byte 0 selecting it as there) and state_fuzzer (saved states of several
// layouts) into two directories.
#include <cstdio>
#include <string>
#include <vector>

#include "comm/engine/agreement.h"
#include "comm/security/crypto.h"
#include "comm/security/job_identity.h"
#include "comm/security/peer_blob.h"
#include "comm/store/sealed_store.h"
#include "comm/store/store_handshake.h"
#include "comm/store/store_protocol.h"
#include "comm/transports/ucx/worker_address.h"
#include "common/bytes.h"
#include "common/checksum.h"
#include "tests/fuzz/ucx_address_samples.h"

namespace {

int files = 0;

bool write(const std::string& dir, const std::string& name, char selector, const std::string& bytes) {
  std::FILE* f = std::fopen((dir + "/" + name).c_str(), "wb");
  if (!f) return false;
  std::fputc(selector, f);
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
  ++files;
  return true;
}

std::string request(gz::store_proto::Op op, const std::vector<std::string>& keys, const std::string& value = {}) {
  namespace sp = gz::store_proto;
  std::string b;
  gz::bytes::Writer w(b);
  w.put(static_cast<std::uint8_t>(op));
  if (op == sp::Op::Wait) w.put<std::uint32_t>(1000);
  if (op == sp::Op::Wait || op == sp::Op::Erase) w.put(static_cast<std::uint32_t>(keys.size()));
  for (const auto& k : keys) w.str(k);
  if (op == sp::Op::Set) w.str(value);
  if (op == sp::Op::Add) w.put<std::int64_t>(1);
  return b;
}

// A saved state as error_feedback.cc writes it.
std::string saved(const std::string& spec, std::uint64_t n, std::uint32_t rank, std::uint32_t world,
                  std::uint8_t algorithm, std::uint64_t worker, std::uint64_t server) {
  std::string s;
  gz::bytes::Writer w(s);
  w.put<std::uint32_t>(0x46455A47u);
  w.put<std::uint32_t>(2);
  w.str(spec);
  w.put(n);
  w.put(rank);
  w.put(world);
  w.put(algorithm);
  w.put(worker);
  w.put(server);
  for (std::uint64_t i = 0; i < worker + server; ++i) w.put(0.25f * static_cast<float>(i % 7) - 0.5f);
  w.put(gz::checksum64(s));
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s RENDEZVOUS_DIR STATE_DIR\n", argv[0]);
    return 2;
  }
  namespace sp = gz::store_proto;
  const std::string r = argv[1], st = argv[2];
  bool ok = write(r, "set", 0, request(sp::Op::Set, {"gradzip/ucx/addr/1"}, "value")) &&
            write(r, "get", 0, request(sp::Op::Get, {"gradzip/agree/0/1"})) &&
            write(r, "wait", 0, request(sp::Op::Wait, {"a", "b", "c"})) &&
            write(r, "add", 0, request(sp::Op::Add, {"gradzip/agree/0/read"})) &&
            write(r, "erase", 0, request(sp::Op::Erase, {"a", "b"}));
  const gz::JobIdentity job = gz::job_identity_from_token("fuzz-seed-token-0123456789");
  const std::string nonce(gz::store_hs::kNonceBytes, 'n');
  const gz::store_hs::Hello hello = gz::store_hs::make_hello(job, 1, 4, nonce);
  ok = ok && write(r, "hello", 1, gz::store_hs::encode_hello(hello)) &&
       write(r, "challenge", 2, gz::store_hs::encode_challenge(nonce)) &&
       write(r, "welcome", 3, gz::store_hs::encode_welcome(gz::store_hs::server_proof(job, hello, nonce))) &&
       write(r, "refused", 3, gz::store_hs::encode_refusal("this store belongs to another job")) &&
       write(r, "fields", 4, gz::encode_fields({{"codec", "onebit:block=512"}, {"n", "1000"}, {"op", "avg"}})) &&
       write(r, "sealed", 5, gz::seal_value("fuzz-job-key", "gradzip/agree/0/1", "fields")) &&
       write(r, "blob", 6, gz::frame_peer_blob(gz::kUcxAddressMagic, 1, std::string(200, 'u'))) &&
       write(r, "ucx_v1_tcp", 7, gz::test::kUcxAddressV1Tcp) && write(r, "ucx_v1_all", 7, gz::test::kUcxAddressV1All) &&
       write(r, "ucx_v1_named", 7, gz::test::kUcxAddressV1Named) && write(r, "ucx_v2_tcp", 15, gz::test::kUcxAddressV2Tcp);
  // Saved states: byte 0 even (the fuzzer fixes the checksum) and odd (as is).
  ok = ok && write(st, "onebit_allgather", 0, saved("onebit", 40, 0, 1, 1, 40, 0)) &&
       write(st, "topk_scatter", 1, saved("topk:density=0.1", 10, 1, 3, 2, 10, 3)) &&
       write(st, "none", 0, saved("none", 5, 0, 2, 1, 0, 0)) &&
       write(st, "fp16_ef_off", 1, saved("fp16:ef=off", 7, 2, 4, 2, 0, 0));
  if (!ok) return 1;
  std::printf("wrote %d seeds to %s and %s\n", files, argv[1], argv[2]);
  return 0;
}
