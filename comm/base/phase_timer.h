// PhaseTimer: how long the encode and decode work of one allreduce took,
// measured without stalling the pipeline it is part of: on the CPU the wall
// time of each region, on CUDA a pair of events around each region on the
// stream, read once at the end, after the call has synchronized anyway.
#pragma once

#include <chrono>
#include <vector>

#include "common/stream.h"

namespace gz::detail {

class PhaseTimer {
 public:
  PhaseTimer() = default;
  ~PhaseTimer();
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

  /// Off: begin/end do nothing (calls without stats).
  void reset(bool on, Device device, Stream stream);
  void begin();
  /// Adds the region's time to *acc (CUDA: at collect()).
  void end(double* acc);
  /// CUDA: adds up the regions (their events must have completed).
  void collect();

 private:
  struct Region {
    void* start;  // cudaEvent_t
    void* stop;
    double* acc;
  };
  bool on_ = false;
  Device device_ = Device::Cpu;
  Stream stream_ = nullptr;
  std::chrono::steady_clock::time_point t0_;
  [[maybe_unused]] void* open_ = nullptr;  // CUDA: the start event of the open region (unused without CUDA)
  std::vector<Region> regions_;
};

}  // namespace gz::detail
