// cuda/common.cuh - helpers shared by the CUDA files: error checks and
// running a body with the tensors' device current.
#ifndef QQ_CUDA_COMMON_CUH_
#define QQ_CUDA_COMMON_CUH_

#include "cublaslt_loader.h"  // cuBLASLt types (first: codec.h needs cuda_fp16.h); its functions through lt_api()
#include <cuda_runtime.h>

#include <map>
#include <mutex>

#include "../internal.h"

#define QQ_CUDA_TRY(call, what)                                                     \
  do {                                                                              \
    cudaError_t e_ = (call);                                                        \
    if (e_ != cudaSuccess)                                                          \
      return ::qq::set_error(QQ_STATUS_CUDA_ERROR, "%s: %s failed: %s (%s)", what, #call, \
                             cudaGetErrorName(e_), cudaGetErrorString(e_));         \
  } while (0)

namespace qq {
namespace cuda {
struct GemmKey;
struct GemmPlan;
}  // namespace cuda
}  // namespace qq

// The handle (qq.h's qqHandle_t): one per device. cuBLASLt's handle, the GEMM
// plans (descriptors + the heuristic's algorithm, keyed by shape, types and
// alignment: no heuristic query after the first call of a shape), and a
// stream-ordered memory pool for per-call scratch (dequantized operands,
// cuBLASLt workspace). Scratch is allocated and freed on the caller's stream,
// so calls on different streams never share a buffer; the pool keeps up to
// kPoolKeepBytes cached between calls instead of returning it to the driver.
struct qqContext {
  int device = 0;
  int cc = 0;                      // compute capability, major * 10 + minor
  cublasLtHandle_t lt = nullptr;   // nullptr when cuBLASLt could not be loaded (cublaslt_loader.h)
  cudaMemPool_t pool = nullptr;
  std::mutex mu;                   // guards `plans` and the descriptors inside them
  std::map<qq::cuda::GemmKey, qq::cuda::GemmPlan*>* plans = nullptr;
};

namespace qq {
namespace cuda {

constexpr uint64_t kPoolKeepBytes = 1ull << 30;

// The handle to use for tensors on `device`: `h` itself (it must be bound to
// that device) or the device's default handle, created on first use.
qqStatus_t resolve_handle(const char* op, qqHandle_t h, int device, qqContext** out);

// Stream-ordered scratch from the handle's pool; freed (on the same stream)
// when it goes out of scope.
class Scratch {
 public:
  Scratch(qqContext* c, cudaStream_t st) : c_(c), st_(st) {}
  ~Scratch() {
    for (int i = 0; i < n_; ++i) cudaFreeAsync(p_[i], st_);
  }
  // *out = `bytes` of device memory (256-byte aligned), valid on the stream
  // until this object goes out of scope.
  template <typename T>
  qqStatus_t get(const char* op, size_t bytes, T** out) {
    if (n_ == kMax) return set_error(QQ_STATUS_INTERNAL_ERROR, "%s: too many scratch buffers", op);
    void* p = nullptr;
    const cudaError_t e = cudaMallocFromPoolAsync(&p, bytes ? bytes : 1, c_->pool, st_);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return set_error(e == cudaErrorMemoryAllocation ? QQ_STATUS_ALLOC_FAILED : QQ_STATUS_CUDA_ERROR,
                       "%s: allocating %zu bytes of scratch on device %d failed: %s", op, bytes, c_->device,
                       cudaGetErrorString(e));
    }
    p_[n_++] = p;
    *out = static_cast<T*>(p);
    return QQ_STATUS_SUCCESS;
  }

 private:
  static constexpr int kMax = 8;
  qqContext* c_;
  cudaStream_t st_;
  void* p_[kMax] = {};
  int n_ = 0;
};

// Number of SMs of CUDA device `device` (runtime.cu), cached per device id:
// for launch heuristics that size a grid to fill the device the call runs on.
int sm_count(int device);

// NOT_SUPPORTED, naming `op` and `what` it does on the host, where `stream` is being captured
// into a CUDA graph (runtime.cu): for the calls that wait on the host. Made before any work is
// queued, so the capture stays valid; waiting inside it would fail in CUDA and invalidate it.
qqStatus_t refuse_if_captured(const char* op, void* stream, const char* what);

// Copies `bytes` (0: none) from device `src` to host `dst` on `stream`, then waits for the
// stream on the host (runtime.cu), in relaxed capture mode: for a stream refuse_if_captured
// passed, while this thread may be capturing another.
qqStatus_t wait_on_host(const char* op, void* stream, void* dst, const void* src, size_t bytes);

// Status of the last launch (configuration errors surface here; faults inside
// a kernel surface at the caller's next synchronization, as with any CUDA op).
inline qqStatus_t check_launch(const char* op) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return set_error(QQ_STATUS_CUDA_ERROR, "%s: kernel launch failed: %s (%s)", op, cudaGetErrorName(e),
                     cudaGetErrorString(e));
  return QQ_STATUS_SUCCESS;
}

// Vector loads and stores need aligned rows: start, row stride and batch
// strides multiples of `align` bytes.
inline bool aligned(const Mat& m, int align) {
  const int es = dtype_size(m.dt);
  bool ok = ((uintptr_t)m.ptr % align) == 0 && (m.ld * es) % align == 0;
  for (int i = 0; i < m.nb; ++i) ok = ok && (m.bstride[i] * es) % align == 0;
  return ok;
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
