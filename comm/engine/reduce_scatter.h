// Compressed reduce-scatter: every rank hands in a float buffer of n elements
// cut into P chunks, and rank j gets back the sum (or average) over all ranks
// of chunk j, with the bytes on the wire compressed by a Codec with error
// feedback. The collective FSDP's gradient reduction needs (each rank keeps
// its shard of the summed gradient); python/gradzip/torch/fsdp.py plugs it
// into torch's fully_shard.
//
//   gz::AllreduceWorkspace ws;          // one per transport, shared with allreduce
//   gz::ErrorFeedback state;            // one per gradient buffer (its worker residual)
//   gz::ReduceScatterOptions o;
//   o.transport = &transport; o.store = &store; o.workspace = &ws;
//   o.codec = codec.get(); o.state = &state;
//   o.buffer = grad; o.n = n; o.op = gz::ReduceOp::Average;
//   gz::reduce_scatter(o);
//   const gz::ChunkRange mine = gz::chunk_range(n, P, rank);
//   // grad[mine.offset, mine.offset + mine.count) now holds this rank's chunk of the average
//
// It is the allreduce engine's scatter_reduce stopped after its reduce
// (comm/algorithms/scatter_reduce.cc, Half::ReduceOnly): segment s of chunk j is encoded
// with this rank's error feedback and sent to rank j, which sums the P
// payloads in rank order. Pipelined as the allreduce is; traffic per rank
// (P-1)/P payloads of the buffer, half of scatter_reduce's.
//
// Constraints (as allreduce(), allreduce.h, unless said here):
//   - Chunks: chunk j is chunk_range(n, P, j): equal chunks when n % P == 0
//     (FSDP pads its gradients so), else the first n % P chunks one longer.
//   - In place, as NCCL's in-place reduce-scatter: `buffer` is read, and only
//     this rank's chunk is overwritten (with the result); the other chunks
//     are left as they were.
//   - Deterministic: the result is the same bits on every rank that computes
//     it (decoded payloads summed in rank order, then scaled); for codec none
//     it is the fp32 sum in rank order, times 1/P for an average.
//   - State: the worker residual (n floats) of this rank's contribution; a
//     state used here cannot be used by allreduce() (a different layout).
//     The agreement checks algorithm 'reduce_scatter' on every rank, so a rank
//     calling allreduce against one calling reduce_scatter fails on both.
#pragma once

#include <cstddef>

#include "comm/engine/allreduce.h"
#include "comm/engine/error_feedback.h"

namespace gz {

struct ReduceScatterOptions {
  Transport* transport = nullptr;           ///< [in] required
  Store* store = nullptr;                   ///< [in] required when size() > 1 (agreement)
  AllreduceWorkspace* workspace = nullptr;  ///< [in,out] required (the allreduce's: one per transport)
  Codec* codec = nullptr;                   ///< [in] required (one call at a time)
  ErrorFeedback* state = nullptr;           ///< [in,out] required: this buffer's error feedback
  float* buffer = nullptr;                  ///< [in,out] n floats on `device`; out: this rank's chunk only
  std::size_t n = 0;
  ReduceOp op = ReduceOp::Sum;
  Device device = Device::Cpu;
  Stream stream = nullptr;                  ///< CUDA stream (Device::Cuda)
  Timeout timeout = default_timeout();      ///< for every wait of the call
  std::size_t segment_bytes = 0;            ///< payload bytes per pipeline segment (0: the default)
  AllreduceStats* stats = nullptr;          ///< [out] optional; algorithm is ReduceScatter
};

/// Runs one compressed reduce-scatter; see the top of this file.
void reduce_scatter(const ReduceScatterOptions& options);

}  // namespace gz
