// The Transport contract (transport.h), checked on a live transport by every
// rank at once: several exchanges in flight, messages of different sizes
// (zero included), waited in reverse order or polled with test(); every
// receive gets the k-th message its peer posted to it, whole.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/transports/transport.h"

namespace gz::test {

/// Returns "" when the contract held, else what broke.
inline std::string check_exchanges(Transport& t, Timeout timeout) {
  const int P = t.size(), me = t.rank();
  constexpr int kExchanges = 4;
  // Message e from a to b: (37 a + 11 b + e) % 5 * 1000 + e bytes, each byte a + 3 b + 7 e.
  auto size_of = [](int a, int b, int e) { return static_cast<std::size_t>(((37 * a + 11 * b + e) % 5) * 1000 + e); };
  auto byte_of = [](int a, int b, int e) { return static_cast<std::uint8_t>(a + 3 * b + 7 * e); };
  std::vector<std::vector<std::vector<std::uint8_t>>> out(kExchanges), in(kExchanges);
  std::vector<std::vector<std::size_t>> got(kExchanges, std::vector<std::size_t>(static_cast<std::size_t>(P), 0));
  std::vector<Transport::Exchange> xs;
  for (int e = 0; e < kExchanges; ++e) {
    std::vector<SendOp> sends;
    std::vector<RecvOp> recvs;
    out[e].resize(static_cast<std::size_t>(P));
    in[e].resize(static_cast<std::size_t>(P));
    for (int p = 0; p < P; ++p) {
      if (p == me) continue;
      auto& o = out[e][static_cast<std::size_t>(p)];
      o.assign(size_of(me, p, e), byte_of(me, p, e));
      auto& i = in[e][static_cast<std::size_t>(p)];
      i.assign(5000, 0xEE);  // room for any size
      sends.push_back({p, ConstSlice{o.data(), o.size()}});
      recvs.push_back({p, Slice{i.data(), i.size()}, &got[e][static_cast<std::size_t>(p)]});
    }
    xs.push_back(t.start(sends, recvs, CallContext{Device::Cpu, nullptr, timeout}));
  }
  // The newest first; the oldest by polling.
  for (int e = kExchanges - 1; e >= 1; --e) t.wait(xs[static_cast<std::size_t>(e)]);
  while (!t.test(xs[0])) {
  }
  for (int e = 0; e < kExchanges; ++e)
    for (int p = 0; p < P; ++p) {
      if (p == me) continue;
      const std::size_t want = size_of(p, me, e);
      const auto& i = in[e][static_cast<std::size_t>(p)];
      if (got[e][static_cast<std::size_t>(p)] != want)
        return "exchange " + std::to_string(e) + " from rank " + std::to_string(p) + ": " +
               std::to_string(got[e][static_cast<std::size_t>(p)]) + " bytes, expected " + std::to_string(want);
      for (std::size_t b = 0; b < want; ++b)
        if (i[b] != byte_of(p, me, e))
          return "exchange " + std::to_string(e) + " from rank " + std::to_string(p) + ": byte " + std::to_string(b) +
                 " is wrong (messages matched out of order?)";
      if (want < i.size() && i[want] != 0xEE)
        return "exchange " + std::to_string(e) + " wrote past the message";
    }
  return "";
}

}  // namespace gz::test
