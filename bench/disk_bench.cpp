// The disk tier's benchmark (issue 28): the disk's own sequential O_DIRECT write and read
// bandwidth through the tier's I/O layer (src/util/block_io.h) on each engine (the pread/pwrite
// pool, and io_uring where it runs: a row each and their ratio), then ZO steps of a random model
// all in host memory against steps with the blocks beyond --host-mem on disk (the least budget
// and half the model; the engine the tier picks, ZOF_IO as set), in one run so the ratios hold
// on a noisy machine. Prints tables. --steps 0: the disk alone.
//   build/disk_bench [--dir DIR] [--model-config llama-125m] [--steps 3] [--threads 2]
//                    [--io-mib 512] [--io-threads 2] [--io-rounds 1] [--write-back 1,2,4,8]
// --write-back: rows at the least budget with each write-back window (--write-back-every N):
// the bytes written against the z's regenerated.
// --scale CONFIG (llama2-13b, llama-30b, ...): instead, a model of that shape larger than RAM,
// bf16 master, never held whole: laid out in untouched pages, each block drawn into the disk
// tier's ring and written to the store, then --steps ZO-SGD steps at the least --host-mem;
// prints s/step, GB/s from and to disk and the peak resident set. --host-fraction 1,0.5,0.25:
// the same model all in RAM, then with half and a quarter of it in RAM (each run a process of
// its own: the bench forks one per budget).
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

#include "bench_common.h"
#include "util/block_io.h"
#include "zof/disk_tier.h"
#include "zof/error.h"
#include "zof/runtime.h"
#include "zof/streaming.h"
#include "zof/zo.h"

namespace fs = std::filesystem;

