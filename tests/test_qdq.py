"""quantize_dequantize (q(x)'s bf16 values along K and / or along M, one read of x) and
qqmm's prepared operands (x_prepared, w_prepared, transposed views): docs/api.md.

The values are checked bit for bit against the NumPy reference's exact dequantization of
its own quantization (reference.py: no global factor, one rounding to bf16, which is exact
except past bf16's range); the column-wise ones against the quantization of x^T zero-padded
to whole blocks. The GEMMs on prepared values against the float64 product of those values."""

import numpy as np
import pytest

import reference as R
from helpers import (BF16, DEVICES, FP_PARAMS, assert_bits_equal, assert_matmul_close, dtype_params, raises,
                     capture, random_data, to_device, to_numpy)

import qq

F32 = np.float32


def _gs(cfg, x):
    return R.amax(x).astype(F32) if cfg.global_scale else None


class _Vals:
    """Reference values (bf16) and where their zeros may carry either sign: the groups the
    reference marks loose_sign (amax 0, an nvfp4 scale of 0), as assert_quantized_equal."""

    def __init__(self, v, loose):
        self.v, self.loose = v, loose

    @property
    def T(self):
        return _Vals(np.ascontiguousarray(self.v.T), np.ascontiguousarray(self.loose.T))


def _values(x, cfg, gs):
    """The reference's q(x)'s values along the last axis as bf16 (global factor left out)."""
    r = R.quantize(x, **cfg.kwargs(gs))
    v = R.dequantize_exact(r.data, r.scales, r.group_size, r.bits, r.mode, fp8_format=r.fp8_format)
    with np.errstate(over="ignore", invalid="ignore"):
        v = R.f32_to_bf16(v.astype(F32))
    return _Vals(v, np.repeat(r.loose_sign, r.group_size, axis=-1).reshape(v.shape))


