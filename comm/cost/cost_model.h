// The cost model of the compressed allreduce: a predicted time per algorithm
// from the codecs' rates on this machine (codec_rates.h), the link and the
// topology. `auto` (Communicator, with a link given) runs the fastest
// algorithm the accuracy rules allow; gradzip-bench --predict prints the
// prediction next to each measured row; gradzip-model sweeps it to 1024
// ranks. Pure functions: the same inputs give the same choice on every rank.
//
// What a call costs (docs/comm.md, "The cost model"). Every algorithm is a
// pipeline of S segments with two in flight (allreduce_flat.cc): while one
// segment's bytes move, the next is encoded and the last decoded. Per
// segment, E + D seconds of codec work on the rank's core (encode, decode
// and the transport's own copies) and W seconds of wire time (the bytes
// crossing the busiest link / its rate, plus the latency of an exchange).
// The call then takes the longer of
//   compute-bound: S (E + D) + max(0, W - D)   (the last transfer not hidden)
//   wire-bound:    E + S W + D                 (the first encode, the last decode)
// Hierarchical runs its three phases one after another (allreduce_hierarchical.cc).
//
// Each algorithm's formula lives in its own file (comm/algorithms/<name>.cc:
// the descriptor's predict, memory_bytes, bytes_per_peer), composed from the
// building blocks below; predict() and memory_limit() look them up.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "comm/engine/collective.h"

