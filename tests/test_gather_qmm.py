"""qq.gather_qmm (weight-only matmul with each batch entry's weight picked by an int32
index: MoE decode) against the NumPy reference (reference.gather_qmm: dequantize the
experts, gather, matmul in float64), on the CPU and the GPU: every weight format, x dtypes,
the M regimes of the GPU dispatch (tensor-core kernel, CUDA-core kernel, its row slices),
broadcasting of x against the indices, both orientations, bias, out=, bad indices and
argument errors. The CUDA graph case is in test_graphs.py."""

from __future__ import annotations

import numpy as np
import pytest

import qq
import reference as R
from helpers import BF16, DEVICES, assert_matmul_close, poison, raises, to_numpy
from matmul_cases import F32, QMM_WEIGHTS, dev, make_weight, randn

E = 6


def gqmm(device, x, ref_q, idx, transpose=True, **kw):
    """qq.gather_qmm with the reference's packed [E, ...] weight, on `device`."""
    extra = {}
    if ref_q.mode == "mxfp8":
        extra["fp8_format"] = ref_q.fp8_format
    if ref_q.global_scale is not None:
        extra["global_scale"] = dev(ref_q.global_scale, device)
    if kw.get("bias") is not None:
        kw["bias"] = dev(kw["bias"], device)
    return qq.gather_qmm(dev(x, device), dev(ref_q.data, device), dev(ref_q.scales, device),
                         dev(ref_q.biases, device), dev(idx, device), transpose=transpose,
                         group_size=ref_q.group_size, bits=ref_q.bits, mode=ref_q.mode,
                         scale_layout=ref_q.scale_layout, **extra, **kw)


def indices(rng, shape, e=E):
    return rng.integers(0, e, size=shape).astype(np.int32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [1, 3, 8, 16, 33])
@pytest.mark.parametrize("name", [n for n, _ in QMM_WEIGHTS])
def test_gather_qmm_formats(name, m, device, rng):
    """Every weight format; M = 1 .. 33 crosses the GPU's kernels (qmma up to 64 rows for
    bf16 x, qmv up to 4, qmv in slices of 4 rows above); x [T, 1, M, K] against indices
    [T, top_k] (each token's top-k experts, repeats included); N = 40 is a ragged tile."""
    n, k, t, top = 40, 256, 3, 4
    ref_q = make_weight(name, (E, n, k), rng)
    x = randn(rng, (t, 1, m, k), BF16)
    idx = indices(rng, (t, top))
    got = gqmm(device, x, ref_q, idx)
    assert to_numpy(got).shape == (t, top, m, n)
    assert_matmul_close(got, R.gather_qmm(x, ref_q, idx), f"gather_qmm {name}", dtype=BF16)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [1, 6])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("name", ["nvfp4-gs", "mxfp8", "affine4"])
def test_gather_qmm_dtypes(name, dtype, m, device, rng):
    """fp32 and fp16 x (the GPU's CUDA-core kernel, in row slices for M > 4); output in
    x's dtype."""
    ref_q = make_weight(name, (E, 32, 128), rng)
    x = randn(rng, (5, m, 128), dtype)
    idx = indices(rng, (5,))
    got = gqmm(device, x, ref_q, idx)
    assert to_numpy(got).dtype == np.dtype(dtype)
    assert_matmul_close(got, R.gather_qmm(x, ref_q, idx), "gather_qmm", dtype=dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["nvfp4", "mxfp4", "affine8"])
def test_gather_qmm_transpose_false(name, device, rng):
    """transpose=False: w [E, K, N*bits/8], groups along N (MLX's layout)."""
    k, n = 64, 128
    wf = randn(rng, (E, k, n), F32, 0.5)
    ref_q = R.quantize(wf, **({"mode": name} if name != "affine8" else {"group_size": 32, "bits": 8}))
    x = randn(rng, (4, 2, k), BF16)
    idx = indices(rng, (4,))
    got = gqmm(device, x, ref_q, idx, transpose=False)
    assert_matmul_close(got, R.gather_qmm(x, ref_q, idx, transpose=False), "gather_qmm", dtype=BF16)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("xshape,ishape", [((2, 64), (7,)), ((3, 1, 2, 64), (3, 5)),
                                           ((4, 2, 64), (1,)), ((2, 3, 1, 64), (2, 1))])
