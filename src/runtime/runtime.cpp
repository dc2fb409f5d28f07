// The runtime layer (zof/runtime.h): the backend a device name asks for, the job's communicator,
// and the host threads. The only code outside the backends that includes their headers or omp.h.
#include "zof/runtime.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <tuple>

#include "cpu/sim_device.h"
#include "cuda/cuda_backend.h"
#include "zof/error.h"

namespace zof {

std::unique_ptr<Backend> make_backend(const BackendOptions& o) {
  ZOF_CHECK(!o.tf32 || o.device == DeviceChoice::Cuda,
            "--tf32 runs a GPU's fp32 products on TF32 tensor cores: it needs --device cuda");
  ZOF_CHECK(!o.sim_device || o.device == DeviceChoice::Cpu,
            std::string("the simulated device runs over the cpu backend, not '") +
                word(o.device) + "'");
  std::unique_ptr<Backend> be;
  switch (o.device) {
    case DeviceChoice::Cuda:
      be = make_cuda_backend(o.local_rank % std::max(1, cuda_device_count()), o.tf32);
      break;
    case DeviceChoice::Reference: be = make_reference_backend(); break;
    case DeviceChoice::Cpu: be = make_cpu_backend(o.threads); break;
  }
  if (!o.sim_device) return be;
  SimDeviceOptions so;
  so.budget = o.sim_budget;
  so.copy_bandwidth = o.sim_copy_bandwidth;
  so.check_hazards = o.sim_check_hazards;
  so.check_pointers = o.sim_check_pointers;
  return make_sim_device(std::move(be), so);
}

DType resolve_compute_dtype(ComputeChoice choice, Backend& be) {
  const bool automatic = choice == ComputeChoice::Auto;
  if (choice == ComputeChoice::Fp32) return DType::F32;
  if (automatic && !be.compute_info().bf16_fast) return DType::F32;
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
    if (automatic) return DType::F32;
    throw;
  }
  return DType::BF16;
}

namespace {

// The weights of a model's products: multiply-adds a row.
int64_t product_weights(const std::vector<MatmulShape>& shapes) {
  int64_t w = 0;
  for (const MatmulShape& s : shapes) w += std::max<int64_t>(s.N, 0) * std::max<int64_t>(s.K, 0);
  return w;
}

// Backend memory for the probe, freed on every path.
struct ProbeBuffers {
  Backend& be;
  std::vector<void*> p;
  void* alloc(size_t bytes) { return p.emplace_back(be.alloc(bytes)); }
  ~ProbeBuffers() {
    for (void* q : p) be.free(q);
  }
};

// The best of a few timings of one product, in seconds.
double time_matmul(Backend& be, const float* x, const void* w, DType wt, float* y,
                   const MatmulShape& s) {
  double best = HUGE_VAL;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    be.matmul(x, w, wt, nullptr, y, s.M, s.N, s.K);
    be.synchronize(nullptr);
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

void measure(Backend& be, std::vector<MatmulShape> shapes, ComputeProbe& probe, double budget_s) {
  const auto t0 = std::chrono::steady_clock::now();
  probe.budget_s = budget_s;
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  for (MatmulShape& s : shapes)
    s = {std::min<int64_t>(s.M, 256), std::min<int64_t>(s.N, 8192), std::min<int64_t>(s.K, 8192)};
  std::sort(shapes.begin(), shapes.end(), [](const MatmulShape& a, const MatmulShape& b) {
    return std::tie(a.M, a.N, a.K) < std::tie(b.M, b.N, b.K);
  });
  double flops = 0, t32 = 0, t16 = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const MatmulShape& s = shapes[i];
    if (s.M <= 0 || s.N <= 0 || s.K <= 0) continue;
    if (i > 0 && s.M == shapes[i - 1].M && s.N == shapes[i - 1].N && s.K == shapes[i - 1].K)
      continue;
    if (probe.shapes > 0 && elapsed() >= budget_s) {  // out of time: count what is left
      ++probe.skipped;
      continue;
    }
    std::vector<float> x(s.M * s.K), w(s.N * s.K);
    std::vector<uint16_t> wb(w.size());
    for (size_t k = 0; k < x.size(); ++k) x[k] = 0.01f * float(int(k * 7 % 13) - 6);
    for (size_t k = 0; k < w.size(); ++k) wb[k] = f32_to_bf16(w[k] = 0.02f * float(int(k * 5 % 11) - 5));
    ProbeBuffers b{be, {}};
    float* dx = static_cast<float*>(b.alloc(x.size() * sizeof(float)));
    float* dw = static_cast<float*>(b.alloc(w.size() * sizeof(float)));
    void* dwb = b.alloc(wb.size() * sizeof(uint16_t));
    float* dy = static_cast<float*>(b.alloc(size_t(s.M * s.N) * sizeof(float)));
    be.copy_to_device(dx, x.data(), x.size() * sizeof(float), nullptr);
    be.copy_to_device(dw, w.data(), w.size() * sizeof(float), nullptr);
    be.copy_to_device(dwb, wb.data(), wb.size() * sizeof(uint16_t), nullptr);
    // Once each first: a library builds its kernels on a shape's first product.
    be.matmul(dx, dw, DType::F32, nullptr, dy, s.M, s.N, s.K);
    be.matmul(dx, dwb, DType::BF16, nullptr, dy, s.M, s.N, s.K);
    be.synchronize(nullptr);
    t32 += time_matmul(be, dx, dw, DType::F32, dy, s);
    t16 += time_matmul(be, dx, dwb, DType::BF16, dy, s);
    flops += 2.0 * double(s.M) * double(s.N) * double(s.K);
    ++probe.shapes;
  }
  probe.measured = probe.shapes > 0;
  probe.fp32_gflops = t32 > 0 ? flops / t32 * 1e-9 : 0;
  probe.bf16_gflops = t16 > 0 ? flops / t16 * 1e-9 : 0;
  probe.seconds = elapsed();
}

}  // namespace

