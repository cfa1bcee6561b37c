"""qq.qqmm (both operands quantized, y = alpha * q(x) @ q(w).T + bias) and
qq.quantized_matmul (weight-only, y = x @ W.T or x @ W, W = dequantize(w)).

The reference computes the exact result in float64 from the quantized operands; a correct
fp32-accumulating GEMM lies within 1e-5 * sum|a_i b_i| of it, plus the alpha/bias
roundings and one ulp of the output dtype (reference.matmul_mismatch). A wrong code,
scale, group or transpose moves the answer by far more than that."""

from __future__ import annotations

import numpy as np
import pytest

import qq
import reference as R
from helpers import (BF16, DEVICES, DTYPES, FpCfg, assert_matmul_close, cast, dtype_params, poison, raises,
                     to_device, to_numpy)

F32 = np.float32

QQMM_CFGS = [FpCfg("nvfp4"), FpCfg("nvfp4", global_scale=True), FpCfg("mxfp4", "ceil"),
             FpCfg("mxfp4", "floor"), FpCfg("mxfp8", "ceil", "e4m3"), FpCfg("mxfp8", "floor", "e5m2")]
QQMM_PARAMS = [pytest.param(c, id=str(c)) for c in QQMM_CFGS]


def randn(rng, shape, dtype=F32, scale=1.0):
    return cast(rng.standard_normal(shape) * scale, dtype)


def dev(a, device):
    return to_device(None if a is None else np.asarray(a), device)


def qq_kwargs(cfg: FpCfg):
    kw = {"mode": cfg.mode}
    if cfg.mode != "nvfp4":
        kw["rounding"] = cfg.rounding
    if cfg.mode == "mxfp8":
        kw["fp8_format"] = cfg.fp8_format
    return kw


def ref_qqmm(x, w, cfg: FpCfg, gx=None, gw=None, bias=None):
    return R.qqmm(x, w, cfg.mode, global_scale_x=gx, global_scale_w=gw, bias=bias,
                  rounding=cfg.rounding, fp8_format=cfg.fp8_format)


