// gradzip._core.Codec: the C++ Codec on caller-provided arrays, zero-copy.
//
// Arrays come in through DLPack (numpy, torch, ...) and are used where they
// live: host arrays by the CPU loops, CUDA arrays by the CUDA kernels on the
// stream the caller names. The GIL is released while the codec works, and a
// per-object mutex serialises calls on one Codec (its scratch is shared).
// Allocation (payloads, residuals, CUDA workspaces) is left to Python, which
// uses the caller's framework and its allocator; see gradzip/codec.py.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/unique_ptr.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "arrays.h"
#include "bindings.h"
#include "codec_handle.h"
#include "common/error.h"
#include "compressors/codec.h"
#include "compressors/descriptor.h"
#include "compressors/spec.h"
#include "compressors/wire_format.h"

namespace nb = nanobind;

namespace gzpy {
namespace {

// An element count from Python, before any size arithmetic on it (4 * 2^62
// bytes would wrap around).
std::size_t checked_count(std::size_t n) {
  if (n > gz::wire::kMaxCount)
    GZ_THROW(gz::InvalidArgument, n, " elements is over the wire format's limit of ", gz::wire::kMaxCount);
  return n;
}

gz::Dtype parse_dtype_name(std::string_view d) {
  if (const auto t = gz::parse_dtype(d)) return *t;
  GZ_THROW(gz::InvalidArgument, "unknown dtype '", d, "'; valid: float32, float16, bfloat16");
}

gz::Device parse_device(std::string_view d) {
  if (d == "cpu") return gz::Device::Cpu;
  if (d == "cuda" || d.substr(0, 5) == "cuda:") return gz::Device::Cuda;
  GZ_THROW(gz::InvalidArgument, "unknown device '", d, "'; valid: cpu, cuda");
}

// Where a call on `data` runs: its device, the stream (CUDA only), and the
// optional workspace array, checked to live beside `data`.
gz::ExecContext make_context(const Span& data, const char* name, std::uintptr_t stream, const OutArray& workspace) {
  if (data.place.device == gz::Device::Cpu && stream != 0)
    GZ_THROW(gz::InvalidArgument, "a stream was given but ", name, " is a host array");
  gz::ExecContext ctx;
  ctx.device = data.place.device;
  ctx.stream = reinterpret_cast<gz::Stream>(stream);
  if (workspace.is_valid()) {
    const Span ws = check_array(workspace, Elem::U8, "workspace");
    check_same_place(data, name, ws, "workspace");
    ctx.workspace = ws.data;
    ctx.workspace_bytes = ws.count;
  }
  return ctx;
}

std::size_t encode_into(CodecHandle& self, const InArray& grad, const OutArray& residual, const OutArray& payload,
                        std::uintptr_t stream, const OutArray& workspace, std::uint64_t step) {
  gz::Codec& codec = self.codec();
  const Span g = check_array(grad, Elem::Grad, "grad");
  const Span p = check_array(payload, Elem::U8, "payload");
  check_same_place(g, "grad", p, "payload");
  check_disjoint(g, g.bytes(), "grad", p, p.count, "payload");

  Span r;
  if (codec.error_feedback()) {
    if (!residual.is_valid())
      GZ_THROW(gz::InvalidArgument, codec.spec(),
               " has error feedback on, so encode needs a residual (n float32, zeros at the start); "
               "or use the spec with ef=off");
    r = check_array(residual, Elem::F32, "residual");
    check_same_place(g, "grad", r, "residual");
    if (r.count != g.count)
      GZ_THROW(gz::InvalidArgument, "residual has ", r.count, " elements but grad has ", g.count);
    check_disjoint(g, g.bytes(), "grad", r, r.count * 4, "residual");
    check_disjoint(r, r.count * 4, "residual", p, p.count, "payload");
  }
  gz::ExecContext ctx = make_context(g, "grad", stream, workspace);
  ctx.step = step;
  nb::gil_scoped_release release;
  std::lock_guard<std::mutex> lock(self.mutex());
  return codec.encode(g.data, g.dtype, static_cast<float*>(r.data), g.count, static_cast<std::byte*>(p.data), p.count,
                      ctx);
}

void decode_accumulate_into(CodecHandle& self, const InArray& payload, const OutArray& out, std::uintptr_t stream,
                            const OutArray& workspace) {
  gz::Codec& codec = self.codec();
  const Span p = check_array(payload, Elem::U8, "payload");
  const Span o = check_array(out, Elem::Grad, "out");
  check_same_place(o, "out", p, "payload");
  check_disjoint(o, o.bytes(), "out", p, p.count, "payload");
  const gz::ExecContext ctx = make_context(o, "out", stream, workspace);
  nb::gil_scoped_release release;
  std::lock_guard<std::mutex> lock(self.mutex());
  codec.decode_accumulate(static_cast<const std::byte*>(p.data), p.count, o.data, o.dtype, o.count, ctx);
}

// Codec.params: the config's key values by the descriptor's keys.
nb::dict params(const CodecHandle& c) {
  const gz::CodecConfig& cfg = c.codec().config();
  const gz::CodecDescriptor& d = cfg.descriptor();
  nb::dict out;
  for (std::size_t i = 0; i < d.keys.size(); ++i) {
    const gz::CodecKey& key = d.keys[i];
    const nb::str name(key.name.data(), key.name.size());
    const double v = cfg.values[i];
    switch (key.kind) {
      case gz::CodecKey::Kind::Integer:
        out[name] = static_cast<std::int64_t>(v);
        break;
      case gz::CodecKey::Kind::Real:
        out[name] = v;
        break;
      case gz::CodecKey::Kind::Choice: {
        const std::string_view choice = key.choices[static_cast<std::size_t>(v)];
        out[name] = nb::str(choice.data(), choice.size());
        break;
      }
    }
  }
  return out;
}

}  // namespace

void bind_codec(nb::module_& m) {
  nb::class_<CodecHandle>(m, "Codec",
                          "A gradient codec named by a spec string (see gradzip.Codec for the array-level API).\n\n"
                          "This is the raw binding: encode_into / decode_accumulate_into work on buffers the caller\n"
                          "provides, on the CPU or on a CUDA stream, without copies.")
      .def(nb::init<std::string_view>(), nb::arg("spec"),
           "Builds the codec a spec string names, e.g. 'onebit:block=512' or 'topk:density=0.01,ef=off'.\n"
           "Raises InvalidArgument naming the valid codecs or keys.")
      .def_prop_ro("spec", [](const CodecHandle& c) { return c.codec().spec(); }, "The canonical spec string.")
      .def_prop_ro("name", [](const CodecHandle& c) { return std::string(c.codec().descriptor().name); },
                   "The codec's name (one of gradzip.codec_names()).")
      .def_prop_ro("params", &params, nb::sig("def params(self) -> dict[str, int | float | str]"),
                   "The codec's keys and their values, defaults included: integers as int, reals as float,\n"
                   "choices by name ({'density': 0.01, 'k': 0, 'select': 'exact'} for 'topk'; topk's k is 0\n"
                   "when its density applies). ef is error_feedback.")
      .def_prop_ro("error_feedback", [](const CodecHandle& c) { return c.codec().error_feedback(); },
                   "Whether encode keeps a residual (error feedback). Always False for none.")
      .def_prop_ro("fixed_size", [](const CodecHandle& c) { return c.codec().fixed_size(); },
                   "True when every payload of n elements has exactly max_payload_bytes(n) bytes\n"
                   "(the codec's descriptor says; topk with select=sample varies per call).")
      .def_prop_ro("error_bound", [](const CodecHandle& c) { return gz::error_bound(c.codec().config()); },
                   "The documented bound on the relative error of one compressed allreduce with this codec.")
      .def("prefers_allgather", [](const CodecHandle& c, int ranks) {
             return gz::prefers_allgather(c.codec().descriptor(), ranks);
           },
           nb::arg("ranks"), "Whether the allreduce's automatic choice on this many ranks is allgather.")
      .def("max_payload_bytes",
           [](const CodecHandle& c, std::size_t n) { return c.codec().max_payload_bytes(checked_count(n)); },
           nb::arg("n"), "Payload bytes (header included) for n elements: exact, or the upper bound when not fixed_size.")
      .def("workspace_bytes",
           [](const CodecHandle& c, std::size_t n, std::string_view device, std::string_view dtype) {
             return c.codec().workspace_bytes(checked_count(n), parse_device(device), parse_dtype_name(dtype));
           },
           nb::arg("n"), nb::arg("device") = "cpu", nb::arg("dtype") = "float32",
           "Scratch bytes an encode or decode of n elements of dtype ('float32', 'float16', 'bfloat16')\n"
           "needs on device ('cpu' or 'cuda'); encode_into / decode_accumulate_into need a workspace of\n"
           "that many bytes when it is not 0.")
      .def("encode_into", &encode_into, nb::arg("grad").noconvert(), nb::arg("residual").noconvert().none(),
           nb::arg("payload").noconvert(), nb::kw_only(), nb::arg("stream") = 0,
           nb::arg("workspace").noconvert().none() = nb::none(), nb::arg("step") = 0,
           nb::sig("def encode_into(self, grad: object, residual: object | None, payload: object, *, "
                   "stream: int = 0, workspace: object | None = None, step: int = 0) -> int"),
           "Encodes grad (float32, float16 or bfloat16, contiguous; residual float32) into payload (uint8, at least max_payload_bytes(n) bytes),\n"
           "updating residual in place (error feedback: v = grad + residual; payload = Q(v);\n"
           "residual = v - D(payload)). Returns the payload's size in bytes.\n\n"
           "All arrays must be on one device, workspace (uint8) included, which must hold\n"
           "workspace_bytes(n, device) bytes (it may be None when that is 0). step keys the random draws of\n"
           "codecs that make any (qsgd's stochastic rounding): same step, same bits. For CUDA arrays, stream is\n"
           "the cudaStream_t (an int; 0 is the legacy default stream); the call is queued on that stream.\n"
           "The GIL is released while it runs.")
      .def("decode_accumulate_into", &decode_accumulate_into, nb::arg("payload").noconvert(),
           nb::arg("out").noconvert(), nb::kw_only(), nb::arg("stream") = 0,
           nb::arg("workspace").noconvert().none() = nb::none(),
           nb::sig("def decode_accumulate_into(self, payload: object, out: object, *, stream: int = 0, "
                   "workspace: object | None = None) -> None"),
           "Adds the decoded payload into out (float32, float16 or bfloat16, contiguous, the encoded\n"
           "element count); a 16-bit out gets the float sum rounded once (to nearest even).\n"
           "payload must be exactly the bytes encode returned. Raises PayloadError, leaving out\n"
           "untouched, when the payload is malformed or belongs to another codec or size.")
      .def("__repr__", [](const CodecHandle& c) { return "Codec('" + c.codec().spec() + "')"; });
}

}  // namespace gzpy