namespace {

struct Args {
  std::string dir = fs::temp_directory_path().string();
  std::string model_config = "llama-125m";
  int steps = 3, threads = 2, io_threads = 2, io_rounds = 1;
  uint64_t io_mib = 512;
  std::vector<int> write_back{1, 2, 4, 8};
  std::string scale;  // --scale CONFIG: a model larger than RAM (scale_steps)
  // --host-fraction F[,F...] with --scale: budgets as fractions of the master (1: all in RAM,
  // no tier; 0: the least budget), one run each.
  std::vector<double> fractions{0};
};

// "1,2,4" as numbers.
template <class T>
std::vector<T> list_of(const std::string& v) {
  std::vector<T> out;
  for (size_t p = 0; p < v.size();) {
    const size_t c = std::min(v.find(',', p), v.size());
    out.push_back((T)std::stod(v.substr(p, c - p)));
    p = c + 1;
  }
  return out;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Bandwidth {
  std::string engine;
  double write_gb = 0, read_gb = 0;  // GB/s, the best of the rounds
  double cpu_s_per_gb = 0;            // this process's CPU seconds (user + system) per GB moved
};

double cpu_s() {  // every thread's, user and system
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// Sequential transfers of io_mib in 4 MiB requests on one engine, all submitted at once as the
// tier does (the pool runs io_threads at a time, io_uring up to its queue depth); the file is
// written first, then read back, `rounds` times (the best kept: a busy machine only slows).
Bandwidth disk_bandwidth(const Args& a, zof::IoEngineKind kind, std::string* mode) {
  const uint64_t chunk = uint64_t(4) << 20, bytes = a.io_mib << 20;
  const fs::path p = fs::path(a.dir) / ("zof-disk-bench-" + std::to_string(::getpid()) + ".bin");
  zof::BlockFile f(p, bytes);
  *mode = f.direct() ? "O_DIRECT" : "buffered (" + f.note() + ")";
  std::unique_ptr<zof::IoEngine> io = zof::make_io_engine(a.io_threads, kind);
  // Eight buffers shared round robin (their contents do not matter, only the traffic).
  std::vector<std::unique_ptr<zof::AlignedBuffer>> bufs;
  for (int i = 0; i < 8; ++i) {
    bufs.push_back(std::make_unique<zof::AlignedBuffer>(chunk));
    std::memset(bufs.back()->data, 0x5a + i, chunk);
  }
  auto run = [&](char op) {
    std::vector<zof::IoTransfer> jobs;
    for (uint64_t off = 0; off < bytes; off += chunk)
      jobs.push_back({op, &f, bufs[(off / chunk) % bufs.size()]->data, chunk, off, {}});
    const double t0 = now_s();
    io->submit(std::move(jobs))->wait();
    if (op == 'w') ::sync();  // buffered fallback: what reached the disk
    return bytes / (now_s() - t0) / 1e9;
  };
  Bandwidth b;
  b.engine = kind == zof::IoEngineKind::Pool
                 ? "pread/pwrite, " + std::to_string(a.io_threads) + " threads"
                 : "io_uring, queue depth " + std::to_string(zof::kUringDepth);
  const double c0 = cpu_s();
  for (int r = 0; r < std::max(1, a.io_rounds); ++r) {
    b.write_gb = std::max(b.write_gb, run('w'));
    b.read_gb = std::max(b.read_gb, run('r'));
  }
  b.cpu_s_per_gb = (cpu_s() - c0) / (2.0 * std::max(1, a.io_rounds) * bytes / 1e9);
  io.reset();
  f.remove();
  return b;
}

void disk_bandwidths(const Args& a) {
  std::string mode;
  std::vector<Bandwidth> rows{disk_bandwidth(a, zof::IoEngineKind::Pool, &mode)};
  const std::string why = zof::io_uring_unavailable();
  if (why.empty()) rows.push_back(disk_bandwidth(a, zof::IoEngineKind::Uring, &mode));
  std::printf("disk %s: %s, %llu MiB in 4 MiB requests, best of %d round(s)%s\n\n", a.dir.c_str(),
              mode.c_str(), (unsigned long long)a.io_mib, std::max(1, a.io_rounds),
              why.empty() ? "" : ("; io_uring not measured: " + why).c_str());
  std::printf("| engine | write MB/s | read MB/s | write x pool | read x pool | CPU s/GB |\n"
              "|---|---|---|---|---|---|\n");
  for (const Bandwidth& b : rows)
    std::printf("| %s | %.0f | %.0f | %.2f | %.2f | %.3f |\n", b.engine.c_str(),
                b.write_gb * 1e3, b.read_gb * 1e3, b.write_gb / rows[0].write_gb,
                b.read_gb / rows[0].read_gb, b.cpu_s_per_gb);
  std::printf("\n");
}

struct Row {
  std::string name;
  uint64_t budget = 0;
  int on_disk = 0, ring = 0;
  double step_s = 0, read_gb = 0, write_gb = 0, stall_s = 0;
};

Row steps(const Args& a, const zof::ModelConfig& cfg, const std::string& name, uint64_t budget,
          int write_back = 1) {
  zof::Model model = zof::Model::random(cfg, 1);
  std::mt19937_64 rng(2);
  std::vector<std::vector<int32_t>> seqs(1, std::vector<int32_t>(32));
  for (auto& t : seqs[0]) t = (int32_t)(rng() % (uint64_t)cfg.vocab_size);
  const std::vector<zof::LossBatch> micro{zof::LossBatch::next_token(zof::Batch::from_sequences(seqs))};
  zof::BackendOptions bo;
  bo.threads = a.threads;
  std::unique_ptr<zof::Backend> be = zof::make_backend(bo);
  zof::ZOStepOptions zo;
  zo.write_back_every = write_back;
  zof::ZOEngine eng(model, *be, 32, zo);
  Row r;
  r.name = name;
  if (budget == 1) budget = eng.disk_tier_minimum();
  r.budget = budget;
  if (budget > 0) eng.enable_disk_tier(budget, a.dir, a.io_threads);
  if (const zof::DiskTier* t = eng.disk_tier()) {
    r.on_disk = (int)std::count(t->plan().on_disk.begin(), t->plan().on_disk.end(), true);
    r.ring = t->plan().ring;
  }
  uint32_t step = 0;
  auto one = [&] {
    const auto ql = eng.perturbed_losses(step, micro);
    eng.schedule_update(step, 1e-5f, eng.projected_gradients(ql));
    ++step;
  };
  // Warm: the second walk applies an update, as every later one does. A write-back window's
  // steps are timed over whole windows, from a window's start.
  one();
  do one(); while ((step - 1) % write_back != 0);
  const int n = (a.steps + write_back - 1) / write_back * write_back;
  const zof::DiskTierStats s0 = eng.disk_tier() ? eng.disk_tier()->stats() : zof::DiskTierStats{};
  const double t0 = now_s();
  for (int i = 0; i < n; ++i) one();
  r.step_s = (now_s() - t0) / n;
  if (eng.disk_tier()) {
    const zof::DiskTierStats& s = eng.disk_tier()->stats();
    r.read_gb = (s.bytes_read - s0.bytes_read) / 1e9 / n;
    r.write_gb = (s.bytes_written - s0.bytes_written) / 1e9 / n;
    r.stall_s = (s.stall_s - s0.stall_s) / n;
    std::printf("  %s: %s\n", name.c_str(), eng.disk_tier()->describe().c_str());
  }
  return r;
}

// The process's resident set now and its peak, in bytes (/proc/self/status VmRSS, VmHWM).
uint64_t rss_bytes(const char* field) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  uint64_t kb = 0;
  const size_t n = std::strlen(field);
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, field, n) == 0 && line[n] == ':') kb = std::strtoull(line + n + 1, nullptr, 10);
  std::fclose(f);
  return kb * 1024;
}

