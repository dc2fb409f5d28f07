// The NCCL communicator (nccl_comm.cpp), compiled only when zof is built with NCCL
// (-DZOF_NCCL, which needs the CUDA backend). The public factories are in zof/dist.h.
#pragma once
#include <memory>

#include "zof/dist.h"

namespace zof::dist {
#ifdef ZOF_WITH_NCCL
// NCCL over the ranks of *bootstrap on CUDA device `device` (see make_nccl). `owned` is null or
// the bootstrap itself, which the result then keeps alive. The device must exist.
std::unique_ptr<Communicator> make_nccl_comm(Communicator* bootstrap,
                                             std::unique_ptr<Communicator> owned, int device,
                                             double timeout_s);
#endif
}  // namespace zof::dist
