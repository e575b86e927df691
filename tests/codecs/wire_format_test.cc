// Every validation branch of the payload reader, through the public decoder:
// each malformed payload is rejected with a PayloadError whose message says
// what is wrong, and the output buffer is left exactly as it was.
#include <gtest/gtest.h>

#include <cstring>

#include "common/error.h"
#include "compressors/wire_format.h"
#include "test_util.h"

namespace gz {
namespace {

using test::Encoded;

struct Fixture {
  std::unique_ptr<Codec> codec;
  Encoded payload;
  std::size_t n;
};

Fixture make(const char* spec, std::size_t n) {
  Fixture f{make_codec(spec), {}, n};
  std::vector<float> g = test::normal(n, 7);
  std::vector<float> r(n, 0.0f);
  f.payload = test::encode(*f.codec, g, &r);
  return f;
}

wire::Header header_of(const Encoded& e) {
  wire::Header h;
  std::memcpy(&h, e.data(), sizeof h);
  return h;
}

void set_header(Encoded& e, const wire::Header& h) { wire::write_header(h, e.data()); }

using test::expect_rejected;

TEST(WireFormat, HeaderIs32LittleEndianBytes) {
  Fixture f = make("fp16", 10);
  const std::byte* p = f.payload.data();
  EXPECT_EQ(std::to_integer<int>(p[0]), 'G');
  EXPECT_EQ(std::to_integer<int>(p[1]), 'Z');
  EXPECT_EQ(std::to_integer<int>(p[2]), 'P');
  EXPECT_EQ(std::to_integer<int>(p[3]), '1');
  EXPECT_EQ(std::to_integer<int>(p[4]), 1);  // version
  EXPECT_EQ(std::to_integer<int>(p[6]), static_cast<int>(CodecId::Fp16));
  EXPECT_EQ(std::to_integer<int>(p[16]), 10);  // count
  EXPECT_EQ(std::to_integer<int>(p[24]), 20);  // body bytes
  EXPECT_EQ(f.payload.bytes, 52u);
}

TEST(WireFormat, AcceptsValidPayloads) {
  for (const char* spec : {"none", "fp16", "bf16", "onebit:block=64", "topk:k=5", "topk:density=0.1,select=sample"}) {
    Fixture f = make(spec, 1000);
    EXPECT_NO_THROW(test::decode(*f.codec, f.payload, f.n)) << spec;
  }
}

TEST(WireFormat, RejectsNullAndTruncatedHeader) {
  Fixture f = make("fp16", 16);
  std::vector<float> out(16, 42.0f);
  EXPECT_THROW(f.codec->decode_accumulate(nullptr, 64, out.data(), 16), PayloadError);
  for (std::size_t size : {0u, 1u, 31u}) expect_rejected(*f.codec, f.payload, size, 16, "truncated");
}

TEST(WireFormat, RejectsBadMagic) {
  Fixture f = make("fp16", 16);
  wire::Header h = header_of(f.payload);
  h.magic = 0x12345678;
  set_header(f.payload, h);
  expect_rejected(*f.codec, f.payload, f.payload.bytes, 16, "bad magic");
}

TEST(WireFormat, RejectsOtherVersion) {
  Fixture f = make("fp16", 16);
  wire::Header h = header_of(f.payload);
  h.version = 2;
  set_header(f.payload, h);
  expect_rejected(*f.codec, f.payload, f.payload.bytes, 16, "unsupported wire format version 2");
}

TEST(WireFormat, RejectsUnknownCodecId) {
  for (std::uint16_t id : {0, kLastCodecId + 1, 0xFFFF}) {
    Fixture f = make("fp16", 16);
    wire::Header h = header_of(f.payload);
    h.codec = static_cast<CodecId>(id);
    set_header(f.payload, h);
    expect_rejected(*f.codec, f.payload, f.payload.bytes, 16, "unknown codec id");
  }
}

TEST(WireFormat, RejectsReservedFlags) {
  Fixture f = make("bf16", 16);
  wire::Header h = header_of(f.payload);
  h.flags = 1;
  set_header(f.payload, h);
  expect_rejected(*f.codec, f.payload, f.payload.bytes, 16, "reserved header flags");
}

TEST(WireFormat, RejectsAbsurdCount) {
  Fixture f = make("none", 16);
  wire::Header h = header_of(f.payload);
  h.count = std::uint64_t{1} << 62;
  h.body_bytes = 4 * h.count;  // would overflow-check badly if trusted
  set_header(f.payload, h);
  expect_rejected(*f.codec, f.payload, f.payload.bytes, 16, "absurd element count");
}

TEST(WireFormat, RejectsParamOnParameterlessCodec) {
  Fixture f = make("fp16", 16);
  wire::Header h = header_of(f.payload);
  h.param = 3;
  set_header(f.payload, h);
  expect_rejected(*f.codec, f.payload, f.payload.bytes, 16, "non-zero param");
}

TEST(WireFormat, RejectsOnebitBlockZero) {
  Fixture f = make("onebit:block=8", 64);
  wire::Header h = header_of(f.payload);
  h.param = 0;
  set_header(f.payload, h);
  expect_rejected(*f.codec, f.payload, f.payload.bytes, 64, "block size 0");
}

TEST(WireFormat, RejectsOnebitBlockMismatch) {
  Fixture f = make("onebit:block=8", 64);
  auto other = make_codec("onebit:block=16");
  expect_rejected(*other, f.payload, f.payload.bytes, 64, "differs from the decoder's 16");
}

TEST(WireFormat, RejectsTopkCountBeyondU32) {
  Fixture f = make("topk:k=2", 16);
  wire::Header h = header_of(f.payload);
  h.count = std::uint64_t{1} << 33;
  set_header(f.payload, h);
  expect_rejected(*f.codec, f.payload, f.payload.bytes, 16, "exceeds u32 indices");
}

TEST(WireFormat, RejectsTopkMoreEntriesThanElements) {
  Fixture f = make("topk:k=2", 16);
  wire::Header h = header_of(f.payload);
  h.param = 17;
  set_header(f.payload, h);
  expect_rejected(*f.codec, f.payload, f.payload.bytes, 16, "17 entries for only 16 elements");
}

TEST(WireFormat, RejectsTopkEntryCountMismatch) {
  Fixture f = make("topk:k=2", 16);
  wire::Header h = header_of(f.payload);
  h.param = 1;
  h.body_bytes = 8;
  set_header(f.payload, h);
  expect_rejected(*f.codec, f.payload, 32 + 8, 16, "differs from the decoder's 2");
}

TEST(WireFormat, RejectsBodySizeDisagreeingWithFormula) {
  Fixture f = make("fp16", 16);
  wire::Header h = header_of(f.payload);
  h.body_bytes = 30;
  set_header(f.payload, h);
  expect_rejected(*f.codec, f.payload, f.payload.bytes, 16, "the format needs 32");
}

TEST(WireFormat, RejectsTruncatedAndTrailingBody) {
  Fixture f = make("onebit:block=8", 64);
  expect_rejected(*f.codec, f.payload, f.payload.bytes - 1, 64, "(truncated)");
  expect_rejected(*f.codec, f.payload, f.payload.bytes + 4, 64, "(trailing bytes)");
}

TEST(WireFormat, RejectsWrongCodec) {
  Fixture f = make("fp16", 16);
  auto bf = make_codec("bf16");
  expect_rejected(*bf, f.payload, f.payload.bytes, 16, "encoded by fp16, this decoder is bf16");
}

TEST(WireFormat, RejectsWrongCount) {
  Fixture f = make("fp16", 16);
  expect_rejected(*f.codec, f.payload, f.payload.bytes, 15, "holds 16 elements, the output buffer has 15");
}

TEST(WireFormat, RejectsTopkIndexOutOfRange) {
  Fixture f = make("topk:k=3", 16);
  auto* idx = reinterpret_cast<std::uint32_t*>(f.payload.data() + 32);
  idx[2] = 16;
  expect_rejected(*f.codec, f.payload, f.payload.bytes, 16, "index 16 at entry 2 is out of range");
}

TEST(WireFormat, RejectsTopkIndicesNotIncreasing) {
  Fixture f = make("topk:k=3", 16);
  auto* idx = reinterpret_cast<std::uint32_t*>(f.payload.data() + 32);
  idx[1] = idx[0];
  expect_rejected(*f.codec, f.payload, f.payload.bytes, 16, "not strictly increasing at entry 1");
  idx[0] = 9, idx[1] = 3, idx[2] = 12;
  expect_rejected(*f.codec, f.payload, f.payload.bytes, 16, "not strictly increasing at entry 1");
}

TEST(WireFormat, RejectsMisalignedPayload) {
  Fixture f = make("none", 4);
  std::vector<std::byte> shifted(f.payload.bytes + 1);
  std::memcpy(shifted.data() + 1, f.payload.data(), f.payload.bytes);
  std::vector<float> out(4, 0.0f);
  EXPECT_THROW(f.codec->decode_accumulate(shifted.data() + 1, f.payload.bytes, out.data(), 4), InvalidArgument);
}

TEST(WireFormat, BodyBytesFormula) {
  EXPECT_EQ(wire::body_bytes(CodecId::None, 0, 10), 40u);
  EXPECT_EQ(wire::body_bytes(CodecId::Fp16, 0, 10), 20u);
  EXPECT_EQ(wire::body_bytes(CodecId::Bf16, 0, 10), 20u);
  // 1000 elements, block 512: 2 blocks of scales (16 B) + 32 sign words (128 B)
  EXPECT_EQ(wire::body_bytes(CodecId::Onebit, 512, 1000), 16u + 128u);
  EXPECT_EQ(wire::body_bytes(CodecId::Onebit, 512, 0), 0u);
  EXPECT_EQ(wire::body_bytes(CodecId::TopK, 7, 100), 56u);
}

}  // namespace
}  // namespace gz
