"""qq.qqmm: both operands quantized, y = alpha * q(x) @ q(w).T (+ bias) (+ beta * C), on every
route (cpu/qqmm.cu's reference, cuda/qqmm.cu's dispatch: exact, qmma, qmv, the forced block-scaled
fallback), prepared and batched weights, streams and threads. Values against tests/reference.py
(matmul_cases.py says how close a correct GEMM must be)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import qq
import reference as R
from helpers import BF16, DEVICES, FpCfg, assert_matmul_close, cast, dtype_params, poison, raises, to_device, to_numpy
from matmul_cases import F32, QQMM_PARAMS, randn, dev, qq_kwargs, ref_qqmm, CFGS, torch_or_skip, cuda, k_for


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [1, 3, 130])
@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("cfg", QQMM_PARAMS)
def test_qqmm_float_operands(cfg, dtype, m, device, rng):
    """x [M, K] and w [N, K] float, both quantized on the fly (with the rounding and fp8
    format asked for); nvfp4 global scales give alpha = gx * gw / 2688^2. The output has
    x's dtype. M = 1, 3 and 130 (a float w takes the GEMM route at every M: test_route.py)."""
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


@pytest.mark.gpu
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
    kw = qq_kwargs(cfg)
    qw = qq.quantize(cuda(w), global_scale=cuda(gw), scale_layout=layout, **kw)
    got = qq.qqmm(cuda(x), qw, global_scale_x=cuda(gx), **kw)
    assert_matmul_close(got, ref_qqmm(x, w, cfg, gx, gw), f"qqmm m={m} {layout}", dtype=BF16)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("m", [1, 33, 65])
@pytest.mark.parametrize("cfg", [FpCfg("nvfp4", global_scale=True), FpCfg("mxfp8")], ids=str)
def test_qqmm_bias_out_poisoned(cfg, m, dtype, rng):
    """bias and a poisoned out= of every dtype on every route a stored weight takes: the
    weight-only kernels (qmma; qmv for mxfp8 at one row) and, past 64 rows, the GEMM."""
    n, k = 40, 128
    x, w = randn(rng, (m, k)), randn(rng, (n, k))
    bias = randn(rng, (n,), BF16, 3.0)
    gx = R.amax(x) if cfg.global_scale else None
    gw = R.amax(w) if cfg.global_scale else None
    kw = qq_kwargs(cfg)
    qw = qq.quantize(cuda(w), global_scale=cuda(gw), **kw)
    out = cuda(poison((m, n), dtype))
    got = qq.qqmm(cuda(x), qw, global_scale_x=cuda(gx), bias=cuda(bias), out=out, **kw)
    assert got is out
    assert qq.last_route() == ("exact" if m > 64 else ("qmv" if cfg.mode == "mxfp8" and m == 1 else "qmma"))
    assert_matmul_close(out, ref_qqmm(x, w, cfg, gx, gw, bias), "qqmm bias out=", dtype=dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", dtype_params())
def test_gemm_bias_of_out_dtype_and_alignment(dtype, rng):
    """The GEMM route's epilogue takes a bias of out's dtype as it is (no fp32 copy): one
    from the start of its allocation, then one 2 or 4 bytes past it, same shape (cuBLASLt
    picks its algorithm for the bias pointer's alignment: the plan cache keys on it).
    qqmm and quantized_matmul's dequantize + GEMM route (M above the weight-only kernels)."""
    m, n, k = 200, 72, 128
    x, w = randn(rng, (m, k), dtype), randn(rng, (n, k))
    big = randn(rng, (n + 1,), dtype, 3.0)
    qw = qq.quantize(cuda(w), mode="mxfp8")
    wref = R.quantize(w, mode="mxfp8")
    for off in (0, 1, 0):
        bias = big[off:off + n]
        cb = cuda(big)[off:off + n]
        got = qq.qqmm(cuda(x), qw, mode="mxfp8", bias=cb, dtype=dtype)
        assert qq.last_route() == "exact"
        assert_matmul_close(got, R.qqmm(x, w, "mxfp8", bias=bias), f"qqmm bias offset {off}", dtype=dtype)
        got = qq.quantized_matmul(cuda(x), qw.data, qw.scales, mode="mxfp8", bias=cb)
        assert_matmul_close(got, R.quantized_matmul(x, wref, bias=bias), f"quantized_matmul bias offset {off}",
                            dtype=dtype)


@pytest.mark.gpu
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


@pytest.mark.gpu
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


@pytest.mark.gpu
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


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 64])
@pytest.mark.parametrize("cfg", [FpCfg("nvfp4", global_scale=True), FpCfg("mxfp4"), FpCfg("mxfp8")], ids=str)
def test_qqmm_small_m_route(cfg, m, rng):
    """qqmm with a stored weight and M <= 64 runs the tensor-core weight-only kernel on
    q(x) in bf16 with alpha = gx * gw / 2688^2 on its sums (K = 512: whole chunks, which
    nvfp4's K = 144 above does not give); mxfp8 at one row runs qmv.cu's kernel
    (test_route.py's table)."""
    n, k = 96, 512
    x, w = randn(rng, (m, k), BF16), randn(rng, (n, k), BF16)
    gx = R.amax(x) if cfg.global_scale else None
    gw = R.amax(w) if cfg.global_scale else None
    kw = qq_kwargs(cfg)
    qw = qq.quantize(cuda(w), global_scale=cuda(gw), scale_layout="blocked", **kw)
    got = qq.qqmm(cuda(x), qw, global_scale_x=cuda(gx), dtype="float32", **kw)
    assert qq.last_route() == ("qmv" if cfg.mode == "mxfp8" and m == 1 else "qmma"), qq.last_route()
    assert_matmul_close(got, ref_qqmm(x, w, cfg, gx, gw), f"qqmm small-M m={m}", dtype=F32)


