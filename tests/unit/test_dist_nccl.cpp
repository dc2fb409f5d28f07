// The choice of the NCCL communicator, on any machine: a build without NCCL says so
// (built_with_nccl() is false and the factories throw a zof::Error naming -DZOF_NCCL), a build
// with it and no such GPU throws a zof::Error naming the device, and connect_devices keeps the
// world communicator where NCCL has nothing to carry. The communicator itself is tested on a GPU
// (tests/gpu/test_nccl.cpp).
#include <string>

#include <gtest/gtest.h>

#include "cuda/cuda_backend.h"
#include "zof/dist.h"
#include "zof/error.h"

namespace {

using zof::dist::Communicator;

// Runs f, which must throw a zof::Error whose message holds `part`.
template <class F>
void expect_error(F f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no zof::Error (wanted one saying '" << part << "')";
  } catch (const zof::Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

// A world of two ranks that never talks: enough for connect_devices' choice.
class TwoRanks : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  int local_size() const override { return 2; }
  int local_rank() const override { return 0; }
  std::string name() const override { return "two ranks (test)"; }
  void allreduce_sum_ordered(double*, int) override {}
  void broadcast(void*, size_t, int) override {}
  void send(const float*, int64_t, int, int) override {}
  void recv(float*, int64_t, int, int) override {}
  void barrier() override {}
  [[noreturn]] void abort(int, const std::string& why) override { throw zof::Error(why); }
};

TEST(DistNccl, BuiltWithNcclFollowsTheBuild) {
#ifdef ZOF_WITH_NCCL
  EXPECT_TRUE(zof::dist::built_with_nccl());
#else
  EXPECT_FALSE(zof::dist::built_with_nccl());
#endif
}

TEST(DistNccl, FactoriesSayWhatIsMissing) {
  auto boot = zof::dist::make_single_process();
  const int gpus = zof::cuda_device_count();
  if (!zof::dist::built_with_nccl()) {
    expect_error([] { zof::dist::make_nccl_single(0); }, "-DZOF_NCCL=ON");
    expect_error([&] { zof::dist::make_nccl(*boot, 0, 5); }, "-DZOF_NCCL=ON");
    return;
  }
  const std::string none = "does not exist (" + std::to_string(gpus) + " visible)";
  expect_error([&] { zof::dist::make_nccl_single(gpus); }, none);
  expect_error([&] { zof::dist::make_nccl(*boot, -1); }, none);
}

TEST(DistNccl, ConnectDevicesKeepsTheWorldWhereNcclHasNothingToCarry) {
  // A CPU backend: the world's host-memory communicator.
  auto w = zof::dist::make_single_process();
  const Communicator* world = w.get();
  auto c = zof::dist::connect_devices(std::move(w), false, 0, 0);
  EXPECT_EQ(c.get(), world);
  EXPECT_FALSE(c->buffers_on_device());
  // One rank: nothing crosses ranks, whatever the backend.
  w = zof::dist::make_single_process();
  world = w.get();
  c = zof::dist::connect_devices(std::move(w), true, 0, 0);
  EXPECT_EQ(c.get(), world);
  // Several GPU ranks: NCCL when built with it (here, without a GPU, the device is missing).
  auto two = std::make_unique<TwoRanks>();
  world = two.get();
  if (!zof::dist::built_with_nccl()) {
    c = zof::dist::connect_devices(std::move(two), true, 0, 0);
    EXPECT_EQ(c.get(), world);  // MPI carries host buffers instead
  } else if (zof::cuda_device_count() == 0) {
    expect_error([&] { zof::dist::connect_devices(std::move(two), true, 0, 0); },
                 "does not exist (0 visible)");
  }  // with a GPU, connect_devices would wait for the second rank: tests/gpu covers NCCL
}

}  // namespace
