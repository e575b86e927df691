// The formats and primitives of the rendezvous, each on its own: SHA-256 and
// HMAC against their published vectors, the checksum, the job identity, the
// peer-blob frame (UCX addresses, NCCL's id), the store handshake and the
// request parser. (The same parsers are fuzzed: tests/fuzz/.)
#include <gtest/gtest.h>

#include <random>

#include "comm/security/crypto.h"
#include "comm/security/job_identity.h"
#include "comm/security/peer_blob.h"
#include "comm/store/store_handshake.h"
#include "comm/store/store_protocol.h"
#include "comm/transports/ucx/worker_address.h"
#include "common/bytes.h"
#include "common/checksum.h"
#include "common/error.h"
#include "tests/fuzz/ucx_address_samples.h"

namespace gz {
namespace {

using test::kUcxAddressV1All;
using test::kUcxAddressV1Named;
using test::kUcxAddressV1Tcp;
using test::kUcxAddressV2Tcp;

// Real addresses of UCX 1.13.1 pass; what a member of another version or
// configuration, or a damaged one, would hand ucp_ep_create does not.
TEST(UcxWorkerAddress, TakesRealAddressesAndRefusesWhatUcxCannotRead) {
  for (const std::string* own : {&kUcxAddressV1Tcp, &kUcxAddressV2Tcp, &kUcxAddressV1All, &kUcxAddressV1Named}) {
    EXPECT_EQ(check_worker_address(*own, *own), "");
    for (std::size_t k = 0; k < own->size(); ++k)
      EXPECT_NE(check_worker_address(own->substr(0, k), *own), "") << "truncated to " << k;
    EXPECT_NE(check_worker_address(*own + "x", *own), "");
    for (unsigned v = 2; v < 16; ++v) {  // UCX asserts on any version but v1 and v2
      std::string bad = *own;
      bad[0] = static_cast<char>((bad[0] & 0xf0) | v);
      EXPECT_NE(check_worker_address(bad, *own).find("neither v1 nor v2"), std::string::npos);
    }
  }
  // Other addresses of the same version and configuration pass.
  EXPECT_EQ(check_worker_address(kUcxAddressV1All, kUcxAddressV1Tcp), "");
  EXPECT_EQ(check_worker_address(kUcxAddressV1Named, kUcxAddressV1Tcp), "");
  EXPECT_NE(check_worker_address(kUcxAddressV2Tcp, kUcxAddressV1Tcp).find("UCX_ADDRESS_VERSION"), std::string::npos);
  EXPECT_NE(check_worker_address(kUcxAddressV1Tcp, kUcxAddressV2Tcp).find("UCX_ADDRESS_VERSION"), std::string::npos);
  // Every single-bit flip is either refused or still walks to the end (a
  // flip inside an address or attribute is UCX's to judge).
  for (std::size_t i = 0; i < kUcxAddressV1Tcp.size(); ++i)
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = kUcxAddressV1Tcp;
      bad[i] = static_cast<char>(bad[i] ^ (1 << bit));
      if (check_worker_address(bad, kUcxAddressV1Tcp).empty()) {
        EXPECT_EQ(check_worker_address(bad, bad), "");
      }
    }
  // An interface length that claims endpoint addresses (a worker address has none).
  std::string ep = kUcxAddressV1Tcp;
  ep[47] = static_cast<char>(ep[47] | 0x40);  // the first interface's length byte
  EXPECT_NE(check_worker_address(ep, kUcxAddressV1Tcp), "");
}

std::string hex(const crypto::Digest& d) { return crypto::to_hex(crypto::as_bytes(d)); }

TEST(Crypto, Sha256MatchesFips180Vectors) {
  EXPECT_EQ(hex(crypto::sha256("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex(crypto::sha256("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hex(crypto::sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // A million 'a's, fed in uneven pieces (the incremental path).
  crypto::Sha256 s;
  const std::string piece(997, 'a');
  std::size_t left = 1000000;
  for (; left >= piece.size(); left -= piece.size()) s.update(piece);
  s.update(std::string(left, 'a'));
  EXPECT_EQ(hex(s.finish()), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Crypto, HmacMatchesRfc4231Vectors) {
  EXPECT_EQ(hex(crypto::hmac_sha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(hex(crypto::hmac_sha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(hex(crypto::hmac_sha256(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST(Crypto, ConstantTimeCompareAndRandomBytes) {
  EXPECT_TRUE(crypto::equal_constant_time("abc", "abc"));
  EXPECT_FALSE(crypto::equal_constant_time("abc", "abd"));
  EXPECT_FALSE(crypto::equal_constant_time("abc", "ab"));
  const std::string a = crypto::random_bytes(16), b = crypto::random_bytes(16);
  EXPECT_EQ(a.size(), 16u);
  EXPECT_NE(a, b);
}

TEST(Checksum, EveryFlippedBitAndEveryTruncationChangesIt) {
  std::mt19937 rng(7);
  for (std::size_t n : {0u, 1u, 7u, 8u, 31u, 32u, 33u, 100u, 1000u}) {
    std::string s(n, '\0');
    for (auto& c : s) c = static_cast<char>(rng());
    const std::uint64_t sum = checksum64(s);
    for (std::size_t i = 0; i < n; ++i)
      for (int bit = 0; bit < 8; ++bit) {
        std::string t = s;
        t[i] = static_cast<char>(t[i] ^ (1 << bit));
        ASSERT_NE(checksum64(t), sum) << "n=" << n << " byte " << i << " bit " << bit;
      }
    for (std::size_t k = 0; k < n; ++k) ASSERT_NE(checksum64(s.substr(0, k)), sum) << "n=" << n << " cut at " << k;
    EXPECT_EQ(checksum64(s), sum);  // deterministic
  }
}

TEST(JobIdentity, TokenGivesAStableIdAndShortTokensAreRefused) {
  const JobIdentity a = job_identity_from_token("3b9f04e1c7a25d86f0e2"), b = job_identity_from_token("3b9f04e1c7a25d86f0e2");
  EXPECT_TRUE(a.secret());
  EXPECT_EQ(a.id, b.id);
  EXPECT_EQ(a.id.size(), 16u);
  EXPECT_EQ(a.id.find("3b9f04e1c7a25d86f0e2"), std::string::npos);  // the id does not reveal the token
  EXPECT_NE(job_identity_from_token("3b9f04e1c7a25d86f0e3").id, a.id);
  EXPECT_THROW(job_identity_from_token("short"), InvalidArgument);
  EXPECT_EQ(new_job_token().size(), 32u);
  EXPECT_NE(new_job_token(), new_job_token());
}

TEST(PeerBlob, RoundTripsAndRejectsDamageNamingTheRank) {
  const std::string blob(300, 'u');
  const std::string framed = frame_peer_blob(kUcxAddressMagic, 3, blob);
  EXPECT_EQ(parse_peer_blob(kUcxAddressMagic, 3, 1000, framed, "UCX worker address", 0), blob);
  auto rejects = [&](const std::string& bad, std::size_t max, std::uint32_t magic, int rank) {
    try {
      parse_peer_blob(magic, rank, max, bad, "UCX worker address", 0);
      return false;
    } catch (const IoError& e) {
      return std::string(e.what()).find("of rank " + std::to_string(rank)) != std::string::npos;
    }
  };
  for (std::size_t i = 0; i < framed.size(); ++i) {  // any flipped byte
    std::string bad = framed;
    bad[i] = static_cast<char>(bad[i] ^ 0x40);
    EXPECT_TRUE(rejects(bad, 1000, kUcxAddressMagic, 3)) << "byte " << i;
  }
  for (std::size_t k = 0; k < framed.size(); ++k) EXPECT_TRUE(rejects(framed.substr(0, k), 1000, kUcxAddressMagic, 3));
  EXPECT_TRUE(rejects(framed + "x", 1000, kUcxAddressMagic, 3));
  EXPECT_TRUE(rejects(framed, 1000, kUcxAddressMagic, 2));   // written as another rank's
  EXPECT_TRUE(rejects(framed, 1000, 0x494E5A47u, 3));        // another kind (NCCL's unique id)
  EXPECT_TRUE(rejects(framed, 299, kUcxAddressMagic, 3));    // over the limit
  std::mt19937 rng(1);
  for (std::size_t n : {64u, 400u}) {  // the random values a stray client wrote in the issue
    std::string junk(n, '\0');
    for (auto& c : junk) c = static_cast<char>(rng());
    EXPECT_TRUE(rejects(junk, 1 << 16, kUcxAddressMagic, 1));
  }
}

TEST(StoreHandshake, AdmitsTheJobAndRefusesEverythingElse) {
  const JobIdentity job = job_identity_from_token("the-token-of-job-A"), other = job_identity_from_token("the-token-of-job-B");
  const std::string nonce = crypto::random_bytes(store_hs::kNonceBytes);
  std::uint32_t version = 0;
  EXPECT_EQ(store_hs::parse_challenge(store_hs::encode_challenge(nonce), &version), nonce);
  EXPECT_EQ(version, store_hs::kVersion);

  const store_hs::Hello good = store_hs::make_hello(job, 1, 4, nonce);
  const auto parsed = store_hs::parse_hello(store_hs::encode_hello(good));
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(store_hs::check_hello(*parsed, job, 4, nonce), "");
  // The server's proof verifies for the client; the client's does not pass as the server's.
  EXPECT_TRUE(store_hs::server_proof_ok(job, good, nonce, store_hs::server_proof(job, good, nonce)));
  EXPECT_FALSE(store_hs::server_proof_ok(job, good, nonce, good.proof));
  EXPECT_FALSE(store_hs::server_proof_ok(other, good, nonce, store_hs::server_proof(job, good, nonce)));

  auto refused = [&](const store_hs::Hello& h, int world, const std::string& word) {
    const std::string why = store_hs::check_hello(h, job, world, nonce);
    EXPECT_NE(why.find(word), std::string::npos) << why;
  };
  refused(store_hs::make_hello(other, 1, 4, nonce), 4, "another job");        // another job
  refused(good, 8, "another job");                                             // another world size
  refused(store_hs::make_hello(job, 1, 4, crypto::random_bytes(16)), 4, "proof");  // a replayed or stale proof
  store_hs::Hello forged = store_hs::make_hello(other, 1, 4, nonce);
  forged.job_id = job.id;  // claims the job without its token
  refused(forged, 4, "proof");
  refused(store_hs::make_hello(job, 4, 4, nonce), 4, "not in [0, 4)");
  store_hs::Hello old = good;
  old.version = 1;
  refused(old, 4, "version");

  const auto welcome = store_hs::parse_answer(store_hs::encode_welcome(std::string(32, 'p')));
  ASSERT_TRUE(welcome && welcome->admitted);
  const auto refusal = store_hs::parse_answer(store_hs::encode_refusal("no"));
  ASSERT_TRUE(refusal && !refusal->admitted);
  EXPECT_EQ(refusal->reason, "no");
  for (const std::string& junk : {std::string(), std::string("\x11"), store_hs::encode_hello(good) + "x",
                                  std::string("GET / HTTP/1.1")}) {
    EXPECT_FALSE(store_hs::parse_hello(junk).has_value());
    EXPECT_FALSE(store_hs::parse_answer(junk).has_value());
    EXPECT_FALSE(store_hs::parse_challenge(junk, &version).has_value());
  }
}

TEST(StoreProtocol, ParsesEveryRequestAndRejectsMalformedOnes) {
  auto body = [](auto&&... fields) {
    std::string b;
    bytes::Writer w(b);
    (w.put(fields), ...);
    return b;
  };
  std::string set = body(static_cast<std::uint8_t>(store_proto::Op::Set));
  bytes::Writer(set).str("key");
  bytes::Writer(set).str("value");
  auto q = store_proto::parse_request(set);
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ(q->keys.at(0), "key");
  EXPECT_EQ(q->value, "value");
  EXPECT_FALSE(store_proto::parse_request(set + "x").has_value());                 // trailing bytes
  EXPECT_FALSE(store_proto::parse_request(set.substr(0, set.size() - 1)).has_value());  // truncated
  std::string erase = body(static_cast<std::uint8_t>(store_proto::Op::Erase), std::uint32_t{2});
  bytes::Writer(erase).str("a");
  bytes::Writer(erase).str("b");
  q = store_proto::parse_request(erase);
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ(q->keys.size(), 2u);
  std::string empty_key = body(static_cast<std::uint8_t>(store_proto::Op::Get), std::uint32_t{0});
  EXPECT_FALSE(store_proto::parse_request(empty_key).has_value());
  EXPECT_FALSE(store_proto::parse_request(body(std::uint8_t{99})).has_value());
  EXPECT_FALSE(store_proto::parse_request(body(static_cast<std::uint8_t>(store_proto::Op::Wait), std::uint32_t{5},
                                               std::uint32_t{1u << 30}))
                   .has_value());
  EXPECT_FALSE(store_proto::parse_request("").has_value());
}

}  // namespace
}  // namespace gz