# ---------------------------------------------------------------------------
# qqmm
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [1, 3, 130])
@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("cfg", QQMM_PARAMS)
def test_qqmm_float_operands(cfg, dtype, m, device, rng):
    """x [M, K] and w [N, K] float, both quantized on the fly (with the rounding and fp8
    format asked for); nvfp4 global scales give alpha = gx * gw / 2688^2. The output has
    x's dtype. M = 1 and 3 take the small-M path, 130 the GEMM path."""
    n, k = 48, 256
    x, w = randn(rng, (m, k), dtype), randn(rng, (n, k), dtype)
    gx = R.amax(x) if cfg.global_scale else None
    gw = R.amax(w) if cfg.global_scale else None
    got = qq.qqmm(dev(x, device), dev(w, device), global_scale_x=dev(gx, device),
                  global_scale_w=dev(gw, device), **qq_kwargs(cfg))
    assert_matmul_close(got, ref_qqmm(x, w, cfg, gx, gw), "qqmm", dtype=dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_qqmm_known_answers(device):
    """Rows of ones: mxfp8 codes 1.0 exactly, so q(x) @ q(w).T = K = 32. nvfp4 with
    gx = 2688 (enc 1: s = E4M3(1/6) = 0.171875, element 6 -> 1.03125) and gw = 5376
    (enc 0.5: s = 0.0859375, element 6 -> 0.515625), alpha = 2:
    32 * 1.03125 * 0.515625 * 2 = 34.03125, plus bias [1, 2, 3]."""
    x, w = np.ones((2, 32), F32), np.ones((3, 32), F32)
    got = to_numpy(qq.qqmm(dev(x, device), dev(w, device), mode="mxfp8", dtype="float32"))
    assert got.dtype == F32 and (got == 32).all()
    got = to_numpy(qq.qqmm(dev(x, device), dev(w, device), mode="nvfp4",
                           global_scale_x=dev(np.array(2688, F32), device),
                           global_scale_w=dev(np.array(5376, F32), device),
                           bias=dev(np.array([1, 2, 3], F32), device), dtype="float32"))
    np.testing.assert_array_equal(got, np.tile(np.array([35.03125, 36.03125, 37.03125], F32), (2, 1)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cfg", QQMM_PARAMS)
def test_qqmm_prequantized(cfg, device, rng):
    """Pre-quantized operands: QuantizedArrays from qq.quantize for both, and raw packed
    data + scales made by the reference (w with `scales`, x with `x_scales`). With a packed
    x the output defaults to bfloat16."""
    m, n, k = 40, 24, 128
    x, w = randn(rng, (m, k), BF16), randn(rng, (n, k), BF16)
    gx = R.amax(x) if cfg.global_scale else None
    gw = R.amax(w) if cfg.global_scale else None
    ref = ref_qqmm(x, w, cfg, gx, gw)
    qkw = qq_kwargs(cfg)
    qx = qq.quantize(dev(x, device), global_scale=dev(gx, device), **qkw)
    qw = qq.quantize(dev(w, device), global_scale=dev(gw, device), **qkw)
    assert_matmul_close(qq.qqmm(qx, qw), ref, "qqmm(QuantizedArray, QuantizedArray)", dtype=BF16)
    # float x, stored weights: the common inference case
    got = qq.qqmm(dev(x, device), qw, global_scale_x=dev(gx, device), **qkw)
    assert_matmul_close(got, ref, "qqmm(float x, QuantizedArray w)", dtype=BF16)
    # packed bytes from the reference, scales passed separately
    rx = R.quantize(x, global_scale=gx, **cfg.kwargs())
    rw = R.quantize(w, global_scale=gw, **cfg.kwargs())
    qkw.pop("rounding", None)
    got = qq.qqmm(dev(rx.data, device), dev(rw.data, device), dev(rw.scales, device),
                  x_scales=dev(rx.scales, device), global_scale_x=dev(gx, device),
                  global_scale_w=dev(gw, device), dtype="float32", **qkw)
    assert_matmul_close(got, ref, "qqmm(packed x, packed w)", dtype=F32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cfg", [FpCfg("nvfp4", global_scale=True), FpCfg("mxfp4"), FpCfg("mxfp8")],
                         ids=str)
def test_qqmm_blocked_scales(cfg, device, rng):
    """w packed with blocked scales (scale_layout="blocked"), N = 130 so the padding rows
    exist; then both operands pre-quantized in the blocked layout."""
    m, n, k = 17, 130, 192
    x, w = randn(rng, (m, k)), randn(rng, (n, k))
    gx = R.amax(x) if cfg.global_scale else None
    gw = R.amax(w) if cfg.global_scale else None
    ref = ref_qqmm(x, w, cfg, gx, gw)
    rw = R.quantize(w, global_scale=gw, scale_layout="blocked", **cfg.kwargs())
    assert rw.scales.shape == (256, R.roundup(k // cfg.group_size, 4))
    kw = qq_kwargs(cfg)
    kw.pop("rounding", None)
    got = qq.qqmm(dev(x, device), dev(rw.data, device), dev(rw.scales, device),
                  scale_layout="blocked", global_scale_x=dev(gx, device),
                  global_scale_w=dev(gw, device), **kw)
    assert_matmul_close(got, ref, "qqmm(x, blocked w)", dtype=F32)
    qx = qq.quantize(dev(x, device), global_scale=dev(gx, device), scale_layout="blocked", **kw)
    qw = qq.quantize(dev(w, device), global_scale=dev(gw, device), scale_layout="blocked", **kw)
    assert_matmul_close(qq.qqmm(qx, qw, dtype="float32"), ref, "qqmm(blocked x, blocked w)")


@pytest.mark.parametrize("device", DEVICES)
def test_qqmm_one_global_scale(device, rng):
    """Only one global scale: the missing one counts as 2688 (a factor of 1)."""
    x, w = randn(rng, (8, 64)), randn(rng, (16, 64))
    gx = R.amax(x)
    got = qq.qqmm(dev(x, device), dev(w, device), mode="nvfp4", global_scale_x=dev(gx, device))
    assert_matmul_close(got, R.qqmm(x, w, "nvfp4", global_scale_x=gx), "qqmm gx only")
    gw = R.amax(w)
    got = qq.qqmm(dev(x, device), dev(w, device), mode="nvfp4", global_scale_w=dev(gw, device))
    assert_matmul_close(got, R.qqmm(x, w, "nvfp4", global_scale_w=gw), "qqmm gw only")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bias_dtype", dtype_params())
@pytest.mark.parametrize("out_dtype", dtype_params())
def test_qqmm_bias_and_dtype(out_dtype, bias_dtype, device, rng):
    """bias [N] of any float dtype is added to every row; dtype picks the output dtype."""
    x, w = randn(rng, (5, 64)), randn(rng, (12, 64))
    bias = randn(rng, (12,), bias_dtype, 10.0)
    got = qq.qqmm(dev(x, device), dev(w, device), mode="mxfp8", bias=dev(bias, device),
                  dtype=out_dtype)
    assert_matmul_close(got, R.qqmm(x, w, "mxfp8", bias=bias), "qqmm + bias", dtype=out_dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["nvfp4", "mxfp8"])
def test_qqmm_batched_x(mode, device, rng):
    """x [2, 3, M, K] with w [N, K]: out [2, 3, M, N]."""
    x, w = randn(rng, (2, 3, 7, 64), BF16), randn(rng, (10, 64), BF16)
    got = qq.qqmm(dev(x, device), dev(w, device), mode=mode)
    assert tuple(got.shape) == (2, 3, 7, 10)
    assert_matmul_close(got, R.qqmm(x, w, mode), "qqmm batched", dtype=BF16)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", dtype_params())
def test_qqmm_out_buffer(dtype, device, rng):
    """out= (poisoned with 0xAB) is filled and returned; its dtype sets the result's."""
    x, w = randn(rng, (9, 64)), randn(rng, (6, 64))
    out = dev(poison((9, 6), dtype), device)
    got = qq.qqmm(dev(x, device), dev(w, device), mode="mxfp4", dtype=dtype, out=out)
    assert got is out
    assert_matmul_close(out, R.qqmm(x, w, "mxfp4"), "qqmm out=", dtype=dtype)


# ---------------------------------------------------------------------------
# quantized_matmul
# ---------------------------------------------------------------------------

def qmm(device, x, ref: R.RefQuantized, transpose=True, **kw):
    """qq.quantized_matmul with the reference's packed weight, on `device`."""
    extra = {}
    if ref.mode == "mxfp8":
        extra["fp8_format"] = ref.fp8_format
    if ref.global_scale is not None:
        extra["global_scale"] = dev(ref.global_scale, device)
    if "bias" in kw:
        kw["bias"] = dev(kw["bias"], device)
    if "out" in kw:
        extra["out"] = kw.pop("out")
    return qq.quantized_matmul(dev(x, device), dev(ref.data, device), dev(ref.scales, device),
                               dev(ref.biases, device), transpose=transpose,
                               group_size=ref.group_size, bits=ref.bits, mode=ref.mode,
                               scale_layout=ref.scale_layout, **extra, **kw)


AFFINE_QMM = [(4, 64), (2, 32), (3, 128), (5, 64), (6, 32), (8, 128)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [1, 70])
@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("transpose", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("bits,group_size", AFFINE_QMM, ids=[f"affine{b}-g{g}" for b, g in AFFINE_QMM])
def test_qmm_affine(bits, group_size, transpose, dtype, m, device, rng):
    """Weight-only affine: transpose=True multiplies by W.T with w [N, K*bits/8] (groups
    along K); transpose=False by W with w [K, N*bits/8] (groups along N, as MLX). M = 1 is
    the qmv path, 70 the GEMM path. The output has x's dtype."""
    n, k = 128, 256
    x = randn(rng, (m, k), dtype)
    wf = randn(rng, (n, k) if transpose else (k, n), dtype, 0.1)
    ref_q = R.quantize(wf, group_size=group_size, bits=bits)
    got = qmm(device, x, ref_q, transpose)
    assert_matmul_close(got, R.quantized_matmul(x, ref_q, transpose=transpose), "quantized_matmul",
                        dtype=dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("transpose", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("cfg", [FpCfg("nvfp4"), FpCfg("nvfp4", global_scale=True), FpCfg("mxfp4"),
                                 FpCfg("mxfp8"), FpCfg("mxfp8", fp8_format="e5m2")], ids=str)
def test_qmm_fp(cfg, transpose, dtype, device, rng):
    """Weight-only with fp weights (nvfp4 with and without its global scale, mxfp4,
    mxfp8 E4M3/E5M2), both orientations; M = 33."""
    m, n, k = 33, 64, 128
    x = randn(rng, (m, k), dtype)
    wf = randn(rng, (n, k) if transpose else (k, n), F32)
    gs = R.amax(wf) if cfg.global_scale else None
    ref_q = R.quantize(wf, **cfg.kwargs(gs))
    got = qmm(device, x, ref_q, transpose)
    assert_matmul_close(got, R.quantized_matmul(x, ref_q, transpose=transpose), "quantized_matmul",
                        dtype=dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_qmm_known_answer(device):
    """W rows 0..15 (twice) quantize exactly in 4-bit affine (scale -1, bias 15); x = ones:
    every output is 2 * (0 + ... + 15) = 240; transposed orientation likewise."""
    w = np.tile(np.arange(16, dtype=F32), 2)[None, :].repeat(8, axis=0)  # [N=8, K=32]
    q = R.quantize(w, group_size=32, bits=4)
    x = np.ones((3, 32), F32)
    got = to_numpy(qmm(device, x, q, True))
    assert got.dtype == F32 and (got == 240).all()
    wt = np.tile(np.arange(16, dtype=F32), 2)[None, :].repeat(32, axis=0)  # [K=32, N=32]
    qt = R.quantize(wt, group_size=32, bits=4)
    got = to_numpy(qmm(device, np.ones((2, 32), F32), qt, False))
    np.testing.assert_array_equal(got, np.tile(32 * np.tile(np.arange(16, dtype=F32), 2), (2, 1)))


BROADCAST = [((2, 1, 5, 64), (3, 32, 64)), ((5, 64), (2, 32, 64)), ((4, 5, 64), (32, 64)),
             ((2, 3, 5, 64), (1, 3, 32, 64))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("transpose", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("shapes", BROADCAST, ids=lambda s: f"{s[0]}@{s[1]}".replace(" ", ""))
def test_qmm_batch_broadcast(shapes, transpose, device, rng):
    """Batch axes of x [..., M, K] and w broadcast like NumPy: (2,1)x(3) -> (2,3),
    ()x(2) -> (2), (4)x() -> (4), (2,3)x(1,3) -> (2,3)."""
    xs, ws = shapes
    x = randn(rng, xs, BF16)
    wshape = ws if transpose else ws[:-2] + (ws[-1], ws[-2])
    ref_q = R.quantize(randn(rng, wshape, BF16), group_size=32, bits=4)
    ref = R.quantized_matmul(x, ref_q, transpose=transpose)
    got = qmm(device, x, ref_q, transpose)
    assert tuple(got.shape) == ref.value.shape
    assert_matmul_close(got, ref, "quantized_matmul broadcast", dtype=BF16)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("transpose", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("mode", ["affine", "nvfp4"])
def test_qmm_bias(mode, transpose, device, rng):
    """bias [N] (any float dtype) is added to every row."""
    x = randn(rng, (2, 6, 96))
    wf = randn(rng, (64, 96) if transpose else (96, 64))  # N = 64
    ref_q = R.quantize(wf, mode=mode, group_size=16 if mode == "nvfp4" else 32)
    for bias in (randn(rng, (64,), F32, 5.0), randn(rng, (64,), BF16, 5.0)):
        got = qmm(device, x, ref_q, transpose, bias=bias)
        assert_matmul_close(got, R.quantized_matmul(x, ref_q, transpose=transpose, bias=bias),
                            "quantized_matmul + bias", dtype=F32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cfg", [FpCfg("nvfp4", global_scale=True), FpCfg("mxfp8")], ids=str)
def test_qmm_blocked_scales(cfg, device, rng):
    """Blocked scales are accepted for fp weights with transpose=True; N = 130 pads rows."""
    x = randn(rng, (9, 96))
    wf = randn(rng, (130, 96))
    gs = R.amax(wf) if cfg.global_scale else None
    ref_q = R.quantize(wf, scale_layout="blocked", **cfg.kwargs(gs))
    got = qmm(device, x, ref_q, True)
    assert_matmul_close(got, R.quantized_matmul(x, ref_q), "quantized_matmul blocked", dtype=F32)


@pytest.mark.parametrize("device", DEVICES)
def test_qmm_quantized_array_and_dtype(device, rng):
    """w as a QuantizedArray from qq.quantize (its own parameters apply); dtype overrides
    x's dtype; out= (poisoned) is filled and returned."""
    x = randn(rng, (4, 128), BF16)
    wf = randn(rng, (40, 128), BF16)
    gs = R.amax(wf)
    qa = qq.quantize(dev(wf, device), mode="nvfp4", global_scale=dev(gs, device))
    ref = R.quantized_matmul(x, R.quantize(wf, mode="nvfp4", global_scale=gs))
    assert_matmul_close(qq.quantized_matmul(dev(x, device), qa), ref, "qmm(QuantizedArray)", dtype=BF16)
    for dt in DTYPES:
        got = qq.quantized_matmul(dev(x, device), qa, dtype=dt)
        assert_matmul_close(got, ref, f"qmm dtype={dt}", dtype=dt)
        out = dev(poison((4, 40), dt), device)
        got = qq.quantized_matmul(dev(x, device), qa, dtype=dt, out=out)
        assert got is out
        assert_matmul_close(out, ref, f"qmm out= {dt}", dtype=dt)
    qa = qq.quantize(dev(wf, device), group_size=128, bits=8)
    ref = R.quantized_matmul(x, R.quantize(wf, group_size=128, bits=8))
    assert_matmul_close(qq.quantized_matmul(dev(x, device), qa), ref, "qmm(affine QuantizedArray)")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [3, 40])
@pytest.mark.parametrize("cfg", QQMM_PARAMS)
def test_qqmm_prepared_weight(cfg, m, device, rng):
    """qq.prepare_weight keeps q(w) (packed, and its exact bf16 values without the global
    scale where qqmm dequantizes); qqmm with it equals qqmm with the float w. M = 3 uses
    the packed form, M = 40 the values."""
    n, k = 24, 128
    x, w = randn(rng, (m, k), BF16), randn(rng, (n, k), BF16)
    gx = R.amax(x) if cfg.global_scale else None
    gw = R.amax(w) if cfg.global_scale else None
    kw = qq_kwargs(cfg)
    pw = qq.prepare_weight(dev(w, device), global_scale=dev(gw, device), **kw)
    assert isinstance(pw, qq.PreparedWeight) and pw.shape == (n, k) and pw.mode == cfg.mode
    rq = R.quantize(w, global_scale=gw, **cfg.kwargs())
    if pw.values is not None:  # the exact values, global scale left out (it goes into alpha)
        want = R.dequantize(rq.data, rq.scales, mode=rq.mode, group_size=rq.group_size,
                            fp8_format=rq.fp8_format, dtype=BF16)
        np.testing.assert_array_equal(to_numpy(pw.values).view(np.uint16), want.view(np.uint16))
    got = qq.qqmm(dev(x, device), pw, global_scale_x=dev(gx, device), **kw)
    assert_matmul_close(got, ref_qqmm(x, w, cfg, gx, gw), "qqmm(x, PreparedWeight)", dtype=BF16)
# ---------------------------------------------------------------------------
# the small-M kernels (cuda/qmv.cu) specifically: every M up to 16, every mode, both
# orientations, odd N, K of a single group, unaligned x rows
# ---------------------------------------------------------------------------

QMV_CFGS = [FpCfg("nvfp4"), FpCfg("nvfp4", global_scale=True), FpCfg("mxfp4"), FpCfg("mxfp8"),
            FpCfg("mxfp8", fp8_format="e5m2")]
QMV_AFFINE = [(4, 32), (8, 64), (3, 128), (2, 64), (5, 32), (6, 64)]


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
    """Every M of the small-M path (M tiles 1, 4, 16 skip their rows past M), N = 200 (not
    a multiple of any row tile; 256 with transpose=False, where N is grouped), K = 640 (wide chunks plus a partial step of the unrolled
    loop); bf16 x, fp32 output."""
    n, k = 200, 640
    if not transpose:
        n = 256  # groups along N: a multiple of every group size
    ref_q = _qmv_case(cfg, transpose, n, k, rng)
    x = randn(rng, (m, k), BF16)
    got = qmm(device, x, ref_q, transpose, dtype="float32")
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
    to element loads of x; out of every dtype."""
    m, n, k = 5, 96, 256
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
    assert_matmul_close(got, R.quantized_matmul(x, ref_q), "qmv unaligned x", dtype=dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cfg", [FpCfg("nvfp4", global_scale=True), FpCfg("mxfp4"), FpCfg("mxfp8")], ids=str)
def test_qmv_blocked_large_k(cfg, device, rng):
    """Blocked scales with N = 300 (3 row tiles of 128, the last padded) and K = 4096 (more
    than one step of every thread's chunk loop), M = 1 and 16."""
    n, k = 300, 4096
    wf = randn(rng, (n, k), F32)
    gs = R.amax(wf) if cfg.global_scale else None
    ref_q = R.quantize(wf, scale_layout="blocked", **cfg.kwargs(gs))
    for m in (1, 16):
        x = randn(rng, (m, k), BF16)
        got = qmm(device, x, ref_q, True, dtype="float32")
        assert_matmul_close(got, R.quantized_matmul(x, ref_q), "qmv blocked", dtype=F32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shared_x", [False, True], ids=["x_batched", "x_shared"])
@pytest.mark.parametrize("cfg", [FpCfg("nvfp4", global_scale=True), FpCfg("mxfp8")], ids=str)
def test_qqmm_batched_w(cfg, shared_x, device, rng):
    """A 3D weight [B, N, K] (float, or stored with blocked scales) with x [B, M, K] or a
    shared x [M, K]: out [B, M, N], entry b = q(x[b]) @ q(w[b]).T."""
    b, m, n, k = 3, 5, 24, 64
    x = randn(rng, (m, k) if shared_x else (b, m, k), BF16)
    w = randn(rng, (b, n, k), BF16)
    gx = R.amax(x) if cfg.global_scale else None
    gw = R.amax(w) if cfg.global_scale else None
    ref_vals = [ref_qqmm(x if shared_x else x[i], w[i], cfg, gx, gw) for i in range(b)]
    ref = R.MatmulRef(np.stack([r.value for r in ref_vals]), np.stack([r.abs_sum for r in ref_vals]))
    kw = qq_kwargs(cfg)
    got = qq.qqmm(dev(x, device), dev(w, device), global_scale_x=dev(gx, device),
                  global_scale_w=dev(gw, device), **kw)
    assert tuple(got.shape) == (b, m, n)
    assert_matmul_close(got, ref, "qqmm batched w", dtype=BF16)
    qw = qq.quantize(dev(w, device), global_scale=dev(gw, device), scale_layout="blocked", **kw)
    assert_matmul_close(qq.qqmm(dev(x, device), qw, global_scale_x=dev(gx, device), **kw), ref,
                        "qqmm batched stored w", dtype=BF16)


# ---------------------------------------------------------------------------
# beta * C
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("m", [1, 3, 70])
@pytest.mark.parametrize("cfg", [FpCfg("nvfp4", global_scale=True), FpCfg("mxfp4"), FpCfg("mxfp8")], ids=str)
def test_qqmm_beta_c(cfg, m, dtype, device, rng):
    """y = alpha q(x) q(w)^T + bias + beta C on every route (M = 1, 3: weight-only kernels
    on the GPU; 70: the GEMM), C of another dtype than out, and the in-place form out=C
    (C's old values must be read before out is written)."""
    n, k = 40, 256
    x, w = randn(rng, (m, k), F32), randn(rng, (n, k), F32)
    bias = randn(rng, (n,), F32)
    c = randn(rng, (m, n), BF16)
    gx = R.amax(x) if cfg.global_scale else None
    gw = R.amax(w) if cfg.global_scale else None
    kw = qq_kwargs(cfg)
    qw = qq.quantize(dev(w, device), global_scale=dev(gw, device), scale_layout="blocked", **kw)
    ref = R.qqmm(x, w, cfg.mode, global_scale_x=gx, global_scale_w=gw, bias=bias, c=c, beta=-0.75,
                 rounding=cfg.rounding, fp8_format=cfg.fp8_format)
    got = qq.qqmm(dev(x, device), qw, global_scale_x=dev(gx, device), bias=dev(bias, device), c=dev(c, device),
                  beta=-0.75, dtype=dtype, **kw)
    assert_matmul_close(got, ref, f"qqmm beta*C m={m}", dtype=np.dtype(BF16 if dtype == "bfloat16" else F32))
    # in place: out = C
    cbuf = dev(cast(c, BF16 if dtype == "bfloat16" else F32), device)
    ref2 = R.qqmm(x, w, cfg.mode, global_scale_x=gx, global_scale_w=gw, bias=bias,
                  c=to_numpy(cbuf).astype(F32), beta=2.0, rounding=cfg.rounding, fp8_format=cfg.fp8_format)
    got2 = qq.qqmm(dev(x, device), qw, global_scale_x=dev(gx, device), bias=dev(bias, device), c=cbuf, beta=2.0,
                   out=cbuf, **kw)
    assert got2 is cbuf
    assert_matmul_close(cbuf, ref2, f"qqmm out=C m={m}")


@pytest.mark.parametrize("device", DEVICES)
def test_qqmm_beta_c_batched_and_errors(device, rng):
    """C with a batch of x and with a batched w; wrong shape / dtype of C; beta = 0 ignores C."""
    cfg = FpCfg("mxfp8")
    x, w = randn(rng, (2, 5, 64), F32), randn(rng, (24, 64), F32)
    c = randn(rng, (2, 5, 24), F32)
    got = qq.qqmm(dev(x, device), dev(w, device), c=dev(c, device), beta=0.5, dtype="float32", **qq_kwargs(cfg))
    assert_matmul_close(got, R.qqmm(x, w, "mxfp8", c=c, beta=0.5), "qqmm beta*C batch of x")
    wb = randn(rng, (2, 24, 64), F32)
    got = qq.qqmm(dev(x, device), dev(wb, device), c=dev(c, device), beta=0.5, dtype="float32", **qq_kwargs(cfg))
    for b in range(2):
        assert_matmul_close(to_numpy(got)[b], R.qqmm(x[b], wb[b], "mxfp8", c=c[b], beta=0.5), "batched w, C")
    nan_c = np.full((2, 5, 24), np.nan, F32)
    got = qq.qqmm(dev(x, device), dev(w, device), c=dev(nan_c, device), beta=0.0, dtype="float32", **qq_kwargs(cfg))
    assert np.isfinite(to_numpy(got)).all(), "beta = 0 must not read C"
    raises(ValueError, "c", qq.qqmm, dev(x, device), dev(w, device), c=dev(c[:, :4], device), **qq_kwargs(cfg))
    raises(TypeError, "c", qq.qqmm, dev(x, device), dev(w, device), c=dev(c.astype(np.int32), device),
           **qq_kwargs(cfg))
