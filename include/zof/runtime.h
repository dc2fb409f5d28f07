// Where the work runs: the one place that turns a device name, thread counts and the job's ranks
// into a Backend and a communicator. It alone knows the backends (src/cpu, src/cuda, the
// simulated device) and OpenMP; the model, ZO and trainer code see only Backend and Communicator.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zof/backend.h"
#include "zof/choices.h"
#include "zof/dist.h"

namespace zof {

struct BackendOptions {
  DeviceChoice device = DeviceChoice::Cpu;  // cpu | reference (the scalar oracle) | cuda
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

// The backend the options name. zof::Error for a CUDA device that does not exist or a build
// without CUDA (the message says how to get one).
std::unique_ptr<Backend> make_backend(const BackendOptions& opt);

// --dtype, the type of the matrix products: fp32 or bf16 as given, auto bf16 where the
// backend's bf16 products are faster than fp32 (Backend::compute_info: AMX, tensor cores), fp32
// elsewhere. zof::Error naming --dtype for bf16 on a backend that has no bf16 products (one is
// tried).
DType resolve_compute_dtype(ComputeChoice choice, Backend& be);

// One matrix product of a model, y(M,N) = x(M,K) w(N,K)^T, as its walk runs it.
struct MatmulShape {
  int64_t M = 0, N = 0, K = 0;
};
// What --dtype auto measured: the backend's fp32 and bf16 product rates at a model's shapes.
struct ComputeProbe {
  bool measured = false;  // false: the unit decided (AMX, tensor cores), fp32 was asked for, or
                          // the model is too small (small)
  bool small = false;     // below kProbeMinWeights: fp32 without a probe
  int64_t weights = 0;    // the products' weights: multiply-adds a row
  double fp32_gflops = 0, bf16_gflops = 0;
  int shapes = 0;         // distinct shapes timed
  int skipped = 0;        // distinct shapes left untimed when the probe ran out of its budget
  double budget_s = 0;    // that budget
  double seconds = 0;     // the probe's own time
  nlohmann::json to_json() const;
};
// bf16 is chosen by the probe only when its products are at least this much faster than fp32's:
// a bf16 walk also rounds its inputs, so a smaller gain does not reach the step (and a timing
// that noise could flip would make two runs of one command compute differently).
inline constexpr double kBf16ProbeMargin = 1.3;
// A model whose products hold fewer weights than this (multiply-adds a row of a step's walk)
// computes in fp32 under --dtype auto without a probe: its step is spent outside the products
// (a 15M-parameter model's forward is ~30 MFLOP a token), bf16 would round for nothing, and a
// timing of products this small is noise that could make two runs of one command differ.
inline constexpr int64_t kProbeMinWeights = 16'000'000;
// The probe's wall-clock budget: on a quiet 2-core machine a large model's probe takes well under
// a second, but its work is fixed, and a CPU starved by other work stretched it to 30 s. Past
// this budget it stops after the shape it is timing and decides from the shapes timed so far
// (at least one), smallest first; its record says how many it left (ComputeProbe::skipped).
inline constexpr double kProbeBudgetSeconds = 5.0;
// --dtype auto on a unit that is not known to be fast in bf16 (AMX CPUs and tensor cores are):
// fp32 for a model below kProbeMinWeights; otherwise times each of `shapes` (rows capped at 256,
// columns and depth at 8192: a short probe, well under a second) in fp32 and in bf16, within
// budget_s (above), and chooses bf16 when its rate is kBf16ProbeMargin times fp32's.
// fp32 and bf16 as asked; the probe's numbers in *probe.
DType resolve_compute_dtype(ComputeChoice choice, Backend& be,
                            const std::vector<MatmulShape>& shapes, ComputeProbe* probe,
                            double budget_s = kProbeBudgetSeconds);
// The probe itself, whatever the unit: both dtypes' rates at `shapes`, within budget_s.
ComputeProbe measure_compute(Backend& be, const std::vector<MatmulShape>& shapes,
                             double budget_s = kProbeBudgetSeconds);
// The flag's word for a compute dtype: "fp32" or "bf16"; and its choice.
const char* compute_dtype_word(DType t);
ComputeChoice compute_choice(DType t);

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
