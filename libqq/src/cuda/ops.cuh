// cuda/ops.cuh - entry points one CUDA file offers another.
//
// runtime.cu answers the public operations; it calls into the kernel
// families declared here. All take the caller's stream and never
// synchronize with the host.
#ifndef QQ_CUDA_OPS_CUH_
#define QQ_CUDA_OPS_CUH_

#include <cuda_runtime.h>

#include "../internal.h"

namespace qq {
namespace cuda {

// qmv.cu - weight-only matmul for small M: out = x @ dequant(w)^T (+ bias),
// reading each packed weight byte once. Covers every mode, x/out dtype,
// transpose both ways, batch broadcasting and bias for M <= kQmvMaxM.
// Returns QQ_STATUS_NOT_SUPPORTED (without an error message) for a case it
// does not cover, so the caller can pick another path.
constexpr int kQmvMaxM = 16;
qqStatus_t qmv(const MatmulArgs& a, cudaStream_t stream);

}  // namespace cuda
}  // namespace qq

#endif  // QQ_CUDA_OPS_CUH_
