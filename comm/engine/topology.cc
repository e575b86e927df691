#include "comm/engine/topology.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <map>
#include <optional>

#include "common/error.h"

namespace gz {
namespace {

std::optional<std::string> env(const char* name) { return env_value(name); }

std::optional<long> env_long(const char* name) {
  const auto v = env(name);
  if (!v) return std::nullopt;
  long x = 0;
  const auto [p, ec] = std::from_chars(v->data(), v->data() + v->size(), x);
  if (ec != std::errc() || p != v->data() + v->size()) return std::nullopt;
  return x;
}

std::string host_name() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) return "unknown-host";
  return host;
}

constexpr std::size_t kMaxName = 256;

}  // namespace

Topology Topology::flat(int ranks) {
  Topology t;
  for (int r = 0; r < ranks; ++r) t.node.push_back(r);
  return t;
}

Topology Topology::blocks(int ranks, int per_node) {
  GZ_ENFORCE(per_node >= 1 && ranks % per_node == 0, ranks, " ranks do not split into nodes of ", per_node);
  Topology t;
  for (int r = 0; r < ranks; ++r) t.node.push_back(r / per_node);
  return t;
}

int Topology::nodes() const { return node.empty() ? 0 : *std::max_element(node.begin(), node.end()) + 1; }

std::vector<int> Topology::members(int k) const {
  std::vector<int> m;
  for (int r = 0; r < ranks(); ++r)
    if (node[static_cast<std::size_t>(r)] == k) m.push_back(r);
  return m;
}

int Topology::uniform_size() const {
  const int N = nodes();
  if (N == 0) return 0;
  std::vector<int> count(static_cast<std::size_t>(N), 0);
  for (int k : node) ++count[static_cast<std::size_t>(k)];
  for (int c : count)
    if (c != count[0]) return 0;
  return count[0];
}

std::string Topology::describe() const {
  const int L = uniform_size();
  if (L > 0) return std::to_string(ranks()) + " ranks: " + std::to_string(nodes()) + " nodes x " + std::to_string(L);
  std::string s = std::to_string(ranks()) + " ranks on nodes ";
  for (std::size_t r = 0; r < node.size(); ++r) s += (r ? "," : "") + std::to_string(node[r]);
  return s;
}

std::string node_name_from_env(int rank) {
  if (auto v = env("GRADZIP_NODE")) return "node " + *v;
  if (auto v = env("GROUP_RANK")) return "group " + *v;  // torchrun
  if (auto v = env("SLURM_NODEID")) return "slurm node " + *v;
  if (env("OMPI_COMM_WORLD_LOCAL_RANK")) return "host " + host_name();  // mpirun may place ranks round robin
  const auto local = env_long("LOCAL_RANK");
  if (local && env("LOCAL_WORLD_SIZE") && *local >= 0 && *local <= rank)
    return "first rank " + std::to_string(rank - *local);  // launchers that number ranks node by node
  return "host " + host_name();
}

Topology discover_topology(Store& store, int rank, int size, Timeout timeout, const std::string& node) {
  // Each rank publishes its node's name and what its launcher says of the
  // node's size; every rank checks every claim, so all fail alike. A name
  // the caller gives comes with no claim: the launcher's variables describe
  // its job, not this group.
  std::string mine = node.empty() ? node_name_from_env(rank) : "named " + node;
  if (mine.size() > kMaxName) mine.resize(kMaxName);
  std::string claim;
  for (const char* var : {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"})
    if (const auto said = env_long(var); node.empty() && said && claim.empty())
      claim = std::string(var) + "=" + std::to_string(*said);
  store.set("topology/" + std::to_string(rank), mine + "\n" + claim);
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back("topology/" + std::to_string(r));
  store.wait(keys, timeout);
  Topology t;
  std::vector<std::string> names, claims;
  std::map<std::string, int> index;  // name -> node number, in order of first rank
  for (int r = 0; r < size; ++r) {
    const std::string value = store.get(keys[static_cast<std::size_t>(r)], timeout);
    const auto nl = value.find('\n');
    if (value.size() > 2 * kMaxName || nl == std::string::npos)
      GZ_THROW(IoError, "topology: rank ", r, " published a malformed node record (", value.size(), " bytes)");
    names.push_back(value.substr(0, nl));
    claims.push_back(value.substr(nl + 1));
    const auto [it, fresh] = index.emplace(names.back(), static_cast<int>(index.size()));
    t.node.push_back(it->second);
  }
  // What each launcher says of its rank's node must match what was found.
  std::string problems;
  for (int r = 0; r < size; ++r) {
    const std::string& c = claims[static_cast<std::size_t>(r)];
    if (c.empty()) continue;
    const int found = static_cast<int>(t.members(t.node[static_cast<std::size_t>(r)]).size());
    if (c.substr(c.find('=') + 1) != std::to_string(found))
      problems += "\n  rank " + std::to_string(r) + ": " + c + " but " + std::to_string(found) +
                  " rank(s) share its node ('" + names[static_cast<std::size_t>(r)] + "')";
  }
  if (!problems.empty())
    GZ_THROW(InvalidArgument, "topology: the launcher's node sizes contradict the node names (set GRADZIP_NODE "
                              "to name each rank's node):", problems);
  return t;
}

}  // namespace gz
