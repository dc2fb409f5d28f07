// The distributed layer's one small interface: a communicator over the ranks of a job (MPI when
// the binary was started by mpirun and built with MPI, a single process otherwise; NCCL over
// either when the ranks drive GPUs), and the layout of ranks into pipeline stages and
// data-parallel replicas. ZO needs little from it:
// a few scalars per step (every rank regenerates z from the seed) and, for pipelines, the
// hidden states that cross a stage boundary.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
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
  // Ranks on this node (to share its cores between them), and this rank's index among them (to
  // pick a GPU).
  virtual int local_size() const = 0;
  virtual int local_rank() const = 0;
  virtual std::string name() const = 0;  // "single process", "MPI (Open MPI v4.1.4), 4 ranks"

  // v (n) <- the sum over ranks of every rank's v, added in rank order (gathered to rank 0,
  // summed v_0 + v_1 + ..., broadcast), so every rank gets the same bits, and those bits do not
  // depend on a reduction tree: the same numbers added in the same order as one process would.
  virtual void allreduce_sum_ordered(double* v, int n) = 0;
  // data (bytes) of rank root to every rank.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  // Blocking point-to-point for pipeline activations and weight gathers; n floats. Messages
  // between a pair of ranks with the same tag arrive in the order sent. buf is host memory,
  // except on a communicator whose buffers_on_device() is true (NCCL: see make_nccl).
  virtual void send(const float* buf, int64_t n, int dest, int tag) = 0;
  virtual void recv(float* buf, int64_t n, int src, int tag) = 0;
  // Whether send/recv take device memory on this rank's GPU (NCCL) rather than host memory
  // (MPI, single process). allreduce_sum_ordered and broadcast take host memory everywhere.
  virtual bool buffers_on_device() const { return false; }
  virtual void barrier() = 0;
  // Work rank 0 does alone while the others wait for it (the held-out evaluation, writing a
  // checkpoint): rank 0 runs fn, the others return when it has finished. While it works, rank 0
  // sends a heartbeat every quarter of the watchdog's timeout, so that the waiting ranks'
  // watchdog (--dist-timeout) stops the job only when rank 0 has gone silent, not when its work
  // takes long. An exception from fn reaches rank 0's caller, and the others get a zof::Error
  // saying rank 0 failed in `what`.
  virtual void run_on_root(const char* what, const std::function<void()>& fn) {
    (void)what;
    if (rank() == 0) fn();
  }
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

// ---- GPU ranks: NCCL ----
// Whether this binary has the NCCL communicator (-DZOF_NCCL=AUTO|ON|OFF; needs the CUDA backend).
bool built_with_nccl();

// The communicator over NCCL between the ranks of `bootstrap` (MPI, or a single process), each
// rank on CUDA device `device`, one rank per GPU. Every rank of bootstrap calls it; rank 0 makes
// the ncclUniqueId and broadcasts it through bootstrap, which must outlive the result: abort()
// and the failures below end the job through it (MPI_Abort under MPI). Unlike MPI:
//  - send/recv take DEVICE memory on `device` (pipeline activations stay on the GPU; a host
//    pointer aborts). Both run on the communicator's own stream, unordered with the caller's
//    streams: a send's buffer must have been written by work that has finished, and a recv's
//    buffer must no longer be read by pending work (synchronize the streams that touch it
//    first); recv returns with the data in buf. Tags are not carried (NCCL has none):
//    messages between two ranks match in the order both issue them, as the pipeline walk does,
//    with equal counts on both sides. A send/recv with the rank itself aborts (blocking, it
//    would wait for ever), so a one-rank NCCL communicator has no point-to-point.
//  - allreduce_sum_ordered and broadcast take HOST memory, as with MPI, staged through a device
//    buffer. The reduction is an ncclAllGather of the n values, then every rank adds them in
//    rank order on the host: the same bits as MPI and one process (ncclAllReduce adds in ring or
//    tree order). bytes_sent counts as MPI's gather + broadcast does (not NCCL's ring traffic),
//    so the per-step numbers do not depend on the transport. barrier is a one-value all-reduce.
//  - timeout_s > 0: the NCCL communicator is non-blocking and every call polls it, so a call
//    (creation and teardown included) that waits on its peers longer than that, or an error
//    NCCL notices (a peer lost), prints which call and ends the job (exit 3 / 2). The
//    ncclUniqueId broadcast runs under bootstrap's own timeout; errors between calls show at
//    the next call; nothing is watched while this rank is not in a call.
// zof::Error when this binary has no NCCL (the message names -DZOF_NCCL) or `device` is not a
// visible CUDA device.
std::unique_ptr<Communicator> make_nccl(Communicator& bootstrap, int device, double timeout_s = 0);
// make_nccl over make_single_process(), which the result owns: one process, one GPU. Every
// collective goes through NCCL (and is the identity); send/recv abort (there is no other rank).
std::unique_ptr<Communicator> make_nccl_single(int device, double timeout_s = 0);

// The communicator for a job whose ranks drive GPUs: NCCL over `world` (which the result then
// owns) when this binary has NCCL, cuda_backend is true and the job has more than one rank,
// each rank on CUDA device `device` (the caller's choice: its rank on the node, say); `world`
// itself otherwise. buffers_on_device() says which memory send/recv then take.
// Not used yet: the CUDA backend cannot run the trainer (the forward keeps activations in host
// buffers), so the runtime (src/runtime, for the trainer) calls connect_world. Once the forward
// runs on the device, it calls connect_devices(connect_world(timeout), true, local rank, timeout)
// and hands the pipeline's send/recv device buffers.
std::unique_ptr<Communicator> connect_devices(std::unique_ptr<Communicator> world,
                                              bool cuda_backend, int device, double timeout_s);

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

// The 3-D grid: ranks = replicas x stages x tensor, the tensor group innermost (consecutive
// ranks: the same node, the closest links), then the stages of one pipeline, then the replicas.
// Rank r is tensor rank r % tensor of stage (r / tensor) % stages of replica
// r / (tensor * stages). With tensor = 1 it is Layout's.
struct Grid {
  int ranks = 1, stages = 1, tensor = 1, replicas = 1;
  int tensor_rank(int rank) const { return rank % tensor; }
  int stage(int rank) const { return rank / tensor % stages; }
  int replica(int rank) const { return rank / (tensor * stages); }
  // The world ranks of rank's tensor group, tensor rank 0 first.
  std::vector<int> tensor_group(int rank) const;
  // zof::Error unless ranks is a positive multiple of stages x tensor: one line naming
  // --pipeline-stages and --tensor-parallel, the rank count and the fix.
  static Grid make(int ranks, int stages, int tensor);
};

// out (ranks.size() * bytes) <- the `bytes` of every member of `ranks` (world ranks, this one
// among them, the same list in the same order on every member), the first member's first.
// Over send/recv: the members send to the first, which sends the whole back to each, so the
// bytes are the same on every member whatever the timing. bytes_sent counts them.
void group_all_gather(Communicator& c, const std::vector<int>& ranks, const void* in,
                      size_t bytes, void* out);

// Contiguous ranges of the ZO walk's blocks (0 = embedding, 1..L = layers, L+1 = head) for each
// of `stages` stages: the layers split as evenly as counts allow (stage s gets layers
// [s*L/S, (s+1)*L/S)), the embedding with stage 0 and the head with the last stage. Each pair is
// (first, last) inclusive. zof::Error when there are fewer layers than stages.
std::vector<std::pair<int, int>> stage_blocks(int num_layers, int stages);

}  // namespace zof::dist
