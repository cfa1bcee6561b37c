// cuda/runtime.cu - device queries, handles, stream-ordered allocation and
// the host copies of the CUDA backend.
//
// The operations are not here: each entry point of internal.h lives with its
// kernels, one family per file under cuda/ (the list: ops.cuh).
#include "cublaslt_loader.h"  // first, where cublasLt.h was: codec.h needs cuda_fp16.h
#include <cuda_runtime.h>

#include <stdlib.h>

#include <atomic>
#include <mutex>
#include <string>

#include "../internal.h"
#include "common.cuh"
#include "ops.cuh"

namespace qq {
namespace cuda {

// Runs `body` with this thread's stream-capture mode relaxed, then restores the mode: for
// calls that are no stream work and so no part of any graph (a free, a handle's creation),
// which CUDA refuses in the global and thread-local modes while a stream is captured,
// invalidating that capture.
template <typename F>
qqStatus_t outside_capture(const char* op, F body) {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  QQ_CUDA_TRY(cudaThreadExchangeStreamCaptureMode(&mode), op);
  const qqStatus_t st = body();
  QQ_CUDA_TRY(cudaThreadExchangeStreamCaptureMode(&mode), op);
  return st;
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver / no device: report 0, not an error
    return 0;
  }
  return n;
}

// Asked once per device id and cached: the launch heuristics of qmv.cu and
// qmma.cu call this on every product, and a process may drive several
// devices of different sizes (a static in each launcher would keep the SM
// count of whichever device ran first). Two threads racing on the first call
// both query and store the same value, so a relaxed atomic is enough. Device
// ids past the cache (or a failed query) are answered without caching; a
// failed query answers 132, the H100 SXM the launch heuristics were tuned on.
int sm_count(int device) {
  constexpr int kCached = 64;  // as many as resolve_handle keeps default handles for
  static std::atomic<int> cache[kCached];  // 0: not asked yet (zero-initialized static storage)
  const bool cacheable = device >= 0 && device < kCached;
  if (cacheable) {
    const int v = cache[device].load(std::memory_order_relaxed);
    if (v > 0) return v;
  }
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms <= 0) {
    (void)cudaGetLastError();  // the heuristics only need a plausible size; the launch itself reports errors
    return 132;
  }
  if (cacheable) cache[device].store(sms, std::memory_order_relaxed);
  return sms;
}

