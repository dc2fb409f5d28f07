// The single-process communicator, the choice between it, MPI and NCCL, and the rank layout of
// pipeline stages and data-parallel replicas (see zof/dist.h).
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "comm/mpi_comm.h"
#include "comm/nccl_comm.h"
#include "cuda/cuda_backend.h"
#include "zof/dist.h"
#include "zof/error.h"

namespace zof::dist {
namespace {

class SingleProcess : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_size() const override { return 1; }
  int local_rank() const override { return 0; }
  std::string name() const override { return "single process"; }
  void allreduce_sum_ordered(double*, int) override {}
  void broadcast(void*, size_t, int root) override { ZOF_ASSERT(root == 0); }
  void send(const float*, int64_t, int, int) override {
    ZOF_ABORT("send in a single-process job: there is no other rank");
  }
  void recv(float*, int64_t, int, int) override {
    ZOF_ABORT("recv in a single-process job: there is no other rank");
  }
  void barrier() override {}
  [[noreturn]] void abort(int code, const std::string& why) override {
    std::fprintf(stderr, "zof: error: %s\n", why.c_str());
    std::_Exit(code);
  }
};

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : 0;
}

}  // namespace

std::unique_ptr<Communicator> make_single_process() { return std::make_unique<SingleProcess>(); }

bool launched_by_mpi(int* world_size) {
  const bool launched = std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") ||
                        std::getenv("PMIX_RANK");
  if (world_size) {
    int n = env_int("OMPI_COMM_WORLD_SIZE");
    if (n <= 0) n = env_int("PMI_SIZE");
    *world_size = n > 0 ? n : 1;
  }
  return launched;
}

