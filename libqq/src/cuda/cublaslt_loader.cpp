// cuda/cublaslt_loader.cpp - loads cuBLASLt with dlopen / dlsym, once
// (cublaslt_loader.h says why and where it looks).
#ifndef _GNU_SOURCE
#define _GNU_SOURCE  // dlinfo, RTLD_DI_LINKMAP
#endif
#include "cublaslt_loader.h"

#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>

#include <mutex>
#include <string>

#define QQ_LT_STR_(x) #x
#define QQ_LT_STR(x) QQ_LT_STR_(x)

namespace qq {
namespace cuda {
namespace {

// The soname of the major version libqq was compiled against: a different
// major is a different ABI.
constexpr const char* kSoname = "libcublasLt.so." QQ_LT_STR(CUBLAS_VER_MAJOR);

struct Loaded {
  CublasLtApi api;
  bool ok = false;
  size_t version = 0;
  std::string path;
  std::string error;
};

Loaded& state() {
  static Loaded s;  // never destroyed before the process's end; the library is never closed
  return s;
}

std::string how_to_get() {
  return std::string("; the GPU operations that need cuBLASLt (qqmm and quantized_matmul through a GEMM) are "
                     "unavailable, the others (quantize, dequantize, amax, swiglu, swizzle_scales, small-M "
                     "quantized_matmul) still run. Install it with `pip install 'nvidia-cublas>=") +
         QQ_LT_STR(CUBLAS_VER_MAJOR) + ",<" + std::to_string(CUBLAS_VER_MAJOR + 1) +
         "'` (found by `import qq` through cuda.pathfinder, or put its nvidia/cu" QQ_LT_STR(CUBLAS_VER_MAJOR) "/lib on "
         "LD_LIBRARY_PATH) or with the CUDA toolkit's cuBLAS";
}

void load(Loaded& s) {
  const char* env = getenv("QQ_CUBLASLT_LIBRARY");
  const bool from_env = env && *env;
  const char* name = from_env ? env : kSoname;
  dlerror();
  void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    s.error = std::string("cuBLASLt (") + name + ") could not be loaded: " + (e ? e : "unknown dlopen error") +
              (from_env ? " (named by QQ_CUBLASLT_LIBRARY)" : "") + how_to_get();
    return;
  }
  std::string missing;
#define QQ_CUBLASLT_RESOLVE(fn)                                          \
  s.api.fn = reinterpret_cast<decltype(s.api.fn)>(dlsym(h, #fn));       \
  if (!s.api.fn) missing += std::string(missing.empty() ? "" : ", ") + #fn;
  QQ_CUBLASLT_FUNCTIONS(QQ_CUBLASLT_RESOLVE)
#undef QQ_CUBLASLT_RESOLVE
  struct link_map* lm = nullptr;
  if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && *lm->l_name) s.path = lm->l_name;
  else s.path = name;
  if (char* real = realpath(s.path.c_str(), nullptr)) {  // $ORIGIN/../../nvidia/... -> a plain path
    s.path = real;
    free(real);
  }
  if (!missing.empty()) {
    s.error = "cuBLASLt (" + s.path + ") lacks functions libqq needs: " + missing +
              "; it is older than or different from the cuBLASLt " QQ_LT_STR(CUBLAS_VER_MAJOR) ".x libqq was built against" +
              how_to_get();
    s.path.clear();
    s.api = CublasLtApi{};
    return;  // the handle stays open: closing a library that may be in use elsewhere in the process gains nothing
  }
  s.version = s.api.cublasLtGetVersion();
  if (s.version / 10000 != (size_t)CUBLAS_VER_MAJOR) {
    s.error = "cuBLASLt (" + s.path + ") is version " + std::to_string(s.version / 10000) + "." +
              std::to_string(s.version / 100 % 100) + "." + std::to_string(s.version % 100) +
              ", but libqq was built against " QQ_LT_STR(CUBLAS_VER_MAJOR) ".x (another major version has another "
              "ABI)" + how_to_get();
    s.path.clear();
    s.version = 0;
    s.api = CublasLtApi{};
    return;
  }
  s.ok = true;
}

}  // namespace

bool cublaslt_load() {
  static std::once_flag once;
  Loaded& s = state();
  std::call_once(once, [&] { load(s); });
  return s.ok;
}

const char* cublaslt_error() {
  cublaslt_load();
  return state().error.c_str();
}

size_t cublaslt_version() { return cublaslt_load() ? state().version : 0; }

const char* cublaslt_path() {
  cublaslt_load();
  return state().path.c_str();
}

const CublasLtApi& lt_api() { return state().api; }

}  // namespace cuda
}  // namespace qq
