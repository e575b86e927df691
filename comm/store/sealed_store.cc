#include "comm/store/sealed_store.h"

#include "comm/security/crypto.h"
#include "common/bytes.h"
#include "common/error.h"

namespace gz {
namespace {

constexpr std::uint32_t kSealMagic = 0x31565A47u;  // "GZV1"
constexpr std::size_t kTagBytes = 16;

std::string tag(std::string_view job_key, std::string_view key, std::string_view value) {
  std::string m = "gradzip value\n";
  bytes::Writer w(m);
  w.str(key);
  w.raw(value);
  return std::string(crypto::as_bytes(crypto::hmac_sha256(job_key, m)).substr(0, kTagBytes));
}

}  // namespace

std::string seal_value(std::string_view job_key, std::string_view key, std::string_view value) {
  std::string s;
  s.reserve(8 + value.size() + kTagBytes);
  bytes::Writer w(s);
  w.put(kSealMagic);
  w.str(value);
  w.raw(tag(job_key, key, value));
  return s;
}

std::string unseal_value(std::string_view job_key, std::string_view key, std::string_view sealed) {
  bytes::Reader r(sealed);
  const auto magic = r.get<std::uint32_t>("magic");
  const std::string_view value = r.str(sealed.size(), "value");
  const std::string_view t = r.raw(kTagBytes, "tag");
  if (!r.ok() || !r.at_end() || magic != kSealMagic)
    GZ_THROW(IoError, "store value '", key, "' is not a sealed gradzip value (",
             r.ok() ? (magic != kSealMagic ? std::string("bad magic") : std::string("trailing bytes")) : r.failure(),
             "): a stranger wrote it, or a rank of another gradzip version");
  if (!crypto::equal_constant_time(t, tag(job_key, key, value)))
    GZ_THROW(IoError, "store value '", key, "' was not written by a member of this job (its tag does not verify: "
                      "a stranger wrote it, or GRADZIP_JOB_TOKEN differs between ranks)");
  return std::string(value);
}

}  // namespace gz
