// The transport registry's lookups (registry.h's list).
#include "comm/transports/registry.h"

#include <string>

#include "common/error.h"

namespace gz {

std::span<const TransportDescriptor* const> all_transports() {
  static constexpr const TransportDescriptor* kAll[] = {
#define GZ_TRANSPORT_ADDRESS(name) &transports::name,
      GZ_TRANSPORT_REGISTRY(GZ_TRANSPORT_ADDRESS)
#undef GZ_TRANSPORT_ADDRESS
  };
  return kAll;
}

const TransportDescriptor* find_transport(std::string_view name) {
  for (const TransportDescriptor* d : all_transports())
    if (d->name == name) return d;
  return nullptr;
}

std::string transport_names() {
  std::string names;
  for (const TransportDescriptor* d : all_transports()) {
    if (!names.empty()) names += ", ";
    names += d->name;
  }
  return names;
}

const TransportDescriptor& transport_descriptor(std::string_view name) {
  const TransportDescriptor* d = find_transport(name);
  if (!d) GZ_THROW(InvalidArgument, "unknown transport '", name, "'; valid: ", transport_names());
  if (!d->make)
    GZ_THROW(InvalidArgument, "this build of gradzip has no ", d->name, " transport (configure with ",
             d->build_option, "=ON)");
  return *d;
}

bool transport_available(std::string_view name) {
  const TransportDescriptor* d = find_transport(name);
  return d && d->make;
}

std::string_view transport_for_torch_backend(std::string_view backend) {
  for (const TransportDescriptor* d : all_transports())
    if (!d->torch_backend.empty() && d->torch_backend == backend) return d->name;
  return kDefaultTransport;
}

}  // namespace gz
