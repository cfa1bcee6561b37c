"""libqq loads cuBLASLt at run time (libqq/src/cuda/cublaslt_loader.cpp; docs/build.md):
libqq.so does not link it, `import qq` works without it, and qq.cuda_info() / `python -m qq`
say whether it loaded and why there is no CUDA device. The no-cuBLASLt cases run in a
subprocess with QQ_CUBLASLT_LIBRARY naming a file that does not exist (the loader then
tries nothing else), so they need no GPU and leave this process's libqq alone."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import qq
from helpers import libqq_path

CUDA_BUILD = qq.build_info()["cuda"]


def test_cuda_info_keys():
    info = qq.cuda_info()
    assert set(info) >= {"cuda_built", "device_count", "device_note", "driver_version", "runtime_version",
                         "cublaslt_loaded", "cublaslt_version", "cublaslt_path", "cublaslt_note"}
    assert info["cuda_built"] == CUDA_BUILD
    assert info["device_count"] == qq.device_count()
    if info["device_count"] == 0:
        assert info["device_note"]  # why there is none
    if not CUDA_BUILD:
        assert "CPU-only" in info["device_note"] and not info["cublaslt_loaded"]
    if info["cublaslt_loaded"]:
        assert info["cublaslt_note"] == "" and info["cublaslt_version"].count(".") == 2
        assert "libcublasLt" in info["cublaslt_path"]
    elif CUDA_BUILD:
        assert "libcublasLt" in info["cublaslt_note"]


@pytest.mark.skipif(shutil.which("readelf") is None, reason="needs readelf")
def test_libqq_does_not_link_cublaslt():
    out = subprocess.run(["readelf", "-d", libqq_path()], capture_output=True, text=True, check=True).stdout
    needed = [line for line in out.splitlines() if "(NEEDED)" in line]
    assert needed and not any("cublas" in line.lower() for line in needed), needed


_CHILD = r"""
import numpy as np
import qq
info = qq.cuda_info()
assert not info["cublaslt_loaded"], info
assert "/nonexistent/libcublasLt.so.13" in info["cublaslt_note"], info
assert "pip install" in info["cublaslt_note"], info
x = np.linspace(-1, 1, 4 * 64, dtype=np.float32).reshape(4, 64)
q = qq.quantize(x, mode="nvfp4")
y = qq.qqmm(x, x, mode="mxfp8")
assert y.shape == (4, 4)
print("ok", info["cublaslt_note"][:60])
"""


@pytest.mark.skipif(not CUDA_BUILD, reason="a CPU-only build never loads cuBLASLt")
def test_import_and_cpu_work_without_cublaslt():
    env = dict(os.environ, QQ_CUBLASLT_LIBRARY="/nonexistent/libcublasLt.so.13")
    r = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-m", "qq", "--no-demo"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "not loaded: cuBLASLt (/nonexistent/libcublasLt.so.13) could not be loaded" in r.stdout, r.stdout


_CHILD_GPU = r"""
import numpy as np
import qq
from qq import _qq
d = _qq._device_empty((256, 512), "float32", 0)
q = qq.quantize(d, mode="nvfp4")              # libqq's own kernel: works
try:
    qq.qqmm(d, d, mode="mxfp8")                  # M = 256: a cuBLASLt GEMM
except qq.NotSupportedError as e:
    assert "libcublasLt" in str(e), e
    print("refused:", e)
else:
    raise AssertionError("qqmm ran without cuBLASLt")
"""


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA_BUILD or qq.device_count() == 0, reason="needs a CUDA build and a GPU")
def test_gpu_without_cublaslt():
    env = dict(os.environ, QQ_CUBLASLT_LIBRARY="/nonexistent/libcublasLt.so.13")
    r = subprocess.run([sys.executable, "-c", _CHILD_GPU], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout + r.stderr


def test_python_m_qq_says_why_no_devices():
    if qq.device_count():
        pytest.skip("a CUDA device is visible")
    r = subprocess.run([sys.executable, "-m", "qq", "--no-demo"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "CUDA devices: 0 - " in r.stdout, r.stdout
