// gradzip._core.Communicator and ErrorFeedback (a collective's error-feedback
// state, which gradzip.ErrorFeedback wraps): gradzip's compressed
// allreduce over its own transports (UCX, NCCL), and a Store that forwards to
// a Python object (torch.distributed's store), so a job that already has a
// torch process group needs no second rendezvous port.
//
// Every call that waits on peers runs with the GIL released; the Python store
// takes it back only for its own calls.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "arrays.h"
#include "bindings.h"
#include "codec_handle.h"
#include "comm/algorithms/algorithm.h"
#include "comm/engine/agreement.h"
#include "py_transport.h"
#include "comm/engine/allreduce.h"
#include "comm/engine/communicator.h"
#include "comm/store/prefix_store.h"
#include "comm/store/sealed_store.h"
#include "common/error.h"
#include "common/units.h"

namespace nb = nanobind;

namespace gzpy {
namespace {

gz::Timeout to_timeout(std::optional<double> seconds) {
  if (!seconds) return gz::default_timeout();
  if (!std::isfinite(*seconds) || *seconds <= 0)
    GZ_THROW(gz::InvalidArgument, "timeout must be a positive number of seconds, got ", *seconds);
  return gz::Timeout(static_cast<gz::Timeout::rep>(std::ceil(*seconds * 1000.0)));
}

// A Store whose operations call a Python object with torch.distributed.Store's
// methods: set(key, bytes), get(key) -> bytes, wait(keys, timedelta), add(key, int),
// check(keys) -> bool, and delete_key(key) when it has one.
// Python exceptions (torch's store timeout among them) become IoError.
class PyStore final : public gz::Store {
 public:
  PyStore(nb::object store, gz::Timeout timeout) : Store(timeout), store_(std::move(store)) {}
  ~PyStore() override {
    if (!Py_IsInitialized()) {
      store_.release();  // the interpreter is gone: leak rather than touch it
      return;
    }
    nb::gil_scoped_acquire gil;
    store_.reset();
  }

 protected:
  void do_set(const std::string& key, std::string_view value) override {
    call("set", key, [&] { store_.attr("set")(key, nb::bytes(value.data(), value.size())); });
  }
  std::string do_get(const std::string& key) override {
    std::string out;
    call("get", key, [&] {
      nb::object v = store_.attr("get")(key);
      if (nb::isinstance<nb::bytes>(v)) {
        nb::bytes b = nb::borrow<nb::bytes>(v);
        out.assign(static_cast<const char*>(b.data()), b.size());
      } else {
        out = nb::cast<std::string>(v);
      }
    });
    return out;
  }
  void do_wait(const std::vector<std::string>& keys, gz::Timeout timeout) override {
    call("wait", gz::join_keys(keys), [&] {
      nb::list list;
      for (const auto& k : keys) list.append(nb::str(k.data(), k.size()));
      if (timeout.count() <= 0) {
        // "Has it arrived?": torch's wait() treats a zero timeout as already expired.
        if (!nb::cast<bool>(store_.attr("check")(list)))
          GZ_THROW(gz::IoError, "rendezvous store: keys not set: ", gz::join_keys(keys));
        return;
      }
      nb::object delta = nb::module_::import_("datetime").attr("timedelta")(
          nb::arg("milliseconds") = static_cast<double>(timeout.count()));
      store_.attr("wait")(list, delta);
    });
  }
  std::int64_t do_add(const std::string& key, std::int64_t delta) override {
    std::int64_t out = 0;
    call("add", key, [&] { out = nb::cast<std::int64_t>(store_.attr("add")(key, delta)); });
    return out;
  }
  void do_erase(const std::vector<std::string>& keys) override {
    call("delete_key", gz::join_keys(keys), [&] {
      if (!nb::hasattr(store_, "delete_key")) return;  // such a store keeps what the ranks agreed on
      for (const auto& k : keys) store_.attr("delete_key")(k);
    });
  }

