// The MPI communicator (mpi_comm.cpp), compiled only when zof is built with MPI.
#pragma once
#include <memory>

#include "zof/dist.h"

namespace zof::dist {
#ifdef ZOF_WITH_MPI
// MPI_COMM_WORLD with a watchdog when timeout_s > 0 (see connect_world).
std::unique_ptr<Communicator> make_mpi_world(double timeout_s);
#endif
}  // namespace zof::dist
