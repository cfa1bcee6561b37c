// cuda/cublaslt_loader.h - cuBLASLt, loaded at run time.
//
// libqq does not link libcublasLt: its types and enums come from cublasLt.h
// at build time, its functions from a table that cublaslt_loader.cpp fills
// once (std::call_once) with dlopen("libcublasLt.so.<major>") and dlsym. So a
// CUDA build of libqq loads, and runs everything that does not need cuBLASLt
// (quantize, dequantize, amax, swizzle, the small-M qmv / qmma matmuls), on a
// machine where cuBLASLt is missing; what needs it (the GEMMs of gemm.cu)
// returns QQ_STATUS_NOT_SUPPORTED with cublaslt_error() as the reason.
//
// dlopen finds the library as the dynamic loader would for libqq itself: a
// copy already loaded into the process under that soname (e.g. preloaded by
// `import qq` through cuda.pathfinder), libqq's RUNPATH (the directory it was
// built against: the nvidia-cublas wheel's, $ORIGIN-relative inside the
// Python wheel), LD_LIBRARY_PATH, the ld.so cache. QQ_CUBLASLT_LIBRARY (an
// environment variable, read once) names a file to load instead.
#ifndef QQ_CUDA_CUBLASLT_LOADER_H_
#define QQ_CUDA_CUBLASLT_LOADER_H_

#include <cublasLt.h>
#include <stddef.h>

// Every cuBLASLt function libqq calls. Add one here to use it.
#define QQ_CUBLASLT_FUNCTIONS(X)            \
  X(cublasLtGetVersion)                     \
  X(cublasLtCreate)                         \
  X(cublasLtDestroy)                        \
  X(cublasLtMatmul)                         \
  X(cublasLtMatmulDescCreate)               \
  X(cublasLtMatmulDescDestroy)              \
  X(cublasLtMatmulDescSetAttribute)         \
  X(cublasLtMatrixLayoutCreate)             \
  X(cublasLtMatrixLayoutDestroy)            \
  X(cublasLtMatrixLayoutSetAttribute)       \
  X(cublasLtMatmulPreferenceCreate)         \
  X(cublasLtMatmulPreferenceDestroy)        \
  X(cublasLtMatmulPreferenceSetAttribute)   \
  X(cublasLtMatmulAlgoGetHeuristic)

namespace qq {
namespace cuda {

// The loaded functions, under their own names: lt_api().cublasLtMatmul(...).
struct CublasLtApi {
#define QQ_CUBLASLT_MEMBER(name) decltype(&::name) name = nullptr;
  QQ_CUBLASLT_FUNCTIONS(QQ_CUBLASLT_MEMBER)
#undef QQ_CUBLASLT_MEMBER
};

// Loads cuBLASLt on the first call (thread-safe; later calls only read the
// result). true when every function of the table was found.
bool cublaslt_load();
// Why cublaslt_load() failed, with how to get the library ("" when loaded).
const char* cublaslt_error();
// cublasLtGetVersion() of the loaded library (e.g. 131000 for 13.10.0), 0
// when not loaded.
size_t cublaslt_version();
// The file the library was loaded from ("" when not loaded).
const char* cublaslt_path();

// The table. Only valid after cublaslt_load() returned true - which holds
// wherever a qqContext has a cuBLASLt handle (create_handle loads it first).
const CublasLtApi& lt_api();

}  // namespace cuda
}  // namespace qq

#endif  // QQ_CUDA_CUBLASLT_LOADER_H_
