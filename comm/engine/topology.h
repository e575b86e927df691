// Topology: which node (machine) each rank runs on, so that the hierarchical
// allreduce can keep uncompressed traffic on the fast local path (shared
// memory, NVLink) and compress only what crosses the slower network.
//
// Discovery (collective, through the Store): every rank names its node and
// reads everyone's; ranks with the same name share a node. The name is the
// first of:
//   GRADZIP_NODE                       set by hand, or by gradzip-run
//   GROUP_RANK                         torchrun's node index
//   SLURM_NODEID                       srun
//   OMPI_COMM_WORLD_... + host name    mpirun (its local rank variables)
//   RANK - LOCAL_RANK                  when LOCAL_RANK and LOCAL_WORLD_SIZE are
//                                      set and ranks are numbered node by node
//   the host name                      otherwise
// LOCAL_WORLD_SIZE (or OMPI_COMM_WORLD_LOCAL_SIZE), when set, must match the
// size of the rank's node as discovered; every rank checks every rank's, so
// a mismatch is the same InvalidArgument on every rank, naming the ranks (a
// launcher and the names disagree).
#pragma once

#include <string>
#include <vector>

#include "comm/base/env.h"
#include "comm/store/store.h"

namespace gz {

/// A topology's counts, without its per-rank list (what auto's rules read;
/// built on the hot path without allocating).
struct TopologyShape {
  int ranks = 1;
  int nodes = 1;
  int per_node = 1;  ///< ranks per node when every node has the same number, else 0

  /// Every rank a node of its own.
  static TopologyShape flat(int ranks) { return {ranks, ranks, 1}; }
};

struct Topology {
  /// node[r]: the node of rank r, numbered 0.. in the order of each node's
  /// lowest rank.
  std::vector<int> node;

  /// Every rank a node of its own.
  static Topology flat(int ranks);
  /// Ranks 0..M-1 on node 0, M..2M-1 on node 1, ... (ranks % M == 0).
  static Topology blocks(int ranks, int per_node);

  int ranks() const { return static_cast<int>(node.size()); }
  int nodes() const;
  /// The ranks of node k, increasing.
  std::vector<int> members(int k) const;
  /// Ranks per node when every node has the same number, else 0.
  int uniform_size() const;
  /// "4 ranks: 2 nodes x 2" / "3 ranks on nodes 0,0,1": what the agreement compares.
  std::string describe() const;
  TopologyShape shape() const { return {ranks(), nodes(), uniform_size()}; }
};

/// Collective over `size` ranks: learns every rank's node through the Store
/// (keys "topology/<rank>"). Throws InvalidArgument on every rank when a
/// rank's LOCAL_WORLD_SIZE contradicts what was found, IoError when a rank
/// never answers. `node`: this rank's node name (empty: node_name_from_env,
/// and the launcher's claim of its size is checked).
Topology discover_topology(Store& store, int rank, int size, Timeout timeout, const std::string& node = "");

/// This rank's node name as discovery uses it (from the environment, see above).
std::string node_name_from_env(int rank);

}  // namespace gz