def test_gather_qmm_broadcast(xshape, ishape, device, rng):
    """x's batch axes and the indices' shape broadcast as in NumPy (and MLX)."""
    ref_q = make_weight("nvfp4", (E, 32, 64), rng)
    x = randn(rng, xshape, BF16)
    idx = indices(rng, ishape)
    got = gqmm(device, x, ref_q, idx)
    want = R.gather_qmm(x, ref_q, idx)
    assert to_numpy(got).shape == want.value.shape
    assert_matmul_close(got, want, "gather_qmm", dtype=BF16)


@pytest.mark.parametrize("device", DEVICES)
def test_gather_qmm_strided_indices_bias_out(device, rng):
    """Indices as a strided view, a bias, and out= (poisoned first: every element must be
    written)."""
    ref_q = make_weight("mxfp4", (E, 48, 64), rng)
    x = randn(rng, (4, 3, 64), BF16)
    idx_full = indices(rng, (4, 2))
    idx = idx_full[:, 1]                                    # stride 2 elements
    bias = randn(rng, (48,), F32)
    out = dev(poison((4, 3, 48), BF16), device)
    got = gqmm(device, x, ref_q, idx, bias=bias, out=out)
    assert got is out
    assert_matmul_close(out, R.gather_qmm(x, ref_q, idx, bias=bias), "gather_qmm", dtype=BF16)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,m", [(n, m) for n in ("nvfp4", "mxfp8", "affine4") for m in (1, 2, 4)
                                    if (n, m) != ("mxfp8", 1)])   # (quantized_matmul: qmv there)
def test_gather_qmm_equals_batched_quantized_matmul(name, m, device, rng):
    """With indices 0..E-1 over x [E, M, K], gather_qmm is quantized_matmul with the batched
    weight, bit for bit: the same kernels and order of sums (quantized_matmul takes the
    entries one by one, gather_qmm on the GPU groups them by expert first). (M <= 4: above,
    quantized_matmul may dequantize fp32-scaled affine weights to bf16 for a GEMM.)"""
    ref_q = make_weight(name, (E, 32, 128), rng)
    x = randn(rng, (E, m, 128), BF16)
    got = gqmm(device, x, ref_q, np.arange(E, dtype=np.int32))
    kw = {"fp8_format": ref_q.fp8_format} if ref_q.mode == "mxfp8" else {}
    want = qq.quantized_matmul(dev(x, device), dev(ref_q.data, device), dev(ref_q.scales, device),
                               dev(ref_q.biases, device), group_size=ref_q.group_size,
                               bits=ref_q.bits, mode=ref_q.mode, **kw)
    assert np.array_equal(to_numpy(got).view(np.uint16), to_numpy(want).view(np.uint16))


def test_gather_qmm_bad_index_cpu(rng):
    """The CPU refuses an index outside [0, E), naming the argument and the entry."""
    ref_q = make_weight("nvfp4", (E, 16, 64), rng)
    x = randn(rng, (3, 1, 64), F32)
    for bad in (E, -1):
        idx = np.array([0, bad, 2], dtype=np.int32)
        e = raises(ValueError, "rhs_indices", gqmm, "cpu", x, ref_q, idx)
        assert "[0, E=6)" in str(e) and "batch entry 1" in str(e)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 8])
@pytest.mark.parametrize("entries", [4, 12], ids=["one-by-one", "grouped"])
def test_gather_qmm_bad_index_gpu(entries, m, rng):
    """The GPU cannot raise without synchronizing: an index outside [0, E) gives NaN rows
    for its entry, the others stay right (entries taken one by one, and grouped by expert,
    where the bad ones form a group of their own)."""
    ref_q = make_weight("nvfp4", (E, 16, 64), rng)
    x = randn(rng, (entries, m, 64), BF16)
    idx = np.resize(np.array([1, E, -3, 5], dtype=np.int32), entries)
    got = to_numpy(gqmm("cuda", x, ref_q, idx)).astype(np.float32)
    bad = (idx < 0) | (idx >= E)
    assert np.isnan(got[bad]).all()
    good = np.flatnonzero(~bad)
    assert_matmul_close(got[good].astype(BF16), R.gather_qmm(x[good], ref_q, idx[good]), "gather_qmm",
                        dtype=BF16)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["nvfp4", "mxfp8", "affine4"])
