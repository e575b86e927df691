#include "comm/cost/auto_choice.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "comm/algorithms/algorithm.h"
#include "comm/cost/codec_rates.h"
#include "comm/base/env.h"
#include "common/error.h"
#include "common/units.h"

namespace gz {

namespace {

std::string boot_id() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(f, id);
  return id.empty() ? "unknown" : id;
}

int cpu_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return sched_getaffinity(0, sizeof set, &set) == 0 ? std::max(1, CPU_COUNT(&set)) : 1;
}

std::string rates_text(const CodecRates& r) {
  char b[160];
  std::snprintf(b, sizeof b, "%.9g %.9g %.9g %.9g", r.encode_s, r.decode_s, r.decode_each_s, r.bytes_per_element);
  return b;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string part;
  std::istringstream in(s);
  while (std::getline(in, part, sep)) out.push_back(part);
  return out;
}

// Seconds of a fixed loop that touches no memory (xorshift in registers):
// what a share of one core costs, apart from the memory bus.
double spin_seconds() {
  const auto t0 = std::chrono::steady_clock::now();
  // Seeded from the clock: a loop the compiler cannot run ahead of time.
  std::uint64_t x = 0x9E3779B97F4A7C15ull ^ static_cast<std::uint64_t>(t0.time_since_epoch().count());
  for (int i = 0; i < (1 << 24); ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // x feeds the result (never 0 in practice), so the loop is not dropped.
  return x == 0 ? took + 1e-9 : took;
}

}  // namespace

std::vector<Algorithm> auto_candidates(const CodecConfig& codec, const Topology& topology) {
  // Every registered allreduce that may run here and has a time formula (its descriptor).
  std::vector<Algorithm> c;
  const TopologyShape shape = topology.shape();
  for (const AlgorithmDescriptor* d : all_algorithms())
    if (d->allreduce && d->predict && d->auto_candidate && d->auto_candidate(codec, shape)) c.push_back(d->id);
  return c;
}

Algorithm fastest_algorithm(const CostInputs& in, const std::vector<Algorithm>& candidates) {
  GZ_ENFORCE(!candidates.empty(), "no algorithm to choose from");
  Algorithm best = candidates.front();
  double best_s = predict(best, in).total_s;
  for (std::size_t i = 1; i < candidates.size(); ++i) {
    const double t = predict(candidates[i], in).total_s;
    if (t < best_s) {
      best = candidates[i];
      best_s = t;
    }
  }
  return best;
}

AutoChoice::AutoChoice(std::string link) : link_text_(std::move(link)) {
  if (link_text_.empty()) link_text_ = env_value("GRADZIP_LINK").value_or("");
  if (env_value("GRADZIP_COST_MODEL").value_or("") == "off") link_text_.clear();
}

