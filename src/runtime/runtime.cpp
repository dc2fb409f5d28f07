// The runtime layer (zof/runtime.h): the backend a device name asks for, the job's communicator,
// and the host threads. The only code outside the backends that includes their headers or omp.h.
#include "zof/runtime.h"

#include <omp.h>

#include <algorithm>

#include "cpu/sim_device.h"
#include "zof/cuda.h"
#include "zof/error.h"

namespace zof {

std::unique_ptr<Backend> make_backend(const BackendOptions& o) {
  ZOF_CHECK(o.device == "cpu" || o.device == "reference" || o.device == "cuda",
            "unknown device '" + o.device + "': use cpu, reference or cuda");
  ZOF_CHECK(!o.tf32 || o.device == "cuda",
            "--tf32 runs a GPU's fp32 products on TF32 tensor cores: it needs --device cuda");
  ZOF_CHECK(!o.sim_device || o.device == "cpu",
            "the simulated device runs over the cpu backend, not '" + o.device + "'");
  std::unique_ptr<Backend> be;
  if (o.device == "cuda")
    be = make_cuda_backend(o.local_rank % std::max(1, cuda_device_count()), o.tf32);
  else if (o.device == "reference")
    be = make_reference_backend();
  else
    be = make_cpu_backend(o.threads);
  if (!o.sim_device) return be;
  SimDeviceOptions so;
  so.budget = o.sim_budget;
  so.copy_bandwidth = o.sim_copy_bandwidth;
  so.check_hazards = o.sim_check_hazards;
  so.check_pointers = o.sim_check_pointers;
  return make_sim_device(std::move(be), so);
}

DType resolve_compute_dtype(const std::string& flag, Backend& be) {
  ZOF_CHECK(flag == "auto" || flag == "bf16" || flag == "fp32",
            "--dtype must be auto, bf16 or fp32, not '" + flag + "'");
  if (flag == "fp32") return DType::F32;
  if (flag == "auto" && !be.compute_info().bf16_fast) return DType::F32;
  // One bf16 product now, so that a backend without them refuses before anything is created
  // (its error names the unit and --dtype fp32); auto falls back to fp32 instead.
  struct Buffers {
    Backend& be;
    void* p[3] = {};
    ~Buffers() {
      for (void* q : p) be.free(q);
    }
  } b{be};
  try {
    b.p[0] = be.alloc(sizeof(float));
    b.p[1] = be.alloc(sizeof(uint16_t));
    b.p[2] = be.alloc(sizeof(float));
    const float one = 1.f;
    const uint16_t wone = f32_to_bf16(1.f);
    be.copy_to_device(b.p[0], &one, sizeof one, nullptr);
    be.copy_to_device(b.p[1], &wone, sizeof wone, nullptr);
    be.matmul(static_cast<float*>(b.p[0]), b.p[1], DType::BF16, nullptr,
              static_cast<float*>(b.p[2]), 1, 1, 1);
    be.synchronize(nullptr);
  } catch (const Error&) {
    if (flag == "auto") return DType::F32;
    throw;
  }
  return DType::BF16;
}

const char* compute_dtype_word(DType t) { return t == DType::BF16 ? "bf16" : "fp32"; }

std::unique_ptr<dist::Communicator> connect_job(double timeout_s) {
  return dist::connect_world(timeout_s);
}

int setup_host_threads(int requested, int ranks_on_node) {
  int threads = requested;
  if (threads == 0 && ranks_on_node > 1) threads = std::max(1, omp_get_num_procs() / ranks_on_node);
  if (threads > 0) omp_set_num_threads(threads);
  return threads;
}

int default_host_threads() { return omp_get_max_threads(); }

std::optional<SimDeviceReport> sim_device_report(const Backend& be) {
  const auto* sim = dynamic_cast<const SimDevice*>(&be);
  if (!sim) return std::nullopt;
  const SimDeviceStats s = sim->stats();
  SimDeviceReport r;
  r.budget = s.budget;
  r.in_use = s.in_use;
  r.peak = s.peak;
  r.bytes_to_device = s.bytes_to_device;
  r.bytes_to_host = s.bytes_to_host;
  r.copies = s.copies;
  r.copy_busy_s = s.copy_busy_s;
  r.compute_wait_s = s.compute_wait_s;
  r.hazards = s.hazards;
  r.first_hazard = s.first_hazard;
  r.foreign = s.foreign;
  r.first_foreign = s.first_foreign;
  return r;
}

bool reset_sim_device_counters(Backend& be) {
  auto* sim = dynamic_cast<SimDevice*>(&be);
  if (sim) sim->reset_counters();
  return sim != nullptr;
}

}  // namespace zof