bool built_with_mpi() {
#ifdef ZOF_WITH_MPI
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Communicator> connect_world(double timeout_s) {
  int n = 1;
  const bool launched = launched_by_mpi(&n);
#ifdef ZOF_WITH_MPI
  if (launched) return make_mpi_world(timeout_s);
#endif
  ZOF_CHECK(!launched || n == 1,
            "started by mpirun with " + std::to_string(n) +
                " ranks, but this zof was built without MPI; install libopenmpi-dev "
                "(scripts/setup.sh) and rebuild with -DZOF_MPI=ON, or run one process");
  return make_single_process();
}

bool built_with_nccl() {
#ifdef ZOF_WITH_NCCL
  return true;
#else
  return false;
#endif
}

#ifdef ZOF_WITH_NCCL
namespace {
void check_nccl_device(int device) {
  const int n = cuda_device_count();
  ZOF_CHECK(device >= 0 && device < n,
            "CUDA device " + std::to_string(device) + " for the NCCL communicator does not exist (" +
                std::to_string(n) +
                " visible); give each rank one of its node's GPUs, or check CUDA_VISIBLE_DEVICES "
                "and the driver");
}
}  // namespace

std::unique_ptr<Communicator> make_nccl(Communicator& bootstrap, int device, double timeout_s) {
  check_nccl_device(device);
  return make_nccl_comm(&bootstrap, nullptr, device, timeout_s);
}

std::unique_ptr<Communicator> make_nccl_single(int device, double timeout_s) {
  check_nccl_device(device);
  auto single = make_single_process();
  Communicator* boot = single.get();
  return make_nccl_comm(boot, std::move(single), device, timeout_s);
}
#else
namespace {
const char* kNoNccl =
    "this zof was built without NCCL (-DZOF_NCCL=OFF, the CUDA backend off, or nccl.h and "
    "libnccl not found when configuring); install NCCL (the CUDA toolkit's, libnccl-dev, or "
    "the nvidia-nccl wheel PyTorch installs) and rebuild with -DZOF_CUDA=ON -DZOF_NCCL=ON";
}

std::unique_ptr<Communicator> make_nccl(Communicator&, int, double) { throw Error(kNoNccl); }
std::unique_ptr<Communicator> make_nccl_single(int, double) { throw Error(kNoNccl); }
#endif

std::unique_ptr<Communicator> connect_devices(std::unique_ptr<Communicator> world,
                                              bool cuda_backend, int device, double timeout_s) {
  ZOF_ASSERT(world);
  if (!cuda_backend || world->size() == 1 || !built_with_nccl()) return world;
#ifdef ZOF_WITH_NCCL
  check_nccl_device(device);
  Communicator* boot = world.get();
  return make_nccl_comm(boot, std::move(world), device, timeout_s);
#else
  return world;
#endif
}

Layout Layout::make(int ranks, int stages) {
  ZOF_CHECK(stages >= 1, "--pipeline-stages must be at least 1");
  ZOF_CHECK(ranks % stages == 0,
            "--pipeline-stages " + std::to_string(stages) + " does not divide the " +
                std::to_string(ranks) +
                " ranks of the job; ranks = stages x replicas, so start a multiple of " +
                std::to_string(stages) + " ranks");
  return Layout{ranks, stages, ranks / stages};
}

std::vector<std::pair<int, int>> stage_blocks(int num_layers, int stages) {
  ZOF_CHECK(stages <= num_layers, "--pipeline-stages " + std::to_string(stages) +
                                      " exceeds the model's " + std::to_string(num_layers) +
                                      " layers; each stage needs at least one layer");
  std::vector<std::pair<int, int>> out;
  for (int s = 0; s < stages; ++s) {
    const int lo = (int)((int64_t)s * num_layers / stages);
    const int hi = (int)((int64_t)(s + 1) * num_layers / stages);  // layers [lo, hi)
    out.push_back({s == 0 ? 0 : lo + 1, s == stages - 1 ? num_layers + 1 : hi});
  }
  return out;
}

std::vector<int> Grid::tensor_group(int rank) const {
  std::vector<int> out;
  const int first = rank - tensor_rank(rank);
  for (int t = 0; t < tensor; ++t) out.push_back(first + t);
  return out;
}

Grid Grid::make(int ranks, int stages, int tensor) {
  ZOF_CHECK(stages >= 1, "--pipeline-stages must be at least 1");
  ZOF_CHECK(tensor >= 1, "--tensor-parallel must be at least 1");
  const int64_t cell = (int64_t)stages * tensor;
  ZOF_CHECK(ranks >= 1 && ranks % cell == 0,
            "--pipeline-stages " + std::to_string(stages) + " x --tensor-parallel " +
                std::to_string(tensor) + " = " + std::to_string(cell) + " does not divide the " +
                std::to_string(ranks) + " ranks of the job; ranks = replicas x stages x tensor, "
                "so start a multiple of " + std::to_string(cell) + " ranks (mpirun -np)");
  return Grid{ranks, stages, tensor, ranks / (int)cell};
}

void group_all_gather(Communicator& c, const std::vector<int>& ranks, const void* in,
                      size_t bytes, void* out) {
  // A tag no pipeline stream uses (those count from 0).
  constexpr int kTag = 0x7A29;
  const int n = (int)ranks.size();
  int me = -1;
  for (int i = 0; i < n; ++i)
    if (ranks[(size_t)i] == c.rank()) me = i;
  ZOF_ASSERT(me >= 0);
  std::memcpy((char*)out + (size_t)me * bytes, in, bytes);
  if (n == 1) return;
  // send/recv carry floats: each piece is staged in whole floats.
  const int64_t words = (int64_t)((bytes + sizeof(float) - 1) / sizeof(float));
  std::vector<float> stage((size_t)(words * n));
  if (me == 0) {
    std::memcpy(stage.data(), in, bytes);
    for (int i = 1; i < n; ++i) c.recv(stage.data() + (size_t)(i * words), words, ranks[(size_t)i], kTag);
    for (int i = 1; i < n; ++i) c.send(stage.data(), words * n, ranks[(size_t)i], kTag);
  } else {
    std::memcpy(stage.data(), in, bytes);
    c.send(stage.data(), words, ranks[0], kTag);
    c.recv(stage.data(), words * n, ranks[0], kTag);
  }
  for (int i = 0; i < n; ++i)
    std::memcpy((char*)out + (size_t)i * bytes, stage.data() + (size_t)(i * words), bytes);
}

}  // namespace zof::dist
