"""GPU-only cases of qq.qqmm and qq.quantized_matmul: every dispatch route (the small-M
weight-only kernel, the dequantize + cuBLASLt GEMM path, the Blackwell block-scaled path
forced onto a GPU that refuses it), ragged shapes, streams and threads. The values are
checked against tests/reference.py as in test_matmul.py; the CPU cases live there."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import qq
import reference as R
from helpers import (BF16, FpCfg, assert_matmul_close, cast, dtype_params, poison, to_device, to_numpy,
                     try_import)
from test_matmul import qq_kwargs as qkw
from test_matmul import ref_qqmm

pytestmark = pytest.mark.gpu
F32 = np.float32

CFGS = [FpCfg("nvfp4"), FpCfg("nvfp4", global_scale=True), FpCfg("mxfp4", "ceil"), FpCfg("mxfp4", "floor"),
        FpCfg("mxfp8", "ceil", "e4m3"), FpCfg("mxfp8", "floor", "e5m2")]


def torch_or_skip():
    torch = try_import("torch")
    if torch is None or not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA")
    return torch


def randn(rng, shape, dtype=F32, scale=1.0):
    return cast(rng.standard_normal(shape) * scale, dtype)


def cuda(a):
    return to_device(None if a is None else np.asarray(a), "cuda")


def k_for(cfg, k):
    return k if k % cfg.group_size == 0 else k + cfg.group_size - k % cfg.group_size


# ---------------------------------------------------------------------------
# qqmm
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["linear", "blocked"])
@pytest.mark.parametrize("m", [1, 2, 5, 9, 16, 17, 33, 65])
@pytest.mark.parametrize("cfg", CFGS, ids=str)
def test_qqmm_ragged_stored_weight(cfg, m, layout, rng):
    """A stored (pre-quantized) w and a float x: M <= 16 takes the weight-only kernel on
    q(x), larger M the dequantize + GEMM path; N = 72 and K = 160 (nvfp4: 144) are not
    multiples of a tile."""
    n, k = 72, k_for(cfg, 150)
    x, w = randn(rng, (m, k), BF16), randn(rng, (n, k), BF16)
    gx = R.amax(x) if cfg.global_scale else None
    gw = R.amax(w) if cfg.global_scale else None
    kw = qkw(cfg)
    qw = qq.quantize(cuda(w), global_scale=cuda(gw), scale_layout=layout, **kw)
    got = qq.qqmm(cuda(x), qw, global_scale_x=cuda(gx), **kw)
    assert_matmul_close(got, ref_qqmm(x, w, cfg, gx, gw), f"qqmm m={m} {layout}", dtype=BF16)


@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("m", [1, 33])
@pytest.mark.parametrize("cfg", [FpCfg("nvfp4", global_scale=True), FpCfg("mxfp8")], ids=str)
def test_qqmm_bias_out_poisoned(cfg, m, dtype, rng):
    """bias and a poisoned out= of every dtype on both routes (qmv and GEMM)."""
    n, k = 40, 128
    x, w = randn(rng, (m, k)), randn(rng, (n, k))
    bias = randn(rng, (n,), BF16, 3.0)
    gx = R.amax(x) if cfg.global_scale else None
    gw = R.amax(w) if cfg.global_scale else None
    kw = qkw(cfg)
    qw = qq.quantize(cuda(w), global_scale=cuda(gw), **kw)
    out = cuda(poison((m, n), dtype))
    got = qq.qqmm(cuda(x), qw, global_scale_x=cuda(gx), bias=cuda(bias), out=out, **kw)
    assert got is out
    assert_matmul_close(out, ref_qqmm(x, w, cfg, gx, gw, bias), "qqmm bias out=", dtype=dtype)


def test_qqmm_non_default_stream(rng):
    """Work runs on the stream given (or torch's current one) and is ordered after the
    inputs' producers on that stream."""
    torch = torch_or_skip()
    x, w = randn(rng, (70, 256), BF16), randn(rng, (96, 256), BF16)
    ref = R.qqmm(x, w, "mxfp8")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        xt, wt = cuda(x), cuda(w)
        got = qq.qqmm(xt * 1, wt, mode="mxfp8")  # x produced on s, consumed on s
    s.synchronize()
    assert_matmul_close(got, ref, "qqmm on a side stream", dtype=BF16)
    got = qq.qqmm(xt, wt, mode="mxfp8", stream=s)
    s.synchronize()
    assert_matmul_close(got, ref, "qqmm stream=", dtype=BF16)


def test_qqmm_two_threads_two_streams(rng):
    """Two threads call through the (shared default) handle, each on its own stream,
    with different shapes so the plan cache and the scratch pool see both at once."""
    torch = torch_or_skip()
    cases = []
    for m, n, k in [(64, 96, 256), (48, 80, 512)]:
        x, w = randn(rng, (m, k), BF16), randn(rng, (n, k), BF16)
        cases.append((cuda(x), cuda(w), R.qqmm(x, w, "nvfp4")))
    errors, results = [], [[], []]

    def work(i):
        try:
            s = torch.cuda.Stream()
            xt, wt, _ = cases[i]
            qw = qq.quantize(wt, mode="nvfp4", stream=s)
            for _ in range(25):
                results[i].append(qq.qqmm(xt, qw, stream=s))
            s.synchronize()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i in range(2):
        first = to_numpy(results[i][0])
        assert_matmul_close(first, cases[i][2], f"thread {i}", dtype=BF16)
        for r in results[i][1:]:
            np.testing.assert_array_equal(to_numpy(r).view(np.uint16), first.view(np.uint16))


def test_qqmm_forced_blockscaled_falls_back(rng):
    """The force_blockscaled test hook sends qqmm to the Blackwell cuBLASLt path on any GPU:
    the descriptors are built and, where cuBLASLt refuses (Hopper), the exact path answers
    with the same result. On Blackwell this runs the hardware path itself. (Every refusal
    path: tests/test_route.py.)"""
    torch_or_skip()
    old = qq._qq._set_test_hook("force_blockscaled", 1)
    try:
        for mode in ("nvfp4", "mxfp4", "mxfp8"):
            x = rng.standard_normal((40, 128)).astype(np.float32)
            w = rng.standard_normal((72, 128)).astype(np.float32)
            g = R.amax(x) if mode == "nvfp4" else None
            gw = R.amax(w) if mode == "nvfp4" else None
            qw = qq.quantize(to_device(w, "cuda"), mode=mode, scale_layout="blocked",
                             global_scale=None if gw is None else to_device(np.asarray(gw), "cuda"))
            got = qq.qqmm(to_device(x, "cuda"), qw, mode=mode, dtype="float32",
                          global_scale_x=None if g is None else to_device(np.asarray(g), "cuda"))
            assert_matmul_close(got, R.qqmm(x, w, mode, global_scale_x=g, global_scale_w=gw), mode)
    finally:
        qq._qq._set_test_hook("force_blockscaled", old)


# ---------------------------------------------------------------------------
# quantized_matmul
# ---------------------------------------------------------------------------

QMM_WEIGHTS = [("nvfp4", {}), ("nvfp4-gs", {}), ("mxfp4", {}), ("mxfp8", {}), ("mxfp8-e5m2", {}),
               ("affine4", {"group_size": 64, "bits": 4}), ("affine8", {"group_size": 32, "bits": 8}),
               ("affine3", {"group_size": 128, "bits": 3})]


def make_weight(name, shape, rng, layout="linear"):
    """The reference's quantization of a random weight for one QMM_WEIGHTS entry."""
    wf = randn(rng, shape, F32, 0.5)
    if name.startswith("affine"):
        return R.quantize(wf, **dict(QMM_WEIGHTS)[name])
    mode = name.split("-")[0]
    kw = {"mode": mode}
    if name == "mxfp8-e5m2":
        kw["fp8_format"] = "e5m2"
    if name == "nvfp4-gs":
        kw["global_scale"] = R.amax(wf)
    if layout == "blocked":
        kw["scale_layout"] = "blocked"
    return R.quantize(wf, **kw)


def run_qmm(x, ref_q, transpose=True, **kw):
    extra = {}
    if ref_q.mode == "mxfp8":
        extra["fp8_format"] = ref_q.fp8_format
    if ref_q.global_scale is not None:
        extra["global_scale"] = cuda(ref_q.global_scale)
    if kw.get("bias") is not None:
        kw["bias"] = cuda(kw["bias"])
    return qq.quantized_matmul(cuda(x), cuda(ref_q.data), cuda(ref_q.scales), cuda(ref_q.biases),
                               transpose=transpose, group_size=ref_q.group_size, bits=ref_q.bits,
                               mode=ref_q.mode, scale_layout=ref_q.scale_layout, **extra, **kw)


@pytest.mark.parametrize("transpose", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 67])
@pytest.mark.parametrize("name", [n for n, _ in QMM_WEIGHTS])
def test_qmm_m_sweep(name, m, transpose, rng):
    """Every M from 1 to 9, 16 (the largest weight-only-kernel M), 17 and 67 (the GEMM
    path), K = 384, both orientations, bf16 x. N = 200 (not a tile multiple) with
    transpose=True; 256 with transpose=False, where N is the grouped axis."""
    n, k = (200, 384) if transpose else (256, 384)
    x = randn(rng, (m, k), BF16)
    ref_q = make_weight(name, (n, k) if transpose else (k, n), rng)
    got = run_qmm(x, ref_q, transpose)
    assert_matmul_close(got, R.quantized_matmul(x, ref_q, transpose=transpose), f"qmm {name} m={m}",
                        dtype=BF16)


