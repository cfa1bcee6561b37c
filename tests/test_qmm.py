"""qq.quantized_matmul (weight-only, y = x @ W.T or x @ W, W = dequantize(w)) through its
dispatch (cuda/qmm.cu): every mode, both orientations, batch broadcasting, bias, blocked scales,
the M regimes (weight-only kernels up to M = 64, dequantize + GEMM above), streams. The kernels
themselves: test_qmv.py, test_qmma.py."""

from __future__ import annotations

import numpy as np
import pytest

import qq
import reference as R
from helpers import BF16, DEVICES, DTYPES, FpCfg, assert_matmul_close, dtype_params, poison, to_numpy
from matmul_cases import F32, randn, dev, qmm, torch_or_skip, cuda, QMM_WEIGHTS, make_weight, run_qmm


AFFINE_QMM = [(4, 64), (2, 32), (3, 128), (5, 64), (6, 32), (8, 128)]


BROADCAST = [((2, 1, 5, 64), (3, 32, 64)), ((5, 64), (2, 32, 64)), ((4, 5, 64), (32, 64)),
             ((2, 3, 5, 64), (1, 3, 32, 64)),
             # more rows of x than the CPU multiplies at a time (64), chunks across entries,
             # two weight entries each broadcast over three of x's entries, N not a multiple of 16
             ((3, 50, 64), (40, 64)), ((2, 3, 30, 64), (2, 1, 40, 64)), ((3, 50, 64), (96, 64))]


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


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("transpose", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("shapes", BROADCAST, ids=lambda s: f"{s[0]}@{s[1]}".replace(" ", ""))
def test_qmm_batch_broadcast(shapes, transpose, device, rng):
    """Batch axes of x [..., M, K] and w broadcast like NumPy: (2,1)x(3) -> (2,3),
    ()x(2) -> (2), (4)x() -> (4), (2,3)x(1,3) -> (2,3), (3)x() and (2,3)x(2,1) with more
    rows of x than the CPU backend multiplies at a time (w [K, N]: N = 96, three blocks of
    columns)."""
    xs, ws = shapes
    if not transpose and ws[-2] % 32:
        pytest.skip("w [K, N] groups along N: N must be a multiple of the group size (32)")
    x = randn(rng, xs, BF16)
    wshape = ws if transpose else ws[:-2] + (ws[-1], ws[-2])
    ref_q = R.quantize(randn(rng, wshape, BF16), group_size=32, bits=4)
    ref = R.quantized_matmul(x, ref_q, transpose=transpose)
    got = qmm(device, x, ref_q, transpose)
    assert tuple(got.shape) == ref.value.shape
    assert_matmul_close(got, ref, "quantized_matmul broadcast", dtype=BF16)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("transpose", [True, False], ids=["T", "N"])
def test_qmm_broadcast_w_own_biases(transpose, device, rng):
    """Affine w and scales broadcast over a batch axis (stride 0, as expand() / broadcast_to
    make them) while the biases differ per entry: each entry multiplies by its own biases
    (the CPU backend groups entries by the w, scales and biases they read; grouping by w and
    scales alone gave entries (1, j) the biases of (0, j), off by hundreds)."""
    ref_q = R.quantize(randn(rng, (1, 3, 32, 64) if transpose else (1, 3, 64, 32), F32), group_size=32, bits=4)
    data = np.broadcast_to(ref_q.data, (2,) + ref_q.data.shape[1:])
    scales = np.broadcast_to(ref_q.scales, (2,) + ref_q.scales.shape[1:])
    biases = np.stack([ref_q.biases[0], ref_q.biases[0] + 5.0]).astype(ref_q.biases.dtype)  # [2, 3, ...]
    x = randn(rng, (2, 3, 4, 64), F32)
    got = to_numpy(qq.quantized_matmul(dev(x, device), dev(data, device), dev(scales, device),
                                       dev(biases, device), transpose=transpose, group_size=32, bits=4))
    for i in range(2):
        for j in range(3):
            w = R.dequantize(np.ascontiguousarray(data[i, j]), np.ascontiguousarray(scales[i, j]),
                             biases[i, j], group_size=32, bits=4, dtype=F32)
            want = x[i, j] @ (w.T if transpose else w)
            np.testing.assert_allclose(got[i, j], want, rtol=1e-4, atol=1e-3 * float(np.abs(want).max()),
                                       err_msg=f"entry ({i}, {j})")


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


@pytest.mark.gpu
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


@pytest.mark.gpu
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


@pytest.mark.gpu
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


@pytest.mark.gpu
def test_qmm_stream(rng):
    torch = torch_or_skip()
    x = randn(rng, (3, 512), BF16)
    ref_q = make_weight("mxfp4", (256, 512), rng)
    s = torch.cuda.Stream()
    got = run_qmm(x, ref_q, stream=s)
    s.synchronize()
    assert_matmul_close(got, R.quantized_matmul(x, ref_q), "qmm stream=", dtype=BF16)
