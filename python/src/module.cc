// gradzip._core: the nanobind module. Exceptions, spec-string helpers and
// build facts live here; codec.cc binds Codec, comm.cc the Communicator.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <cstdlib>
#include <string>
#include <string_view>

#include "arrays.h"
#include "bindings.h"
#include "common/checksum.h"
#include "common/error.h"
#include "compressors/descriptor.h"
#include "compressors/spec.h"
#include "compressors/wire_format.h"
#if GZ_PY_HAVE_COMM
#include "comm/transports/registry.h"
#endif

namespace nb = nanobind;

namespace gzpy {
namespace {

PyObject* g_error = nullptr;
PyObject* g_invalid = nullptr;
PyObject* g_payload = nullptr;
PyObject* g_io = nullptr;
PyObject* g_cuda = nullptr;

// Creates gradzip.<name> deriving from `bases` and adds it to the module.
PyObject* add_exception(nb::module_& m, const char* name, const char* doc, PyObject* bases) {
  // Named after this module ("_core" while stubgen imports it alone,
  // "gradzip._core" when installed); gradzip/__init__.py renames them to
  // gradzip.<name> for readable tracebacks.
  const std::string qualified = nb::cast<std::string>(m.attr("__name__")) + "." + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases, nullptr);
  if (!type) throw nb::python_error();
  m.attr(name) = nb::handle(type);
  return type;
}

// Raises `type` with the message. A message may quote bytes from outside (a
// peer's value, a file): decoded with backslash escapes for what is not
// UTF-8, so the caller gets the gradzip error, never a UnicodeDecodeError.
void set_error(PyObject* type, const std::exception& e) {
  const std::string_view m = e.what();
  PyObject* msg = PyUnicode_DecodeUTF8(m.data(), static_cast<Py_ssize_t>(m.size()), "backslashreplace");
  if (!msg) {
    PyErr_Clear();
    PyErr_SetString(type, "(a gradzip error whose message could not be decoded)");
    return;
  }
  PyErr_SetObject(type, msg);
  Py_DECREF(msg);
}

void register_exceptions(nb::module_& m) {
  g_error = add_exception(m, "GradzipError", "Base class of every error gradzip raises.", PyExc_Exception);
  nb::object invalid_bases = nb::make_tuple(nb::handle(g_error), nb::handle(PyExc_ValueError));
  g_invalid = add_exception(m, "InvalidArgument",
                            "An argument is invalid (a bad spec string, a wrong dtype, device or size, "
                            "a state bound to another buffer). Nothing was modified.",
                            invalid_bases.ptr());
  nb::object payload_bases = nb::make_tuple(nb::handle(g_invalid));
  g_payload = add_exception(m, "PayloadError",
                            "A payload failed validation (truncated, wrong codec or size, bad indices). "
                            "The output was left untouched.",
                            payload_bases.ptr());
  nb::object runtime_bases = nb::make_tuple(nb::handle(g_error), nb::handle(PyExc_RuntimeError));
  g_io = add_exception(m, "IoError",
                       "A peer, the network or the rendezvous failed or timed out. The communicator is "
                       "broken: build a new one.",
                       runtime_bases.ptr());
  g_cuda = add_exception(m, "CudaError", "A CUDA or NCCL call failed.", runtime_bases.ptr());

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const gz::PayloadError& e) {
      set_error(g_payload, e);
    } catch (const gz::InvalidArgument& e) {
      set_error(g_invalid, e);
    } catch (const gz::IoError& e) {
      set_error(g_io, e);
    } catch (const gz::CudaError& e) {
      set_error(g_cuda, e);
    } catch (const gz::Error& e) {
      set_error(g_error, e);
    }
  });
}

nb::dict payload_info(const InArray& payload) {
  const Span p = check_array(payload, Elem::U8, "payload");
  if (p.place.device != gz::Device::Cpu)
    GZ_THROW(gz::InvalidArgument, "payload_info reads host payloads; this one is on ", to_string(p.place));
  const gz::wire::Header h = gz::wire::read_header(static_cast<const std::byte*>(p.data), p.count);
  nb::dict d;
  d["codec"] = gz::codec_name(h.codec);
  d["count"] = h.count;
  d["param"] = h.param;
  d["bytes"] = gz::wire::kHeaderBytes + h.body_bytes;
  return d;
}

// The registry as Python data, for the sweep and for help texts.
nb::list codec_info() {
  nb::list out;
  for (const gz::CodecDescriptor* c : gz::all_codecs()) {
    nb::dict d;
    d["name"] = std::string(c->name);
    d["id"] = static_cast<int>(c->id);
    d["summary"] = std::string(c->summary);
    nb::list keys;
    for (const gz::CodecKey& k : c->keys) {
      nb::dict kd;
      kd["name"] = std::string(k.name);
      nb::list choices;
      for (std::string_view ch : k.choices) choices.append(std::string(ch));
      using Kind = gz::CodecKey::Kind;
      kd["kind"] = k.kind == Kind::Integer ? "integer" : k.kind == Kind::Real ? "real" : "choice";
      if (k.kind == Kind::Choice)
        kd["default"] = std::string(k.choices[static_cast<std::size_t>(k.fallback)]);
      else
        kd["default"] = k.fallback;
      kd["range"] = std::string(k.range);
      kd["choices"] = choices;
      keys.append(kd);
    }
    d["keys"] = keys;
    d["lossless"] = c->lossless;
    d["sparse"] = c->hint.sparse;
    d["allgather_up_to_ranks"] = c->hint.allgather_up_to_ranks;
    nb::list bench;
    for (const gz::BenchSpec& b : c->bench_specs) bench.append(nb::make_tuple(std::string(b.label), std::string(b.spec)));
    d["bench_specs"] = bench;
    out.append(d);
  }
  return out;
}

}  // namespace
}  // namespace gzpy

