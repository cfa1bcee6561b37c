"""The CUDA-core weight-only kernel (cuda/qmv.cu) through quantized_matmul: every M it takes
(1..4) and the routes past it, every mode, both orientations, odd N, K of a single group,
unaligned x rows, blocked scales with a large K. On the GPU each call's route is checked: the
tensor-core kernel (qmma.cu) takes bf16 x with fp weights given transposed, so the cases meant
for qmv use another orientation, affine weights with fp32 scales, unaligned x or float16 x."""

from __future__ import annotations

import numpy as np
import pytest

import qq
import reference as R
from helpers import BF16, DEVICES, FpCfg, assert_matmul_close, dtype_params
from matmul_cases import F32, randn, dev, qmm


QMV_CFGS = [FpCfg("nvfp4"), FpCfg("nvfp4", global_scale=True), FpCfg("mxfp4"), FpCfg("mxfp8"),
            FpCfg("mxfp8", fp8_format="e5m2")]


QMV_AFFINE = [(4, 32), (8, 64), (3, 128), (2, 64), (5, 32), (6, 64)]


def _gpu_route(cfg, transpose, m):
    """The route of a bf16-x call on the GPU (16-byte aligned x and weight rows): qmma for
    fp weights given transposed up to 64 rows but mxfp8 at one row; else qmv up to 4 rows
    (affine with fp32 scales: qmma takes bf16 ones only); else dequantize + GEMM."""
    if isinstance(cfg, FpCfg) and transpose and m <= 64 and not (cfg.mode == "mxfp8" and m == 1):
        return "qmma"
    return "qmv" if m <= 4 else "exact"


def _qmv_case(cfg_or_affine, transpose, n, k, rng, wdtype=F32):
    wf = randn(rng, (n, k) if transpose else (k, n), wdtype, 0.5)
    if isinstance(cfg_or_affine, FpCfg):
        gs = R.amax(wf) if cfg_or_affine.global_scale else None
        return R.quantize(wf, **cfg_or_affine.kwargs(gs))
    bits, g = cfg_or_affine
    return R.quantize(wf, group_size=g, bits=bits)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 7, 8, 9, 16])
@pytest.mark.parametrize("transpose", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("cfg", QMV_CFGS + QMV_AFFINE,
                         ids=[str(c) for c in QMV_CFGS] + [f"affine{b}-g{g}" for b, g in QMV_AFFINE])
def test_qmv_m_sweep(cfg, transpose, m, device, rng):
    """Every M of the small-M path (M tiles 1 and 4 skip their rows past M) and the routes
    past it, N = 200 (not a multiple of any row tile; 256 with transpose=False, where N is
    grouped), K = 640 (wide chunks plus a partial step of the unrolled loop); bf16 x, fp32
    output; on the GPU the route each call takes (_gpu_route)."""
    n, k = 200, 640
    if not transpose:
        n = 256  # groups along N: a multiple of every group size
    ref_q = _qmv_case(cfg, transpose, n, k, rng)
    x = randn(rng, (m, k), BF16)
    got = qmm(device, x, ref_q, transpose, dtype="float32")
    if device == "cuda":
        assert qq.last_route() == _gpu_route(cfg, transpose, m), qq.last_route()
    assert_matmul_close(got, R.quantized_matmul(x, ref_q, transpose=transpose), "qmv m sweep", dtype=F32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("cfg", QMV_CFGS + [(4, 32), (8, 32), (3, 32)], ids=str)
def test_qmv_one_group(cfg, dtype, device, rng):
    """K = one group (16 for nvfp4, 32 otherwise): a row of 8 or 16 (fp4) / 32 (fp8)
    bytes, too short for a whole 16-byte chunk in some modes, so the byte-wise path runs."""
    k = 16 if isinstance(cfg, FpCfg) and cfg.mode == "nvfp4" else 32
    ref_q = _qmv_case(cfg, True, 37, k, rng)
    x = randn(rng, (3, k), dtype)
    got = qmm(device, x, ref_q, True)
    assert_matmul_close(got, R.quantized_matmul(x, ref_q), "qmv K = group", dtype=dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("cfg", [FpCfg("nvfp4", global_scale=True), FpCfg("mxfp8"), (4, 64), (8, 128)],
                         ids=str)
def test_qmv_unaligned_x(cfg, dtype, device, rng):
    """x rows with an odd stride (a column slice of a wider array): the kernel must fall back
    to element loads of x (qmma takes only 16-byte aligned x, so qmv runs every case); out of
    every dtype."""
    m, n, k = 4, 96, 256
    ref_q = _qmv_case(cfg, True, n, k, rng)
    wide = randn(rng, (m, k + 3), dtype)
    x = np.ascontiguousarray(wide[:, 1:k + 1])
    xd = dev(wide, device)[:, 1:k + 1]  # the view itself: row stride k + 3, start 1 element in
    extra = {"fp8_format": ref_q.fp8_format} if ref_q.mode == "mxfp8" else {}
    if ref_q.global_scale is not None:
        extra["global_scale"] = dev(ref_q.global_scale, device)
    got = qq.quantized_matmul(xd, dev(ref_q.data, device), dev(ref_q.scales, device),
                              dev(ref_q.biases, device), group_size=ref_q.group_size, bits=ref_q.bits,
                              mode=ref_q.mode, **extra)
    if device == "cuda":
        assert qq.last_route() == "qmv", qq.last_route()
    assert_matmul_close(got, R.quantized_matmul(x, ref_q), "qmv unaligned x", dtype=dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cfg", [FpCfg("nvfp4", global_scale=True), FpCfg("mxfp4"), FpCfg("mxfp8")], ids=str)
def test_qmv_blocked_large_k(cfg, device, rng):
    """Blocked scales with N = 300 (3 row tiles of 128, the last padded) and K = 4096 (more
    than one step of every thread's chunk loop), M = 1 and 4, float16 x (which the tensor-core
    kernel does not take: qmv runs every case on the GPU)."""
    n, k = 300, 4096
    wf = randn(rng, (n, k), F32)
    gs = R.amax(wf) if cfg.global_scale else None
    ref_q = R.quantize(wf, scale_layout="blocked", **cfg.kwargs(gs))
    for m in (1, 4):
        x = randn(rng, (m, k), np.float16)
        got = qmm(device, x, ref_q, True, dtype="float32")
        if device == "cuda":
            assert qq.last_route() == "qmv", qq.last_route()
        assert_matmul_close(got, R.quantized_matmul(x, ref_q), "qmv blocked", dtype=F32)
