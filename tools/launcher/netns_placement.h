// The emulated cluster: gradzip-run --link RATE[,DELAY] puts every node in a
// network namespace of its own, joined to a switch, with each node's port
// shaped to RATE in both directions, so that a one-machine job sees the
// network a real cluster of that link speed would give it. A node holds one
// rank, or M with --ranks-per-node M: those share the namespace, and their
// traffic to each other stays inside it, unshaped, like ranks on one machine.
//
//   namespace gzrun-<pid>-hub    br0 (the switch), v0..v{N-1} (its ports)
//   namespace gzrun-<pid>-n<k>   eth0 = 10.213.X.(k+1)/24, the other end of v<k>;
//                                ranks k*M .. k*M+M-1
//
// Shaping. A node's egress is shaped on its eth0 and its ingress on the
// switch's port v<k> (that port's egress): a token bucket filter (tbf) of
// RATE on each, so traffic between two nodes crosses the sender's and the
// receiver's limit, like a full-duplex port on a switch. DELAY (netem, on
// eth0) adds one-way latency between any two nodes; it needs the kernel's
// sch_netem, and without it the placement refuses rather than ignore DELAY.
//
// Nodes of several ranks are whole machines in miniature: besides the network
// namespace, a node has its own host name (gznode-<k>), System V IPC and a
// private /dev/shm, held by one sleeping process per node that every rank of
// the node enters (nsenter). So UCX's shared-memory transports connect the
// ranks of a node, and only them: with one /dev/shm for all, UCX took the
// shared memory between nodes too and no byte crossed the shaped links.
//
// Ranks learn their node from the torchrun variables (LOCAL_RANK,
// LOCAL_WORLD_SIZE, GROUP_RANK) and GRADZIP_NODE (comm/engine/topology.h).
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
  std::string unshare, nsenter;  // util-linux: nodes of several ranks (empty when not found)
};
Tools check_prerequisites();

/// Deletes the namespaces of gradzip-run processes that no longer run (a
/// launcher killed with SIGKILL cannot clean up). Returns how many it deleted.
int cleanup_stale(const Tools& tools, bool verbose);

class NetnsPlacement final : public Placement {
 public:
  /// `ranks_per_node` ranks share each node's namespace (setup() needs a
  /// rank count that is a multiple of it).
  NetnsPlacement(LinkSpec link, bool verbose, int ranks_per_node = 1);
  ~NetnsPlacement() override;

  void setup(int ranks) override;
  std::string master_addr() const override;
  int master_port(int requested) const override;
  std::map<std::string, std::string> env(int rank) const override;
  std::vector<std::string> wrap(int rank, const std::vector<std::string>& command) const override;
  void teardown() override;

  /// Namespace names and addresses (valid after setup).
  std::string hub_namespace() const;
  std::string node_namespace(int node) const;
  std::string node_address(int node) const;
  int node_of(int rank) const { return rank / per_node_; }

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
  int per_node_ = 1;
  std::vector<std::string> made_;  // namespaces made, in order
  std::vector<int> holders_;       // nodes of several ranks: the process holding each node's namespaces
};

}  // namespace gz::launcher
