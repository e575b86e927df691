// The emulated cluster: gradzip-run --link RATE[,DELAY] puts every rank in a
// network namespace of its own, joined to a switch, with each rank's port
// shaped to RATE in both directions, so that a one-machine job sees the
// network a real cluster of that link speed would give it.
//
//   namespace gzrun-<pid>-hub    br0 (the switch), v0..v{P-1} (its ports)
//   namespace gzrun-<pid>-r<k>   eth0 = 10.213.X.(k+1)/24, the other end of v<k>
//
// Shaping. A rank's egress is shaped on its eth0 and its ingress on the
// switch's port v<k> (that port's egress): a token bucket filter (tbf) of
// RATE on each, so traffic between two ranks crosses the sender's and the
// receiver's limit, like a full-duplex port on a switch. DELAY (netem, on
// eth0) adds one-way latency between any two ranks; it needs the kernel's
// sch_netem, and without it the placement refuses rather than ignore DELAY.
//
// What it touches: only namespaces it creates and the devices inside them.
// The host's own namespace gets no device, address or route. Teardown
// deletes the namespaces (their veths and bridge go with them); namespaces
// of an earlier gradzip-run that no longer runs are deleted at the next start
// (or with --cleanup).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tools/launcher/launcher.h"

namespace gz::launcher {

/// One rank's link to the switch (each direction).
struct LinkSpec {
  std::uint64_t rate_bps = 0;     ///< bits per second
  std::uint64_t delay_ns = 0;     ///< added one-way latency between two ranks (0: none)
  int mtu = 9000;                 ///< bytes; jumbo frames, as on cluster networks
  std::uint64_t burst_bytes = 0;  ///< tbf bucket; 0: default_burst()
  std::string text;               ///< as given, for messages and GRADZIP_LINK
};

/// Parses "1gbit", "2.5gbit,50us", "100mbit,1ms": a rate with a unit (bit,
/// kbit, mbit, gbit, tbit: powers of 1000) and an optional delay (ns, us, ms,
/// s). Throws std::invalid_argument with the reason.
LinkSpec parse_link(std::string_view text);

/// The tbf bucket for a rate: 4 ms worth of bytes, within [64 KiB + MTU, 2 MiB].
/// Smaller buckets lose throughput to timer lateness on a loaded VM (measured:
/// 1 ms at 1 Gbit/s gave 93% of the payload rate, 4 ms gave 99.9% of it);
/// larger ones let more bytes through at once after an idle period (at most
/// one bucket per phase of the allreduce: under 1% of a 25.6M-float phase at
/// 1 Gbit/s, under 3% at 10 Gbit/s).
std::uint64_t default_burst(std::uint64_t rate_bps, int mtu);

/// Paths of ip and tc; throws std::runtime_error with what to install or how
/// to run when this process lacks root or iproute2.
struct Tools {
  std::string ip, tc;
};
Tools check_prerequisites();

/// Deletes the namespaces of gradzip-run processes that no longer run (a
/// launcher killed with SIGKILL cannot clean up). Returns how many it deleted.
int cleanup_stale(const Tools& tools, bool verbose);

class NetnsPlacement final : public Placement {
 public:
  NetnsPlacement(LinkSpec link, bool verbose);
  ~NetnsPlacement() override;

  void setup(int ranks) override;
  std::string master_addr() const override;
  int master_port(int requested) const override;
  std::map<std::string, std::string> env(int rank) const override;
  std::vector<std::string> wrap(int rank, const std::vector<std::string>& command) const override;
  void teardown() override;

  /// Namespace names (valid after setup).
  std::string hub_namespace() const;
  std::string rank_namespace(int rank) const;
  std::string rank_address(int rank) const;

 private:
  void run(const std::vector<std::string>& argv) const;  // throws with the tool's output
  void shape(const std::string& ns, const std::string& dev, bool with_delay) const;
  void tune(const std::string& ns, const std::string& dev) const;

  LinkSpec link_;
  bool verbose_;
  Tools tools_;
  std::string prefix_;  // gzrun-<pid>-
  int subnet_ = -1;     // X in 10.213.X.0/24
  int ranks_ = 0;
  std::vector<std::string> made_;  // namespaces made, in order
};

}  // namespace gz::launcher