@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("m", [1, 4, 40])
@pytest.mark.parametrize("name", ["nvfp4-gs", "mxfp8", "affine4"])
def test_qmm_dtypes_one_group_bias(name, m, dtype, rng):
    """x of every dtype, K of a single group, a bias, a poisoned out=."""
    k = 16 if name.startswith("nvfp4") else (64 if name == "affine4" else 32)
    n = 48
    x = randn(rng, (m, k), dtype)
    ref_q = make_weight(name, (n, k), rng)
    bias = randn(rng, (n,), F32, 2.0)
    out = cuda(poison((m, n), dtype))
    got = run_qmm(x, ref_q, bias=bias, out=out)
    assert got is out
    assert_matmul_close(out, R.quantized_matmul(x, ref_q, bias=bias), f"qmm {name} K=1 group", dtype=dtype)


@pytest.mark.parametrize("m", [1, 40])
def test_qmm_blocked_and_batched(m, rng):
    """Blocked scales (N = 130: padding rows) and a batched, broadcast weight."""
    k = 256
    x = randn(rng, (m, k), BF16)
    ref_q = make_weight("nvfp4-gs", (130, k), rng, layout="blocked")
    assert_matmul_close(run_qmm(x, ref_q), R.quantized_matmul(x, ref_q), "qmm blocked", dtype=BF16)
    xb = randn(rng, (2, 1, m, k), BF16)
    wq = R.quantize(randn(rng, (3, 64, k), F32), group_size=64, bits=4)
    got = run_qmm(xb, wq)
    assert tuple(got.shape) == (2, 3, m, 64)
    assert_matmul_close(got, R.quantized_matmul(xb, wq), "qmm batched", dtype=BF16)


