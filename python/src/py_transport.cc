#include "py_transport.h"

#include <nanobind/ndarray.h>

#include <algorithm>
#include <cstdint>

#include "common/error.h"

namespace nb = nanobind;

namespace gzpy {
namespace {

using Tensor = nb::ndarray<nb::pytorch, std::uint8_t, nb::ndim<1>, nb::c_contig>;

// The interpreter is going away (a communicator destroyed at exit): no Python.
bool python_gone() {
#if PY_VERSION_HEX >= 0x030D0000
  return !Py_IsInitialized() || Py_IsFinalizing();
#else
  return !Py_IsInitialized() || _Py_IsFinalizing();
#endif
}

// A torch uint8 tensor over `bytes` at `data`, without a copy and without
// ownership: the algorithms keep the memory alive until the exchange ends.
nb::object tensor_over(void* data, std::size_t bytes, bool cuda, int device_id) {
  static std::uint8_t empty = 0;  // a 0-byte message still needs an address
  const std::size_t shape[1] = {bytes};
  Tensor t(bytes ? data : &empty, 1, shape, nb::handle(), nullptr, nb::dtype<std::uint8_t>(),
           cuda ? nb::device::cuda::value : nb::device::cpu::value, cuda ? device_id : 0);
  return t.cast(nb::rv_policy::reference);
}

double seconds_until(std::chrono::steady_clock::time_point deadline) {
  const auto left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
  return std::max(left, 0.0);
}

}  // namespace

PyTransport::PyTransport(nb::object driver) {
  nb::gil_scoped_acquire gil;
  driver_ = std::move(driver);
  try {
    rank_ = nb::cast<int>(driver_.attr("rank"));
    size_ = nb::cast<int>(driver_.attr("size"));
    name_ = nb::cast<std::string>(driver_.attr("name"));
    device_memory_ = nb::cast<bool>(driver_.attr("device_memory"));
    cuda_device_ = nb::cast<int>(driver_.attr("cuda_device"));
  } catch (const std::exception& e) {
    GZ_THROW(gz::InvalidArgument, "a Python transport needs rank, size, name, device_memory and cuda_device: ",
             e.what());
  }
  if (size_ < 1 || rank_ < 0 || rank_ >= size_)
    GZ_THROW(gz::InvalidArgument, "Python transport: rank ", rank_, " is not in [0, ", size_, ")");
  if (device_memory_ && cuda_device_ < 0)
    GZ_THROW(gz::InvalidArgument, "Python transport: device_memory needs a cuda_device");
}

PyTransport::~PyTransport() {
  if (python_gone()) {
    // Leak rather than touch a finalizing interpreter.
    for (Pending& p : pending_) p.handle.release();
    driver_.release();
    return;
  }
  nb::gil_scoped_acquire gil;
  if (!pending_.empty()) drop_all("the transport is being destroyed");
  driver_.reset();
}

void PyTransport::check_usable() const {
  if (broken_) GZ_THROW(gz::IoError, name_, " transport is broken (", why_broken_, "); build a new communicator");
  if (python_gone()) GZ_THROW(gz::IoError, name_, " transport: the Python interpreter is shutting down");
}

void PyTransport::fail(std::string_view op, std::string_view what) {
  if (!broken_) {
    broken_ = true;
    why_broken_ = std::string(op) + " failed";
    drop_all(why_broken_);
  }
  GZ_THROW(gz::IoError, "rank ", rank_, ": ", name_, " ", op, " failed: ", what);
}

void PyTransport::drop_all(std::string_view why) {
  if (pending_.empty()) return;
  nb::list handles;
  for (Pending& p : pending_) handles.append(p.handle);
  pending_.clear();
  try {
    driver_.attr("abort")(handles, nb::str(why.data(), why.size()));
  } catch (const std::exception&) {
    // Cancelling is best effort; the transport is broken either way.
  }
}

PyTransport::Pending* PyTransport::find(Exchange x) {
  for (Pending& p : pending_)
    if (p.id == x.id) return &p;
  GZ_THROW(gz::InvalidArgument, name_, " transport: exchange ", x.id, " is not in flight");
}

void PyTransport::complete(Pending* p) {
  for (auto& [out, bytes] : p->received)
    if (out) *out = bytes;
  pending_.erase(pending_.begin() + (p - pending_.data()));
}

gz::Transport::Exchange PyTransport::start(std::span<const gz::SendOp> sends, std::span<const gz::RecvOp> recvs,
                                           const gz::CallContext& ctx) {
  check_usable();
  const bool cuda = device_memory_ && ctx.device == gz::Device::Cuda;
  Pending p;
  p.id = next_id_++;
  p.deadline = Clock::now() + ctx.timeout;
  p.received.reserve(recvs.size());
  for (const gz::RecvOp& r : recvs) p.received.emplace_back(r.received, r.data.bytes);

  nb::gil_scoped_acquire gil;
  try {
    nb::list send_list, recv_list;
    for (const gz::SendOp& s : sends) {
      GZ_ENFORCE(s.peer != rank_ && s.peer >= 0 && s.peer < size_, "bad peer ", s.peer);
      send_list.append(nb::make_tuple(s.peer, tensor_over(const_cast<void*>(s.data.data), s.data.bytes, cuda,
                                                          cuda_device_)));
    }
    for (const gz::RecvOp& r : recvs) {
      GZ_ENFORCE(r.peer != rank_ && r.peer >= 0 && r.peer < size_, "bad peer ", r.peer);
      recv_list.append(nb::make_tuple(r.peer, tensor_over(r.data.data, r.data.bytes, cuda, cuda_device_)));
    }
    const auto stream = reinterpret_cast<std::uintptr_t>(cuda ? ctx.stream : nullptr);
    p.handle = driver_.attr("start")(send_list, recv_list, stream);
  } catch (const nb::python_error& e) {
    fail("start", e.what());
  }
  pending_.push_back(std::move(p));
  return Exchange{pending_.back().id};
}

bool PyTransport::test(Exchange x) {
  check_usable();
  nb::gil_scoped_acquire gil;
  Pending* p = find(x);
  bool done = false;
  try {
    done = nb::cast<bool>(driver_.attr("test")(p->handle));
  } catch (const nb::python_error& e) {
    fail("test", e.what());
  }
  if (done) complete(p);
  return done;
}

void PyTransport::wait(Exchange x) {
  check_usable();
  nb::gil_scoped_acquire gil;
  Pending* p = find(x);
  try {
    // torch's waits release the GIL while they block.
    driver_.attr("wait")(p->handle, seconds_until(p->deadline));
  } catch (const nb::python_error& e) {
    fail("wait", e.what());
  }
  complete(find(x));
}

void PyTransport::abort(std::string_view why) {
  if (python_gone()) return;
  nb::gil_scoped_acquire gil;
  if (!broken_) {
    broken_ = true;
    why_broken_ = "aborted: " + std::string(why);
  }
  drop_all(why);
}

void PyTransport::synchronize(const gz::CallContext& ctx) {
  if (!device_memory_ || ctx.device != gz::Device::Cuda) return;  // host exchanges return complete
  check_usable();
  nb::gil_scoped_acquire gil;
  try {
    driver_.attr("synchronize")(reinterpret_cast<std::uintptr_t>(ctx.stream),
                                std::chrono::duration<double>(ctx.timeout).count());
  } catch (const nb::python_error& e) {
    fail("synchronize", e.what());
  }
}

}  // namespace gzpy