// Why cudaGetDeviceCount gave no device (qqGetCudaInfo's device_note).
static std::string device_note(cudaError_t e, int n, int driver) {
  const auto ver = [](int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
  const char* vis = getenv("CUDA_VISIBLE_DEVICES");
  const std::string visible =
      vis ? std::string(" (CUDA_VISIBLE_DEVICES=\"") + vis + "\" hides the others)" : std::string();
  if (e == cudaSuccess)
    return n > 0 ? std::string() : "the NVIDIA driver (CUDA " + ver(driver) + ") sees no GPU" + visible;
  if (driver == 0)
    return std::string("no NVIDIA driver: libcuda.so.1 could not be loaded (") + cudaGetErrorName(e) +
           "); install the NVIDIA driver, or in a container give it the GPUs (e.g. docker run --gpus all)";
  if (e == cudaErrorInsufficientDriver)
    return "the NVIDIA driver supports CUDA " + ver(driver) + ", older than the CUDA " + ver(CUDART_VERSION) +
           " runtime libqq was built with; update the driver";
  if (e == cudaErrorNoDevice) return "the NVIDIA driver (CUDA " + ver(driver) + ") sees no GPU" + visible;
  return std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

void cuda_info(qqCudaInfo_t* info) {
  static std::once_flag once;
  static std::string note;
  static int count = 0, driver = 0, runtime = 0;
  std::call_once(once, [] {
    if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
    if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) runtime = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) count = 0;
    (void)cudaGetLastError();
    note = device_note(e, count, driver);
  });
  info->cuda_built = 1;
  info->device_count = count;
  info->device_note = note.c_str();
  info->driver_version = driver;
  info->runtime_version = runtime;
  info->cublaslt_loaded = cublaslt_load() ? 1 : 0;
  info->cublaslt_version = cublaslt_version();
  info->cublaslt_path = cublaslt_path();
  info->cublaslt_note = cublaslt_error();
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

// The handle's cuBLASLt handle and memory pool.
static qqStatus_t init_handle(qqContext* c) {
  // Without cuBLASLt the handle has none (lt stays nullptr): the operations that need
  // it say so (gemm.cu), the others run.
  if (cublaslt_load()) {
    const cublasStatus_t cs = lt_api().cublasLtCreate(&c->lt);
    if (cs != CUBLAS_STATUS_SUCCESS)
      return set_error(QQ_STATUS_CUBLAS_ERROR, "qqCreate: cublasLtCreate failed with status %d", (int)cs);
  }
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = c->device;
  QQ_CUDA_TRY(cudaMemPoolCreate(&c->pool, &props), "qqCreate");
  uint64_t keep = kPoolKeepBytes;
  QQ_CUDA_TRY(cudaMemPoolSetAttribute(c->pool, cudaMemPoolAttrReleaseThreshold, &keep), "qqCreate");
  return QQ_STATUS_SUCCESS;
}

qqStatus_t create_handle(qqHandle_t* h, int device) {
  qqStatus_t st = check_device_id("qqCreate", device);
  if (st) return st;
  qqContext* c = new (std::nothrow) qqContext;
  if (!c) return set_error(QQ_STATUS_ALLOC_FAILED, "qqCreate: out of host memory");
  c->device = device;
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  c->cc = major * 10 + minor;
  // A default handle is made by the first call that needs one, which may be inside a capture
  // (torch.cuda.graph around a model's first qq call): there cudaMemPoolCreate was refused
  // and the capture invalidated (bench/tune/capture_first_call_where.py, session ay).
  st = outside_capture("qqCreate", [&]() { return on_device(device, [&]() { return init_handle(c); }); });
  if (st) {
    destroy_handle(c);
    return st;
  }
  *h = c;
  return QQ_STATUS_SUCCESS;
}

qqStatus_t destroy_handle(qqHandle_t h) {
  destroy_plans(h);
  if (h->lt) lt_api().cublasLtDestroy(h->lt);
  if (h->pool) cudaMemPoolDestroy(h->pool);
  delete h;
  return QQ_STATUS_SUCCESS;
}

// Default handles, one per device, created on first use and kept for the
// life of the process (destroying cuBLASLt handles from an exit handler can
// race the CUDA runtime's own teardown).
qqStatus_t resolve_handle(const char* op, qqHandle_t h, int device, qqContext** out) {
  if (h) {
    if (h->device != device)
      return set_error(QQ_STATUS_INVALID_VALUE, "%s: the handle is bound to device %d but the tensors are on "
                       "device %d; pass a handle created for device %d, or NULL", op, h->device, device, device);
    *out = h;
    return QQ_STATUS_SUCCESS;
  }
  constexpr int kMaxDevices = 64;
  static std::mutex mu;
  static qqContext* defaults[kMaxDevices] = {};
  if (device < 0 || device >= kMaxDevices)
    return set_error(QQ_STATUS_NOT_SUPPORTED, "%s: device %d is beyond the %d devices with default handles; "
                     "pass a handle from qqCreate", op, device, kMaxDevices);
  std::lock_guard<std::mutex> lock(mu);
  if (!defaults[device]) QQ_TRY(create_handle(&defaults[device], device));
  *out = defaults[device];
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

qqStatus_t refuse_if_captured(const char* op, void* stream, const char* what) {
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  QQ_CUDA_TRY(cudaStreamIsCapturing((cudaStream_t)stream, &cs), op);
  if (cs != cudaStreamCaptureStatusNone)
    return set_error(QQ_STATUS_NOT_SUPPORTED, "%s: %s, which cannot be done while the stream is being captured "
                     "into a CUDA graph; call it outside the capture (docs/api.md, CUDA graphs)", op, what);
  return QQ_STATUS_SUCCESS;
}

qqStatus_t wait_on_host(const char* op, void* stream, void* dst, const void* src, size_t bytes) {
  // `stream` is not captured (the caller refused that), but another stream may be: torch
  // captures in global mode, where a host wait is a prohibited call and invalidates that
  // capture though it is no part of it (bench/tune/capture_sync_probe.py, session az).
  return outside_capture(op, [&]() -> qqStatus_t {
    if (bytes) QQ_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, (cudaStream_t)stream), op);
    QQ_CUDA_TRY(cudaStreamSynchronize((cudaStream_t)stream), op);
    return QQ_STATUS_SUCCESS;
  });
}

qqStatus_t copy_to_host(int device, const void* src, size_t bytes, void* dst, void* stream) {
  return on_device(device, [&]() -> qqStatus_t {
    QQ_TRY(refuse_if_captured("grouped_qqmm", stream, "the group offsets are read on the host"));
    return wait_on_host("grouped_qqmm", stream, dst, src, bytes);
  });
}

qqStatus_t stream_synchronize(int device, void* stream) {
  return on_device(device, [&]() -> qqStatus_t {
    QQ_TRY(refuse_if_captured("qqStreamSynchronize", stream, "it waits on the host for the stream's work"));
    return wait_on_host("qqStreamSynchronize", stream, nullptr, nullptr, 0);
  });
}

qqStatus_t device_free(int device, void* ptr, void* stream) {
  return on_device(device, [&]() -> qqStatus_t {
    // A binding frees its buffers whenever their owner is dropped: Python's garbage collector
    // can do that while this thread captures a CUDA graph on another stream (torch's default
    // capture mode is global). There the free is a prohibited call and invalidated the
    // capture (bench/tune/capture_gc_probe.py, session ax); it is not part of the capture.
    return outside_capture("qqDeviceFree", [&]() -> qqStatus_t {
      QQ_CUDA_TRY(cudaFreeAsync(ptr, (cudaStream_t)stream), "qqDeviceFree");
      return QQ_STATUS_SUCCESS;
    });
  });
}

}  // namespace cuda
}  // namespace qq
