// Where the work runs: the one place that turns a device name, thread counts and the job's ranks
// into a Backend and a communicator. It alone knows the backends (src/cpu, src/cuda, the
// simulated device) and OpenMP; the model, ZO and trainer code see only Backend and Communicator.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "zof/backend.h"
#include "zof/dist.h"

namespace zof {

struct BackendOptions {
  std::string device = "cpu";  // cpu | reference (the scalar oracle) | cuda
  int threads = 0;             // cpu: OpenMP threads (<= 0: OpenMP's default)
  // cuda: the GPU; ranks on one node take its GPUs in turn (local_rank modulo the device count).
  int local_rank = 0;
  // The simulated device (host memory with a byte budget, threads as copy streams) over the
  // cpu backend: the streaming schedule without a GPU.
  bool tf32 = false;               // cuda: fp32 products on TF32 tensor cores
  bool sim_device = false;
  size_t sim_budget = 0;           // bytes (0: what the host has available)
  double sim_copy_bandwidth = 0;   // bytes/s of each copy stream (0: memcpy speed)
  bool sim_check_hazards = true;   // the vector-clock checker
  bool sim_check_pointers = true;  // operands must be device memory
};

// The backend the options name. zof::Error for an unknown device name, a CUDA device that does
// not exist or a build without CUDA (the message says how to get one).
std::unique_ptr<Backend> make_backend(const BackendOptions& opt);

// --dtype, the type of the matrix products: "fp32" or "bf16" as given, "auto" bf16 where the
// backend's bf16 products are faster than fp32 (Backend::compute_info: AMX, tensor cores), fp32
// elsewhere. zof::Error naming --dtype for any other word, and for bf16 on a backend that has
// no bf16 products (one is tried).
DType resolve_compute_dtype(const std::string& flag, Backend& be);
// The flag's word for a compute dtype: "fp32" or "bf16".
const char* compute_dtype_word(DType t);

// The job's communicator: MPI under mpirun (built with MPI), one process otherwise (zof/dist.h
// connect_world). Once the forward runs on the device, the choice of NCCL joins it here.
std::unique_ptr<dist::Communicator> connect_job(double timeout_s);

// The host threads of each rank: `requested`, or with 0 and several ranks on one node, the
// node's cores shared between them (results do not depend on the thread count). A positive
// count is also applied to OpenMP, for host passes outside the backend. Returns the count.
int setup_host_threads(int requested, int ranks_on_node);

// The threads OpenMP uses by default (benchmarks report it).
int default_host_threads();

// What the simulated device measured, for run summaries and benchmarks; nullopt when `be` is
// not the simulated device.
struct SimDeviceReport {
  size_t budget = 0, in_use = 0, peak = 0;  // device memory, bytes
  uint64_t bytes_to_device = 0, bytes_to_host = 0, copies = 0;
  double copy_busy_s = 0;     // time copy streams spent copying, summed over streams
  double compute_wait_s = 0;  // time the default stream (the host) blocked on events
  int64_t hazards = 0;        // unordered conflicting accesses
  std::string first_hazard;
  int64_t foreign = 0;        // operands outside device memory
  std::string first_foreign;
};
std::optional<SimDeviceReport> sim_device_report(const Backend& be);
// Zeroes the simulated device's traffic and time counters; false when `be` is not one.
bool reset_sim_device_counters(Backend& be);

}  // namespace zof