def test_qmm_stream(rng):
    torch = torch_or_skip()
    x = randn(rng, (3, 512), BF16)
    ref_q = make_weight("mxfp4", (256, 512), rng)
    s = torch.cuda.Stream()
    got = run_qmm(x, ref_q, stream=s)
    s.synchronize()
    assert_matmul_close(got, R.quantized_matmul(x, ref_q), "qmm stream=", dtype=BF16)


# ---------------------------------------------------------------------------
# the tensor-core weight-only kernel (cuda/qmma.cu: bf16 x, fp modes, M <= 64)
# ---------------------------------------------------------------------------

QMMA_WEIGHTS = ["nvfp4", "nvfp4-gs", "mxfp4", "mxfp8", "mxfp8-e5m2"]


@pytest.mark.parametrize("nk", [(24, 4096), (200, 160), (130, 1056), (16, 16384)],
                         ids=["ksplit", "ragged-chunks", "blocked", "k16384"])
@pytest.mark.parametrize("m", [1, 8, 9, 16, 17, 33, 64])
@pytest.mark.parametrize("name", QMMA_WEIGHTS)
def test_qmma_shapes(name, m, nk, rng):
    """M across every tile of the kernel (8, 16, 32, 64 rows of x), N not a multiple of
    its 16-row tiles, K whose chunks do not fill the last step (160), K split over
    several warps (few rows, long K), blocked scales (N = 130), a poisoned bf16 out."""
    n, k = nk
    x = randn(rng, (m, k), BF16)
    ref_q = make_weight(name, (n, k), rng, layout="blocked" if n == 130 else "linear")
    out = cuda(poison((m, n), BF16))
    got = run_qmm(x, ref_q, out=out)
    assert got is out
    assert_matmul_close(out, R.quantized_matmul(x, ref_q), f"qmma {name} m={m} {nk}", dtype=BF16)


