// libFuzzer target: every parser of bytes a rank reads from the rendezvous.
// Byte 0 picks the parser, the rest is its input:
//   0  a Store request body (store_proto::parse_request: the server's parser)
//   1  a handshake hello (what a stranger sends first)
//   2  a handshake challenge and 3 its answer (what a fake server sends)
//   4  agreement fields (decode_fields)
//   5  a sealed value (unseal_value)
//   6  a peer blob (a UCX worker address frame, NCCL's id)
//   7  a UCX worker address (check_worker_address, against a real v1 or v2
//      address of this rank: byte 0's bit 3 picks which)
// Contract: no crash, no out-of-bounds read (ASan), no undefined behaviour
// (UBSan); malformed input is refused (nullopt or IoError); and what a
// parser accepts re-encodes to exactly the bytes it was given, so nothing
// was read past, skipped or invented.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "comm/engine/agreement.h"
#include "comm/security/peer_blob.h"
#include "comm/store/sealed_store.h"
#include "comm/store/store_handshake.h"
#include "comm/store/store_protocol.h"
#include "comm/transports/ucx/worker_address.h"
#include "common/bytes.h"
#include "common/error.h"
#include "tests/fuzz/ucx_address_samples.h"

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

std::string reencode(const gz::store_proto::Request& q) {
  namespace sp = gz::store_proto;
  std::string b;
  gz::bytes::Writer w(b);
  w.put(static_cast<std::uint8_t>(q.op));
  switch (q.op) {
    case sp::Op::Set:
      w.str(q.keys[0]);
      w.str(q.value);
      break;
    case sp::Op::Get:
      w.str(q.keys[0]);
      break;
    case sp::Op::Wait:
      w.put(q.timeout_ms);
      w.put(static_cast<std::uint32_t>(q.keys.size()));
      for (auto k : q.keys) w.str(k);
      break;
    case sp::Op::Add:
      w.str(q.keys[0]);
      w.put(q.delta);
      break;
    case sp::Op::Erase:
      w.put(static_cast<std::uint32_t>(q.keys.size()));
      for (auto k : q.keys) w.str(k);
      break;
  }
  return b;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::string in(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 8) {
    case 0:
      if (const auto q = gz::store_proto::parse_request(in)) {
        for (auto k : q->keys) check(!k.empty() && k.size() <= gz::store_proto::kMaxKey);
        check(reencode(*q) == in);
      }
      break;
    case 1:
      if (const auto h = gz::store_hs::parse_hello(in)) check(gz::store_hs::encode_hello(*h) == in);
      break;
    case 2: {
      std::uint32_t version = 0;
      if (const auto nonce = gz::store_hs::parse_challenge(in, &version))
        check(version != gz::store_hs::kVersion || gz::store_hs::encode_challenge(*nonce) == in);
      break;
    }
    case 3:
      if (const auto a = gz::store_hs::parse_answer(in))
        check((a->admitted ? gz::store_hs::encode_welcome(a->proof) : gz::store_hs::encode_refusal(a->reason)) == in);
      break;
    case 4:
      if (const auto f = gz::decode_fields(in)) check(gz::encode_fields(*f) == in);
      break;
    case 5:
      try {
        const std::string v = gz::unseal_value("fuzz-job-key", "gradzip/agree/0/1", in);
        check(gz::seal_value("fuzz-job-key", "gradzip/agree/0/1", v) == in);
      } catch (const gz::IoError&) {
      }
      break;
    case 6:
      try {
        const std::string blob = gz::parse_peer_blob(gz::kUcxAddressMagic, 1, 4096, in, "UCX worker address", 0);
        check(gz::frame_peer_blob(gz::kUcxAddressMagic, 1, blob) == in);
      } catch (const gz::IoError&) {
      }
      break;
    case 7: {
      // An address the check takes walks to its end under this rank's
      // layout, so it also passes as a rank's own address.
      const std::string& own = data[0] & 8 ? gz::test::kUcxAddressV2Tcp : gz::test::kUcxAddressV1Tcp;
      if (gz::check_worker_address(in, own).empty()) check(gz::check_worker_address(in, in).empty());
      break;
    }
  }
  return 0;
}
