// The distributed layer's one small interface: a communicator over the ranks of a job (MPI when
// the binary was started by mpirun and built with MPI, a single process otherwise), and the
// layout of ranks into pipeline stages and data-parallel replicas. ZO needs little from it:
// a few scalars per step (every rank regenerates z from the seed) and, for pipelines, the
// hidden states that cross a stage boundary.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace zof::dist {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Ranks on this node (to share its cores between them).
  virtual int local_size() const = 0;
  virtual std::string name() const = 0;  // "single process", "MPI (Open MPI v4.1.4), 4 ranks"

  // v (n) <- the sum over ranks of every rank's v, added in rank order (gathered to rank 0,
  // summed v_0 + v_1 + ..., broadcast), so every rank gets the same bits, and those bits do not
  // depend on a reduction tree: the same numbers added in the same order as one process would.
  virtual void allreduce_sum_ordered(double* v, int n) = 0;
  // data (bytes) of rank root to every rank.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  // Blocking point-to-point for pipeline activations and weight gathers; n floats. Messages
  // between a pair of ranks with the same tag arrive in the order sent.
  virtual void send(const float* buf, int64_t n, int dest, int tag) = 0;
  virtual void recv(float* buf, int64_t n, int src, int tag) = 0;
  virtual void barrier() = 0;
  // Ends every rank of the job now with exit code `code`, after printing why on this rank.
  [[noreturn]] virtual void abort(int code, const std::string& why) = 0;

  // Payload bytes this rank has sent through the calls above (collectives counted as the
  // messages a gather + broadcast sends: n values from each non-root, n to each non-root).
  uint64_t bytes_sent() const { return bytes_sent_; }

 protected:
  uint64_t bytes_sent_ = 0;
};

// One process, one rank: every collective is the identity; send/recv are errors.
std::unique_ptr<Communicator> make_single_process();

// The job's communicator. Under mpirun (OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK set) and
// built with MPI: MPI_COMM_WORLD, initialised here and finalised when the object is destroyed
// normally (not while an exception unwinds: then the process exits without MPI_Finalize and
// mpirun ends the job). Otherwise a single process; zof::Error when started by mpirun with
// several ranks but built without MPI. timeout_s > 0 starts a watchdog: a call that waits on its
// peers longer than that prints which call and aborts the whole job (MPI_Abort), so that a dead
// or hung rank never leaves the others waiting forever. Only one MPI communicator per process.
std::unique_ptr<Communicator> connect_world(double timeout_s);

// Whether this process was started by an MPI launcher; *world_size gets the job's size from
// the launcher's environment (1 when it does not say).
bool launched_by_mpi(int* world_size = nullptr);
// Whether this binary has the MPI implementation.
bool built_with_mpi();

// Ranks = stages x replicas; rank r is stage r % stages of replica r / stages, so the stages of
// one pipeline are consecutive ranks.
struct Layout {
  int ranks = 1, stages = 1, replicas = 1;
  int stage(int rank) const { return rank % stages; }
  int replica(int rank) const { return rank / stages; }
  int rank_of(int replica, int stage) const { return replica * stages + stage; }
  // zof::Error unless ranks is a positive multiple of stages.
  static Layout make(int ranks, int stages);
};

// Contiguous ranges of the ZO walk's blocks (0 = embedding, 1..L = layers, L+1 = head) for each
// of `stages` stages: the layers split as evenly as counts allow (stage s gets layers
// [s*L/S, (s+1)*L/S)), the embedding with stage 0 and the head with the last stage. Each pair is
// (first, last) inclusive. zof::Error when there are fewer layers than stages.
std::vector<std::pair<int, int>> stage_blocks(int num_layers, int stages);

}  // namespace zof::dist
