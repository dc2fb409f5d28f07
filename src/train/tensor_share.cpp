// A rank's share of a tensor-parallel run (tensor_share.h), and the tensor group over the
// world's ranks that zof eval --tensor-parallel exchanges through too (zof/trainer.h).
#include "train/tensor_share.h"

#include <algorithm>

#include "zof/error.h"
#include "zof/trainer.h"

namespace zof {
namespace {

// The tensor group over the world's ranks (dist::group_all_gather).
class WorldGroup final : public tp::Group {
 public:
  WorldGroup(dist::Communicator& c, std::vector<int> ranks, int me)
      : c_(c), ranks_(std::move(ranks)), me_(me) {}
  int rank() const override { return me_; }
  int size() const override { return (int)ranks_.size(); }
  void all_gather(const void* in, size_t bytes, void* out) override {
    dist::group_all_gather(c_, ranks_, in, bytes, out);
  }

 private:
  dist::Communicator& c_;
  std::vector<int> ranks_;
  int me_;
};

constexpr int kSliceTag = 30001;  // a tensor rank's slice, gathered to rank 0

}  // namespace

std::unique_ptr<tp::Group> make_tensor_group(dist::Communicator& world, const dist::Grid& grid) {
  const int me = grid.tensor_rank(world.rank());
  return std::make_unique<WorldGroup>(world, grid.tensor_group(world.rank()), me);
}

namespace train {

TensorShare::TensorShare(dist::Communicator& world, const dist::Grid& grid, const Model& full)
    : world_(world),
      grid_(grid),
      config_(full.config()),
      plan_(tp::plan(full.config(), grid.tensor_rank(world.rank()), grid.tensor)),
      local_(tp::slice(full, plan_)),
      group_(make_tensor_group(world, grid)) {}

std::vector<std::vector<tp::ElementRun>> TensorShare::element_runs() const {
  std::vector<std::vector<tp::ElementRun>> runs;
  for (int pi = 0; pi < (int)local_.params().size(); ++pi)
    runs.push_back(tp::element_runs(plan_, pi));
  return runs;
}

void TensorShare::gather_to_root(Model& full) { gather_storage_to_root(local_.storage(), full); }

void TensorShare::gather_plane_to_root(const std::vector<float>& mine, std::vector<float>& whole) {
  ZOF_ASSERT((int64_t)mine.size() == local_.storage_size());
  Model full;
  if (world_.rank() == 0) full = Model::zeros(config_);
  gather_storage_to_root(mine.data(), full);
  if (world_.rank() == 0) whole.assign(full.storage(), full.storage() + full.storage_size());
}

std::vector<float> TensorShare::slice_plane(const std::vector<float>& whole) const {
  Model full = Model::zeros(config_);
  ZOF_ASSERT((int64_t)whole.size() == full.storage_size());
  std::copy(whole.begin(), whole.end(), full.storage());
  const Model mine = tp::slice(full, plan_);
  return std::vector<float>(mine.storage(), mine.storage() + mine.storage_size());
}

void TensorShare::gather_storage_to_root(const float* mine, Model& full) {
  const int rank = world_.rank();
  if (grid_.replica(rank) != 0 || grid_.stage(rank) != 0) return;
  const std::vector<int> members = grid_.tensor_group(rank);
  ZOF_ASSERT(members[0] == 0);
  if (rank != 0) {
    world_.send(mine, local_.storage_size(), 0, kSliceTag);
    return;
  }
  tp::place(plan_, mine, full);
  for (int t = 1; t < grid_.tensor; ++t) {
    const tp::Plan p = tp::plan(config_, t, grid_.tensor);
    std::vector<float> slice((size_t)Model::zeros(p.local, false).storage_size());
    world_.recv(slice.data(), (int64_t)slice.size(), members[(size_t)t], kSliceTag);
    tp::place(p, slice.data(), full);
  }
}

}  // namespace train
}  // namespace zof