def _qqmm_kernels(torch, fn):
    """Names of the CUDA kernels one call of fn launches (torch's profiler)."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
            and not e.name.startswith(("Memcpy", "Memset"))]


def _x_specials(x, k, huge):
    """x with the groups the quantizer treats apart: in row 0 all zeros, subnormals and
    (huge) values near the top of the scales' range, all finite so that the row's products are
    compared; a NaN and an Inf in the last row when there are two or more (a NaN or Inf
    group makes its whole output row NaN). The other rows stay random."""
    x = x.copy()
    if k >= 160:
        x[0, 0:32] = 0.0
        x[0, 128:160] = 1.0e-39 * np.sign(x[0, 128:160])
        if huge:  # (not 3e38: a product's sums must stay within fp32)
            x[0, 96:128] = 1.0e36 * np.sign(x[0, 96:128])
        if x.shape[0] > 1:
            x[-1, 32] = np.nan
            x[-1, 64] = np.inf
    return x


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 512), (1, 96), (1, 16384), (2, 4096), (5, 224), (8, 2048),
                                   (2, 3, 256)], ids=str)
@pytest.mark.parametrize("xdt", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("cfg", [FpCfg("nvfp4", global_scale=True), FpCfg("nvfp4"), FpCfg("mxfp4", "floor"),
                                 FpCfg("mxfp8", "ceil", "e4m3"), FpCfg("mxfp8", "ceil", "e5m2")], ids=str)
def test_qqmm_small_m_x_quantized_in_the_launch(cfg, xdt, shape, rng):
    """At M <= 8 with a stored weight qqmm quantizes x inside the weight-only kernel's own
    launch (ops.cuh, QX: qmma, and qmv for mxfp8 at M = 1), one kernel and no scratch: the
    same bits as the two-launch form (the unfused_qx hook: a qdq kernel first, then the
    kernel on q(x)), and the reference's values. Special groups (zeros, subnormals, 1e36 in
    row 0; NaN and Inf in the last row), ragged steps (K = 96, 224), x in every dtype,
    batched x (M = 6 folded, entries apart in memory), rows off 16-byte boundaries (K = 224),
    the largest K that fits (16384 at M = 1)."""
    torch = torch_or_skip()
    *lead, k = shape
    m = int(np.prod(lead))
    n = 72
    # (huge values only without a global scale: one would scale every other row to zero)
    x = cast(_x_specials(randn(rng, (m, k)), k, not cfg.global_scale), getattr(np, xdt) if xdt != "bfloat16" else BF16)
    w = randn(rng, (n, k), BF16)
    gx = R.amax(np.where(np.isfinite(x.astype(F32)), x, 0).astype(F32)) if cfg.global_scale else None
    gw = R.amax(w) if cfg.global_scale else None
    kw = qq_kwargs(cfg)
    qw = qq.quantize(cuda(w), global_scale=cuda(gw), **kw)
    xc = cuda(x.reshape(shape))
    if len(shape) == 3:  # entries apart in memory: a batch stride other than rows * K
        big = torch.zeros(shape[0], shape[1] + 1, k, dtype=xc.dtype, device="cuda")
        big[:, :shape[1]] = xc
        xc = big[:, :shape[1]]
    if k == 224:  # rows that start off 16-byte boundaries (element loads in the kernels)
        big = torch.zeros(*xc.shape[:-1], k + 1, dtype=xc.dtype, device="cuda")
        big[..., 1:] = xc
        xc = big[..., 1:]
    gxc = cuda(gx)
    call = lambda: qq.qqmm(xc, qw, global_scale_x=gxc, dtype="float32", **kw)  # noqa: E731
    fused = to_numpy(call()).reshape(m, n)
    route = qq.last_route()
    assert route == ("qmv" if cfg.mode == "mxfp8" and m == 1 else "qmma")
    kernels = _qqmm_kernels(torch, call)
    assert len(kernels) == 1 and "qdq" not in kernels[0], kernels
    old = qq._qq._set_test_hook("unfused_qx", 1)
    try:
        two = to_numpy(call()).reshape(m, n)
        assert qq.last_route() == route
        assert len(_qqmm_kernels(torch, call)) == 2
    finally:
        qq._qq._set_test_hook("unfused_qx", old)
    np.testing.assert_array_equal(fused, two)  # NaN where NaN, every other bit equal
    assert_matmul_close(fused, ref_qqmm(x, w, cfg, gx, gw), f"qqmm fused {cfg} M={m} K={k}", dtype=F32)


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,n", [(2, 16384, 72), (9, 512, 72), (4, 4096, 4096)], ids=str)
def test_qqmm_small_m_two_launches_beyond_the_bound(m, k, n, rng):
    """Where q(x) does not fit the kernels' shared memory (M = 2, K = 16384: 64 KB), M > 8,
    or every CTA re-quantizing x would cost more than the launch it saves (ops.cuh,
    qx_work_ok: 4096 x 4096 at M = 4 is ~256 CTAs x 16384 fp4 elements), qqmm quantizes x
    in a kernel of its own first, as before."""
    torch = torch_or_skip()
    if n == 4096 and torch.cuda.get_device_properties(0).multi_processor_count < 100:
        pytest.skip("the CTA count, and so the bound, follows the SMs: stated for H100-class GPUs")
    x, w = randn(rng, (m, k), BF16), randn(rng, (n, k), BF16)
    qw = qq.quantize(cuda(w), mode="nvfp4")
    xc = cuda(x)
    call = lambda: qq.qqmm(xc, qw, mode="nvfp4", dtype="float32")  # noqa: E731
    y = to_numpy(call())
    assert qq.last_route() == "qmma"
    assert len(_qqmm_kernels(torch, call)) == 2
    assert_matmul_close(y, ref_qqmm(x, w, FpCfg("nvfp4")), f"qqmm M={m} K={k}", dtype=F32)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["nvfp4", "mxfp4", "mxfp8"])
def test_qqmm_decode_shape_is_one_launch(mode, rng):
    """The decode call the host-cost benchmark times (bench_overhead: M = 1, 4096 x 4096,
    a prepared weight) runs as one kernel on an H100 / H200 (256 CTAs x 4096 elements of
    re-quantization: within ops.cuh's qx_work_ok)."""
    torch = torch_or_skip()
    if torch.cuda.get_device_properties(0).multi_processor_count < 100:
        pytest.skip("the bound is stated for H100-class GPUs (its CTA count follows the SMs)")
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    pw = qq.prepare_weight(w, mode=mode)
    call = lambda: qq.qqmm(x, pw)  # noqa: E731
    assert len(_qqmm_kernels(torch, call)) == 1
    assert qq.last_route() == ("qmv" if mode == "mxfp8" else "qmma")


@pytest.mark.gpu
@pytest.mark.parametrize("k", [512, 4096])
@pytest.mark.parametrize("cfg", [FpCfg("nvfp4", global_scale=True), FpCfg("nvfp4"), FpCfg("mxfp4", "ceil"),
                                 FpCfg("mxfp8", "floor", "e5m2")], ids=str)
def test_qqmm_qmv_route_x_quantized_in_the_launch(cfg, k, rng):
    """route='qmv' at M = 1 (AUTO sends only mxfp8 there) also quantizes x in the launch,
    every fp mode: x's nvfp4 global factor multiplies each sum at the store (the two-launch
    form puts it into every q(x) value: one rounding apart, so compared through the
    reference there; bit for bit without a global scale)."""
    torch = torch_or_skip()
    n = 72
    x = _x_specials(randn(rng, (1, k), BF16).astype(F32), k, not cfg.global_scale).astype(BF16)
    w = randn(rng, (n, k), BF16)
    gx = R.amax(x) if cfg.global_scale else None
    gw = R.amax(w) if cfg.global_scale else None
    kw = qq_kwargs(cfg)
    qw = qq.quantize(cuda(w), global_scale=cuda(gw), **kw)
    xc, gxc = cuda(x), cuda(gx)
    call = lambda: qq.qqmm(xc, qw, global_scale_x=gxc, dtype="float32", route="qmv", **kw)  # noqa: E731
    fused = to_numpy(call())
    assert qq.last_route() == "qmv"
    assert len(_qqmm_kernels(torch, call)) == 1
    old = qq._qq._set_test_hook("unfused_qx", 1)
    try:
        two = to_numpy(call())
        assert len(_qqmm_kernels(torch, call)) == 2
    finally:
        qq._qq._set_test_hook("unfused_qx", old)
    want = ref_qqmm(x, w, cfg, gx, gw)
    assert_matmul_close(fused, want, f"qqmm qmv fused {cfg} K={k}", dtype=F32)
    assert_matmul_close(two, want, f"qqmm qmv two launches {cfg} K={k}", dtype=F32)
    if not cfg.global_scale:
        np.testing.assert_array_equal(fused, two)
