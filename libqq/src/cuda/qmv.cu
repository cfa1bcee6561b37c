// cuda/qmv.cu - weight-only matmul for small M (placeholder until the kernel lands).
#include "ops.cuh"

namespace qq {
namespace cuda {

qqStatus_t qmv(const MatmulArgs&, cudaStream_t) { return QQ_STATUS_NOT_SUPPORTED; }

}  // namespace cuda
}  // namespace qq
