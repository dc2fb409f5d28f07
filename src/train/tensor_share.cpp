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

constexpr int kSliceTag = 30001;   // a tensor rank's slice, gathered to rank 0
constexpr int kHiddenTag = 30002;  // a stage's hidden states, to the next stage's same tensor rank

}  // namespace

std::unique_ptr<tp::Group> make_tensor_group(dist::Communicator& world, const dist::Grid& grid) {
  const int me = grid.tensor_rank(world.rank());
  return std::make_unique<WorldGroup>(world, grid.tensor_group(world.rank()), me);
}

namespace train {

TensorShare::TensorShare(dist::Communicator& world, const dist::Grid& grid, const Model& full)
    : world_(world),
      grid_(grid),
      stage_(grid.stage(world.rank())),
      config_(full.config()),
      stage_blocks_(dist::stage_blocks((int)full.config().num_layers, grid.stages)),
      plan_(tp::plan(full.config(), grid.tensor_rank(world.rank()), grid.tensor)),
      local_(tp::slice(full, plan_)),
      group_(make_tensor_group(world, grid)) {
  for (const auto& [first, last] : stage_blocks_) {
    std::vector<int> ps;
    for (int b = first; b <= last; ++b)
      for (int pi : full.blocks()[(size_t)b].params) ps.push_back(pi);
    stage_params_.push_back(std::move(ps));
  }
  walk_params_ = stage_params_[(size_t)stage_];
  if (stage_ > 0 && stage_ == grid.stages - 1 && full.config().tie_embeddings)
    for (int pi : full.blocks()[0].params) walk_params_.push_back(pi);
}

void TensorShare::wire(tp::TensorForward& fwd) {
  const auto [first, last] = stage_blocks_[(size_t)stage_];
  const int me = world_.rank(), T = grid_.tensor;
  dist::Communicator* c = &world_;
  tp::TensorForward::Recv recv;
  tp::TensorForward::Send send;
  if (stage_ > 0) recv = [c, me, T](float* h, int64_t n) { c->recv(h, n, me - T, kHiddenTag); };
  if (stage_ < grid_.stages - 1)
    send = [c, me, T](const float* h, int64_t n) { c->send(h, n, me + T, kHiddenTag); };
  fwd.set_stage(first, last, std::move(recv), std::move(send));
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
  if (grid_.replica(rank) != 0) return;
  // Stage s's blocks in a slice's storage: one contiguous span.
  auto span = [&](const Model& layout, int s) {
    const auto& blocks = layout.blocks();
    const Block &b0 = blocks[(size_t)stage_blocks_[(size_t)s].first],
                &b1 = blocks[(size_t)stage_blocks_[(size_t)s].second];
    return std::pair<int64_t, int64_t>{b0.offset, b1.offset + b1.span - b0.offset};
  };
  if (rank != 0) {
    const auto [off, n] = span(local_, stage_);
    world_.send(mine + off, n, 0, kSliceTag);
    return;
  }
  const int T = grid_.tensor;
  for (int s = 0; s < grid_.stages; ++s)
    for (int t = 0; t < T; ++t) {
      const int from = s * T + t;  // replica 0's rank of (stage s, tensor rank t)
      if (from == 0) {
        tp::place(plan_, mine, full, &stage_params_[0]);
        continue;
      }
      const tp::Plan p = tp::plan(config_, t, T);
      const Model layout = Model::zeros(p.local, false);
      const auto [off, n] = span(layout, s);
      std::vector<float> slice((size_t)layout.storage_size(), 0.f);
      world_.recv(slice.data() + off, n, from, kSliceTag);
      tp::place(p, slice.data(), full, &stage_params_[(size_t)s]);
    }
}

}  // namespace train
}  // namespace zof
