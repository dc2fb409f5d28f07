// The NCCL communicator in one process on one GPU (make_nccl_single): the collectives go through
// NCCL and are the identity bit for bit, the byte count stays 0 (one rank sends to nobody), and
// send/recv, which need another rank, abort naming why. What needs two ranks (the all-gather's
// rank order, send/recv between GPUs, the timeout on a lost peer) needs two GPUs, one rank each
// under MPI; the GPU machine has one, so that stays untested here (a second process cannot share
// the GPU: NCCL refuses two ranks on one device).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include "gpu/gpu_test.h"
#include "zof/dist.h"
#include "zof/error.h"

namespace {

using zof::dist::Communicator;

// Skips without a GPU or without NCCL in this build; fails where a GPU is expected (the GPU
// machine has PyTorch's NCCL, which CMake finds).
#define ZOF_REQUIRE_NCCL()                                                                       \
  do {                                                                                           \
    ZOF_REQUIRE_GPU();                                                                           \
    if (!::zof::dist::built_with_nccl()) {                                                       \
      if (::zof::gpu_test::gpu_expected())                                                       \
        FAIL() << "this build has no NCCL (see 'zof: NCCL communicator' in the configure log)"; \
      GTEST_SKIP() << "built without NCCL";                                                      \
    }                                                                                            \
  } while (0)

constexpr double kTimeout = 60;  // seconds; a hang ends the test binary instead of the machine

std::vector<double> scalars() {
  return {1.5, -2.25, 1e-300, std::numbers::pi, -0.0, 123456789.125,
          std::numeric_limits<double>::denorm_min(), std::numeric_limits<double>::quiet_NaN()};
}

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

TEST(Nccl, OneRankCommunicator) {
  ZOF_REQUIRE_NCCL();
  auto c = zof::dist::make_nccl_single(0, kTimeout);
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  EXPECT_EQ(c->local_size(), 1);
  EXPECT_TRUE(c->buffers_on_device());
  EXPECT_NE(c->name().find("NCCL"), std::string::npos) << c->name();
  EXPECT_NE(c->name().find("cuda:0"), std::string::npos) << c->name();
}

TEST(Nccl, OrderedReductionIsTheIdentityForOneRank) {
  ZOF_REQUIRE_NCCL();
  auto c = zof::dist::make_nccl_single(0, kTimeout);
  std::vector<double> v = scalars();
  const std::vector<double> want = v;
  c->allreduce_sum_ordered(v.data(), (int)v.size());
  EXPECT_TRUE(same_bits(v, want));
  c->allreduce_sum_ordered(v.data(), (int)v.size());  // again, on the buffers kept from the first
  EXPECT_TRUE(same_bits(v, want));
  // More values than the first buffers hold: they grow.
  std::vector<double> big(5000);
  for (size_t i = 0; i < big.size(); ++i) big[i] = std::sin(double(i)) * 1e3;
  const std::vector<double> big_want = big;
  c->allreduce_sum_ordered(big.data(), (int)big.size());
  EXPECT_TRUE(same_bits(big, big_want));
  c->allreduce_sum_ordered(v.data(), 0);  // nothing to do
  EXPECT_EQ(c->bytes_sent(), 0u);         // one rank: nothing went to another
}

TEST(Nccl, BroadcastAndBarrierOnOneRank) {
  ZOF_REQUIRE_NCCL();
  auto boot = zof::dist::make_single_process();
  auto c = zof::dist::make_nccl(*boot, 0, kTimeout);  // over an explicit bootstrap
  EXPECT_NE(c->name().find("single process"), std::string::npos) << c->name();
  // Host memory, staged in 16 MiB chunks: 20 MiB takes two.
  std::vector<uint8_t> data((size_t(20) << 20) + 3);
  for (size_t i = 0; i < data.size(); ++i) data[i] = uint8_t(i * 2654435761u >> 13);
  const std::vector<uint8_t> want = data;
  c->broadcast(data.data(), data.size(), 0);
  EXPECT_TRUE(data == want);
  c->barrier();
  c->barrier();
  EXPECT_EQ(c->bytes_sent(), 0u);
}

TEST(Nccl, MissingDeviceIsAnError) {
  ZOF_REQUIRE_NCCL();
  try {
    zof::dist::make_nccl_single(zof::cuda_device_count());
    FAIL() << "no error";
  } catch (const zof::Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not exist"), std::string::npos) << e.what();
  }
}

TEST(NcclDeathTest, PointToPointNeedsDeviceMemoryAndAnotherRank) {
  ZOF_REQUIRE_NCCL();
  // The child re-runs this test from the start in a fresh process (no fork of a CUDA context).
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto be = zof::make_cuda_backend(0);
  auto c = zof::dist::make_nccl_single(0, kTimeout);
  auto* dev = static_cast<float*>(be->alloc(16 * sizeof(float)));
  std::vector<float> host(16, 1.0f);
  EXPECT_DEATH(c->send(host.data(), 16, 0, 0), "not device memory on cuda:0");
  EXPECT_DEATH(c->send(dev, 16, 0, 0), "rank 0 itself");
  EXPECT_DEATH(c->recv(dev, 16, 0, 0), "rank 0 itself");
  EXPECT_DEATH(c->recv(dev, 16, 1, 0), "outside the job's 1 ranks");
  be->free(dev);
  be->synchronize(nullptr);
  EXPECT_EQ(c->bytes_sent(), 0u);
}

}  // namespace
