// The allreduce on CUDA buffers gives the same bits as on host buffers.
//
// Run under gradzip-run: `gradzip-run -n 2 -- gradzip-comm-gpu-check ucx` (ranks
// share one GPU; device buffers staged through pinned memory by UCX) or
// `gradzip-run -n 1 -- gradzip-comm-gpu-check nccl`. For every codec and
// algorithm it runs a few steps with error feedback twice, on the host over UCX
// and on the GPU over the transport named, with the same seeded inputs, and
// compares the results bit for bit (NaN as NaN), which holds because the CUDA
// codecs give the CPU's bits and both paths sum payloads in the same order; for
// every registered allreduce algorithm (hierarchical with each rank a node of
// its own; the ring, which re-encodes partial sums at every hop) and two
// segment sizes (the pipeline's slots in device memory for NCCL, in pinned
// host memory for UCX).
// Exit 0: identical; 1: a difference or an error; 77: no GPU (ctest: skipped).
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "comm/algorithms/algorithm.h"
#include "comm/engine/communicator.h"
#include "comm/base/env.h"
#include "comm/store/prefix_store.h"
#include "comm/store/tcp_store.h"
#include "common/cuda_check.h"
#include "kernels/cuda.h"
#if GZ_HAVE_NCCL
#include "comm/transports/registry.h"
#endif
#include "comm/transports/ucx/ucx_transport.h"

namespace {

bool same(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::memcmp(&a, &b, sizeof a) == 0;
}

std::vector<float> gradient(std::size_t n, int rank, int step) {
  std::mt19937_64 rng(static_cast<std::uint64_t>(1000 * rank + step));
  std::normal_distribution<float> d(0.1f, 1.0f);
  std::vector<float> g(n);
  for (auto& x : g) x = d(rng);
  return g;
}

}  // namespace

int main(int argc, char** argv) {
  if (gz::kernels::cuda::device_count() == 0) {
    std::printf("skipping: no CUDA device\n");
    return 77;
  }
  const std::string kind = argc > 1 ? argv[1] : "ucx";
  try {
    const gz::RankInfo info = gz::rank_info_from_env();
    auto tcp = gz::TcpStore::from_env();
    auto host_store = std::make_shared<gz::PrefixStore>("host", tcp);
    auto dev_store = std::make_shared<gz::PrefixStore>("dev", tcp);
    // Through the registry (comm/transports/registry.h), as the Communicator makes them.
    auto make = [&](std::string_view name, gz::Store& store) {
      return gz::transport_descriptor(name).make(
          gz::TransportSetup{store, info.rank, info.world_size, info.local_rank, -1, gz::default_timeout()});
    };
    if (!gz::transport_available(kind)) {
      std::printf("skipping: this build has no %s transport\n", kind.c_str());
      return 77;
    }
    gz::Communicator host(host_store, make(gz::kDefaultTransport, *host_store));
    // A device transport picks its GPU from the local rank; a host one stages through the current device.
    GZ_CUDA_CHECK(cudaSetDevice(info.local_rank % gz::kernels::cuda::device_count()));
    std::unique_ptr<gz::Transport> dev_transport = make(kind, *dev_store);
    gz::Communicator dev(dev_store, std::move(dev_transport));
    cudaStream_t stream;
    GZ_CUDA_CHECK(cudaStreamCreate(&stream));

    const std::size_t n = (1u << 20) + 3;  // not divisible by the rank count
    float* d_buf = nullptr;
    GZ_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d_buf), n * sizeof(float)));
    int failures = 0;
    for (const char* spec : {"none", "fp16", "bf16", "onebit", "onebit:block=100", "topk:density=0.01"}) {
      for (const gz::AlgorithmDescriptor* algorithm : gz::all_algorithms())  // every registered allreduce
      for (std::size_t segment : {std::size_t{0}, std::size_t{65536}}) {  // default cut, and many segments
        auto host_codec = gz::make_codec(spec), dev_codec = gz::make_codec(spec);
        gz::ErrorFeedback host_state, dev_state;
        gz::AllreduceCall hc, dc;
        hc.op = dc.op = gz::ReduceOp::Average;
        if (!algorithm->allreduce) continue;
        const gz::Algorithm algo = algorithm->id;
        hc.algorithm = dc.algorithm = algo;
        hc.segment_bytes = dc.segment_bytes = segment;
        dc.device = gz::Device::Cuda;
        dc.stream = reinterpret_cast<gz::Stream>(stream);
        std::size_t diff = 0;
        for (int step = 0; step < 3; ++step) {
          std::vector<float> h = gradient(n, info.rank, step), d(n);
          GZ_CUDA_CHECK(cudaMemcpy(d_buf, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
          host.allreduce(h.data(), n, *host_codec, host_state, hc);
          dev.allreduce(d_buf, n, *dev_codec, dev_state, dc);
          GZ_CUDA_CHECK(cudaMemcpy(d.data(), d_buf, n * sizeof(float), cudaMemcpyDeviceToHost));
          for (std::size_t i = 0; i < n; ++i) diff += !same(h[i], d[i]);
        }
        std::printf("%-20s %-15s segment %-6zu %s: %zu of %zu elements differ\n", spec, gz::to_string(algo), segment,
                    kind.c_str(), diff, 3 * n);
        failures += diff != 0;
      }
    }
    GZ_CUDA_CHECK(cudaFree(d_buf));
    GZ_CUDA_CHECK(cudaStreamDestroy(stream));
    std::printf(failures ? "FAILED\n" : "GPU allreduce == CPU allreduce, bit for bit\n");
    return failures ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
