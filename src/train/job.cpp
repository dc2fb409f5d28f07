// The ranks of a training job (job.h). Under mpirun every rank runs the same loop; one ordered
// reduction of 2q + 3 doubles per step (the loss sums, the token counts, a stop flag) leaves
// every rank with the same projected gradients, hence the same weights, without moving a
// gradient or a weight.
#include "train/job.h"

#include "train/tensor_share.h"
#include "zof/error.h"
#include "zof/model.h"

namespace zof::train {
namespace {
constexpr int kWeightsTag = 30000;  // pipeline stages' blocks gathered to rank 0

// The job's grid; without tensor groups in Layout's words (the refusals users have seen).
dist::Grid grid_of(int ranks, int stages, int tensor) {
  if (tensor > 1) {
    const std::string t = std::to_string(tensor);
    ZOF_CHECK(stages > 1 || ranks % tensor == 0,
              "--tensor-parallel " + t + " splits the model over " + t + " ranks, and this job "
              "has " + std::to_string(ranks) + "; start it with mpirun -np " + t + " (or a "
              "multiple of " + t + ": the tensor groups are then data-parallel replicas)");
    return dist::Grid::make(ranks, stages, tensor);
  }
  const dist::Layout l = dist::Layout::make(ranks, stages);
  return dist::Grid{l.ranks, l.stages, 1, l.replicas};
}
}  // namespace

Job::Job(dist::Communicator& c, int pipeline_stages, int tensor_parallel)
    : comm(c),
      grid(grid_of(c.size(), pipeline_stages, tensor_parallel)),
      layout{grid.ranks, grid.stages, grid.replicas},
      rank(c.rank()),
      stage(grid.stage(rank)),
      replica(grid.replica(rank)),
      tensor_rank(grid.tensor_rank(rank)),
      root(rank == 0),
      last_stage(stage == layout.stages - 1) {}

void Job::check_batch(const TrainOptions& opt) const {
  ZOF_CHECK(opt.batch >= (int64_t)layout.replicas * opt.micro_batches,
            "--batch " + std::to_string(opt.batch) + " is split across " +
                std::to_string(layout.replicas) + " data-parallel replicas (" +
                std::string(grid.tensor > 1 ? "ranks / (stages x tensor)" : "ranks / stages") +
                ") and " +
                std::to_string(opt.micro_batches) + " micro-batches each, so it needs at least " +
                std::to_string((int64_t)layout.replicas * opt.micro_batches) +
                " examples; raise --batch or use fewer ranks");
}

void Job::wire_pipeline(ZOEngine& engine, int num_layers) {
  ranges_ = dist::stage_blocks(num_layers, layout.stages);
  if (layout.stages == 1) return;
  if (grid.tensor > 1) {  // the engine updates its stage's blocks; it walks nothing
    // (the tensor-parallel forward carries the hidden states: TensorShare::wire)
    StageIO none;
    none.recv = [](int, float*, int64_t) { ZOF_ASSERT(!"a tensor-parallel engine walks"); };
    none.send = [](int, const float*, int64_t) { ZOF_ASSERT(!"a tensor-parallel engine walks"); };
    engine.set_stage(ranges_[stage].first, ranges_[stage].second, std::move(none));
    return;
  }
  StageIO io;
  const int prev = rank - 1, next = rank + 1;
  dist::Communicator* c = &comm;
  if (stage > 0) io.recv = [c, prev](int s, float* h, int64_t n) { c->recv(h, n, prev, s); };
  if (!last_stage)
    io.send = [c, next](int s, const float* h, int64_t n) { c->send(h, n, next, s); };
  engine.set_stage(ranges_[stage].first, ranges_[stage].second, std::move(io));
}

void Job::set_tensor_share(TensorShare* share, Forward* full) {
  ZOF_ASSERT(share && (full != nullptr) == root);
  share_ = share;
  full_ = full;
}

void Job::gather_state(ZOEngine& engine, std::vector<float>& m, std::vector<float>& v) {
  if (!share_) {
    if (root) engine.read_state(m, v);
    return;
  }
  std::vector<float> mm, vv;
  engine.read_state(mm, vv);
  share_->gather_plane_to_root(mm, m);
  if (!vv.empty()) share_->gather_plane_to_root(vv, v);
}

Forward& Job::eval_forward(ZOEngine& engine) { return full_ ? *full_ : engine.forward(); }

void Job::gather_weights(ZOEngine& engine, Model& model) {
  engine.flush();
  if (share_) {
    share_->gather_to_root(model);
    if (full_) full_->weights_changed();
    return;
  }
  if (layout.stages == 1 || replica != 0) return;
  const auto& blocks = model.blocks();
  for (int s = 1; s < layout.stages; ++s) {
    const Block &b0 = blocks[ranges_[s].first], &b1 = blocks[ranges_[s].second];
    const int64_t n = b1.offset + b1.span - b0.offset;
    if (rank == s) comm.send(model.storage() + b0.offset, n, 0, kWeightsTag);
    if (root) comm.recv(model.storage() + b0.offset, n, s, kWeightsTag);
  }
  engine.forward().weights_changed();  // the other stages' blocks arrived in the model
}

bool Job::reduce_step(int q, QueryLosses& ql, double& tokens, bool stop) {
  std::vector<double> red(2 * q + 3, 0.0);
  if (last_stage && tensor_rank == 0) {  // a tensor group's ranks hold the same sums
    for (int j = 0; j < q; ++j) {
      red[j] = ql.sum_plus[j];
      red[q + j] = ql.sum_minus[j];
    }
    red[2 * q] = ql.count;
    red[2 * q + 1] = tokens;
  }
  red[2 * q + 2] = stop ? 1.0 : 0.0;
  comm.allreduce_sum_ordered(red.data(), (int)red.size());
  for (int j = 0; j < q; ++j) {
    ql.sum_plus[j] = red[j];
    ql.sum_minus[j] = red[q + j];
  }
  ql.count = red[2 * q];
  tokens = red[2 * q + 1];
  return red[2 * q + 2] > 0;
}

std::string Job::describe(int threads) const {
  if (comm.size() == 1) return "";
  return "; " + comm.name() + ": " +
         (grid.tensor > 1 ? std::to_string(grid.tensor) + " tensor-parallel rank(s) x " : "") +
         std::to_string(layout.stages) + " pipeline stage(s) x " +
         std::to_string(layout.replicas) + " data-parallel replica(s), " +
         std::to_string(threads) + " thread(s) each";
}

}  // namespace zof::train
