// The CUDA entry points of a build without the CUDA backend (ZOF_CUDA=OFF or no nvcc): no
// devices, and a message that says how to get the backend.
#include "cuda/cuda_backend.h"
#include "zof/error.h"

namespace zof {

namespace {
const char* kNoCuda =
    "this zof was built without the CUDA backend (no nvcc found, or -DZOF_CUDA=OFF); rebuild "
    "with the CUDA toolkit installed and -DZOF_CUDA=ON";
}

int cuda_device_count() { return 0; }
CudaDeviceInfo cuda_device_info(int) { throw Error(kNoCuda); }
std::unique_ptr<CudaBackend> make_cuda_backend(int, bool) { throw Error(kNoCuda); }

}  // namespace zof
