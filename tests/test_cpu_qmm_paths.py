"""The CPU quantized_matmul's ways through its code give the same bits: a [1, 32] x [32, 32]
product (one batch entry, one block of rows: no grouping of the entries, the weight's rows
dequantized in one call) equals the same row and weight tiled inside a bigger problem (more
rows of x, more blocks of w, batch entries grouped by weight), with linear or blocked scales
(scale bytes read in place or gathered) and fp32 or bf16 affine scales (the same values, read
in place or converted). Both orientations, bias, every x dtype."""

from __future__ import annotations

import numpy as np
import pytest

import qq
import reference as R
from helpers import BF16, assert_bits_equal
from matmul_cases import F32, randn, qmm

F16 = np.float16

CFGS = [dict(mode="nvfp4"), dict(mode="nvfp4", global_scale=True), dict(mode="mxfp4"), dict(mode="mxfp8"),
        dict(mode="affine", bits=4, group_size=32), dict(mode="affine", bits=8, group_size=32)]
CFG_IDS = ["nvfp4", "nvfp4-gs", "mxfp4", "mxfp8", "affine4", "affine8"]
TILES = 4   # copies of the weight side by side along N in the big problem
ROW = 37    # x's row that holds the small problem's row in the big one (of 70)


def _weight(rng, cfg, transpose, wdtype=F32, scale_layout="linear"):
    wf = randn(rng, (32, 32), wdtype, 0.1)
    kw = {k: v for k, v in cfg.items() if k != "global_scale"}
    gs = R.amax(wf) if cfg.get("global_scale") else None
    return R.quantize(wf, global_scale=gs, scale_layout=scale_layout, **kw)


def _tiled(ref, transpose):
    """The weight TILES times along N: w [N, K] stacks its rows (axis 0), w [K, N] its columns
    (axis 1; data, scales and biases are all along N there)."""
    ax = 0 if transpose else 1
    cat = lambda a: None if a is None else np.ascontiguousarray(np.concatenate([a] * TILES, axis=ax))  # noqa: E731
    return type(ref)(**{**ref.__dict__, "data": cat(ref.data), "scales": cat(ref.scales),
                        "biases": cat(ref.biases)})


def _call(x, ref, transpose, bias):
    out = qmm("cpu", x, ref, transpose, bias=bias)
    return np.asarray(out)


@pytest.mark.parametrize("transpose", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("cfg", CFGS, ids=CFG_IDS)
def test_small_equals_tiled(cfg, dtype, transpose, rng):
    ref = _weight(rng, cfg, transpose)
    bias = randn(rng, (32,), dtype)
    x = randn(rng, (1, 32), dtype)
    small = _call(x, ref, transpose, bias)
    xb = randn(rng, (70, 32), dtype)   # more than the 64 rows the CPU holds at a time
    xb[ROW] = x[0]
    big = _call(xb, _tiled(ref, transpose), transpose, np.concatenate([bias] * TILES))
    for j in range(TILES):
        assert_bits_equal(big[ROW:ROW + 1, 32 * j:32 * (j + 1)], small, f"tile {j} of the big product")
    # batch entries: x [3, 1, 32] over one broadcast weight (entries grouped by weight), and
    # over a batched weight [3, ...] holding it in entry 1
    xs = randn(rng, (3, 1, 32), dtype)
    xs[1] = x
    got = _call(xs, ref, transpose, bias)
    assert_bits_equal(got[1], small, "entry 1 of x [3, 1, 32] @ w")
    wb = type(ref)(**{**ref.__dict__, **{k: None if getattr(ref, k) is None else
                                         np.ascontiguousarray(np.stack([getattr(ref, k)] * 3))
                                         for k in ("data", "scales", "biases")}})
    got = _call(xs, wb, transpose, bias)
    assert_bits_equal(got[1], small, "entry 1 of x [3, 1, 32] @ w [3, ...]")
    for e in range(3):  # each entry as its own small product
        assert_bits_equal(got[e], _call(xs[e], ref, transpose, bias), f"entry {e} of x [3, 1, 32] @ w [3, ...]")


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize("cfg", CFGS[:4], ids=CFG_IDS[:4])
def test_blocked_equals_linear(cfg, dtype, rng):
    """fp weights with blocked scales (gathered a row at a time) give the linear ones' bits
    (read in place, a block of rows a call)."""
    seed = int(rng.integers(1 << 30))
    lin = _weight(np.random.default_rng(seed), cfg, True)
    blk = _weight(np.random.default_rng(seed), cfg, True, scale_layout="blocked")
    for m in (1, 70):
        x = randn(rng, (m, 32), dtype)
        assert_bits_equal(_call(x, blk, True, None), _call(x, lin, True, None), f"blocked scales, M = {m}")


@pytest.mark.parametrize("transpose", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("cfg", CFGS[4:], ids=CFG_IDS[4:])
def test_affine_scale_dtypes(cfg, transpose, rng):
    """Affine scales and biases in bfloat16 (converted to fp32 a row at a time) and the same
    values in float32 (read in place): the same bits."""
    ref = _weight(rng, cfg, transpose, wdtype=BF16)
    f32 = type(ref)(**{**ref.__dict__, "scales": ref.scales.astype(F32), "biases": ref.biases.astype(F32)})
    for m in (1, 70):
        x = randn(rng, (m, 32), F32)
        assert_bits_equal(_call(x, f32, transpose, None), _call(x, ref, transpose, None),
                          f"fp32 vs bf16 affine scales, M = {m}")
