#include "comm/transports/transport.h"

#include <vector>

#include "comm/base/memory.h"
#include "common/error.h"

namespace gz {

Transport::~Transport() = default;

void Transport::synchronize(const CallContext&) {}

std::string Transport::describe() const { return name(); }

void Transport::native_allreduce_sum(float*, std::size_t, const CallContext&) {
  GZ_THROW(InvalidArgument, "the ", name(), " transport has no allreduce of its own");
}

void Transport::exchange_with_all(std::span<const ConstSlice> send_to, std::span<const Slice> recv,
                                  std::span<std::size_t> received, const CallContext& ctx) {
  const auto P = static_cast<std::size_t>(size()), me = static_cast<std::size_t>(rank());
  std::vector<SendOp> sends;
  std::vector<RecvOp> recvs;
  sends.reserve(P);
  recvs.reserve(P);
  for (std::size_t r = 0; r < P; ++r) {
    if (r == me) continue;
    sends.push_back({static_cast<int>(r), send_to[r]});
    recvs.push_back({static_cast<int>(r), recv[r], &received[r]});
  }
  const Exchange x = start(sends, recvs, ctx);
  const ConstSlice own = send_to[me];
  if (recv[me].data != own.data) mem::copy(recv[me].data, own.data, own.bytes, ctx.device, ctx.stream);
  received[me] = own.bytes;
  wait(x);
}

void Transport::allgatherv(ConstSlice send, std::span<const Slice> recv, std::span<std::size_t> received,
                           const CallContext& ctx) {
  const auto P = static_cast<std::size_t>(size());
  GZ_ENFORCE(recv.size() == P && received.size() == P, "allgatherv needs one slot per rank");
  GZ_ENFORCE_LE(send.bytes, recv[static_cast<std::size_t>(rank())].bytes,
                "allgatherv: this rank's buffer is larger than its slot");
  const std::vector<ConstSlice> send_to(P, send);
  exchange_with_all(send_to, recv, received, ctx);
}

void Transport::alltoallv(std::span<const ConstSlice> send, std::span<const Slice> recv,
                          std::span<std::size_t> received, const CallContext& ctx) {
  const auto P = static_cast<std::size_t>(size());
  GZ_ENFORCE(send.size() == P && recv.size() == P && received.size() == P, "alltoallv needs one slot per rank");
  GZ_ENFORCE_LE(send[static_cast<std::size_t>(rank())].bytes, recv[static_cast<std::size_t>(rank())].bytes,
                "alltoallv: this rank's own buffer is larger than its slot");
  exchange_with_all(send, recv, received, ctx);
}

void Transport::barrier(const CallContext& ctx) {
  const auto P = static_cast<std::size_t>(size());
  const std::byte token{1};
  std::vector<std::byte> in(P);
  std::vector<std::size_t> got(P);
  const std::vector<ConstSlice> send_to(P, ConstSlice{&token, 1});
  std::vector<Slice> recv(P);
  for (std::size_t r = 0; r < P; ++r) recv[r] = {&in[r], 1};
  exchange_with_all(send_to, recv, got, CallContext{Device::Cpu, nullptr, ctx.timeout});
}

}  // namespace gz
