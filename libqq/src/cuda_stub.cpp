// cuda_stub.cpp - the CUDA entry points of a CPU-only build (no nvcc found,
// or QQ_CUDA=OFF). Every one says so plainly; none pretends to work.
#include "internal.h"

namespace qq {
namespace cuda {
namespace {
qqStatus_t no_cuda(const char* op) {
  return set_error(QQ_STATUS_NOT_SUPPORTED,
                   "%s: this libqq was built without CUDA (CPU-only build), so CUDA tensors cannot be used; "
                   "pass CPU tensors, or reinstall on a machine with the CUDA toolkit (nvcc) to get the GPU "
                   "backend", op);
}
}  // namespace

int device_count() { return 0; }
qqStatus_t device_capability(int, int*, int*) { return no_cuda("qqGetDeviceCapability"); }
qqStatus_t create_handle(qqHandle_t*, int) { return no_cuda("qqCreate"); }
qqStatus_t destroy_handle(qqHandle_t) { return no_cuda("qqDestroy"); }
qqStatus_t device_alloc(int, size_t, void**, void*) { return no_cuda("qqDeviceAlloc"); }
qqStatus_t device_free(int, void*, void*) { return no_cuda("qqDeviceFree"); }
qqStatus_t stream_synchronize(int, void*) { return no_cuda("qqStreamSynchronize"); }
qqStatus_t copy_to_host(int, const void*, size_t, void*, void*) { return no_cuda("grouped_qqmm"); }
qqStatus_t quantize(qqHandle_t, const QuantizeArgs&, void*) { return no_cuda("quantize"); }
qqStatus_t quantize_colwise(qqHandle_t, const ColwiseArgs&, void*) { return no_cuda("quantize_colwise"); }
qqStatus_t dequantize(qqHandle_t, const DequantizeArgs&, void*) { return no_cuda("dequantize"); }
qqStatus_t swizzle(qqHandle_t, const Mat&, const Mat&, bool, void*) { return no_cuda("swizzle_scales"); }
qqStatus_t amax(qqHandle_t, const Mat&, float*, void*) { return no_cuda("amax"); }
qqStatus_t swiglu(qqHandle_t, const Mat&, const Mat&, void*) { return no_cuda("swiglu"); }
qqStatus_t qqmm(qqHandle_t, const MatmulArgs&, void*) { return no_cuda("qqmm"); }
qqStatus_t quantize_dequantize(qqHandle_t, const QdqArgs&, void*) { return no_cuda("quantize_dequantize"); }
qqStatus_t grouped_qqmm_wgrad(qqHandle_t, const WgradArgs&, void*) { return no_cuda("grouped_qqmm_wgrad"); }
qqStatus_t grouped_qqmm(qqHandle_t, const MatmulArgs&, int64_t, const int32_t*, int64_t, void*, bool* taken) {
  *taken = false;
  return no_cuda("grouped_qqmm");
}
qqStatus_t quantized_matmul(qqHandle_t, const MatmulArgs&, void*) { return no_cuda("quantized_matmul"); }
qqStatus_t to_decode_layout(qqHandle_t, const DecodeLayoutArgs&, void*) { return no_cuda("to_decode_layout"); }
qqStatus_t decode_matmul(qqHandle_t, const DecodeMatmulArgs&, void*) { return no_cuda("decode_matmul"); }

void cuda_info(qqCudaInfo_t* info) {
  info->cuda_built = 0;
  info->device_count = 0;
  info->device_note = "this libqq was built without CUDA (CPU-only build: no nvcc was found, or QQ_CUDA=OFF); "
                      "reinstall on a machine with the CUDA toolkit (nvcc) to get the GPU backend";
  info->cublaslt_loaded = 0;
  info->cublaslt_version = 0;
  info->cublaslt_path = "";
  info->cublaslt_note = "not used: CPU-only build";
}

}  // namespace cuda
}  // namespace qq
