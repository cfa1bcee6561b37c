// cuda/common.cuh - helpers shared by the CUDA files: error checks and
// running a body with the tensors' device current.
#ifndef QQ_CUDA_COMMON_CUH_
#define QQ_CUDA_COMMON_CUH_

#include <cuda_runtime.h>

#include "../internal.h"

#define QQ_TRY(expr)                          \
  do {                                        \
    qqStatus_t st_ = (expr);                  \
    if (st_ != QQ_STATUS_SUCCESS) return st_; \
  } while (0)

#define QQ_CUDA_TRY(call, what)                                                     \
  do {                                                                              \
    cudaError_t e_ = (call);                                                        \
    if (e_ != cudaSuccess)                                                          \
      return ::qq::set_error(QQ_STATUS_CUDA_ERROR, "%s: %s failed: %s (%s)", what, #call, \
                             cudaGetErrorName(e_), cudaGetErrorString(e_));         \
  } while (0)

namespace qq {
namespace cuda {

// Status of the last launch (configuration errors surface here; faults inside
// a kernel surface at the caller's next synchronization, as with any CUDA op).
inline qqStatus_t check_launch(const char* op) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return set_error(QQ_STATUS_CUDA_ERROR, "%s: kernel launch failed: %s (%s)", op, cudaGetErrorName(e),
                     cudaGetErrorString(e));
  return QQ_STATUS_SUCCESS;
}

// Runs `body` with `device` current and restores the caller's device after.
template <typename F>
inline qqStatus_t on_device(int device, F body) {
  int prev = 0;
  cudaGetDevice(&prev);
  if (prev != device) cudaSetDevice(device);
  const qqStatus_t st = body();
  if (prev != device) cudaSetDevice(prev);
  return st;
}

}  // namespace cuda
}  // namespace qq

#endif  // QQ_CUDA_COMMON_CUH_
