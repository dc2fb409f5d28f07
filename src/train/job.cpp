// The ranks of a training job (job.h). Under mpirun every rank runs the same loop; one ordered
// reduction of 2q + 3 doubles per step (the loss sums, the token counts, a stop flag) leaves
// every rank with the same projected gradients, hence the same weights, without moving a
// gradient or a weight.
#include "train/job.h"

#include "zof/error.h"
#include "zof/model.h"

namespace zof::train {
namespace {
constexpr int kWeightsTag = 30000;  // pipeline stages' blocks gathered to rank 0
}

Job::Job(dist::Communicator& c, int pipeline_stages)
    : comm(c),
      layout(dist::Layout::make(c.size(), pipeline_stages)),
      rank(c.rank()),
      stage(layout.stage(rank)),
      replica(layout.replica(rank)),
      root(rank == 0),
      last_stage(stage == layout.stages - 1) {}

void Job::check_batch(const TrainOptions& opt) const {
  ZOF_CHECK(opt.batch >= (int64_t)layout.replicas * opt.micro_batches,
            "--batch " + std::to_string(opt.batch) + " is split across " +
                std::to_string(layout.replicas) + " data-parallel replicas (ranks / stages) and " +
                std::to_string(opt.micro_batches) + " micro-batches each, so it needs at least " +
                std::to_string((int64_t)layout.replicas * opt.micro_batches) +
                " examples; raise --batch or use fewer ranks");
}

void Job::wire_pipeline(ZOEngine& engine, int num_layers) {
  ranges_ = dist::stage_blocks(num_layers, layout.stages);
  if (layout.stages == 1) return;
  StageIO io;
  const int prev = rank - 1, next = rank + 1;
  dist::Communicator* c = &comm;
  if (stage > 0) io.recv = [c, prev](int s, float* h, int64_t n) { c->recv(h, n, prev, s); };
  if (!last_stage)
    io.send = [c, next](int s, const float* h, int64_t n) { c->send(h, n, next, s); };
  engine.set_stage(ranges_[stage].first, ranges_[stage].second, std::move(io));
}

void Job::gather_weights(ZOEngine& engine, Model& model) {
  engine.flush();
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
  if (last_stage) {
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
  return "; " + comm.name() + ": " + std::to_string(layout.stages) + " pipeline stage(s) x " +
         std::to_string(layout.replicas) + " data-parallel replica(s), " +
         std::to_string(threads) + " thread(s) each";
}

}  // namespace zof::train