def _col_values(x, cfg, gs):
    m = x.shape[0]
    g = cfg.group_size
    pad = np.zeros(((m + g - 1) // g * g, x.shape[1]), x.dtype)
    pad[:m] = x
    t = _values(np.ascontiguousarray(pad.T), cfg, gs).T
    return _Vals(t.v[:m], t.loose[:m])


def _assert_values(got, want: _Vals, what):
    got = to_numpy(got).copy()
    bits = got.view(np.uint16)
    bits[want.loose & ((bits & 0x7FFF) == 0)] &= 0x7FFF
    assert_bits_equal(got, want.v, what=what)


def _with_specials(rng, x):
    """Zeros, a NaN, +-Inf and a huge value in some rows (groups along both axes see them)."""
    x = x.copy()
    x[3, :] = 0
    x[5, 7] = np.nan
    x[9, 1] = np.inf
    x[10, 40 % x.shape[1]] = -np.inf
    return x


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("shape", [(64, 96), (70, 64), (33, 32), (256, 160)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("cfg", FP_PARAMS)
def test_qdq_both_equal_reference(rng, cfg, shape, dtype, device):
    """Both orientations from one call (the fused kernel on the GPU where rows are whole
    8-byte pieces) equal the reference's values; ragged M (70, 33) counts missing rows as
    zeros; special values (NaN groups, Inf, zeros) included."""
    x = random_data(rng, shape, dtype)
    gs = _gs(cfg, x)     # (of the finite data: a NaN amax is refused as a global scale)
    x = _with_specials(rng, x)
    want_r, want_c = _values(x, cfg, gs), _col_values(x, cfg, gs)
    gs_d = None if gs is None else to_device(gs, device)
    kw = {k: v for k, v in cfg.kwargs(gs_d).items() if k != "mode"}
    r, c = qq.quantize_dequantize(to_device(x, device), cfg.mode, colwise=True, **kw)
    _assert_values(r, want_r, what=f"rows [{device}]")
    _assert_values(c, want_c, what=f"cols [{device}]")
    # one orientation at a time: the same values
    _assert_values(qq.quantize_dequantize(to_device(x, device), cfg.mode, **kw), want_r, what="rows only")
    _assert_values(qq.quantize_dequantize(to_device(x, device), cfg.mode, rowwise=False, colwise=True, **kw),
                   want_c, what="cols only")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cfg", [p for p in FP_PARAMS if "e4m3" in p.id])
def test_qdq_mxfp8_bf16_every_scale(rng, cfg, device):
    """mxfp8 E4M3 of bf16 x, row-wise, over the scale bytes a bf16 group can have: one
    group per amax exponent from bf16's smallest subnormal to its largest binade (scale
    bytes 0 .. 246: every one by the floor rule, most by the ceil rule), each group's other
    values spread over 15 binades below its amax (E4M3 subnormals, values under half the
    smallest code, ties: 4 bits past E4M3's 3), the amax first in its group in one row and
    last in the other, plus an all-zero group. (Written for a bf16x2 form of the GPU kernel
    that took scale bytes 7 .. 241 only and was not kept: bench/results/
    quantize-h200-profile.md, session ah.)"""
    exps = np.arange(-133, 128)
    ng = len(exps) + 1
    mant = rng.integers(128, 256, size=(ng, 32)).astype(F32) / 128       # [1, 2) in bf16
    shift = rng.integers(0, 15, size=(ng, 32)).astype(F32)
    shift[:, 0] = 0                                                        # the amax's binade
    sign = np.where(rng.random((ng, 32)) < 0.5, -1, 1).astype(F32)
    e = np.append(exps, 0).astype(F32)[:, None]
    with np.errstate(over="ignore", under="ignore"):
        x = sign * mant * np.exp2(e - shift)
    x[-1] = 0
    x = np.clip(x, -3.3e38, 3.3e38).astype(BF16).reshape(1, -1)
    x = np.repeat(x, 2, axis=0)
    x[1] = x[1, ::-1]                                                     # the amax last in its group
    kw = {k: v for k, v in cfg.kwargs(None).items() if k != "mode"}
    _assert_values(qq.quantize_dequantize(to_device(x, device), cfg.mode, **kw), _values(x, cfg, None),
                   what=f"rows [{device}]")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cfg", [p for p in FP_PARAMS if "e5m2" not in p.id][::2])
def test_qdq_strided_and_odd_widths(rng, cfg, device):
    """Rows that are not whole 8-byte pieces (a row pitch of 65 elements; 37 columns for the
    column-wise values alone) take the element-wise kernels; same values."""
    big = random_data(rng, (96, 65), BF16)
    x_dev = to_device(big, device)[:, :64]
    x = np.ascontiguousarray(big[:, :64])
    gs = _gs(cfg, x)
    gs_d = None if gs is None else to_device(gs, device)
    kw = {k: v for k, v in cfg.kwargs(gs_d).items() if k != "mode"}
    r, c = qq.quantize_dequantize(x_dev, cfg.mode, colwise=True, **kw)
    _assert_values(r, _values(x, cfg, gs), what="rows, pitch 65")
    _assert_values(c, _col_values(x, cfg, gs), what="cols, pitch 65")
    y = random_data(rng, (40, 37), BF16)
    c = qq.quantize_dequantize(to_device(y, device), cfg.mode, rowwise=False, colwise=True, **kw)
    _assert_values(c, _col_values(y, cfg, gs), what="cols, K = 37")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["nvfp4", "mxfp4", "mxfp8"])
def test_qqmm_on_prepared_operands(rng, mode, device):
    """qqmm(x_prepared, w_prepared) multiplies the values as they are: it equals qqmm on the
    float operands (which quantizes them the same way) and the float64 product; transposed
    views (the weight gradient dy^T @ x with both along the tokens) need no copy, and equal
    grouped_qqmm_wgrad with one expert."""
    x, w = random_data(rng, (70, 64), BF16, varied=False), random_data(rng, (48, 64), BF16, varied=False)
    dy = random_data(rng, (70, 32), BF16, varied=False)
    nv = mode == "nvfp4"
    gx, gw, gdy = (R.amax(a).astype(F32) if nv else None for a in (x, w, dy))
    d = lambda a: None if a is None else to_device(a, device)  # noqa: E731
    xr, xc = qq.quantize_dequantize(d(x), mode, global_scale=d(gx), colwise=True)
    wr = qq.quantize_dequantize(d(w), mode, global_scale=d(gw))
    got = qq.qqmm(xr, wr, mode=mode, x_prepared=True, w_prepared=True, global_scale_x=d(gx),
                  global_scale_w=d(gw), dtype="float32")
    assert_matmul_close(got, R.qqmm(x, w, mode, global_scale_x=gx, global_scale_w=gw), what="prepared x, w")
    on_the_fly = qq.qqmm(d(x), d(w), mode=mode, global_scale_x=d(gx), global_scale_w=d(gw), dtype="float32")
    np.testing.assert_allclose(to_numpy(got), to_numpy(on_the_fly), rtol=1e-6, atol=1e-6)
    # x prepared, w packed (dequantized by qqmm)
    qw = qq.quantize(d(w), mode=mode, global_scale=d(gw))
    got = qq.qqmm(xr, qw, x_prepared=True, global_scale_x=d(gx), dtype="float32")
    assert_matmul_close(got, R.qqmm(x, w, mode, global_scale_x=gx, global_scale_w=gw), what="prepared x, packed w")
    # the weight gradient from transposed views
    dyc = qq.quantize_dequantize(d(dy), mode, global_scale=d(gdy), rowwise=False, colwise=True)
    dw = qq.qqmm(dyc.T, xc.T, mode=mode, x_prepared=True, w_prepared=True, global_scale_x=d(gdy),
                 global_scale_w=d(gx), dtype="float32")
    a, b = to_numpy(dyc).astype(np.float64), to_numpy(xc).astype(np.float64)
    alpha = (float(gdy) / 2688.0) * (float(gx) / 2688.0) if nv else 1.0
    assert_matmul_close(dw, R.MatmulRef(a.T @ b * alpha, np.abs(a).T @ np.abs(b) * alpha), what="transposed views")
    ends = d(np.array([70], np.int32))
    ref = qq.grouped_qqmm_wgrad(d(dy), d(x), ends, mode=mode, global_scale_x=d(gdy), global_scale_dy=d(gx),
                                dtype="float32")[0]
    np.testing.assert_allclose(to_numpy(dw), to_numpy(ref), rtol=1e-6, atol=1e-6)
    # dgrad: dy [T, N] @ W [N, K] with W's values along N, read through W^T's view
    w2, dy2 = random_data(rng, (64, 96), BF16, varied=False), random_data(rng, (70, 64), BF16, varied=False)
    g2, gd2 = (R.amax(a).astype(F32) if nv else None for a in (w2, dy2))
    wc = qq.quantize_dequantize(d(w2), mode, global_scale=d(g2), rowwise=False, colwise=True)
    dyr = qq.quantize_dequantize(d(dy2), mode, global_scale=d(gd2))
    dx = qq.qqmm(dyr, wc.T, mode=mode, x_prepared=True, w_prepared=True, global_scale_x=d(gd2),
                 global_scale_w=d(g2), dtype="float32")
    a, b = to_numpy(dyr).astype(np.float64), to_numpy(wc).astype(np.float64)
    alpha = (float(gd2) / 2688.0) * (float(g2) / 2688.0) if nv else 1.0
    assert_matmul_close(dx, R.MatmulRef(a @ b * alpha, np.abs(a) @ np.abs(b) * alpha), what="dgrad view")


@pytest.mark.parametrize("device", DEVICES)
def test_qdq_and_prepared_errors(rng, device):
    x = to_device(random_data(rng, (64, 64), BF16), device)
    raises(ValueError, "affine", qq.quantize_dequantize, x, "affine")
    raises(ValueError, ["rowwise", "colwise"], qq.quantize_dequantize, x, "mxfp8", rowwise=False)
    raises(ValueError, ["x", "M, K"], qq.quantize_dequantize, to_device(random_data(rng, (2, 32, 64), BF16), device),
           "mxfp8")
    raises(ValueError, ["K", "group_size"], qq.quantize_dequantize,
           to_device(random_data(rng, (32, 40), BF16), device), "mxfp8")
    qx = qq.quantize(x, mode="mxfp8")
    w = qq.quantize_dequantize(x, "mxfp8")
    raises(ValueError, ["x_prepared", "x"], qq.qqmm, qx.data, w, mode="mxfp8", x_prepared=True, w_prepared=True)
    raises(ValueError, ["w_prepared"], qq.qqmm, x, qx, w_prepared=True)
    if device == "cuda":
        raises(qq.NotSupportedError, ["qmma", "prepared"], qq.qqmm, w[:1], qx, x_prepared=True, route="qmma")


@pytest.mark.parametrize("device", DEVICES)
def test_qdq_torch_compile(rng, device):
    """The torch op of quantize_dequantize and qqmm's prepared flags pass opcheck."""
    torch = pytest.importorskip("torch")
    from qq import _torch_ops  # noqa: F401  (registers the ops)
    from helpers import torch_device
    dev = torch_device(device)
    x = torch.randn(64, 96, device=dev, dtype=torch.bfloat16)
    w = torch.randn(32, 96, device=dev, dtype=torch.bfloat16)
    torch.library.opcheck(torch.ops.qq.quantize_dequantize, (x, None, "mxfp8", "ceil", "e4m3", True, True))
    xr = qq.quantize_dequantize(x, "mxfp8")
    wr = qq.quantize_dequantize(w, "mxfp8")
    torch.library.opcheck(torch.ops.qq.qqmm, (xr, None, None, wr, None, None, None, None, None, 0.0, "mxfp8",
                                              32, 8, "ceil", "linear", "linear", "e4m3", torch.float32, True, True))
    f = torch.compile(lambda a, b: qq.qqmm(*qq.quantize_dequantize(a, "mxfp8", colwise=True)[:1], b,
                                           x_prepared=True, w_prepared=True, mode="mxfp8"), fullgraph=True)
    torch.testing.assert_close(f(x, wr), qq.qqmm(xr, wr, x_prepared=True, w_prepared=True, mode="mxfp8"),
                               rtol=0, atol=0)


def _moe_values_ref(w, rounding, fp8_format):
    """q(w)'s values under quantize_moe's 32x32 rule, from test_colwise's reference."""
    from test_colwise import ref_moe
    w3 = w if w.ndim == 3 else w[None]
    codes, byte = ref_moe(w3, "32x32", rounding, fp8_format)
    fmt = R.elem_format("mxfp8", fp8_format)
    e, d1, d2 = codes.shape
    scale = np.repeat(np.repeat(R.ue8m0_value(byte), 32, axis=1), 32, axis=2)   # [E, D1, D2]
    with np.errstate(over="ignore", invalid="ignore"):
        v = R.f32_to_bf16((R.decode(codes, fmt).astype(np.float64) * scale).astype(F32))
    loose = np.repeat(np.repeat(np.abs(np.nan_to_num(w3.astype(F32), nan=1.0)).reshape(e, d1 // 32, 32, d2 // 32, 32)
                                .max(axis=(2, 4)) == 0, 32, axis=1), 32, axis=2)
    return _Vals(v if w.ndim == 3 else v[0], loose if w.ndim == 3 else loose[0])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("shape", [(3, 64, 96), (96, 32), (1, 128, 64)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("rounding,fp8", [("ceil", "e4m3"), ("floor", "e4m3"), ("ceil", "e5m2")])
def test_qdq_moe_equals_quantize_moe(rng, rounding, fp8, shape, dtype, device):
    """quantize_dequantize_moe: the values of quantize_moe's 32x32 codes (one scale per tile),
    in w's shape and transposed, from one call; special values included."""
    w = random_data(rng, shape, dtype)
    w[..., -32:, -32:] = 0      # an all-zero tile (its zeros may carry either sign)
    w[..., 3, :] = 0
    w[..., 5, 7] = np.nan       # a NaN tile
    w[..., 40 % shape[-2], 1] = np.inf
    want = _moe_values_ref(w, rounding, fp8)
    v, t = qq.quantize_dequantize_moe(to_device(w, device), values=True, transposed=True, rounding=rounding,
                                      fp8_format=fp8)
    _assert_values(v, want, what=f"values [{device}]")
    _assert_values(t, want.T if w.ndim == 2 else _Vals(np.ascontiguousarray(np.swapaxes(want.v, -1, -2)),
                                                       np.ascontiguousarray(np.swapaxes(want.loose, -1, -2))),
                   what=f"transposed [{device}]")
    _assert_values(qq.quantize_dequantize_moe(to_device(w, device), rounding=rounding, fp8_format=fp8), want,
                   what="values only")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", dtype_params())
def test_qdq_moe_strided_rows(rng, dtype, device):
    """Expert weights whose rows are not 16-byte pieces apart (a row pitch of 100 elements)
    take quantize_dequantize_moe's element-wise loads; the same values as a contiguous copy."""
    big = random_data(rng, (2, 64, 100), dtype)
    big[1, 5, 7] = np.nan
    w = np.ascontiguousarray(big[..., :96])
    want = _moe_values_ref(w, "ceil", "e4m3")
    v, t = qq.quantize_dequantize_moe(to_device(big, device)[..., :96], values=True, transposed=True)
    _assert_values(v, want, what=f"values, pitch 100 [{device}]")
    _assert_values(t, _Vals(np.ascontiguousarray(np.swapaxes(want.v, -1, -2)),
                            np.ascontiguousarray(np.swapaxes(want.loose, -1, -2))), what=f"transposed, pitch 100 [{device}]")


@pytest.mark.parametrize("device", DEVICES)
def test_qdq_moe_errors(rng, device):
    w = to_device(random_data(rng, (2, 64, 64), BF16), device)
    raises(ValueError, ["values", "transposed"], qq.quantize_dequantize_moe, w, values=False)
    raises(ValueError, ["w", "32"], qq.quantize_dequantize_moe, to_device(random_data(rng, (2, 48, 64), BF16), device))
    raises(ValueError, ["w"], qq.quantize_dequantize_moe, to_device(random_data(rng, (64,), BF16), device))


@pytest.mark.parametrize("device", DEVICES)
def test_grouped_qqmm_prepared_values_and_views(rng, device):
    """grouped_qqmm(w_prepared=True) on quantize_dequantize_moe's values equals grouped_qqmm on
    quantize_moe's codes (the same values); the transposed layout given as a view of the other
    ([E, N, K] as vt.transpose(1, 2)) gives the same result (the per-expert loop reads it)."""
    e, n, k, t = 3, 64, 96, 70
    w = to_device(random_data(rng, (e, n, k), BF16, varied=False), device)
    x = to_device(random_data(rng, (t, k), BF16, varied=False), device)
    ends = to_device(np.array([20, 20, 70], np.int32), device)
    swap = (lambda a: np.swapaxes(a, 1, 2)) if device == "cpu" else (lambda a: a.transpose(1, 2))  # noqa: E731
    v, vt = qq.quantize_dequantize_moe(w, values=True, transposed=True)
    got = qq.grouped_qqmm(x, v, ends, w_prepared=True, mode="mxfp8", dtype="float32")
    d, s = qq.quantize_moe(swap(w), scaling="32x32", scale_layout="blocked", torch_dtypes=False)
    ref = qq.grouped_qqmm(x, (d, s), ends, mode="mxfp8", moe_scaling="32x32", scale_layout="blocked",
                          dtype="float32")
    np.testing.assert_allclose(to_numpy(got), to_numpy(ref), rtol=1e-6, atol=1e-6)
    view = qq.grouped_qqmm(x, swap(vt), ends, w_prepared=True, mode="mxfp8", dtype="float32")
    np.testing.assert_allclose(to_numpy(view), to_numpy(got), rtol=1e-6, atol=1e-6)
    raises(ValueError, "w_prepared", qq.grouped_qqmm, x, (d, s), ends, w_prepared=True, moe_scaling="32x32",
           scale_layout="blocked")


@pytest.mark.parametrize("device", DEVICES)
def test_grouped_qqmm_prepared_transposed_view_bf16(rng, device):
    """A MoE layer's dgrad: dy [T, N] @ W[e] with W's [E, N, K] values given as the view
    v.transpose(1, 2) ([E, K, N], stride 1 on axis 1), bf16 result. On Hopper this is the
    transposed-B grouped GEMM (one launch, so it also runs under CUDA-graph capture, where the
    per-expert loop refuses); it equals the call on a contiguous copy bit for bit."""
    e, n, k, t = 4, 96, 64, 90
    w = to_device(random_data(rng, (e, n, k), BF16, varied=False), device)
    dy = to_device(random_data(rng, (t, n), BF16, varied=False), device)
    ends = to_device(np.array([30, 30, 31, 90], np.int32), device)
    v = qq.quantize_dequantize_moe(w)                       # [E, N, K]
    view = np.swapaxes(v, 1, 2) if device == "cpu" else v.transpose(1, 2)
    copy = np.ascontiguousarray(view) if device == "cpu" else view.contiguous()
    got = qq.grouped_qqmm(dy, view, ends, w_prepared=True, mode="mxfp8")
    want = qq.grouped_qqmm(dy, copy, ends, w_prepared=True, mode="mxfp8")
    assert got.shape == (t, k)
    np.testing.assert_array_equal(to_numpy(got).view(np.uint16), to_numpy(want).view(np.uint16))
    dyq = to_numpy(qq.quantize_dequantize(dy, "mxfp8")).astype(np.float64)   # q(dy) along N
    ref = np.concatenate([dyq[r0:r1] @ to_numpy(v)[i].astype(np.float64)
                          for i, (r0, r1) in enumerate(zip([0, 30, 30, 31], [30, 30, 31, 90]))])
    np.testing.assert_allclose(to_numpy(got).astype(np.float64), ref, rtol=1e-2, atol=1e-2)
    if device == "cuda" and qq.build_info().get("grouped_sm90") == "ON" and qq.device_capability(0)[0] == 9:
        import torch
        out = torch.empty_like(got)
        g = torch.cuda.CUDAGraph()
        with capture(g):
            qq.grouped_qqmm(dy, view, ends, w_prepared=True, mode="mxfp8", out=out)
        out.zero_()
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, got)
