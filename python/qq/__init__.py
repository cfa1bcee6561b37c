"""qq: block-scaled low-precision matrix math (NVFP4, MXFP4, MXFP8, affine integer).

A thin layer over libqq's C ABI: NumPy arrays and DLPack tensors (torch, CuPy, JAX) in,
results in the caller's framework out. The API is documented in docs/api.md.
"""


def _preload_cublaslt():
    """Load cuBLASLt (the nvidia-cublas wheel's, or wherever cuda.pathfinder finds it)
    before libqq needs it.

    libqq does not link cuBLASLt: its CUDA backend loads libcublasLt.so.<major> with dlopen
    when it first makes a handle, and finds this already loaded copy by its soname. That
    is one way; libqq's RUNPATH (the wheel's directory) and the system's library path are
    the others. So a failure here is recorded (qq.build_info()["cublaslt_preload"],
    `python -m qq`) and otherwise ignored, and `import qq` works without cuBLASLt: the
    operations that need it then raise NotSupportedError saying so (qq.cuda_info()). It is
    tried before libqq is loaded, when we cannot yet know whether the build has CUDA.
    """
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib
        load_nvidia_dynamic_lib("cublasLt")
    except Exception as e:      # noqa: BLE001 - any failure only means "not preloaded"
        return f"{type(e).__name__}: {e}"
    return "ok"


_CUBLASLT_PRELOAD = _preload_cublaslt()

from . import _qq  # noqa: E402  (after the preload, which must come first)
from ._qq import (  # noqa: E402
    DecodeWeight,
    NotSupportedError,
    PreparedWeight,
    QQError,
    QuantizedArray,
    __version__,
    cuda_info,
    device_capability,
    device_count,
    last_route,
)
# Python wrappers of the Cython functions that torch.compile can trace (qq/_dispatch.py).
from ._dispatch import (  # noqa: E402
    amax,
    dequantize,
    gather_qmm,
    grouped_qqmm,
    grouped_qqmm_wgrad,
    prepare_decode,
    prepare_weight,
    qqmm,
    quantize,
    quantize_colwise,
    quantize_dequantize,
    quantize_dequantize_moe,
    quantize_moe,
    quantized_matmul,
    quantized_matmul_swiglu,
    swiglu,
    swizzle_scales,
    unswizzle_scales,
)
from . import checkpoint  # noqa: E402  (safetensors files; imports safetensors only when used)


def build_info():
    """How the loaded libqq was built: version (str), cuda (bool), cuda_version (str),
    archs (list of str), cublaslt (int), cublaslt_source (where the build took cuBLASLt's
    headers: path, toolkit or wheel; empty without CUDA) and cublaslt_preload ("ok", the
    reason the preload failed, or a note that a CPU-only build does not need it)."""
    info = _qq.build_info()
    if not info["cuda"] and _CUBLASLT_PRELOAD != "ok":
        info["cublaslt_preload"] = f"not needed (CPU-only build); {_CUBLASLT_PRELOAD}"
    else:
        info["cublaslt_preload"] = _CUBLASLT_PRELOAD
    return info


def cmake_prefix_path():
    """The prefix to give CMake (CMAKE_PREFIX_PATH) so that a C/C++ project finds the
    installed libqq with find_package(qq): its lib/cmake/qq holds qqConfig.cmake."""
    import os
    return os.path.dirname(os.path.abspath(_qq.__file__))


__all__ = [
    "NotSupportedError",
    "DecodeWeight",
    "PreparedWeight",
    "QQError",
    "QuantizedArray",
    "__version__",
    "amax",
    "checkpoint",
    "build_info",
    "cuda_info",
    "dequantize",
    "device_capability",
    "device_count",
    "grouped_qqmm",
    "grouped_qqmm_wgrad",
    "last_route",
    "prepare_decode",
    "prepare_weight",
    "qqmm",
    "quantize",
    "quantize_colwise",
    "quantize_dequantize",
    "quantize_dequantize_moe",
    "quantize_moe",
    "quantized_matmul",
    "quantized_matmul_swiglu",
    "gather_qmm",
    "cmake_prefix_path",
    "swiglu",
    "swizzle_scales",
    "unswizzle_scales",
]
