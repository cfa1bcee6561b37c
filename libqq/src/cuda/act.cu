// cuda/act.cu - qqSwiglu on the GPU: out [..., F] = silu(x[..., :F]) * x[..., F:]
// (act.h's formula, one rounding to the dtype).
//
// Why libqq has it: in a decode step the SwiGLU sits between the gate/up and the down
// matmul. Done as torch's silu and mul it is two kernels that do not take part in
// programmatic dependent launch, so the down projection could not start its weight
// prefetch early and ran ~7 us a layer slower than the other decode matmuls
// (bench/results/qmm-decode-h100-notes.md, session q); eagerly it is four host calls
// (two slices, silu, mul). Here it is one kernel that waits for its input with
// griddepcontrol.wait and, for one row, lets the next kernel launch at once.
//
// One thread per 8 elements (16-byte loads of the gate and the up half, one 16-byte
// store) where every row is 16-byte aligned and F % 8 == 0, else per element. Grid:
// x over a row's chunks, y over rows (a loop past 65535).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>

#include "../act.h"
#include "../internal.h"
#include "common.cuh"
#include "vec.cuh"

namespace qq {
namespace cuda {
namespace {

constexpr int kThreads = 128;

template <typename T> __device__ __forceinline__ void store1(T* p, float v) {
  if constexpr (sizeof(T) == 4) *reinterpret_cast<float*>(p) = v;
  else if constexpr (std::is_same<T, __half>::value) *reinterpret_cast<uint16_t*>(p) = f_to_fp16(v);
  else *reinterpret_cast<uint16_t*>(p) = f_to_bf16(v);
}

template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads) swiglu_kernel(const Mat x, const Mat out, int64_t R, bool early) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");  // x comes from the previous kernel
  if (early) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");  // (else: at exit)
#endif
  const int64_t F = out.cols;
  const int64_t j = ((int64_t)blockIdx.x * kThreads + threadIdx.x) * (kVec ? 8 : 1);
  if (j >= F) return;
  for (int64_t row = blockIdx.y; row < R; row += gridDim.y) {
    const int64_t b = row / x.rows, r = row % x.rows;
    const T* g = x.at<const T>(b, r) + j;
    T* o = out.at<T>(b, r) + j;
    if constexpr (kVec) {
      float gv[8], uv[8];
      load8<T>(g, gv);
      load8<T>(g + F, uv);
#pragma unroll
      for (int i = 0; i < 8; ++i) gv[i] = swiglu_f32(gv[i], uv[i]);
      store8<T>(o, gv);
    } else {
      store1<T>(o, swiglu_f32(load1<T>(g), load1<T>(g + F)));
    }
  }
}

// Whether kernel `k` may be launched for programmatic dependent launch on `device`: only
// where its loaded code is sm_90+, which holds the griddepcontrol.wait; an older PTX
// JIT-compiled on a newer GPU would start before the previous kernel ends and read x
// unfinished. Asked once per device and kernel (bit d of *ok / *no: device d; devices
// past 63 ask every time).
template <typename K>
qqStatus_t pdl_ok(K k, int device, std::atomic<uint64_t>* ok, std::atomic<uint64_t>* no, bool* out) {
  const uint64_t bit = device < 64 ? 1ull << device : 0;
  if (bit && (ok->load(std::memory_order_relaxed) & bit)) return *out = true, QQ_STATUS_SUCCESS;
  if (bit && (no->load(std::memory_order_relaxed) & bit)) return *out = false, QQ_STATUS_SUCCESS;
  cudaFuncAttributes fa{};
  QQ_CUDA_TRY(cudaFuncGetAttributes(&fa, k), "swiglu");
  int major = 0;
  QQ_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "swiglu");
  *out = major >= 9 && fa.ptxVersion >= 90;
  (*out ? ok : no)->fetch_or(bit, std::memory_order_relaxed);
  return QQ_STATUS_SUCCESS;
}

template <typename T, bool kVec>
qqStatus_t launch_v(const Mat& x, const Mat& out, int64_t R, int64_t per, cudaStream_t st) {
  static std::atomic<uint64_t> ok{0}, no{0};
  bool pdl = false;
  QQ_TRY(pdl_ok(swiglu_kernel<T, kVec>, x.device, &ok, &no, &pdl));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)((per + kThreads - 1) / kThreads), (unsigned)(R < 65535 ? R : 65535), 1);
  cfg.blockDim = dim3(kThreads, 1, 1);
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  // The next kernel may launch at once (griddepcontrol.launch_dependents at the start) for
  // one row only. H100, 32-layer decode step, CUDA graph (qmm-decode-h100-notes.md, session
  // s): at 1 token the early start of the down matmul gained 2-3 %; at 4 tokens it lost up to
  // 2 % and at 16 tokens 5-7 % against launching it when this kernel ends.
  const bool early = R == 1;
  QQ_CUDA_TRY(cudaLaunchKernelEx(&cfg, swiglu_kernel<T, kVec>, x, out, R, early), "swiglu");
  return check_launch("swiglu");
}

template <typename T>
qqStatus_t launch(const Mat& x, const Mat& out, cudaStream_t st) {
  const int64_t R = x.batch() * x.rows, F = out.cols;
  if (F % 8 == 0 && aligned(x, 16) && aligned(out, 16)) return launch_v<T, true>(x, out, R, F / 8, st);
  return launch_v<T, false>(x, out, R, F, st);
}

}  // namespace

qqStatus_t swiglu(qqHandle_t, const Mat& x, const Mat& out, void* stream) {
  if (out.cols / kThreads >= 2147483647)
    return set_error(QQ_STATUS_NOT_SUPPORTED, "swiglu: rows of %lld columns are over the GPU kernel's grid; "
                     "split the last axis", (long long)out.cols);
  return on_device(x.device, [&]() -> qqStatus_t {
    const cudaStream_t st = (cudaStream_t)stream;
    switch (x.dt) {
      case DType::F32: return launch<float>(x, out, st);
      case DType::F16: return launch<__half>(x, out, st);
      default: return launch<__nv_bfloat16>(x, out, st);
    }
  });
}

}  // namespace cuda
}  // namespace qq
