// The transport registry (comm/transports/registry.h): every line a
// complete descriptor, names unique, and a name that is unknown or not built
// refused with the reason, before anything connects.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "comm/engine/communicator.h"
#include "comm/store/hash_store.h"
#include "comm/transports/registry.h"
#include "common/error.h"

namespace gz {
namespace {

TEST(TransportRegistry, EveryDescriptorIsCompleteAndNamedOnce) {
  std::set<std::string> names;
  for (const TransportDescriptor* d : all_transports()) {
    EXPECT_FALSE(d->name.empty());
    EXPECT_TRUE(d->build_option.starts_with("GRADZIP_")) << d->name;
    EXPECT_FALSE(d->summary.empty()) << d->name;
    EXPECT_TRUE(names.insert(std::string(d->name)).second) << d->name << " twice";
    EXPECT_EQ(find_transport(d->name), d);
    EXPECT_EQ(transport_available(d->name), d->make != nullptr);
  }
  EXPECT_NE(find_transport(kDefaultTransport), nullptr);
}

// A torch process group's backend picks its transport from the registry: at
// most one transport per torch backend; without one, the default.
TEST(TransportRegistry, TorchBackendsMapToOneTransportEach) {
  std::set<std::string> backends;
  for (const TransportDescriptor* d : all_transports()) {
    if (d->torch_backend.empty()) continue;
    EXPECT_TRUE(backends.insert(std::string(d->torch_backend)).second) << d->torch_backend << " claimed twice";
    EXPECT_EQ(transport_for_torch_backend(d->torch_backend), d->name);
  }
  EXPECT_EQ(transport_for_torch_backend("nccl"), "nccl");
  EXPECT_EQ(transport_for_torch_backend("gloo"), kDefaultTransport);
  EXPECT_EQ(transport_for_torch_backend(""), kDefaultTransport);
  EXPECT_TRUE(find_transport("nccl")->device_memory);
  EXPECT_FALSE(find_transport(kDefaultTransport)->device_memory);
}

TEST(TransportRegistry, AnUnknownNameIsRefusedNamingTheValidOnes) {
  EXPECT_EQ(find_transport("tcp"), nullptr);
  EXPECT_FALSE(transport_available("tcp"));
  try {
    transport_descriptor("tcp");
    FAIL() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("unknown transport 'tcp'; valid: " + transport_names()), std::string::npos)
        << e.what();
  }
}

TEST(TransportRegistry, ATransportThisBuildLacksNamesItsOption) {
  bool lacks = false;
  for (const TransportDescriptor* d : all_transports()) lacks = lacks || !d->make;
  if (!lacks) GTEST_SKIP() << "this build has every registered transport";
  for (const TransportDescriptor* d : all_transports()) {
    if (d->make) continue;
    try {
      transport_descriptor(d->name);
      FAIL() << d->name << " accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(d->build_option) + "=ON"), std::string::npos) << e.what();
    }
    // The Communicator refuses it before it touches the store.
    auto store = std::make_shared<HashStore>();
    EXPECT_THROW(Communicator::create(d->name, store, 0, 1, 0), InvalidArgument);
    EXPECT_THROW(store->wait({"gradzip/job-key"}, Timeout(0)), IoError);  // nothing was written
  }
}

}  // namespace
}  // namespace gz
