// cuda_info.cpp - qqGetCudaInfo (qq.h): the CUDA backend at run time, in
// either build (the backend's part is cuda::cuda_info, runtime.cu or
// cuda_stub.cpp).
#include <string.h>

#include <exception>
#include <new>

#include "internal.h"

// The size of qqCudaInfo_t's first version (libqq 0.1): the smallest
// struct_size accepted. Fields added later go after cublaslt_note; keep this.
static constexpr size_t kCudaInfoFirstSize = offsetof(qqCudaInfo_t, cublaslt_note) + sizeof(const char*);

extern "C" QQ_API qqStatus_t qqGetCudaInfo(qqCudaInfo_t* info) {
  try {
    qq::set_error(QQ_STATUS_SUCCESS, "%s", "");
    if (!info) return qq::set_error(QQ_STATUS_INVALID_VALUE, "qqGetCudaInfo: info must not be NULL");
    if (info->struct_size < kCudaInfoFirstSize)
      return qq::set_error(QQ_STATUS_INVALID_VALUE, "qqGetCudaInfo: info->struct_size is %zu, expected at least %zu; "
                           "set it to sizeof(qqCudaInfo_t)", info->struct_size, kCudaInfoFirstSize);
    qqCudaInfo_t r = {};
    r.struct_size = info->struct_size;
    r.device_note = r.cublaslt_path = r.cublaslt_note = "";
    qq::cuda::cuda_info(&r);
    memcpy(info, &r, info->struct_size < sizeof r ? info->struct_size : sizeof r);
    return QQ_STATUS_SUCCESS;
  } catch (const std::bad_alloc&) {
    return QQ_STATUS_ALLOC_FAILED;
  } catch (...) {
    return QQ_STATUS_INTERNAL_ERROR;
  }
}
