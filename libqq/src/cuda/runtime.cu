// cuda/runtime.cu - device queries, handles, stream-ordered allocation, and
// the CUDA entry points of the operations.
//
// The operation kernels live one family per file under cuda/ (quantize.cu,
// then qmm.cu, qqmm.cu). Until a family has landed, its entry point here
// answers QQ_STATUS_NOT_SUPPORTED with the operation's name - never a wrong
// result.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <mutex>

#include "../internal.h"
#include "common.cuh"
#include "ops.cuh"

struct qqContext {
  int device = 0;
  cublasLtHandle_t lt = nullptr;
  std::mutex mu;  // guards the plan cache and the workspace (used by qqmm)
};

namespace qq {
namespace cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver / no device: report 0, not an error
    return 0;
  }
  return n;
}

static qqStatus_t check_device_id(const char* op, int device) {
  const int n = device_count();
  if (device < 0 || device >= n)
    return set_error(QQ_STATUS_INVALID_VALUE, "%s: device %d does not exist (%d CUDA device%s visible)", op,
                     device, n, n == 1 ? "" : "s");
  return QQ_STATUS_SUCCESS;
}

qqStatus_t device_capability(int device, int* major, int* minor) {
  qqStatus_t st = check_device_id("qqGetDeviceCapability", device);
  if (st) return st;
  QQ_CUDA_TRY(cudaDeviceGetAttribute(major, cudaDevAttrComputeCapabilityMajor, device), "qqGetDeviceCapability");
  QQ_CUDA_TRY(cudaDeviceGetAttribute(minor, cudaDevAttrComputeCapabilityMinor, device), "qqGetDeviceCapability");
  return QQ_STATUS_SUCCESS;
}

qqStatus_t create_handle(qqHandle_t* h, int device) {
  qqStatus_t st = check_device_id("qqCreate", device);
  if (st) return st;
  qqContext* c = new (std::nothrow) qqContext;
  if (!c) return set_error(QQ_STATUS_ALLOC_FAILED, "qqCreate: out of host memory");
  c->device = device;
  int prev = 0;
  cudaGetDevice(&prev);
  cudaSetDevice(device);
  cublasStatus_t cs = cublasLtCreate(&c->lt);
  cudaSetDevice(prev);
  if (cs != CUBLAS_STATUS_SUCCESS) {
    delete c;
    return set_error(QQ_STATUS_CUBLAS_ERROR, "qqCreate: cublasLtCreate failed with status %d", (int)cs);
  }
  *h = c;
  return QQ_STATUS_SUCCESS;
}

qqStatus_t destroy_handle(qqHandle_t h) {
  if (h->lt) cublasLtDestroy(h->lt);
  delete h;
  return QQ_STATUS_SUCCESS;
}

qqStatus_t device_alloc(int device, size_t bytes, void** ptr, void* stream) {
  qqStatus_t st = check_device_id("qqDeviceAlloc", device);
  if (st) return st;
  return on_device(device, [&]() -> qqStatus_t {
    cudaError_t e = cudaMallocAsync(ptr, bytes ? bytes : 1, (cudaStream_t)stream);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return set_error(e == cudaErrorMemoryAllocation ? QQ_STATUS_ALLOC_FAILED : QQ_STATUS_CUDA_ERROR,
                       "qqDeviceAlloc: cudaMallocAsync of %zu bytes on device %d failed: %s", bytes, device,
                       cudaGetErrorString(e));
    }
    return QQ_STATUS_SUCCESS;
  });
}

qqStatus_t device_free(int device, void* ptr, void* stream) {
  return on_device(device, [&]() -> qqStatus_t {
    QQ_CUDA_TRY(cudaFreeAsync(ptr, (cudaStream_t)stream), "qqDeviceFree");
    return QQ_STATUS_SUCCESS;
  });
}

static qqStatus_t not_yet(const char* op) {
  return set_error(QQ_STATUS_NOT_SUPPORTED,
                   "%s: the CUDA backend of this operation has not landed yet; pass CPU tensors (NumPy or "
                   ".cpu()) for now", op);
}

qqStatus_t qqmm(qqHandle_t, const MatmulArgs&, void*) { return not_yet("qqmm"); }
// Small M: the qmv kernels (qmv.cu); larger M has no GPU path yet.
qqStatus_t quantized_matmul(qqHandle_t, const MatmulArgs& a, void* stream) {
  if (a.M <= kQmvMaxM) {
    const qqStatus_t st = on_device(a.x.device, [&]() { return qmv(a, (cudaStream_t)stream); });
    if (st != QQ_STATUS_NOT_SUPPORTED) return st;
  }
  return not_yet("quantized_matmul");
}

}  // namespace cuda
}  // namespace qq
