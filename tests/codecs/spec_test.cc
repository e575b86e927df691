#include <gtest/gtest.h>

#include "common/error.h"
#include "compressors/codec.h"
#include "compressors/descriptor.h"
#include "compressors/spec.h"
#include "test_util.h"

namespace gz {
namespace {

std::string error_of(std::string_view spec) { return test::spec_error(spec); }

TEST(Spec, ParsesEveryCodecWithDefaults) {
  EXPECT_EQ(parse_spec("none").id, CodecId::None);
  EXPECT_FALSE(parse_spec("none").ef);
  EXPECT_EQ(parse_spec("fp16").id, CodecId::Fp16);
  EXPECT_TRUE(parse_spec("fp16").ef);
  EXPECT_EQ(parse_spec("bf16").id, CodecId::Bf16);
  const CodecConfig ob = parse_spec("onebit");
  EXPECT_EQ(ob.id, CodecId::Onebit);
  EXPECT_EQ(ob.value("block"), 512);
  const CodecConfig tk = parse_spec("topk");
  EXPECT_EQ(tk.id, CodecId::TopK);
  EXPECT_DOUBLE_EQ(tk.value("density"), 0.01);
  EXPECT_EQ(tk.value("k"), 0);
  EXPECT_EQ(tk.value("select"), 0);  // exact
  EXPECT_THROW((void)tk.value("block"), InvalidArgument);
}

// Messages name the file relative to the repository (not the build machine's
// folders), and only while locations are on (the Python module turns them off).
TEST(Spec, ErrorsNameTheRepositoryFileOrNothing) {
  const std::string located = error_of("qsgd:bits=9");
  EXPECT_EQ(located.rfind("[compressors/spec.cc:", 0), 0u) << located;
  set_error_locations(false);
  const std::string plain = error_of("qsgd:bits=9");
  set_error_locations(true);
  EXPECT_EQ(plain.rfind("codec spec 'qsgd:bits=9': bits must be", 0), 0u) << plain;
  EXPECT_EQ(located.substr(located.find("] ") + 2), plain);
}

TEST(Spec, ParsesKeys) {
  const CodecConfig c = parse_spec(" topk : density=0.25, select=sample ,ef=off ");
  EXPECT_DOUBLE_EQ(c.value("density"), 0.25);
  EXPECT_EQ(c.value("select"), 1);  // sample
  EXPECT_FALSE(c.ef);
  EXPECT_EQ(parse_spec("topk:k=100").value("k"), 100);
  EXPECT_EQ(parse_spec("onebit:block=1").value("block"), 1);
  EXPECT_FALSE(parse_spec("fp16:ef=false").ef);
}

TEST(Spec, CanonicalRoundTrips) {
  for (const char* s : {"none", "fp16", "bf16:ef=off", "onebit:block=256", "onebit:block=512,ef=off",
                        "topk:density=0.001", "topk:k=5,select=sample", "topk:density=0.5,ef=off"}) {
    const CodecConfig c = parse_spec(s);
    EXPECT_EQ(c.canonical(), s);
    EXPECT_EQ(parse_spec(c.canonical()), c) << s;
  }
  EXPECT_EQ(parse_spec("onebit").canonical(), "onebit:block=512");
  EXPECT_EQ(parse_spec("topk").canonical(), "topk:density=0.01");
}

TEST(Spec, UnknownCodecListsValidOnes) {
  const std::string e = error_of("twobit");
  EXPECT_NE(e.find("unknown codec 'twobit'"), std::string::npos) << e;
  EXPECT_NE(e.find("none, fp16, bf16, onebit, topk"), std::string::npos) << e;
}

TEST(Spec, UnknownKeyListsValidKeys) {
  const std::string e = error_of("onebit:blocks=4");
  EXPECT_NE(e.find("unknown key 'blocks'"), std::string::npos) << e;
  EXPECT_NE(e.find("block, ef"), std::string::npos) << e;
  EXPECT_NE(error_of("fp16:block=4").find("valid keys: ef"), std::string::npos);
  EXPECT_NE(error_of("topk:block=4").find("density, k, select, ef"), std::string::npos);
}

TEST(Spec, RejectsOutOfRangeValues) {
  EXPECT_NE(error_of("topk:density=0").find("density must be in (0, 1]"), std::string::npos);
  EXPECT_NE(error_of("topk:density=1.5").find("density must be in (0, 1]"), std::string::npos);
  EXPECT_NE(error_of("topk:density=-0.1").find("density must be"), std::string::npos);
  EXPECT_NE(error_of("topk:density=nan").find("density must be"), std::string::npos);
  EXPECT_NE(error_of("onebit:block=0").find("block must be"), std::string::npos);
  EXPECT_NE(error_of("topk:k=0").find("k must be in [1, 2^40]"), std::string::npos);
  EXPECT_NE(error_of("topk:density=abc").find("not a valid number"), std::string::npos);
  EXPECT_NE(error_of("onebit:block=12x").find("not a valid number"), std::string::npos);
  EXPECT_NE(error_of("topk:select=fast").find("exact or sample"), std::string::npos);
  EXPECT_NE(error_of("fp16:ef=maybe").find("on or off"), std::string::npos);
}

TEST(Spec, RejectsMalformedSyntax) {
  EXPECT_NE(error_of("topk:density").find("expected key=value"), std::string::npos);
  EXPECT_NE(error_of("topk:").find("expected key=value"), std::string::npos);
  EXPECT_NE(error_of("topk:density=0.1,density=0.2").find("given twice"), std::string::npos);
  EXPECT_NE(error_of("topk:density=0.1,k=3").find("either density or k"), std::string::npos);
  EXPECT_NE(error_of("none:ef=on").find("lossless"), std::string::npos);
  EXPECT_NE(error_of("").find("unknown codec"), std::string::npos);
}

TEST(Spec, TopkKFromDensity) {
  auto k = [](const char* spec, std::size_t n) { return make_codec(spec)->header_param(n); };
  EXPECT_EQ(k("topk:density=0.01", 100), 1u);  // not 2: 0.01*100 is 1.0000000000000002
  EXPECT_EQ(k("topk:density=0.01", 101), 2u);
  EXPECT_EQ(k("topk:density=0.01", 1), 1u);
  EXPECT_EQ(k("topk:density=0.01", 0), 0u);
  EXPECT_EQ(k("topk:density=1", 77), 77u);
  EXPECT_EQ(k("topk:k=10", 4), 4u);  // clamped to n
  EXPECT_EQ(k("topk:density=0.001", 16u << 20), 16778u);
  EXPECT_EQ(k("fp16", 100), 0u);
}

// Every codec's descriptor is usable by the layers that iterate the registry.
TEST(Registry, EveryDescriptorIsComplete) {
  std::uint16_t last = 0;
  for (const CodecDescriptor* d : all_codecs()) {
    SCOPED_TRACE(std::string(d->name));
    EXPECT_GT(static_cast<std::uint16_t>(d->id), last) << "registry lines must stay in wire id order";
    last = static_cast<std::uint16_t>(d->id);
    EXPECT_EQ(find_codec(d->name), d);
    EXPECT_EQ(find_codec(d->id), d);
    EXPECT_EQ(d->name.data()[d->name.size()], '\0');
    EXPECT_FALSE(d->summary.empty());
    ASSERT_NE(d->make, nullptr);
    ASSERT_NE(d->error_bound, nullptr);
    ASSERT_NE(d->describe_param, nullptr);
    EXPECT_LE(d->keys.size(), kMaxCodecKeys);
    ASSERT_FALSE(d->test_specs.empty());
    ASSERT_FALSE(d->bench_specs.empty());
    // The bare name parses, every test spec round-trips and makes its codec.
    const CodecConfig plain = parse_spec(d->name);
    EXPECT_EQ(parse_spec(plain.canonical()), plain);
    for (std::string_view s : d->test_specs) {
      const CodecConfig c = parse_spec(s);
      EXPECT_EQ(c.id, d->id) << s;
      EXPECT_EQ(parse_spec(c.canonical()), c) << s;
      EXPECT_GT(error_bound(c), 0.0) << s;
      EXPECT_EQ(make_codec(c)->id(), d->id);
    }
    for (const BenchSpec& b : d->bench_specs) EXPECT_EQ(parse_spec(b.spec).id, d->id) << b.spec;
  }
  EXPECT_EQ(last, kLastCodecId);
}

TEST(Registry, AlgorithmHints) {
  for (const CodecDescriptor* d : all_codecs()) {
    EXPECT_TRUE(prefers_allgather(*d, 1));
    EXPECT_TRUE(prefers_allgather(*d, 2));
    EXPECT_EQ(prefers_allgather(*d, 3), d->hint.allgather_up_to_ranks >= 3) << d->name;
  }
  EXPECT_TRUE(prefers_allgather(*find_codec("topk"), 16));
  EXPECT_FALSE(prefers_allgather(*find_codec("topk"), 17));
  EXPECT_FALSE(prefers_allgather(*find_codec("fp16"), 3));
}

TEST(Spec, SplitsSpecLists) {
  const auto v = split_spec_list("none,fp16,onebit:block=256,topk:density=0.01,ef=off,bf16");
  ASSERT_EQ(v.size(), 5u);
  EXPECT_EQ(v[2], "onebit:block=256");
  EXPECT_EQ(v[3], "topk:density=0.01,ef=off");
  EXPECT_EQ(v[4], "bf16");
  EXPECT_EQ(split_spec_list("fp16,ef=off"), (std::vector<std::string>{"fp16:ef=off"}));
}

TEST(Spec, ExpandsGrids) {
  const auto v = expand_spec_grid("topk:density=0.1,0.01,ef=on,off,onebit:block=256,1024,fp16");
  const std::vector<std::string> want = {"topk:density=0.1",       "topk:density=0.1,ef=off", "topk:density=0.01",
                                         "topk:density=0.01,ef=off", "onebit:block=256",        "onebit:block=1024",
                                         "fp16"};
  EXPECT_EQ(v, want);
  EXPECT_THROW(expand_spec_grid("0.1,fp16"), InvalidArgument);
  EXPECT_THROW(expand_spec_grid("onebit:block=0"), InvalidArgument);
}

TEST(Spec, ExpandsGridsAsWrittenWithTheSameChecks) {
  // The sweep's labels: the same grid, each spec as written, each checked.
  EXPECT_EQ(expand_spec_grid_as_written("onebit,topk:density=0.1,0.01,ef=on"),
            (std::vector<std::string>{"onebit", "topk:density=0.1,ef=on", "topk:density=0.01,ef=on"}));
  EXPECT_EQ(expand_spec_grid("onebit").front(), "onebit:block=512");
  for (const char* bad : {"0.1,fp16", "onebit:block=0", "zstd", "topk:density=", "topk:densty=0.1"})
    EXPECT_THROW(expand_spec_grid_as_written(bad), InvalidArgument) << bad;
}

TEST(Spec, RespecSetsKeysAndReturnsTheCanonicalSpec) {
  EXPECT_EQ(respec("topk:density=0.01", "density=0.05"), "topk:density=0.05");
  EXPECT_EQ(respec("onebit", "block=128"), "onebit:block=128");
  EXPECT_EQ(respec("onebit:block=512,ef=off", "block=128"), "onebit:block=128,ef=off");
  EXPECT_EQ(respec("onebit:block=128", "ef=off"), "onebit:block=128,ef=off");
  EXPECT_EQ(respec("qsgd:bits=4", "ef=on"), "qsgd:bits=4,bucket=512");  // on is the default: not shown
  EXPECT_EQ(respec("fp16", ""), "fp16");
  // The grammar's checks apply to the spec, the changes and the result.
  for (auto [spec, changes] : {std::pair{"onebit", "block=0"}, {"onebit", "density=0.1"}, {"zstd", "a=1"},
                               {"onebit:block=1,block=2", "block=3"}, {"onebit", "block"}, {"none", "ef=on"}})
    EXPECT_THROW(respec(spec, changes), InvalidArgument) << spec << " + " << changes;
}

TEST(Spec, SpecKeysAreTheKeysTheCallerWrote) {
  EXPECT_EQ(spec_keys("onebit"), std::vector<std::string>{});
  EXPECT_EQ(spec_keys("onebit:ef=off, block=128"), (std::vector<std::string>{"ef", "block"}));
  EXPECT_THROW(spec_keys("onebit:blok=1"), InvalidArgument);
}

}  // namespace
}  // namespace gz
