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
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <sys/resource.h>
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
};

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
      else if (k == "--write-back") {
        a.write_back.clear();
        for (size_t p = 0; p < v.size();) {
          const size_t c = std::min(v.find(',', p), v.size());
          a.write_back.push_back(std::stoi(v.substr(p, c - p)));
          p = c + 1;
        }
      }
      else if (k == "--io-rounds") a.io_rounds = std::stoi(v);
      else throw zof::Error("unknown flag " + k);
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
