// A simulated device: host memory with a byte budget standing in for GPU memory, and worker
// threads standing in for CUDA streams, so that the streaming schedule (streaming.h) runs, with
// the ordering logic a GPU would need, in CI without a GPU. Ops on the default stream run on the
// calling thread once the events that stream waits on have completed; copies (and ops) on other
// streams run in order on each stream's worker thread. A hazard checker records every access to
// memory with a vector clock per stream and reports accesses that no event, stream order or host
// synchronization orders after a conflicting one: a missing event shows up even when the
// timing happened to hide it. A pointer checker reports operands that are not device memory.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "zof/backend.h"

namespace zof {

struct SimDeviceOptions {
  size_t budget = 0;          // bytes of device memory (0: what the host has available)
  double copy_bandwidth = 0;  // bytes/s of each copy stream, to mimic a bus (0: memcpy speed)
  bool check_hazards = true;  // the vector-clock checker (costs host time per op)
  // Every op's operands and the device side of every copy must lie in memory this device
  // allocated: a host pointer handed to a device op is what a GPU faults on (or reads garbage
  // through). Off for code that is knowingly host-only.
  bool check_pointers = true;
};

struct SimDeviceStats {
  size_t budget = 0, in_use = 0, peak = 0;  // device memory, bytes (allocations rounded to 64)
  uint64_t bytes_to_device = 0, bytes_to_host = 0, copies = 0;
  double copy_busy_s = 0;     // time copy streams spent copying, summed over streams
  double compute_wait_s = 0;  // time the default stream (here: the host) blocked on events
  int64_t hazards = 0;        // unordered conflicting accesses (see above)
  std::string first_hazard;   // what the first one was
  int64_t foreign = 0;        // operands outside device memory (check_pointers)
  std::string first_foreign;  // which op, and what it was handed
};

class SimDevice : public Backend {
 public:
  virtual SimDeviceStats stats() const = 0;
  // Zeroes the traffic and time counters; the peak restarts from what is allocated now.
  virtual void reset_counters() = 0;
};

// The simulated device over a host backend (make_cpu_backend()), which does every op's math.
std::unique_ptr<SimDevice> make_sim_device(std::unique_ptr<Backend> host, SimDeviceOptions opt);

}  // namespace zof