ComputeProbe measure_compute(Backend& be, const std::vector<MatmulShape>& shapes,
                             double budget_s) {
  ComputeProbe p;
  p.weights = product_weights(shapes);
  measure(be, shapes, p, budget_s);
  return p;
}

DType resolve_compute_dtype(ComputeChoice choice, Backend& be,
                            const std::vector<MatmulShape>& shapes, ComputeProbe* probe,
                            double budget_s) {
  ComputeProbe local;
  ComputeProbe& p = probe ? *probe : local;
  p = ComputeProbe{};
  // The unit's own answer first: fp32 as asked, bf16 as asked (refused without bf16 products),
  // AMX and tensor cores; a unit without bf16 products gives fp32 for auto.
  const DType unit = resolve_compute_dtype(choice, be);
  if (choice != ComputeChoice::Auto || unit == DType::BF16 || shapes.empty()) return unit;
  p.weights = product_weights(shapes);
  if (p.weights < kProbeMinWeights) {
    p.small = true;
    return DType::F32;
  }
  try {
    (void)resolve_compute_dtype(ComputeChoice::Bf16, be);  // one bf16 product, or Error
  } catch (const Error&) {
    return DType::F32;  // no bf16 products here
  }
  try {
    measure(be, shapes, p, budget_s);
  } catch (const Error&) {  // no memory for the probe's buffers: fp32, unmeasured
    p = ComputeProbe{};
    return DType::F32;
  }
  return p.measured && p.bf16_gflops >= kBf16ProbeMargin * p.fp32_gflops ? DType::BF16
                                                                         : DType::F32;
}

nlohmann::json ComputeProbe::to_json() const {
  return {{"fp32_gflops", std::round(fp32_gflops * 10) / 10},
          {"bf16_gflops", std::round(bf16_gflops * 10) / 10},
          {"shapes", shapes},
          {"shapes_skipped", skipped},
          {"budget_s", budget_s},
          {"weights", weights},
          {"seconds", std::round(seconds * 1000) / 1000},
          {"bf16_margin", kBf16ProbeMargin}};
}

const char* compute_dtype_word(DType t) { return t == DType::BF16 ? "bf16" : "fp32"; }

ComputeChoice compute_choice(DType t) {
  return t == DType::BF16 ? ComputeChoice::Bf16 : ComputeChoice::Fp32;
}

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