@pytest.mark.parametrize("case", ["many", "one-expert", "wide-E", "max-E", "past-max-E"])
def test_gather_qmm_grouping(case, name, rng):
    """The GPU's grouping of entries by expert: thousands of entries (more than the plan's
    1024 threads), all on one expert (120 rows: tiles of 32 rows for the fp formats, 16 for
    affine, several per expert, the last one partial), more experts than threads see one
    each (E = 1500), the most experts the plan's shared memory holds (4000), and past it
    (4095: entries one by one; with the old bound of 4095 the plan's tables passed the 48 KB
    a launch gets)."""
    e, t, top, m = {"many": (37, 600, 4, 1), "one-expert": (5, 40, 1, 3), "wide-E": (1500, 200, 8, 1),
                    "max-E": (4000, 300, 8, 1), "past-max-E": (4095, 300, 8, 1)}[case]
    n, k = (32, 128) if e < 4000 else (16, 64)
    ref_q = make_weight(name, (e, n, k), rng)
    x = randn(rng, (t, 1, m, k), BF16)
    idx = indices(rng, (t, top), e) if case != "one-expert" else np.full((t, top), 3, np.int32)
    got = gqmm("cuda", x, ref_q, idx)
    assert_matmul_close(got, R.gather_qmm(x, ref_q, idx), f"gather_qmm {case}", dtype=BF16)


@pytest.mark.gpu
def test_gather_qmm_repeatable(rng):
    """The same call twice gives the same bits (fixed order of the k-split sums)."""
    ref_q = make_weight("nvfp4", (8, 256, 2048), rng)
    x = randn(rng, (16, 1, 1, 2048), BF16)
    idx = indices(rng, (16, 2), 8)
    a = to_numpy(gqmm("cuda", x, ref_q, idx)).view(np.uint16)
    b = to_numpy(gqmm("cuda", x, ref_q, idx)).view(np.uint16)
    assert np.array_equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_gather_qmm_errors(device, rng):
    ref_q = make_weight("nvfp4", (E, 16, 64), rng)
    x = randn(rng, (3, 1, 64), BF16)
    w, s = dev(ref_q.data, device), dev(ref_q.scales, device)
    xd = dev(x, device)
    i32 = dev(np.zeros(3, np.int32), device)
    raises(TypeError, "rhs_indices", qq.gather_qmm, xd, w, s, mode="nvfp4")
    raises(TypeError, "rhs_indices", qq.gather_qmm, xd, w, s, rhs_indices=dev(np.zeros(3, np.int64), device),
           mode="nvfp4")
    raises(ValueError, "rhs_indices", qq.gather_qmm, xd, w, s, rhs_indices=dev(np.zeros(4, np.int32), device),
           mode="nvfp4")
    raises(ValueError, "w", qq.gather_qmm, xd, w[0], s[0], rhs_indices=i32, mode="nvfp4")
    raises(ValueError, "x", qq.gather_qmm, dev(x[0, 0], device), w, s, rhs_indices=i32, mode="nvfp4")
    raises(ValueError, "K", qq.gather_qmm, dev(x[..., :32], device), w, s, rhs_indices=i32, mode="nvfp4")


def test_gather_qmm_quantized_array(rng):
    """A QuantizedArray of [E, N, K] carries the weight's parameters."""
    wf = randn(rng, (E, 32, 64), F32)
    qa = qq.quantize(wf, mode="mxfp8")
    x = randn(rng, (2, 1, 3, 64), F32)
    idx = indices(rng, (2, 3))
    got = qq.gather_qmm(x, qa, rhs_indices=idx)
    ref_q = R.quantize(wf, mode="mxfp8")
    assert_matmul_close(got, R.gather_qmm(x, ref_q, idx), "gather_qmm", dtype=F32)
