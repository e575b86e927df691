// `auto` by predicted time: what a Communicator runs for Algorithm::Auto when
// it knows its link (CommunicatorOptions::link, or GRADZIP_LINK as
// gradzip-run --link sets it): the fastest algorithm by the cost model
// (cost_model.h) among those the accuracy rules allow (auto_candidates).
// Without a link, or with GRADZIP_COST_MODEL=off, or on a CUDA device, auto
// is resolve_algorithm's rule by bytes, as before.
//
// Every rank must choose the same algorithm, so every rank computes the
// choice from the same inputs, shared through the Store:
//   - once per communicator (its first auto call): each rank publishes its
//     machine (boot id, CPU count) and rank 0 its link; every rank reads them
//     all. With a link, the ranks then time a few barriers (one exchange
//     with every peer each, as a pipeline segment's) and take rank 0's median
//     as the latency of an exchange (it holds the link's delay, the
//     transport's and the scheduler's); and all copy 192 MiB at once, each
//     timing itself: the slowest, against rank 0's cached copy rate of one
//     quiet core, says how much slower the codecs run now (ranks sharing
//     cores and memory, other work on the machine). Without a transport to
//     time on, ranks per core on the busiest machine stand in for it. Ranks on one machine (the emulated cluster's nodes) share its
//     cores: the codec work of the busiest machine is scaled by its ranks
//     per core.
//   - once per codec (the first call with it): rank 0 looks up the codec's
//     and its server codec's rates (codec_rates.h: cached, or measured in
//     tens of ms) and publishes them; every rank reads rank 0's.
// Calls are collective and come in the same order on every rank, so these
// rounds, numbered per communicator, line up. A rank handed another codec
// than rank 0 (a user error the call's agreement then reports) falls back
// to the rule by bytes for that call.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/engine/allreduce.h"
#include "comm/cost/cost_model.h"

namespace gz {

/// The algorithms auto may run for `codec` on `topology`, keeping the
/// accuracy rules in place: allgather always; scatter_reduce (with the
/// server codec, server_codec_config) unless the codec's hint keeps it on
/// allgather up to this many ranks (top-k: re-sparsifying a chunk sum drops
/// what the first phase kept); hierarchical on 2 or more nodes of one size
/// of 2 or more ranks.
std::vector<Algorithm> auto_candidates(const CodecConfig& codec, const Topology& topology);

/// The candidate with the least predicted time (ties: the earlier one).
Algorithm fastest_algorithm(const CostInputs& in, const std::vector<Algorithm>& candidates);

class AutoChoice {
 public:
  /// `link`: "1gbit", "10gbit,50us" (empty: GRADZIP_LINK; none: no model).
  explicit AutoChoice(std::string link = {});

  /// What a call with these options runs (o.algorithm when not Auto).
  /// Collective on its first auto call and on the first with each codec.
  Algorithm resolve(const AllreduceOptions& o, Store& store, int rank, int size);
  /// The same, with the transport to time the exchanges' latency on (null:
  /// the link's given delay only).
  Algorithm resolve(const AllreduceOptions& o, Store& store, Transport* transport, int rank, int size);

  /// The model's inputs for a call like `o` (any algorithm), when the model
  /// is on and knows the codec (after a resolve of an auto call with it;
  /// collective as resolve). nullopt: the model is off.
  std::optional<CostInputs> inputs(const AllreduceOptions& o, Store& store, Transport* transport, int rank, int size);

  /// Whether the model decides (known after the first auto call).
  bool enabled() const { return enabled_; }

 private:
  struct Shared {
    CodecRates codec, server;
    MachineRates machine;
  };
  void share_hosts(Store& store, Transport* transport, int rank, int size, const Topology& topo, Timeout timeout);
  const Shared* share_rates(const CodecConfig& codec, const CodecConfig& server, Store& store, int rank,
                            Timeout timeout);

  std::string link_text_;
  bool hosts_known_ = false, enabled_ = false;
  LinkModel link_;
  double compute_share_ = 1;
  std::uint64_t rounds_ = 0;  // rate rounds made, the same on every rank
  std::map<std::pair<std::string, std::string>, Shared> rates_;
};

}  // namespace gz