NB_MODULE(_core, m) {
  m.doc() = "gradzip's C++ core: codecs (and, when built, the communicator). Use the gradzip package.";
  gzpy::register_exceptions(m);
  // An installed wheel's users get the message alone; the "[file:line] " that
  // says where C++ detected it is for debug builds and GRADZIP_VERBOSE_ERRORS=1.
#ifdef NDEBUG
  const char* verbose = std::getenv("GRADZIP_VERBOSE_ERRORS");
  gz::set_error_locations(verbose && *verbose && std::string_view(verbose) != "0");
#else
  gz::set_error_locations(true);
#endif
  m.def("set_error_locations", &gz::set_error_locations, nb::arg("on"),
        "Whether gradzip's error messages start with the C++ file and line that raised them "
        "(default: off, on in debug builds or with GRADZIP_VERBOSE_ERRORS=1).");
  m.def("error_locations", &gz::error_locations, "Whether error messages name the C++ file and line.");

  m.attr("__version__") = GZ_VERSION;
  m.attr("HEADER_BYTES") = gz::wire::kHeaderBytes;

  nb::dict build;
#if GZ_HAVE_CUDA
  build["cuda"] = true;
#else
  build["cuda"] = false;
#endif
#if GZ_PY_HAVE_COMM
  build["comm"] = true;
#else
  build["comm"] = false;
#endif
#if GZ_PY_HAVE_COMM
  // One key per registered transport: whether this build has it (comm/transports/registry.h).
  for (const gz::TransportDescriptor* d : gz::all_transports()) build[std::string(d->name).c_str()] = d->make != nullptr;
#endif
  m.attr("BUILD") = build;

  m.def("codec_names", [] {
        std::vector<std::string> names;
        for (const gz::CodecDescriptor* d : gz::all_codecs()) names.emplace_back(d->name);
        return names;
      },
      "Names of the codecs this build knows, in wire id order.");
  m.def("codec_info", &gzpy::codec_info,
        "Every codec's descriptor as a list of dicts: name, id, summary, keys (name, kind, default,\n"
        "choices), lossless, sparse, allgather_up_to_ranks, bench_specs (label, spec).");
  m.def("canonical_spec", [](std::string_view spec) { return gz::parse_spec(spec).canonical(); }, nb::arg("spec"),
        "Parses a codec spec string ('name[:key=value,...]') and returns its canonical form.\n\n"
        "Raises InvalidArgument naming the valid codecs or keys.");
  m.def("respec", &gz::respec, nb::arg("spec"), nb::arg("changes"),
        "`spec` with keys set to other values ('key=value,...', ef included), canonical:\n"
        "respec('topk:density=0.01', 'density=0.05') -> 'topk:density=0.05'. The one way to edit a spec.");
  m.def("spec_keys", &gz::spec_keys, nb::arg("spec"),
        "The keys a spec writes, in its order (ef included): what the caller chose rather than a default.");
  m.def("split_spec_list", &gz::split_spec_list, nb::arg("specs"),
        "Splits a comma-separated list of specs: 'none,fp16,topk:density=0.01,ef=off' -> "
        "['none', 'fp16', 'topk:density=0.01,ef=off'].");
  m.def("expand_spec_grid",
        [](std::string_view grid, bool canonical) {
          return canonical ? gz::expand_spec_grid(grid) : gz::expand_spec_grid_as_written(grid);
        },
        nb::arg("grid"), nb::arg("canonical") = true,
        "Expands a sweep grid: 'topk:density=0.1,0.01,onebit:block=256,1024' -> "
        "['topk:density=0.1', 'topk:density=0.01', 'onebit:block=256', 'onebit:block=1024'];\n"
        "each spec canonical ('onebit' -> 'onebit:block=512'), or as the grid writes it (canonical=False).");
  m.def("_checksum64",
        [](nb::bytes data) { return gz::checksum64(std::string_view(static_cast<const char*>(data.data()), data.size())); },
        nb::arg("data"), "The checksum saved states end with (common/checksum.h); for tests that edit them.");
  m.def("payload_info", &gzpy::payload_info, nb::arg("payload").noconvert(),
        nb::sig("def payload_info(payload: object) -> dict"),
        "Reads and validates the header of a host payload (a uint8 array).\n\n"
        "Returns a dict with codec (name), count (elements), param and bytes (the whole payload's size).\n"
        "Raises PayloadError for a malformed header, or when the array is not exactly that size.");

  gzpy::bind_codec(m);
#if GZ_PY_HAVE_COMM
  gzpy::bind_comm(m);
#endif
}
