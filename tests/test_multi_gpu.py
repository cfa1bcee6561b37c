"""Tensors on a GPU other than device 0 (issue: qqmm on the GPU). Skipped unless two CUDA
devices are visible (run on a 2-GPU machine by `scripts/gpu_session.sh build multi`).

Every call gets its arrays on cuda:1 while torch's current device stays cuda:0: libqq must
switch to the arrays' device for its kernels, scratch and cuBLASLt handle, and use the
stream torch has current on that device. Results are checked against the NumPy reference,
and quantize bit for bit against the CPU backend.
"""

from __future__ import annotations

import numpy as np
import pytest

import qq
import reference as R
from helpers import (BF16, as_bytes, assert_bits_equal, assert_matmul_close, check_quantize, numpy_to_torch,
                     qq_quantize, raises, to_numpy, try_import)

pytestmark = pytest.mark.gpu
F32 = np.float32


@pytest.fixture(scope="module")
def torch():
    t = try_import("torch")
    if t is None or not t.cuda.is_available() or t.cuda.device_count() < 2 or qq.device_count() < 2:
        pytest.skip("needs two CUDA devices and torch")
    return t


def on1(torch, a):
    return None if a is None else numpy_to_torch(np.asarray(a), torch).to("cuda:1")


def randn(rng, shape, dtype=F32):
    return rng.standard_normal(shape).astype(F32).astype(dtype)


@pytest.mark.parametrize("mode", ["nvfp4", "mxfp8", "affine"])
def test_quantize_on_device1(torch, mode, rng):
    """Bit for bit the CPU backend's result (itself checked against the reference)."""
    x = randn(rng, (96, 256), BF16)
    gs = R.amax(x) if mode == "nvfp4" else None
    cpu = check_quantize(x, "cpu", mode=mode, global_scale=gs)
    cpu = qq_quantize(x, "cpu", mode=mode, global_scale=gs)
    got = qq.quantize(on1(torch, x), mode=mode, global_scale=on1(torch, gs))
    assert got.data.device == torch.device("cuda:1")
    assert_bits_equal(as_bytes(got.data), as_bytes(cpu.data), f"{mode} data cuda:1 vs CPU")
    if mode == "affine":
        assert_bits_equal(got.scales, cpu.scales, "scales cuda:1 vs CPU")
        assert_bits_equal(got.biases, cpu.biases, "biases cuda:1 vs CPU")
    else:
        assert_bits_equal(as_bytes(got.scales), as_bytes(cpu.scales), f"{mode} scales cuda:1 vs CPU")


@pytest.mark.parametrize("m", [1, 16, 130])
@pytest.mark.parametrize("mode", ["nvfp4", "mxfp4", "mxfp8"])
def test_qqmm_on_device1(torch, mode, m, rng):
    """Small M (weight-only kernels) and the GEMM path, w stored and float."""
    n, k = 96, 512
    x, w = randn(rng, (m, k), BF16), randn(rng, (n, k), BF16)
    gx = R.amax(x) if mode == "nvfp4" else None
    gw = R.amax(w) if mode == "nvfp4" else None
    ref = R.qqmm(x, w, mode, global_scale_x=gx, global_scale_w=gw)
    qw = qq.quantize(on1(torch, w), mode=mode, global_scale=on1(torch, gw), scale_layout="blocked")
    got = qq.qqmm(on1(torch, x), qw, mode=mode, global_scale_x=on1(torch, gx), dtype="float32")
    assert got.device == torch.device("cuda:1")
    assert_matmul_close(got, ref, f"qqmm cuda:1 {mode} m={m}")
    got = qq.qqmm(on1(torch, x), on1(torch, w), mode=mode, global_scale_x=on1(torch, gx),
                  global_scale_w=on1(torch, gw), dtype="float32")
    assert_matmul_close(got, ref, f"qqmm cuda:1 float w {mode} m={m}")


@pytest.mark.parametrize("m", [1, 8, 200])
def test_quantized_matmul_on_device1(torch, m, rng):
    k, n = 256, 80
    x = randn(rng, (m, k), BF16)
    ref_q = R.quantize(randn(rng, (n, k)), mode="mxfp4")
    got = qq.quantized_matmul(on1(torch, x), on1(torch, ref_q.data), on1(torch, ref_q.scales), mode="mxfp4")
    assert got.device == torch.device("cuda:1")
    assert_matmul_close(got, R.quantized_matmul(x, ref_q), f"qmm cuda:1 m={m}", dtype=BF16)


def test_grouped_on_device1(torch, rng):
    sizes = [5, 0, 40, 1]
    x = randn(rng, (sum(sizes), 128), BF16)
    w = randn(rng, (len(sizes), 64, 128), BF16)
    offsets = np.cumsum(sizes).astype(np.int32)
    got = to_numpy(qq.grouped_qqmm(on1(torch, x), on1(torch, w), on1(torch, offsets), mode="mxfp8",
                                   dtype="float32"))
    start = 0
    for e, s in enumerate(sizes):
        if s:
            assert_matmul_close(got[start:start + s], R.qqmm(x[start:start + s], w[e], "mxfp8"),
                                f"grouped cuda:1 expert {e}")
        start += s


def test_device_mismatch_is_an_error(torch, rng):
    """x on cuda:0 and w on cuda:1: a ValueError naming the devices, no kernel launched."""
    x = numpy_to_torch(randn(rng, (4, 128), BF16), torch).to("cuda:0")
    w = on1(torch, randn(rng, (32, 128), BF16))
    raises(ValueError, ("device", "devices", "w"), qq.qqmm, x, w, mode="mxfp8")