namespace gz {

/// Seconds per element of one codec's work on one core (codec_rates.h
/// measures them). decode_sum of k payloads of m elements takes
/// m (decode_s + k decode_each_s).
struct CodecRates {
  double encode_s = 0;       ///< encode with error feedback, per element
  double decode_s = 0;       ///< decode_sum's fixed part, per element
  double decode_each_s = 0;  ///< decode_sum's part per payload, per element
  double bytes_per_element = 4;  ///< payload bytes per element (headers aside; top-k at its density)
};

/// The machine: memory copy bandwidth and the fp32 sum (codec none on the
/// host sends the floats themselves and sums them with kernels::cpu::sum).
struct MachineRates {
  double copy_bytes_per_s = 10e9;  ///< memcpy of a large buffer (bytes copied per second)
  double sum_s = 0;                ///< sum of k float arrays: m (sum_s + k sum_each_s)
  double sum_each_s = 0;
};

/// The network as the ranks see it.
struct LinkModel {
  double bits_per_s = 0;        ///< each node's link, each direction (0: unknown)
  double latency_s = 0;         ///< added per exchange (one-way delay, as tc's)
  double local_bytes_per_s = 0; ///< between ranks of one node (0: copy_bytes_per_s / 2)
  /// Share of the link rate that carries payload (TCP/IP headers at MTU 9000: 0.99).
  double efficiency = 0.99;
  /// Seconds the transport needs per byte a rank sends to another node (its
  /// own CPU work: TCP through the kernel), beside the link's time: an
  /// exchange takes the longer of the two (measured by AutoChoice; at or
  /// below the link's time when the link is the bottleneck).
  double transport_s_per_byte = 0;
  /// Seconds per message of an exchange (it posts one send and one receive
  /// per peer): what grows with the peer count at hundreds of ranks. 0 in
  /// auto's model (the latency measured on all peers holds it); gradzip-model
  /// takes it as --message-us.
  double per_message_s = 0;
  /// Bytes a node link passes at once after it idled: a token bucket's size
  /// (the emulated cluster's tc tbf, GRADZIP_LINK_BURST, which gradzip-run
  /// sets; 0 for a real link). A call that starts on an idle link can save
  /// up to burst_bytes / rate of wire time (memory_limit).
  double burst_bytes = 0;
};

/// "1gbit", "10gbit", "2.5gbit,50us", "100mbit,1ms" (GRADZIP_LINK): parsed
/// by gradzip-run --link's own parser (common/units.h parse_link: rate units
/// bit, kbit, mbit, gbit, tbit, powers of 1000, in 100kbit..4tbit; delay
/// units ns, us, ms, s, up to 10 s). Throws InvalidArgument with the reason.
LinkModel parse_link_model(std::string_view text);

/// Everything one prediction needs.
struct CostInputs {
  std::size_t n = 0;       ///< elements of the buffer
  int ranks = 1;
  int per_node = 1;        ///< ranks per node (1: every rank a node); nodes = ranks / per_node
  CodecRates codec;        ///< the user's codec
  CodecRates server;       ///< scatter_reduce's chunk sums' codec (server_codec_config)
  bool raw = false;        ///< codec none on the host: floats, no payloads
  MachineRates machine;
  LinkModel link;
  /// How much slower than one quiet core each rank's codec work runs: ranks
  /// per core on the busiest machine, or more when other work takes the
  /// cores (AutoChoice times it on a cache-resident loop).
  double compute_share = 1;
  /// Payload bytes per pipeline segment (0: the library's default, 1 MiB).
  std::size_t segment_bytes = 0;
  bool ef = true;           ///< the codec keeps a residual (error feedback)
  /// Hierarchical's algorithm across nodes (resolve_algorithm's rule for nodes ranks).
  Algorithm inner = Algorithm::Allgather;
};

/// One prediction, and its parts (for reports).
struct Prediction {
  double total_s = 0;
  double compute_s = 0;  ///< codec and copy work of one rank, all segments
  double wire_s = 0;     ///< bytes over the busiest link / its rate (with latencies)
  std::size_t segments = 0;
};

/// The prediction of `a` (its descriptor's predict; Auto or an algorithm
/// without a formula: throws InvalidArgument; hierarchical needs per_node
/// >= 2 dividing ranks).
Prediction predict(Algorithm a, const CostInputs& in);

/// Wire time a call can save at most when it starts on an idle link whose
/// bucket holds link.burst_bytes (0 without a burst or without other
/// nodes): memory_limit subtracts it.
double burst_credit_seconds(const CostInputs& in);

/// Bytes of memory one rank's codec work must touch in a call of `a`
/// (its descriptor's memory_bytes; 0 where it has none: hierarchical): encode reads the gradient (and
/// reads and writes the residual) and writes the payload; decode reads the
/// payloads and writes the output. With the machine's copy bandwidth this is
/// the memory-traffic bound of the call (memory_limit).
double memory_bytes(Algorithm a, const CostInputs& in);

/// The least time a call of `a` can take on this machine: max(the link
/// time of its bytes at the line rate, less the burst, memory_bytes / one
/// core's copy bandwidth (2 x memcpy's rate: a copy reads and writes each
/// byte)). 0 for hierarchical.
double memory_limit(Algorithm a, const CostInputs& in);

/// Wire time of one exchange in which this rank sends `bytes` to each of
/// the other `members - 1` ranks (and receives as many), `local_peers` of
/// them on its node, its node's link shared by `sharers` ranks sending at
/// once.
double exchange_seconds(const CostInputs& in, int members, int local_peers, int sharers, double bytes);

/// The pipeline of S segments with per-segment compute `c` (encode e +
/// decode d) and wire time w (the formula at the top of this file).
double pipeline_seconds(std::size_t S, double e, double d, double w);

/// Elements per segment of a run of `unit` elements whose payload has
/// `bytes_per_element` (Run::wire_for's default cut, without the granules).
std::size_t model_segment_elems(std::size_t unit, double bytes_per_element, std::size_t segment_bytes);

// -- building blocks of the algorithms' formulas ---------------------------------

/// One flat phase's group, as its links see it.
struct CostGroup {
  int members = 1;      ///< ranks in the group
  int local_peers = 0;  ///< of the others, how many share this rank's node (their bytes stay off the link)
  int sharers = 1;      ///< ranks whose traffic crosses this rank's node link at the same time
};
/// Every rank, nodes of in.per_node ranks.
CostGroup world_group(const CostInputs& in);
/// Wire time of one exchange in which this rank sends `bytes` to each other member.
double exchange_seconds(const CostInputs& in, const CostGroup& g, double bytes);
/// CPU time of moving `bytes` per peer through the transport (sent and received).
double transport_cpu_seconds(const CostInputs& in, const CostGroup& g, double bytes);
/// Summing m floats from k sources (codec none).
double sum_seconds(const CostInputs& in, double m, int k);
/// Decoding m elements from k payloads into one sum.
double decode_seconds(const CodecRates& r, double m, int k);
/// The pipelined allgather of `count` elements over group g: every member's
/// payload to every member, decoded into the sum.
Prediction flat_allgather_prediction(const CostInputs& in, const CostGroup& g, std::size_t count);
/// The pipelined two-phase scatter_reduce of `count` elements over group g.
Prediction flat_scatter_reduce_prediction(const CostInputs& in, const CostGroup& g, std::size_t count);
/// Payload bytes per element of the codec and server codec (4 for raw floats).
inline double codec_bytes(const CostInputs& in) { return in.raw ? 4.0 : in.codec.bytes_per_element; }
inline double server_bytes(const CostInputs& in) { return in.raw ? 4.0 : in.server.bytes_per_element; }

}  // namespace gz