void AutoChoice::share_hosts(Store& store, Transport* transport, int rank, int size, const Topology& topo,
                             Timeout timeout) {
  const int per_node = topo.uniform_size();
  if (hosts_known_) return;
  store.set("costmodel/host/" + std::to_string(rank),
            boot_id() + "\t" + std::to_string(cpu_count()) + "\t" + (rank == 0 ? link_text_ : "") + "\t" +
                (rank == 0 ? env_value("GRADZIP_LINK_BURST").value_or("") : ""));
  std::map<std::string, std::pair<int, int>> hosts;  // boot id: ranks, cpus
  std::string link, burst;
  for (int r = 0; r < size; ++r) {
    const auto f = split(store.get("costmodel/host/" + std::to_string(r), timeout), '\t');
    GZ_ENFORCE(f.size() >= 2, "rank ", r, " published a malformed machine record for the cost model");
    auto& h = hosts[f[0]];
    h.first += 1;
    h.second = std::max(1, std::atoi(f[1].c_str()));
    if (r == 0 && f.size() >= 3) link = f[2];
    if (r == 0 && f.size() >= 4) burst = f[3];
  }
  compute_share_ = 1;
  for (const auto& [id, h] : hosts)
    compute_share_ = std::max(compute_share_, static_cast<double>(h.first) / static_cast<double>(h.second));
  hosts_known_ = true;
  enabled_ = false;
  if (link.empty()) return;
  // Rank 0's texts: the same result on every rank. The bucket (gradzip-run's
  // tc tbf) is read by the one parser of counts (common/units.h).
  std::string what = "the link '" + link + "'";
  try {
    link_ = parse_link_model(link);
    if (!burst.empty()) {
      what = "GRADZIP_LINK_BURST '" + burst + "'";
      std::uint64_t bytes = 0;
      try {
        bytes = units::parse_count(burst);
      } catch (const std::invalid_argument& e) {
        GZ_THROW(InvalidArgument, e.what());
      }
      if (bytes > std::uint64_t{1} << 30) GZ_THROW(InvalidArgument, "over 2^30 bytes");
      link_.burst_bytes = static_cast<double>(bytes);
    }
    enabled_ = true;
  } catch (const InvalidArgument& e) {
    if (rank == 0)
      std::fprintf(stderr, "gradzip: warning: %s is not understood (%s); auto chooses by bytes\n", what.c_str(),
                   e.what());
    return;
  }
  // Timed on host buffers only (an NCCL transport takes device memory).
  if (transport == nullptr || transport->device_memory()) return;
  // The latency of one exchange with every peer: rank 0's median barrier.
  const CallContext ctx{Device::Cpu, nullptr, timeout};
  for (int i = 0; i < 2; ++i) transport->barrier(ctx);
  std::vector<double> t;
  for (int i = 0; i < 7; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    transport->barrier(ctx);
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  char b[40];
  std::snprintf(b, sizeof b, "%.9g", t[t.size() / 2]);
  if (rank == 0) store.set("costmodel/latency", b);
  const std::string v = store.get("costmodel/latency", timeout);
  const double latency = std::strtod(v.c_str(), nullptr);
  GZ_ENFORCE(std::isfinite(latency) && latency >= 0 && latency < 10, "rank 0 published a malformed latency '", v, "'");
  link_.latency_s = std::max(link_.latency_s, latency);

  // What the transport moves: every rank sends to every peer at once, as an
  // exchange of the algorithms does, at two sizes past the link's bucket
  // (so that its burst and the latency cancel); rank 0's median times give
  // the cost per byte, and what it takes beyond the link's time per byte
  // (topology and shared node links included) is the transport's own (TCP's
  // kernel work on the emulated cluster's 10 Gbit/s links: far above the
  // link's time). One size under the bucket read as no cost at all.
  // The sizes follow the link: the larger one adds about 80 ms of the link's
  // time (3 MiB per peer from 1 Gbit/s at 4 ranks on, never under 256 KiB).
  // Fixed sizes of 1 and 4 MiB sent 61 MiB per rank over the probe: 20 s of
  // a 50 Mbit/s link before the first step, a fifth of a run there.
  {
    const auto peers = static_cast<std::size_t>(size - 1);
    const int remote_peers = std::max(1, size - std::max(1, per_node));
    const double for_80ms = 0.08 * link_.bits_per_s / 8.0 / remote_peers;
    const std::size_t step =
        std::clamp(static_cast<std::size_t>(for_80ms), std::size_t{256} << 10, std::size_t{3} << 20);
    const std::size_t small = static_cast<std::size_t>(link_.burst_bytes) + step / 3;
    const std::size_t large = small + step;
    std::vector<std::byte> out(large, std::byte{1}), in(large * peers);
    std::vector<std::size_t> got(peers);
    // Rank 0's median of 3 timed exchanges of `bytes` to every peer in
    // `local_only`'s scope (after one untimed), shared as `key`.
    auto timed = [&](std::size_t bytes, bool local_only, const std::string& key) {
      std::vector<SendOp> sends;
      std::vector<RecvOp> recvs;
      const int node = topo.node[static_cast<std::size_t>(rank)];
      for (int r = 0, i = 0; r < size; ++r) {
        if (r == rank) continue;
        const auto slot = static_cast<std::size_t>(i++);
        if (local_only && topo.node[static_cast<std::size_t>(r)] != node) continue;
        sends.push_back({r, ConstSlice{out.data(), bytes}});
        recvs.push_back({r, Slice{in.data() + slot * large, bytes}, &got[slot]});
      }
      std::vector<double> ts;
      for (int i = 0; i < 4; ++i) {
        transport->barrier(ctx);
        const auto t0 = std::chrono::steady_clock::now();
        transport->wait(transport->start(sends, recvs, ctx));
        if (i >= 1) ts.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      std::sort(ts.begin(), ts.end());
      std::snprintf(b, sizeof b, "%.9g", ts[ts.size() / 2]);
      if (rank == 0) store.set(key, b);
      return std::strtod(store.get(key, timeout).c_str(), nullptr);
    };
    const double t_small = timed(small, false, "costmodel/exchange/small");
    const double t_large = timed(large, false, "costmodel/exchange/large");
    if (per_node >= 2) {  // the node's own path: the same with the node's other ranks only
      const double local = timed(large, true, "costmodel/local_exchange");
      if (std::isfinite(local) && local > 0)
        link_.local_bytes_per_s = static_cast<double>(per_node - 1) * static_cast<double>(large) / local;
    }
    // Seconds per byte sent to other nodes: the link's pace or the
    // transport's, whichever was slower (exchange_seconds takes the longer).
    // Within 25% of the link's own pace it is the link, read with the noise
    // of ranks sharing cores (4 ranks on 2 cores at 1 Gbit/s: 7.5 to 17
    // ns/B against the link's 8.1), and counts as none.
    const int L = std::max(1, per_node), remote = size - L;
    const double extra = static_cast<double>(large - small);
    const double link_pace = L / (link_.bits_per_s / 8.0 * link_.efficiency);
    if (std::isfinite(t_large - t_small) && remote > 0) {
      const double pace = std::max(0.0, t_large - t_small) / (static_cast<double>(remote) * extra);
      link_.transport_s_per_byte = pace > 1.25 * link_pace ? pace : 0.0;
    }
  }

  // How much of a core each rank's codec work gets: a loop that stays in
  // registers, timed on rank 0 alone (the others wait in the store) and then
  // on every rank at once. The slowest rank's ratio (ranks sharing cores,
  // other work on them) scales the codec work, never below the ranks per core.
  const double alone = rank == 0 ? spin_seconds() : 0.0;
  if (rank == 0) {
    std::snprintf(b, sizeof b, "%.9g", alone);
    store.set("costmodel/spin", b);
  }
  const double spin1 = std::strtod(store.get("costmodel/spin", timeout).c_str(), nullptr);
  transport->barrier(ctx);
  std::snprintf(b, sizeof b, "%.9g", spin_seconds());
  store.set("costmodel/spin/" + std::to_string(rank), b);
  double spin_slowest = 0;
  for (int r = 0; r < size; ++r)
    spin_slowest =
        std::max(spin_slowest, std::strtod(store.get("costmodel/spin/" + std::to_string(r), timeout).c_str(), nullptr));
  const double cpu_ratio = spin_slowest / spin1;
  if (std::isfinite(cpu_ratio) && cpu_ratio > 0) compute_share_ = std::max(compute_share_, std::min(cpu_ratio, 64.0));
}

const AutoChoice::Shared* AutoChoice::share_rates(const CodecConfig& codec, const CodecConfig& server, Store& store,
                                                  int rank, Timeout timeout) {
  const auto key = std::make_pair(codec.canonical(), server.canonical());
  if (auto it = rates_.find(key); it != rates_.end()) return &it->second;
  const std::string store_key = "costmodel/rates/" + std::to_string(rounds_++);
  if (rank == 0) {
    RatesCache cache(RatesCache::default_path());
    Shared s{cache.codec(codec), cache.codec(server), cache.machine()};
    const MachineRates& m = s.machine;
    char mb[120];
    std::snprintf(mb, sizeof mb, "%.9g %.9g %.9g", m.copy_bytes_per_s, m.sum_s, m.sum_each_s);
    store.set(store_key, key.first + "\t" + key.second + "\t" + rates_text(s.codec) + "\t" + rates_text(s.server) +
                             "\t" + mb);
    return &(rates_[key] = s);
  }
  const auto f = split(store.get(store_key, timeout), '\t');
  GZ_ENFORCE(f.size() == 5, "rank 0 published malformed codec rates for the cost model");
  if (f[0] != key.first || f[1] != key.second) return nullptr;  // another codec: the agreement will say
  auto nums = [](const std::string& s) {
    std::vector<double> v;
    std::istringstream in(s);
    for (double x; in >> x;) v.push_back(x);
    return v;
  };
  const auto c = nums(f[2]), sv = nums(f[3]), m = nums(f[4]);
  GZ_ENFORCE(c.size() == 4 && sv.size() == 4 && m.size() == 3, "rank 0 published malformed codec rates");
  Shared s{{c[0], c[1], c[2], c[3]}, {sv[0], sv[1], sv[2], sv[3]}, {m[0], m[1], m[2]}};
  return &(rates_[key] = s);
}

std::optional<CostInputs> AutoChoice::inputs(const AllreduceOptions& o, Store& store, Transport* transport, int rank,
                                             int size) {
  if (o.device != Device::Cpu || size <= 1 || o.codec == nullptr) return std::nullopt;
  const Topology topo = o.topology ? *o.topology : Topology::flat(size);
  share_hosts(store, transport, rank, size, topo, o.timeout);
  if (!enabled_) return std::nullopt;
  const CodecConfig& cfg = o.codec->config();
  CodecConfig server = o.server_codec ? *o.server_codec : server_codec_config(cfg);
  server.ef = cfg.ef && !server.descriptor().lossless;
  const Shared* s = share_rates(cfg, server, store, rank, o.timeout);
  if (!s) return std::nullopt;
  CostInputs in;
  in.n = o.n;
  in.ranks = size;
  in.per_node = std::max(1, topo.uniform_size());
  in.codec = s->codec;
  in.server = s->server;
  in.raw = cfg.descriptor().lossless;
  in.ef = cfg.ef;
  in.machine = s->machine;
  in.link = link_;
  in.compute_share = compute_share_;
  in.segment_bytes = o.segment_bytes;
  in.inner = topo.nodes() >= 2 ? inner_algorithm(cfg, topo.nodes()) : Algorithm::Allgather;
  return in;
}

Algorithm AutoChoice::resolve(const AllreduceOptions& o, Store& store, int rank, int size) {
  return resolve(o, store, nullptr, rank, size);
}

Algorithm AutoChoice::resolve(const AllreduceOptions& o, Store& store, Transport* transport, int rank, int size) {
  const Topology topo = o.topology ? *o.topology : Topology::flat(size);
  if (o.algorithm != Algorithm::Auto) return o.algorithm;
  const std::optional<CostInputs> in = inputs(o, store, transport, rank, size);
  if (!in) return resolve_algorithm(Algorithm::Auto, o.codec->config(), topo, o.server_codec ? &*o.server_codec : nullptr);
  return fastest_algorithm(*in, auto_candidates(o.codec->config(), topo));
}

}  // namespace gz