// A model of cfg's shape that RAM cannot hold, through the product's own engine and tier: the
// weights are drawn block by block straight into the tier (acquire with nothing to read, fill,
// release: written behind, its pages given back), so no moment holds more than the ring; then
// ZO-SGD steps (bf16 master, bf16 products, batch 1 x 32) at the least --host-mem.
void scale_steps(const Args& a, double fraction) {
  const zof::ModelConfig cfg = zof_bench::config_named(a.scale);
  zof::Model model = zof::Model::zeros(cfg, true, zof::DType::BF16);  // no page touched yet
  const uint64_t weights = zof::DiskTier::all_bytes(model);
  std::printf("%s: %lld parameters, %.1f GB as a bf16 master; RAM %.1f GB; RSS after the layout "
              "%.2f GB\n",
              a.scale.c_str(), (long long)model.num_params(), weights / 1e9,
              ::sysconf(_SC_PHYS_PAGES) * (double)::sysconf(_SC_PAGESIZE) / 1e9,
              rss_bytes("VmRSS") / 1e9);
  zof::BackendOptions bo;
  bo.threads = a.threads;
  std::unique_ptr<zof::Backend> be = zof::make_backend(bo);
  zof::ZOStepOptions zo;
  zo.master = zof::DType::BF16;
  zo.compute = zof::DType::BF16;
  zof::ZOEngine eng(model, *be, 32, zo);
  const uint64_t budget = fraction <= 0 ? eng.disk_tier_minimum()
                          : std::max<uint64_t>(eng.disk_tier_minimum(), (uint64_t)(fraction * weights));
  double t0 = now_s();
  if (fraction < 1) eng.enable_disk_tier(budget, a.dir, a.io_threads);
  zof::DiskTier* tier = eng.disk_tier();
  std::printf("  --host-mem %s (%s): %s\n  store laid out in %.1f s; RSS %.2f GB\n",
              zof::format_bytes(budget).c_str(),
              fraction <= 0 ? "the least" : fraction >= 1 ? "all" : "a fraction of the master",
              tier ? tier->describe().c_str() : "every block in RAM", now_s() - t0,
              rss_bytes("VmRSS") / 1e9);
  // The weights, block by block (normal-ish values of std 0.02 from a cheap generator: norms 1).
  t0 = now_s();
  const auto& blocks = model.blocks();
  for (int b = 0; b < (int)blocks.size(); ++b) {
    if (tier) tier->acquire(b, /*overwrite=*/true);
    const std::vector<int>& ps = blocks[b].params;
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t k = 0; k < ps.size(); ++k) {
      const zof::Param& p = model.params()[ps[k]];
      uint16_t* h = model.storage_bf16() + p.offset;
      uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(ps[k] + 1);
      const bool norm = !p.decay;
      for (int64_t j = 0; j < p.numel; ++j) {
        x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
        const uint64_t r = x * 0x2545f4914f6cdd1dull;
        // The sum of two uniforms on [-0.0245, 0.0245]: std 0.02, as the model's random init.
        const float u = ((float)(r >> 40) / 16777216.f + (float)((r >> 16) & 0xffffff) / 16777216.f -
                         1.f) * 0.049f;
        h[j] = zof::f32_to_bf16(norm ? 1.f : u);
      }
    }
    if (tier) tier->release(b, /*changed=*/true);
  }
  const double fill_s = now_s() - t0;
  std::printf("  weights drawn into the tier in %.1f s (%.2f GB/s); RSS %.2f GB, peak %.2f GB\n",
              fill_s, weights / fill_s / 1e9, rss_bytes("VmRSS") / 1e9, rss_bytes("VmHWM") / 1e9);
  std::mt19937_64 rng(2);
  std::vector<std::vector<int32_t>> seqs(1, std::vector<int32_t>(32));
  for (auto& t : seqs[0]) t = (int32_t)(rng() % (uint64_t)cfg.vocab_size);
  const std::vector<zof::LossBatch> micro{
      zof::LossBatch::next_token(zof::Batch::from_sequences(seqs))};
  std::printf("\n| step | s | GB read | GB written | read GB/s | write GB/s | read stall s | "
              "loss+ | RSS GB | peak RSS GB |\n|---|---|---|---|---|---|---|---|---|---|\n");
  const zof::DiskTierStats none;
  for (int step = 0; step < std::max(a.steps, 2); ++step) {
    const zof::DiskTierStats s0 = tier ? tier->stats() : none;
    t0 = now_s();
    const auto ql = eng.perturbed_losses((uint32_t)step, micro);
    eng.schedule_update((uint32_t)step, 1e-5f, eng.projected_gradients(ql));
    const double dt = now_s() - t0;
    const zof::DiskTierStats& s = tier ? tier->stats() : none;
    const double rd = (s.bytes_read - s0.bytes_read) / 1e9, wr = (s.bytes_written - s0.bytes_written) / 1e9;
    std::printf("| %d%s | %.1f | %.2f | %.2f | %.2f | %.2f | %.1f | %.4f | %.2f | %.2f |\n", step,
                step == 0 ? " (no update yet)" : "", dt, rd, wr, rd / dt, wr / dt,
                s.stall_s - s0.stall_s, ql.sum_plus[0] / 32, rss_bytes("VmRSS") / 1e9,
                rss_bytes("VmHWM") / 1e9);
    std::fflush(stdout);
  }
  // The engine's end would bring every block back into the storage (DiskTier::materialize: what
  // a run's evaluation and save still need), which RAM cannot hold here: the bench stops now,
  // its store unlinked first (transfers in flight end with the process).
  std::error_code ec;
  if (tier) fs::remove(tier->store_path(), ec);
  std::fflush(stdout);
  std::_Exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Args a;
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string k = argv[i], v = argv[i + 1];
      if (k == "--dir") a.dir = v;
      else if (k == "--model-config") a.model_config = v;
      else if (k == "--steps") a.steps = std::stoi(v);
      else if (k == "--threads") a.threads = std::stoi(v);
      else if (k == "--io-threads") a.io_threads = std::stoi(v);
      else if (k == "--io-mib") a.io_mib = std::stoull(v);
      else if (k == "--write-back") a.write_back = list_of<int>(v);
      else if (k == "--io-rounds") a.io_rounds = std::stoi(v);
      else if (k == "--scale") a.scale = v;
      else if (k == "--host-fraction") a.fractions = list_of<double>(v);
      else throw zof::Error("unknown flag " + k);
    }
    if (!a.scale.empty()) {
      for (const double f : a.fractions) {  // a process each: scale_steps ends its process
        std::fflush(stdout);
        const pid_t child = ::fork();
        ZOF_CHECK(child >= 0, std::string("fork: ") + std::strerror(errno));
        if (child == 0) {
          try {
            scale_steps(a, f);
          } catch (const std::exception& e) {
            std::fprintf(stderr, "disk_bench: error: %s\n", e.what());
            std::_Exit(1);
          }
        }
        int status = 0;
        ::waitpid(child, &status, 0);
        ZOF_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "the run at --host-fraction " + std::to_string(f) + " failed");
        std::printf("\n");
      }
      return 0;
    }
    disk_bandwidths(a);
    if (a.steps <= 0) return 0;
    const zof::ModelConfig cfg = zof_bench::config_named(a.model_config);
    const zof::Model probe = zof::Model::random(cfg, 1);
    const uint64_t all = zof::DiskTier::all_bytes(probe);
    std::printf("ZO-SGD steps of %s (%lld parameters, %.0f MB fp32 master), batch 1 x 32 tokens, "
                "%d threads, mean of %d steps\n",
                a.model_config.c_str(), (long long)probe.num_params(), all / 1e6, a.threads,
                a.steps);
    std::vector<Row> rows;
    rows.push_back(steps(a, cfg, "all in RAM", 0));
    rows.push_back(steps(a, cfg, "half on disk", all / 2));
    rows.push_back(steps(a, cfg, "least budget", 1));
    for (int n : a.write_back)
      if (n > 1)
        rows.push_back(steps(a, cfg, "least, write back every " + std::to_string(n), 1, n));
    std::printf("\n| host memory | budget | blocks on disk | ring | s/step | x RAM | GB read/step | "
                "GB written/step | read stall s/step |\n|---|---|---|---|---|---|---|---|---|\n");
    for (const Row& r : rows)
      std::printf("| %s | %s | %d | %d | %.3f | %.2f | %.3f | %.3f | %.3f |\n", r.name.c_str(),
                  r.budget ? zof::format_bytes(r.budget).c_str() : "-", r.on_disk, r.ring,
                  r.step_s, r.step_s / rows[0].step_s, r.read_gb, r.write_gb, r.stall_s);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "disk_bench: error: %s\n", e.what());
    return 1;
  }
}
