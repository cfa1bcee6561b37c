"""Build-time decisions of libqq that pyproject.toml cannot express statically.

A CUDA build (nvcc found and QQ_CUDA != OFF) needs cuBLASLt: from the CUDA
toolkit when it ships it, else from NVIDIA's `nvidia-cublas` wheel, which is
then a build requirement (its headers: libqq does not link cuBLASLt, it
loads it at run time) and a runtime dependency (the library libqq loads;
`import qq` still works without it, the GEMMs then say it is missing). A
CPU-only build needs neither, so a machine without nvcc never downloads the
~400 MB wheel.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

BASE_DEPENDENCIES = ["numpy>=1.24", "ml_dtypes>=0.3"]


def find_nvcc() -> str | None:
    """The nvcc CMake would find: $CUDACXX, PATH, $CUDA_HOME/$CUDA_PATH, /usr/local/cuda.

    Not cuda.pathfinder's find_nvidia_binary_utility("nvcc"): this must predict what CMake's
    check_language(CUDA) will pick (so that the requirements match the build), and
    pathfinder searches elsewhere (nvidia wheels, conda, CUDA_PATH / CUDA_HOME) and not the
    PATH, which is where CMake looks first. Nor is pathfinder installed at this point."""
    if os.environ.get("QQ_CUDA", "AUTO").upper() == "OFF":
        return None
    cands = [os.environ.get("CUDACXX"), shutil.which("nvcc")]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            cands.append(os.path.join(os.environ[var], "bin", "nvcc"))
    cands.append("/usr/local/cuda/bin/nvcc")
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def cuda_major(nvcc: str) -> int | None:
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"release (\d+)\.(\d+)", out)
    return int(m.group(1)) if m else None


def toolkit_has_cublaslt(nvcc: str) -> bool:
    root = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    inc = [os.path.join(root, "include"), os.path.join(root, "targets", "x86_64-linux", "include")]
    return any(os.path.isfile(os.path.join(d, "cublasLt.h")) for d in inc)


def cuda_requirements() -> list[str]:
    nvcc = find_nvcc()
    if not nvcc:
        return []
    major = cuda_major(nvcc)
    reqs = ["cuda-pathfinder>=1.1"]
    if major is None:
        return reqs
    if not toolkit_has_cublaslt(nvcc) or os.environ.get("QQ_CUBLAS_FROM_WHEEL") == "1":
        reqs.append(f"nvidia-cublas>={major}.0,<{major + 1}" if major >= 13 else f"nvidia-cublas-cu{major}")
    return reqs


# ---- scikit-build-core dynamic-metadata provider interface ------------------
def dynamic_metadata(field: str, settings: dict | None = None):
    if field != "dependencies":
        raise ValueError(f"qq_build provides only 'dependencies', not {field!r}")
    return BASE_DEPENDENCIES + cuda_requirements()


# CUTLASS's headers (NVIDIA's nvidia-cutlass wheel) for the sm90 grouped GEMM of
# grouped_qqmm (libqq/src/cuda/grouped_gemm_sm90.cu): a build requirement only, never a
# runtime one (header-only, compiled into libqq). A build without them still works:
# grouped_qqmm then runs one GEMM per expert (docs/build.md).
CUTLASS_REQUIREMENT = "nvidia-cutlass>=4.2,<5"


def get_requires_for_dynamic_metadata(settings: dict | None = None) -> list[str]:
    # Build requirements of a CUDA build: the cuBLAS wheel's headers (libqq loads the
    # library at run time, it does not link it) and cuda-pathfinder, through which
    # build_support/find_cublas.py finds them; CUTLASS's headers.
    reqs = cuda_requirements()
    return reqs + [CUTLASS_REQUIREMENT] if reqs else reqs