 private:
  template <class F>
  void call(const char* op, const std::string& what, F&& f) {
    nb::gil_scoped_acquire gil;
    try {
      f();
    } catch (nb::python_error& e) {
      GZ_THROW(gz::IoError, "rendezvous store ", op, "(", what, ") failed: ", e.what());
    } catch (const nb::cast_error&) {
      GZ_THROW(gz::IoError, "rendezvous store ", op, "(", what, ") returned an unexpected type");
    }
  }

  nb::object store_;
};

// A communicator shared with Python, and the lock that keeps its calls one at a time.
struct CommHandle {
  std::unique_ptr<gz::Communicator> comm;
  std::mutex mutex;

  CommHandle() = default;
  CommHandle(const CommHandle&) = delete;
  CommHandle& operator=(const CommHandle&) = delete;
  ~CommHandle() {
    // The destructor's closing barrier may wait on peers (and on the Python
    // store): not while holding the GIL.
    if (comm && Py_IsInitialized() && PyGILState_Check()) {
      nb::gil_scoped_release release;
      comm.reset();
    }
  }

  gz::Communicator& get() {
    if (!comm) GZ_THROW(gz::InvalidArgument, "this communicator is closed");
    return *comm;
  }
};

gz::CommunicatorOptions make_options(std::optional<double> timeout_s, const std::string& prefix, int cuda_device) {
  gz::CommunicatorOptions o;
  o.timeout = to_timeout(timeout_s);
  o.prefix = prefix;
  o.cuda_device = cuda_device;
  return o;
}

std::unique_ptr<CommHandle> from_env(std::string_view transport, std::optional<double> timeout_s,
                                     const std::string& prefix, int cuda_device) {
  const gz::CommunicatorOptions options = make_options(timeout_s, prefix, cuda_device);
  auto h = std::make_unique<CommHandle>();
  nb::gil_scoped_release release;
  h->comm = gz::Communicator::from_env(transport, options);  // checks the transport's name first
  return h;
}

void check_store(const nb::object& store) {
  for (const char* m : {"set", "get", "wait", "add", "check"})
    if (!nb::hasattr(store, m))
      GZ_THROW(gz::InvalidArgument, "store has no ", m, "() method; pass a torch.distributed.Store "
               "(or an object with its set/get/wait/add/check)");
}

std::unique_ptr<CommHandle> from_store(nb::object store, int rank, int world_size, std::string_view transport,
                                       std::optional<double> timeout_s, const std::string& prefix, int cuda_device,
                                       const std::string& node) {
  gz::transport_descriptor(transport);  // an unknown or absent transport: before anything starts
  if (world_size < 1 || rank < 0 || rank >= world_size)
    GZ_THROW(gz::InvalidArgument, "rank ", rank, " is not in [0, ", world_size, ")");
  check_store(store);
  gz::CommunicatorOptions options = make_options(timeout_s, prefix, cuda_device);
  options.node = node;
  auto py = std::make_shared<PyStore>(std::move(store), options.timeout);
  auto h = std::make_unique<CommHandle>();
  nb::gil_scoped_release release;
  // A torch store has no local rank; one GPU per rank on a node is the usual layout.
  h->comm = gz::Communicator::create(transport, std::move(py), rank, world_size, rank, options);
  return h;
}

// Over a transport a Python object drives (py_transport.h): torch's process
// group. The store is the group's (torch's default store); the group and the
// store outlive the communicator, so closing waits for nobody.
std::unique_ptr<CommHandle> from_python(nb::object store, nb::object driver, std::optional<double> timeout_s,
                                        const std::string& prefix, const std::string& node) {
  check_store(store);
  gz::CommunicatorOptions options = make_options(timeout_s, prefix, -1);
  options.node = node;
  options.closing_barrier = false;
  auto transport = std::make_unique<PyTransport>(std::move(driver));
  auto py = std::make_shared<PyStore>(std::move(store), options.timeout);
  auto h = std::make_unique<CommHandle>();
  nb::gil_scoped_release release;
  h->comm = gz::Communicator::create(std::move(py), std::move(transport), options);
  return h;
}

nb::dict stats_dict(const gz::AllreduceStats& s) {
  nb::dict d;
  d["algorithm"] = gz::to_string(s.algorithm);
  d["encode_s"] = s.encode_s;
  d["comm_s"] = s.comm_s;
  d["decode_s"] = s.decode_s;
  d["wait_s"] = s.wait_s;
  d["total_s"] = s.total_s;
  d["segments"] = s.segments;
  d["wire_bytes"] = s.wire_bytes;
  d["remote_bytes"] = s.remote_bytes;
  d["agreed"] = s.agreed;
  return d;
}

// One collective call on a buffer: checks, then `collective` with the GIL released.
template <class Collective>
nb::dict run_call(CommHandle& h, const OutArray& buffer, CodecHandle& codec, gz::ErrorFeedback& state,
                  std::string_view op, std::string_view algorithm, std::optional<std::string> server_codec,
                  std::uintptr_t stream, std::optional<double> timeout_s, Collective collective) {
  gz::Communicator& comm = h.get();
  const Span b = check_array(buffer, Elem::Grad, "tensor");
  if (b.place.device == gz::Device::Cpu && stream != 0)
    GZ_THROW(gz::InvalidArgument, "a stream was given but tensor is a host array");
  gz::AllreduceStats stats;
  gz::AllreduceCall call;
  call.op = gz::parse_reduce_op(op);
  call.algorithm = gz::parse_algorithm(algorithm);
  if (server_codec) call.server_codec = gz::server_codec_config(codec.codec().config(), server_codec);
  call.device = b.place.device;
  call.stream = reinterpret_cast<gz::Stream>(stream);
  if (timeout_s) call.timeout = to_timeout(timeout_s);
  call.stats = &stats;
  {
    nb::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(h.mutex);
    std::lock_guard<std::mutex> codec_lock(codec.mutex());
    collective(comm, b, codec.codec(), state, call);
  }
  return stats_dict(stats);
}

nb::dict allreduce(CommHandle& h, const OutArray& buffer, CodecHandle& codec, gz::ErrorFeedback& state,
                   std::string_view op, std::string_view algorithm, std::optional<std::string> server_codec,
                   std::uintptr_t stream, std::optional<double> timeout_s) {
  return run_call(h, buffer, codec, state, op, algorithm, std::move(server_codec), stream, timeout_s,
                  [](gz::Communicator& comm, const Span& b, gz::Codec& c, gz::ErrorFeedback& st,
                     const gz::AllreduceCall& call) { comm.allreduce(b.data, b.dtype, b.count, c, st, call); });
}

nb::dict reduce_scatter(CommHandle& h, const OutArray& buffer, CodecHandle& codec, gz::ErrorFeedback& state,
                        std::string_view op, std::uintptr_t stream, std::optional<double> timeout_s) {
  return run_call(h, buffer, codec, state, op, "auto", std::nullopt, stream, timeout_s,
                  [](gz::Communicator& comm, const Span& b, gz::Codec& c, gz::ErrorFeedback& st,
                     const gz::AllreduceCall& call) {
                    if (b.dtype != gz::Dtype::Float32)
                      GZ_THROW(gz::InvalidArgument, "reduce_scatter takes float32 tensors, got ", gz::to_string(b.dtype));
                    comm.reduce_scatter(static_cast<float*>(b.data), b.count, c, st, call);
                  });
}

nb::object layout(const gz::ErrorFeedback& s) {
  if (!s.layout()) return nb::none();
  const auto& l = *s.layout();
  nb::dict d;
  d["codec"] = l.codec;
  d["n"] = l.n;
  d["rank"] = l.rank;
  d["world_size"] = l.world;
  d["algorithm"] = gz::to_string(l.algorithm);
  return d;
}

}  // namespace

void bind_comm(nb::module_& m) {
  // The algorithm registry (comm/algorithms/registry.h): Python, the hook,
  // BlockMomentum and the sweep take names and costs from here.
  m.def("allreduce_algorithm_names", &gz::allreduce_algorithm_names,
        "What an allreduce's `algorithm` takes: 'auto', then each allreduce algorithm of the registry.");
  m.def("algorithms", [] {
          nb::list out;
          for (const gz::AlgorithmDescriptor* d : gz::all_algorithms()) {
            nb::dict e;
            e["name"] = std::string(d->name);
            e["summary"] = std::string(d->summary);
            e["allreduce"] = d->allreduce;
            e["uniform_nodes"] = d->follows_nodes;
            out.append(e);
          }
          return out;
        },
        "Every collective algorithm (comm/algorithms/registry.h), in registry order: dicts of name,\n"
        "summary, allreduce (False: a collective of its own, reduce_scatter) and uniform_nodes (needs\n"
        "the same number of ranks on every node).");
  m.def("scatter_reduce_chunks",
        [](std::uint64_t n, int ranks, std::string_view codec) {
          GZ_ENFORCE(ranks >= 1, "ranks must be >= 1, got ", ranks);
          const std::size_t grain = gz::chunk_grain(gz::parse_spec(codec), n, ranks);
          std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
          for (int j = 0; j < ranks; ++j) {
            const gz::ChunkRange c = gz::chunk_range(n, ranks, j, grain);
            out.emplace_back(c.offset, c.count);
          }
          return out;
        },
        nb::arg("n"), nb::arg("ranks"), nb::arg("codec"),
        "(offset, count) of each rank's chunk in scatter_reduce with this codec: chunks of whole\n"
        "blocks of the codec (chunk_grain: when there are at least 16 per rank), the first ones a\n"
        "block longer, the last block short.");
  m.def("algorithm_wire_cost",
        [](std::string_view algorithm, std::string_view codec, std::uint64_t n, int ranks, int rank,
           std::optional<std::string> server_codec, std::optional<std::vector<int>> nodes) {
          const gz::AlgorithmDescriptor* d = gz::find_algorithm(algorithm == "scatter-reduce" ? "scatter_reduce" : algorithm);
          if (!d) GZ_THROW(gz::InvalidArgument, "unknown algorithm '", algorithm, "' (auto: resolve it first)");
          GZ_ENFORCE(ranks >= 1, "ranks must be >= 1, got ", ranks);
          GZ_ENFORCE(rank >= 0 && rank < ranks, "rank must be in [0, ", ranks, "), got ", rank);
          gz::CostQuery q;
          q.codec = gz::parse_spec(codec);
          q.server = gz::server_codec_config(q.codec, server_codec);
          q.n = n;
          q.rank = rank;
          gz::Topology topo = gz::Topology::flat(ranks);
          if (nodes) {
            GZ_ENFORCE(static_cast<int>(nodes->size()) == ranks, "nodes names ", nodes->size(), " ranks, not ", ranks);
            // Renumbered in the order of each node's lowest rank (Topology's rule).
            std::vector<int> seen;
            for (std::size_t r = 0; r < nodes->size(); ++r) {
              const int k = (*nodes)[r];
              auto it = std::find(seen.begin(), seen.end(), k);
              if (it == seen.end()) it = seen.insert(seen.end(), k);
              topo.node[r] = static_cast<int>(it - seen.begin());
            }
          }
          q.topology = &topo;
          const gz::WireCost c = d->wire_cost(q);
          nb::dict out;
          out["bytes"] = c.bytes;
          out["remote_bytes"] = c.remote_bytes;
          out["messages"] = c.messages;
          out["rounds"] = c.rounds;
          return out;
        },
        nb::arg("algorithm"), nb::arg("codec"), nb::arg("n"), nb::arg("ranks"), nb::arg("rank") = 0,
        nb::arg("server_codec") = nb::none(), nb::arg("nodes") = nb::none(),
        "The algorithm's cost formula (its descriptor's wire_cost) for one call: the payload bytes rank\n"
        "`rank` of `ranks` sends (whole-chunk payloads; each extra pipeline segment adds a 32-byte\n"
        "header), the part to other nodes (`nodes`: each rank's node index; default one node per\n"
        "rank), its messages and its sequential rounds. A dict: bytes, remote_bytes, messages, rounds.");
  m.def("parse_count", [](std::string_view text) { return gz::units::parse_count(text); }, nb::arg("text"),
        "An element count as gradzip-bench --sizes takes it: 1048576, '16M' (K/M/G: powers of 1024),\n"
        "'25.6e6'; whole, 1..2^40. ValueError otherwise (common/units.h).");
  m.def("parse_link", [](std::string_view text) {
          const gz::units::Link l = gz::units::parse_link(text);
          nb::dict out;
          out["rate_bps"] = l.rate_bps;
          out["delay_ns"] = l.delay_ns;
          return out;
        },
        nb::arg("text"),
        "A link as gradzip-run --link takes it ('1gbit', '10gbit,50us'): dict of rate_bps and delay_ns.\n"
        "ValueError otherwise (common/units.h, the launcher's own parser).");
  m.def("server_codec_spec",
        [](std::string_view spec, std::optional<std::string> given) {
          return gz::server_codec_config(gz::parse_spec(spec), given).canonical();
        },
        nb::arg("spec"), nb::arg("given") = nb::none(),
        "The codec scatter_reduce re-encodes the chunk sums with, for codec `spec` and a caller's\n"
        "server_codec argument `given`: None, the default (fp16 for onebit, the codec itself\n"
        "otherwise; docs/comm.md, 'The server phase'); 'same', the codec itself; else that spec.");
  nb::class_<gz::ErrorFeedback>(
      m, "ErrorFeedback",
      "A collective's error-feedback state of one buffer (gz::ErrorFeedback; raw binding, which\n"
      "gradzip.ErrorFeedback wraps): the worker residual and, for scatter_reduce, the server residual\n"
      "of this rank's chunk. Created empty; the first allreduce or reduce_scatter binds it to that\n"
      "call's codec, size, rank, world size and algorithm.")
      .def(nb::init<>())
      .def("save", [](const gz::ErrorFeedback& s) {
             const std::string bytes = s.save();
             return nb::bytes(bytes.data(), bytes.size());
           },
           "Serialises layout and residuals (copied from the device if needed). Raises InvalidArgument\n"
           "for a state that was never used or restored.")
      .def("restore", [](gz::ErrorFeedback& s, nb::bytes data) {
             s.restore(std::string_view(static_cast<const char*>(data.data()), data.size()));
           },
           nb::arg("data"),
           "Loads what save() returned; the next allreduce continues bit-identically. Raises\n"
           "InvalidArgument for malformed data or a state bound to another layout.")
      .def("reset", &gz::ErrorFeedback::reset, "Forgets layout and residuals: the next call starts from zeros.")
      .def("regroup", &gz::ErrorFeedback::regroup,
           "The group changed: the next call may bind the state at another rank, world size or algorithm\n"
           "(same codec and size), carrying the worker residual; the server residual starts from zeros.")
      .def("zero", &gz::ErrorFeedback::zero,
           "Sets the residuals to zeros, keeping the layout and the ranks' last agreement (no new round).")
      .def("respec", &gz::ErrorFeedback::respec, nb::arg("spec"),
           "Rebinds the state to codec `spec`, keeping its residuals, when they have the same sizes for\n"
           "it (top-k at another density). Raises InvalidArgument for an unbound or hierarchical state,\n"
           "other residual sizes, or residuals that are not finite.")
      .def("residuals", [](const gz::ErrorFeedback& s) {
             const auto [worker, server] = s.residuals();
             return nb::make_tuple(nb::bytes(reinterpret_cast<const char*>(worker.data()), 4 * worker.size()),
                                   nb::bytes(reinterpret_cast<const char*>(server.data()), 4 * server.size()));
           },
           "(worker, server): the residuals as float32 bytes (native order), copied to the host. Raises\n"
           "InvalidArgument on an unbound state.")
      .def_prop_ro("bound", &gz::ErrorFeedback::bound, "Whether the state holds a layout (used or restored).")
      .def_prop_ro("memory_bytes", &gz::ErrorFeedback::bytes, "Bytes of residual memory held.")
      .def_prop_ro("layout", &layout, nb::sig("def layout(self) -> dict | None"),
                   "What the state is bound to (codec, n, rank, world_size, algorithm), or None.");

  nb::class_<CommHandle>(m, "Communicator",
                         "gradzip's communicator (raw binding; use gradzip.Communicator).")
      .def_static("from_env", &from_env, nb::arg("transport") = "ucx", nb::arg("timeout") = nb::none(),
                  nb::arg("prefix") = "gradzip", nb::arg("cuda_device") = -1,
                  "Rendezvous from MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE (rank 0 hosts the store).")
      .def_static("from_store", &from_store, nb::arg("store"), nb::arg("rank"), nb::arg("world_size"),
                  nb::arg("transport") = "ucx", nb::arg("timeout") = nb::none(), nb::arg("prefix") = "gradzip",
                  nb::arg("cuda_device") = -1, nb::arg("node") = "",
                  nb::sig("def from_store(store: object, rank: int, world_size: int, transport: str = 'ucx', "
                          "timeout: float | None = None, prefix: str = 'gradzip', cuda_device: int = -1, "
                          "node: str = '') -> Communicator"),
                  "Rendezvous through an existing store (a torch.distributed.Store). `node`: this rank's node\n"
                  "name for the topology (empty: from the launcher's variables).")
      .def_static("from_python", &from_python, nb::arg("store"), nb::arg("transport"),
                  nb::arg("timeout") = nb::none(), nb::arg("prefix") = "gradzip", nb::arg("node") = "",
                  nb::sig("def from_python(store: object, transport: object, timeout: float | None = None, "
                          "prefix: str = 'gradzip', node: str = '') -> Communicator"),
                  "Over a transport a Python object performs (start/test/wait/abort of exchanges; see\n"
                  "python/src/py_transport.h), meeting through `store`. `node`: this rank's node name for\n"
                  "the topology (empty: from the launcher's variables).")
      .def_prop_ro("rank", [](CommHandle& h) { return h.get().rank(); })
      .def_prop_ro("size", [](CommHandle& h) { return h.get().size(); })
      .def_prop_ro("transport", [](CommHandle& h) { return std::string(h.get().transport().name()); })
      .def_prop_ro("workspace_bytes", [](CommHandle& h) { return h.get().workspace_bytes(); })
      .def_prop_ro("broken", [](CommHandle& h) { return h.get().broken(); })
      .def_prop_ro("closed", [](CommHandle& h) { return !h.comm; })
      .def("allreduce", &allreduce, nb::arg("tensor").noconvert(), nb::arg("codec"), nb::arg("state"),
           nb::kw_only(), nb::arg("op") = "avg", nb::arg("algorithm") = "auto",
           nb::arg("server_codec") = nb::none(), nb::arg("stream") = 0, nb::arg("timeout") = nb::none(),
           nb::sig("def allreduce(self, tensor: object, codec: Codec, state: ErrorFeedback, *, op: str = 'avg', "
                   "algorithm: str = 'auto', server_codec: str | None = None, stream: int = 0, "
                   "timeout: float | None = None) -> dict"),
           "In place: tensor = sum or average over ranks, sent compressed; returns the call's stats.")
      .def("reduce_scatter", &reduce_scatter, nb::arg("tensor").noconvert(), nb::arg("codec"), nb::arg("state"),
           nb::kw_only(), nb::arg("op") = "avg", nb::arg("stream") = 0, nb::arg("timeout") = nb::none(),
           nb::sig("def reduce_scatter(self, tensor: object, codec: Codec, state: ErrorFeedback, *, op: str = 'avg', "
                   "stream: int = 0, timeout: float | None = None) -> dict"),
           "In place: chunk `rank` of tensor (chunk_range) = that chunk's sum or average over ranks, sent\n"
           "compressed; the other chunks are read only. Returns the call's stats.")
      .def("barrier", [](CommHandle& h) {
             gz::Communicator& c = h.get();
             nb::gil_scoped_release release;
             std::lock_guard<std::mutex> lock(h.mutex);
             c.barrier();
           })
      .def("close", [](CommHandle& h) {
             nb::gil_scoped_release release;
             std::lock_guard<std::mutex> lock(h.mutex);
             h.comm.reset();  // the destructor waits (briefly) for every rank
           },
           "Releases the transport; waits up to 10 s for the other ranks to close too.");

  m.def("_agree_through_store",
        [](nb::object store, const std::string& prefix, std::uint64_t index, int rank, int size,
           const gz::Fields& fields, std::optional<double> timeout_s, const std::string& round,
           const std::string& mismatch) {
          const gz::Timeout timeout = to_timeout(timeout_s);
          auto py = std::make_shared<PyStore>(std::move(store), timeout);
          nb::gil_scoped_release release;
          // Sealed as a communicator's values are (sealed_store.h), with a key
          // of this round's own when there is no token.
          const std::string round_prefix = prefix + "/" + std::to_string(index);
          auto sealed = std::make_shared<gz::SealedStore>(py, gz::shared_job_key(*py, round_prefix, rank, timeout));
          gz::PrefixStore prefixed(round_prefix, sealed);
          gz::agree(prefixed, index, rank, size, fields, timeout, gz::AgreeWords{round, mismatch});
        },
        nb::arg("store"), nb::arg("prefix"), nb::arg("index"), nb::arg("rank"), nb::arg("size"), nb::arg("fields"),
        nb::arg("timeout"), nb::arg("round"), nb::arg("mismatch"),
        "gradzip's agreement (comm/engine/agreement.h) through a torch.distributed store, every value sealed with\n"
        "the job's key: InvalidArgument on every rank on a mismatch, IoError when a rank does not take part\n"
        "within the timeout or a value is not a member's (the DDP hook's agreement).");
  m.def("_default_timeout_s", [] { return static_cast<double>(gz::default_timeout().count()) / 1000.0; },
        "GRADZIP_TIMEOUT_S in seconds (default 60), as the communicator reads it.");
  m.def("transport_available",
        [](std::string_view t) {
          if (!gz::find_transport(t)) gz::transport_descriptor(t);  // unknown: InvalidArgument naming the valid ones
          return gz::transport_available(t);
        },
        nb::arg("transport"), "Whether this build has the transport (a name of comm/transports/registry.h).");
  m.def("transport_for_torch_backend",
        [](std::string_view backend) { return std::string(gz::transport_for_torch_backend(backend)); },
        nb::arg("backend"),
        "The transport for a torch process group of this backend (\"nccl\" -> \"nccl\"; else the default, \"ucx\").");
  m.def("transport_takes_device_memory",
        [](std::string_view t) {
          const gz::TransportDescriptor* d = gz::find_transport(t);
          if (!d) gz::transport_descriptor(t);  // unknown: InvalidArgument naming the valid ones
          return d->device_memory;
        },
        nb::arg("transport"), "Whether the transport takes CUDA buffers as they are (it is given the current device).");
  m.def("transport_names", [] {
        std::vector<std::string> names;
        for (const gz::TransportDescriptor* d : gz::all_transports()) names.emplace_back(d->name);
        return names;
      },
      "Every registered transport's name, built or not (comm/transports/registry.h).");
}

}  // namespace gzpy
