// Topology: the node names ranks publish (node_name_from_env's order of
// preference), and what a discovered layout says. Discovery through a real
// Store across processes is in mp_test.cc (MpHierarchical).
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "comm/store/hash_store.h"
#include "comm/engine/topology.h"
#include "common/error.h"
#include "tests/comm/env_guard.h"

namespace gz {
namespace {

class NodeName : public ::testing::Test {
 protected:
  test::EnvGuard env_{"GRADZIP_NODE", "GROUP_RANK", "SLURM_NODEID", "OMPI_COMM_WORLD_LOCAL_RANK",
                      "OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};
  static std::string host() {
    char h[256] = {};
    ::gethostname(h, sizeof h - 1);
    return h;
  }
};

TEST_F(NodeName, FollowsTheLaunchersInOrder) {
  EXPECT_EQ(node_name_from_env(5), "host " + host());  // nothing set
  setenv("LOCAL_RANK", "1", 1);
  setenv("LOCAL_WORLD_SIZE", "2", 1);
  EXPECT_EQ(node_name_from_env(5), "first rank 4");  // numbered node by node
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
  EXPECT_EQ(node_name_from_env(5), "host " + host());  // mpirun may place ranks round robin
  setenv("SLURM_NODEID", "3", 1);
  EXPECT_EQ(node_name_from_env(5), "slurm node 3");
  setenv("GROUP_RANK", "2", 1);
  EXPECT_EQ(node_name_from_env(5), "group 2");  // torchrun
  setenv("GRADZIP_NODE", "rack7", 1);
  EXPECT_EQ(node_name_from_env(5), "node rack7");
}

TEST_F(NodeName, ALocalRankAboveTheRankIsIgnored) {
  setenv("LOCAL_RANK", "6", 1);
  setenv("LOCAL_WORLD_SIZE", "8", 1);
  EXPECT_EQ(node_name_from_env(5), "host " + host());
}

TEST(Topology, DescribesAndSplitsLayouts) {
  const Topology t = Topology::blocks(6, 3);
  EXPECT_EQ(t.nodes(), 2);
  EXPECT_EQ(t.uniform_size(), 3);
  EXPECT_EQ(t.members(1), (std::vector<int>{3, 4, 5}));
  EXPECT_EQ(t.describe(), "6 ranks: 2 nodes x 3");
  const Topology uneven{{0, 0, 1}};
  EXPECT_EQ(uneven.uniform_size(), 0);
  EXPECT_EQ(uneven.describe(), "3 ranks on nodes 0,0,1");
  EXPECT_EQ(Topology::flat(3).describe(), "3 ranks: 3 nodes x 1");
  EXPECT_THROW(Topology::blocks(5, 2), InvalidArgument);
}

// One rank alone finds itself (a one-rank job discovers without peers), and
// a LOCAL_WORLD_SIZE that the names contradict is refused.
TEST_F(NodeName, DiscoveryChecksTheLaunchersLocalSize) {
  HashStore store(Timeout(1000));
  setenv("GRADZIP_NODE", "a", 1);
  EXPECT_EQ(discover_topology(store, 0, 1, Timeout(1000)).describe(), "1 ranks: 1 nodes x 1");
  setenv("LOCAL_WORLD_SIZE", "2", 1);
  HashStore other(Timeout(1000));
  EXPECT_THROW(discover_topology(other, 0, 1, Timeout(1000)), InvalidArgument);
}

// A group that names its ranks' nodes itself (torchft's replicas, launched
// as 3 local ranks, now a quorum of 2) is not held to the launcher's claim.
TEST_F(NodeName, ANodeTheCallerNamesSkipsTheLaunchersClaim) {
  setenv("LOCAL_RANK", "0", 1);
  setenv("LOCAL_WORLD_SIZE", "3", 1);
  HashStore store(Timeout(1000));
  store.set("topology/1", "named replica 1\n");
  EXPECT_EQ(discover_topology(store, 0, 2, Timeout(1000), "replica 0").describe(), "2 ranks: 2 nodes x 1");
  HashStore launched(Timeout(1000));
  launched.set("topology/1", "first rank 0\nLOCAL_WORLD_SIZE=3");
  EXPECT_THROW(discover_topology(launched, 0, 2, Timeout(1000)), InvalidArgument);
}

}  // namespace
}  // namespace gz