def _raw_weight(name, n, k, rng):
    """Packed codes and scales drawn over whole code spaces (no quantizer involved):
    subnormal and zero elements, both signs, fp8 NaN / Inf codes in row 0 only, and
    extreme scales in rows 1-3 (UE8M0 0 = 2^-127, 254 = 2^127, 255 = NaN; E4M3 NaN)."""
    import types
    mode = name.split("-")[0]
    fp8 = "e5m2" if name.endswith("e5m2") else "e4m3"
    bits, g = (8, 32) if mode == "mxfp8" else (4, 16 if mode == "nvfp4" else 32)
    codes = rng.integers(0, 1 << bits, size=(n, k), dtype=np.uint8)
    if mode == "mxfp8":
        special = (codes & 0x7f) >= (0x7f if fp8 == "e4m3" else 0x7c)
        special[0] = False
        codes[special] &= 0x3f  # finite everywhere but row 0
    if mode == "nvfp4":
        scales = rng.integers(0x08, 0x7f, size=(n, k // g), dtype=np.uint8)  # positive finite E4M3
        scales[3, 0] = 0x7f
    else:
        scales = rng.integers(110, 140, size=(n, k // g), dtype=np.uint8)
        scales[1, :] = 0
        scales[2, 0] = 254
        scales[3, 1] = 255
    data = R.pack(codes, bits)
    gs = np.asarray(3.0e3, F32) if name == "nvfp4-gs" else None
    return types.SimpleNamespace(data=data, scales=scales, biases=None, group_size=g, bits=bits, mode=mode,
                                 global_scale=gs, scale_layout="linear", fp8_format=fp8)


@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("m", [1, 5, 40])
@pytest.mark.parametrize("name", QMMA_WEIGHTS)
def test_qmma_code_space(name, m, out_dtype, rng):
    """Every element code, subnormals, NaN/Inf elements and scales at the ends of their
    range; x with zeros and both signs. NaN/Inf rows must come out NaN/Inf exactly where
    the float64 reference says so."""
    n, k = 40, 256
    ref_q = _raw_weight(name, n, k, rng)
    x = randn(rng, (m, k), BF16)
    x[:, ::7] = 0
    got = run_qmm(x, ref_q, dtype=out_dtype)
    assert_matmul_close(got, R.quantized_matmul(x, ref_q), f"qmma codes {name} m={m}", dtype=np.dtype(
        BF16 if out_dtype == "bfloat16" else F32))


@pytest.mark.parametrize("m", [3, 24])
def test_qmma_batched_bias(m, rng):
    """A 3D weight [B, N, K] with a batch of x, bias, fp32 output."""
    k, n = 512, 72
    x = randn(rng, (2, m, k), BF16)
    wf = randn(rng, (2, n, k), F32)
    ref_q = R.quantize(wf, mode="mxfp8")
    bias = randn(rng, (n,), F32)
    got = run_qmm(x, ref_q, bias=bias, dtype="float32")
    assert_matmul_close(got, R.quantized_matmul(x, ref_q, bias=bias), "qmma batched", dtype=F32)


@pytest.mark.parametrize("m", [1, 16, 64])
@pytest.mark.parametrize("cfg", [FpCfg("nvfp4", global_scale=True), FpCfg("mxfp4"), FpCfg("mxfp8")], ids=str)
def test_qqmm_small_m_route(cfg, m, rng):
    """qqmm with a stored weight and M <= 64 runs the tensor-core weight-only kernel on
    q(x) in bf16 with alpha = gx * gw / 2688^2 on its sums (K = 512: whole chunks, which
    nvfp4's K = 144 above does not give)."""
    n, k = 96, 512
    x, w = randn(rng, (m, k), BF16), randn(rng, (n, k), BF16)
    gx = R.amax(x) if cfg.global_scale else None
    gw = R.amax(w) if cfg.global_scale else None
    kw = qkw(cfg)
    qw = qq.quantize(cuda(w), global_scale=cuda(gw), scale_layout="blocked", **kw)
    got = qq.qqmm(cuda(x), qw, global_scale_x=cuda(gx), dtype="float32", **kw)
    assert_matmul_close(got, ref_qqmm(x, w, cfg, gx, gw), f"qqmm small-M m={m}", dtype=F32)
