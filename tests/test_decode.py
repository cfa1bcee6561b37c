"""qq.prepare_decode and quantized_matmul with a DecodeWeight (the decode layout of an nvfp4 /
mxfp4 / mxfp8 (E4M3) / affine 4-bit (group 64, 128) or 8-bit weight [N, K] and its small-M
kernel).

* CPU (run in CI): NumPy and torch CPU, fp32 and bf16 x (mxfp8, affine: NumPy fp32 and torch
  bf16), M 1..17, ragged N, zero rows and blocks, group magnitudes spanning many scale codes,
  nvfp4 global scale, bias. Each result equals (a) quantized_matmul on the packed
  QuantizedArray and (b) a float64 reference from qq.dequantize, within the fp32-summation
  bound: every product is exact, only the order of the fp32 sums may differ (affine on the
  GPU: scale and bias applied to partial sums, a looser bound). Errors (mxfp8 e5m2, affine
  group 32 at 4 bits and 3 bits among them), attributes, NaN scales / mxfp8 NaN codes, the mx
  scale windows (mxfp4 2^-20 .. 2^10, mxfp8 2^-108 .. 2^16 over codes that are not all +-0),
  affine scales that are not bf16 values, affine Inf / NaN in x, scales and biases, and
  linear == blocked.
* GPU (`gpu` marker): torch CUDA, route "decode" for bf16 x and M <= 64 (compute capability
  >= 9.0; 17..64 rows run 32- and 64-row tiles of x), other routes beyond, out=, determinism, GPU layout bytes == CPU layout bytes, 3-D x.
"""

from __future__ import annotations

import functools
import zlib

import ml_dtypes
import numpy as np
import pytest

import qq
from helpers import BF16, as_bytes, capture, cast, numpy_to_torch, to_numpy

F16 = np.float16
F32 = np.float32
F64 = np.float64
GROUP = {"nvfp4": 16, "mxfp4": 32, "mxfp8": 32}
# Group magnitudes 10**U(lo, hi): many scale codes; the mx modes stay inside their UE8M0
# windows (mxfp8: scales 2^-47 .. 2^7 of 2^-108 .. 2^16).
MAGS = {"nvfp4": (-3.0, 3.0), "mxfp4": (-4.0, 2.0), "mxfp8": (-12.0, 5.0), "affine": (-3.0, 3.0)}
# affine configurations: (bits, group_size); their weights are quantized from bfloat16 (the
# layout stores bf16 scales and biases)
AFFINE = {"a4g64": (4, 64), "a4g128": (4, 128), "a8g32": (8, 32), "a8g128": (8, 128)}
CFGS = ["nvfp4", "nvfp4-gs", "mxfp4", "mxfp8", *AFFINE]
CPU_SHAPES = [(64, 256), (100, 512), (192, 256)]
GPU_SHAPES = [(64, 256), (200, 768), (4096, 4096)]
gpu = pytest.mark.gpu
DEVICES = ["cpu", pytest.param("cuda", marks=gpu)]


def mode_of(cfg):
    return "affine" if cfg in AFFINE else cfg.split("-")[0]


def group_of(cfg):
    return AFFINE[cfg][1] if cfg in AFFINE else GROUP[mode_of(cfg)]


def rel_of(mode):
    """The relative summation bound of the decode route: affine applies its scale and bias
    to fp32 partial sums (s * sum x c + b * sum x), one more rounding each."""
    return 4e-5 if mode == "affine" else 1e-5


def case_rng(*case):
    return np.random.default_rng(zlib.crc32(repr(case).encode()))


def make_weight(rng, cfg, n, k):
    """float32 [N, K]: normal values times a random magnitude per group, one all-zero row,
    two zero groups and (K >= 512) a zero 256-wide chunk."""
    g = group_of(cfg)
    lo, hi = MAGS[mode_of(cfg)]
    mags = 10.0 ** rng.uniform(lo, hi, size=(n, k // g, 1))
    w = (rng.standard_normal((n, k // g, g)) * mags).reshape(n, k)
    w[n // 3] = 0
    w[1, g:3 * g] = 0
    if k >= 512:
        w[2, 256:512] = 0
    return w.astype(F32)


def torch_mod():
    return pytest.importorskip("torch")  # torch only where a test uses it


def to_fw(a, fw):
    """A NumPy array as `fw`: "numpy", "torch" (CPU) or "cuda" (torch CUDA)."""
    if a is None or fw == "numpy":
        return a
    t = numpy_to_torch(np.asarray(a), torch_mod())
    if fw == "cuda":
        if not torch_mod().cuda.is_available():
            pytest.skip("torch without CUDA")
        t = t.cuda()
    return t


def quantize(w, cfg, fw, layout="linear"):
    """qq.quantize of the float32 NumPy weight `w` in framework `fw`."""
    if cfg in AFFINE:
        bits, group = AFFINE[cfg]
        return qq.quantize(to_fw(cast(w, BF16), fw), mode="affine", bits=bits, group_size=group)
    wt = to_fw(w, fw)
    gs = qq.amax(wt) if cfg.endswith("-gs") else None
    return qq.quantize(wt, mode=mode_of(cfg), global_scale=gs, scale_layout=layout)


def rebuild(data, scales, mode, fw, global_scale=None, shape=None):
    """A linear-layout QuantizedArray of NumPy bytes, in framework `fw`."""
    return qq.QuantizedArray(to_fw(data, fw), to_fw(scales, fw), mode=mode,
                             global_scale=to_fw(global_scale, fw), shape=shape)


def make_x(rng, shape, dtype, fw):
    return to_fw(cast(rng.standard_normal(shape), dtype), fw)


def reference(x, qa, bias=None, w_dtype=None):
    """float64 x @ W.T (+ bias) and |x| @ |W|.T, W = qq.dequantize(qa) in fp32 (global factor
    in), optionally rounded to `w_dtype` (packed paths may round W to x's dtype first)."""
    w = to_numpy(qq.dequantize(qa, dtype="float32"))
    w64 = (w if w_dtype is None else w.astype(w_dtype)).astype(F64)
    x64 = to_numpy(x).astype(F64)
    b = 0.0 if bias is None else to_numpy(bias).astype(F64)
    return x64 @ w64.T + b, np.abs(x64) @ np.abs(w64).T


def mismatch(got, want, abs_sum, rel=1e-5):
    """None if |got - want| <= rel * abs_sum (fp32 summation order) + 2^-21 |want| (global
    factor, bias) + one ulp of got's dtype + its smallest subnormal, elementwise."""
    g = to_numpy(got)
    fi = ml_dtypes.finfo(g.dtype)
    g = g.astype(F64)
    if g.shape != want.shape:
        return f"shape {g.shape} != {want.shape}"
    tol = rel * abs_sum + (2.0 ** -21 + float(fi.eps)) * np.abs(want) + float(fi.smallest_subnormal)
    bad = ~(np.abs(g - want) <= tol)
    if not bad.any():
        return None
    i = np.unravel_index(np.argmax(bad), bad.shape)
    return f"{bad.sum()} of {bad.size} off; first at {i}: got {g[i]!r}, want {want[i]!r} +- {tol[i]!r}"


def check(x, dw, bias=None, dtype="float32", route=None, **kw):
    """quantized_matmul(x, dw) equals the float64 reference and the packed path's result.
    The decode layout's products are exact (routes "decode" and "cpu"): compared with W in
    fp32 only; a packed route may also have rounded W to bf16. `route`: the expected route."""
    got = qq.quantized_matmul(x, dw, bias=bias, dtype=dtype, **kw)
    got_route = qq.last_route()
    if route is not None:
        assert got_route == route, (got_route, route)
    packed = qq.quantized_matmul(x, dw.quantized, bias=bias, dtype=dtype)
    want, s = reference(x, dw.quantized, bias)
    bf16_x = to_numpy(x).dtype == BF16
    rel = rel_of(dw.mode)
    for name, res, strict in [("decode", got, got_route in ("decode", "cpu")), ("packed", packed, False)]:
        msg = mismatch(res, want, s, rel)
        if msg is not None and not strict and bf16_x:
            msg2 = mismatch(res, *reference(x, dw.quantized, bias, BF16), rel)
            msg = None if msg2 is None else f"{msg} (with W in bf16: {msg2})"
        assert msg is None, f"{name} [{got_route}] vs reference: {msg}"
    if mismatch(packed, want, s, rel) is None:  # both within the bound of one exact value
        msg = mismatch(got, to_numpy(packed).astype(F64), s, rel=2 * rel)
        assert msg is None, f"decode [{got_route}] vs packed: {msg}"
    return got, got_route


def decode_expected(x_dtype, m):
    """Route "decode" on this GPU: bf16 x of at most 64 rows, float16 of at most 32 (dense)."""
    rows = 64 if x_dtype == BF16 else 32 if x_dtype == F16 else 0
    return m <= rows and qq.device_capability(0) >= (9, 0)


def assert_rows_same_bits(x, dw, ms, route=None):
    """Rows 0..m-1 of quantized_matmul(x[:m], dw) have the bits of the same rows of the call
    on all of x, for each m in ms (fp32 out); `route`: the full call's expected route."""
    full = to_numpy(qq.quantized_matmul(x, dw, dtype="float32"))
    if route is not None:
        assert qq.last_route() == route
    for m in ms:
        part = to_numpy(qq.quantized_matmul(x[:m].contiguous(), dw, dtype="float32"))
        np.testing.assert_array_equal(part.view(np.uint32), full[:m].view(np.uint32))


# ---------------------------------------------------------------------------
# CPU
# ---------------------------------------------------------------------------

X_KINDS = {"np-f32": ("numpy", F32), "np-bf16": ("numpy", BF16), "torch-f32": ("torch", F32),
           "torch-bf16": ("torch", BF16)}
# cfg x x kind; mxfp8 with two x kinds (both frameworks, both dtypes) to keep the count down.
CPU_CFG_X = [pytest.param(cfg, *X_KINDS[xid], id=f"{cfg}-{xid}") for cfg in CFGS for xid in X_KINDS
             if mode_of(cfg) in ("nvfp4", "mxfp4") or xid in ("np-f32", "torch-bf16")]


@pytest.mark.parametrize("with_bias", [False, True], ids=["", "bias"])
@pytest.mark.parametrize("m", [1, 3, 8, 16, 17])
@pytest.mark.parametrize("n,k", CPU_SHAPES, ids=str)
@pytest.mark.parametrize("cfg,fw,xdt", CPU_CFG_X)
def test_cpu_matches(cfg, n, k, m, fw, xdt, with_bias):
    rng = case_rng(cfg, n, k, m, fw, str(xdt), with_bias)
    qa = quantize(make_weight(rng, cfg, n, k), cfg, fw)
    dw = qq.prepare_decode(qa)
    assert type(dw.data) is type(qa.data)
    x = make_x(rng, (m, k), xdt, fw)
    bias = to_fw(rng.standard_normal(n).astype(F32), fw) if with_bias else None
    check(x, dw, bias, route="cpu")


@pytest.mark.parametrize("cfg", CFGS)
def test_cpu_default_dtype_and_out(cfg):
    """bf16 x without dtype gives bf16 (one rounding of the fp32 result); out= is written."""
    torch = torch_mod()
    rng = case_rng("dtype", cfg)
    qa = quantize(make_weight(rng, cfg, 64, 512), cfg, "torch")
    dw = qq.prepare_decode(qa)
    x = make_x(rng, (5, 512), BF16, "torch")
    got, _ = check(x, dw, dtype=None)
    assert got.dtype == torch.bfloat16 and tuple(got.shape) == (5, 64)
    out = torch.full((5, 64), float("nan"))
    assert check(x, dw, out=out)[0] is out
    assert not out.isnan().any()


@pytest.mark.parametrize("cfg", CFGS)
@pytest.mark.parametrize("fw", ["numpy", "torch"])
def test_attributes(cfg, fw):
    qa = quantize(make_weight(case_rng("attr", cfg), cfg, 100, 512), cfg, fw)
    dw = qq.prepare_decode(qa)
    assert isinstance(dw, qq.DecodeWeight)
    assert dw.shape == (100, 512) and dw.mode == mode_of(cfg)
    assert dw.quantized is qa
    assert str(dw.data.dtype).endswith("uint8")
    if qa.global_scale is None:
        assert dw.global_scale is None
    else:
        assert float(to_numpy(dw.global_scale)) == float(to_numpy(qa.global_scale))


@pytest.mark.parametrize("n", [64, 100])
@pytest.mark.parametrize("cfg", [c for c in CFGS if c not in AFFINE])
def test_blocked_equals_linear(cfg, n):
    w = make_weight(case_rng("layout", cfg, n), cfg, n, 512)
    lin = qq.prepare_decode(quantize(w, cfg, "numpy", "linear"))
    blk = qq.prepare_decode(quantize(w, cfg, "numpy", "blocked"))
    np.testing.assert_array_equal(as_bytes(blk.data), as_bytes(lin.data))


@pytest.mark.parametrize("what", ["affine-g32", "affine-3bit", "e5m2", "4d", "k320"])
def test_errors(what):
    rng = case_rng("err", what)
    w16 = cast(rng.standard_normal((64, 256)), BF16)
    if what == "affine-g32":  # a 4-bit fragment block (64 k) would span two groups
        qa = qq.quantize(w16, mode="affine", group_size=32)
    elif what == "affine-3bit":
        qa = qq.quantize(w16, mode="affine", bits=3)
    elif what == "e5m2":
        qa = qq.quantize(rng.standard_normal((64, 256)).astype(F32), mode="mxfp8", fp8_format="e5m2")
        assert qa.fp8_format == "e5m2"
    elif what == "4d":  # experts [E, N, K] are taken (gather_qmm); more axes are not
        qa = qq.quantize(rng.standard_normal((2, 2, 64, 256)).astype(F32), mode="nvfp4")
    else:
        qa = qq.quantize(rng.standard_normal((64, 320)).astype(F32), mode="nvfp4")
    with pytest.raises(ValueError, match=r"^prepare_decode:"):
        qq.prepare_decode(qa)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("byte", [0x7F, 0xFF])
def test_nvfp4_nan_scale(byte, device):
    qa = qq.quantize(case_rng("nan").standard_normal((64, 256)).astype(F32), mode="nvfp4")
    scales = qa.scales.copy()
    scales[5, 3] = byte
    with pytest.raises(qq.NotSupportedError):
        qq.prepare_decode(rebuild(qa.data, scales, "nvfp4", "numpy" if device == "cpu" else "cuda"))


def _mx_edit(scale, zero_codes):
    """An mxfp4 [64, 256] weight with row 5, group 3's scale byte set (and its codes zeroed)."""
    qa = qq.quantize(case_rng("mx").standard_normal((64, 256)).astype(F32), mode="mxfp4")
    data, scales = qa.data.copy(), qa.scales.copy()
    if zero_codes:
        data[5, 48:64] = 0
    else:
        assert data[5, 48:64].any()
    scales[5, 3] = scale
    return data, scales


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scale", [0, 100, 106, 138, 200, 254])
def test_mxfp4_scale_out_of_window(scale, device):
    data, scales = _mx_edit(scale, zero_codes=False)
    with pytest.raises(qq.NotSupportedError):
        qq.prepare_decode(rebuild(data, scales, "mxfp4", "numpy" if device == "cpu" else "cuda"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scale,zero_codes", [(107, False), (137, False), (0, True), (100, True),
                                              (138, True), (254, True)])
def test_mxfp4_scale_accepted(scale, zero_codes, device):
    """Window edges with nonzero codes; any non-NaN scale on an all-zero-codes block."""
    fw = "torch" if device == "cpu" else "cuda"
    dw = qq.prepare_decode(rebuild(*_mx_edit(scale, zero_codes), "mxfp4", fw))
    x = make_x(case_rng("mxx", scale), (4, 256), BF16, fw)
    check(x, dw, route="cpu" if device == "cpu" else ("decode" if decode_expected(BF16, 4) else None))


def _mx8(edits=()):
    """An mxfp8 (E4M3) [100, 256] weight's NumPy data and scales (every group's codes non-zero)
    after `edits`: (row, k_slice, codes or None, scale byte or None); codes are assigned to
    data[row, k_slice], the scale byte to every group that k_slice touches."""
    qa = qq.quantize(case_rng("mx8").standard_normal((100, 256)).astype(F32), mode="mxfp8")
    data, scales = qa.data.copy(), qa.scales.copy()
    assert (data.reshape(100, 8, 32) & 0x7F).any(axis=2).all()
    for row, ks, codes, scale in edits:
        if codes is not None:
            data[row, ks] = codes
        if scale is not None:
            scales[row, ks.start // 32:(ks.stop - 1) // 32 + 1] = scale
    return data, scales


def _mx8_fw(device):
    return "numpy" if device == "cpu" else "cuda"


def _grp(j):
    return slice(32 * j, 32 * j + 32)


# +-0 codes (0x00 and 0x80 mixed) for one 32-element group.
PM_ZEROS = np.where(np.arange(32) % 3 == 1, 0x80, 0x00).astype(np.uint8)
# (row, k): rows g and g + 8 of a 16-row block, every 8-k slot of a group, the ragged last row.
MX8_SPOTS = [(0, 0), (5, 107), (13, 46), (40, 152), (99, 255)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("spot", MX8_SPOTS, ids=str)
@pytest.mark.parametrize("byte", [0x7F, 0xFF], ids=hex)
def test_mxfp8_nan_code(byte, spot, device):
    """An E4M3 NaN code anywhere: NotSupportedError."""
    r, k = spot
    data, scales = _mx8([(r, slice(k, k + 1), byte, None)])
    with pytest.raises(qq.NotSupportedError):
        qq.prepare_decode(rebuild(data, scales, "mxfp8", _mx8_fw(device)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("byte", [0x7F, 0xFF], ids=hex)
def test_mxfp8_nan_code_in_zero_group(byte, device):
    """A NaN code among +-0 codes, under an in-window scale: NotSupportedError."""
    codes = PM_ZEROS.copy()
    codes[20] = byte
    data, scales = _mx8([(13, _grp(5), codes, 127)])
    with pytest.raises(qq.NotSupportedError):
        qq.prepare_decode(rebuild(data, scales, "mxfp8", _mx8_fw(device)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("zero_codes", [False, True], ids=["codes", "zero-codes"])
@pytest.mark.parametrize("spot", MX8_SPOTS, ids=str)
def test_mxfp8_nan_scale(spot, zero_codes, device):
    """Scale byte 255 (NaN) anywhere, over all-zero codes too: NotSupportedError."""
    r, k = spot
    g = _grp(k // 32)
    data, scales = _mx8([(r, g, PM_ZEROS if zero_codes else None, 255)])
    with pytest.raises(qq.NotSupportedError):
        qq.prepare_decode(rebuild(data, scales, "mxfp8", _mx8_fw(device)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("codes", ["codes", "one-nonzero"])
@pytest.mark.parametrize("scale", [0, 5, 18, 144, 200, 254])
def test_mxfp8_scale_out_of_window(scale, codes, device):
    """A scale byte outside [19, 143] over codes that are not all +-0 (the quantized codes, or
    +-0 codes but for one smallest subnormal -0x81- in the group's last 8-k slot): error."""
    if codes == "codes":
        edits = [(5, _grp(3), None, scale)]
    else:
        one = PM_ZEROS.copy()
        one[27] = 0x81
        edits = [(13, _grp(6), one, scale)]
    data, scales = _mx8(edits)
    with pytest.raises(qq.NotSupportedError):
        qq.prepare_decode(rebuild(data, scales, "mxfp8", _mx8_fw(device)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scale,zero_codes", [(19, False), (143, False), (0, True), (5, True),
                                              (18, True), (144, True), (200, True), (254, True)])
def test_mxfp8_scale_accepted(scale, zero_codes, device):
    """Window edges 2^-108 / 2^16 over non-zero codes: whole rows 5 and 99 at the edge (their
    results are of the edge's magnitude, so the relative bound stays meaningful) and one group
    of row 13. Any non-NaN scale over +-0 codes: one group of row 5, all of row 13 (row 99
    all-zero with scale 0)."""
    if zero_codes:
        edits = [(5, _grp(3), PM_ZEROS, scale), (13, slice(0, 256), np.tile(PM_ZEROS, 8), scale),
                 (99, slice(0, 256), 0, 0)]
    else:
        edits = [(5, slice(0, 256), None, scale), (99, slice(0, 256), None, scale),
                 (13, _grp(2), None, scale)]
    data, scales = _mx8(edits)
    fw = "torch" if device == "cpu" else "cuda"
    dw = qq.prepare_decode(rebuild(data, scales, "mxfp8", fw))
    x = make_x(case_rng("mx8x", scale, zero_codes), (4, 256), BF16, fw)
    route = "cpu" if device == "cpu" else ("decode" if decode_expected(BF16, 4) else None)
    got, _ = check(x, dw, route=route)
    if not zero_codes:  # the edge rows really are at the edge's magnitude
        mag = np.abs(to_numpy(got)[:, [5, 99]]).max()
        assert (2.0 ** -120 < mag < 2.0 ** -80) if scale == 19 else (2.0 ** 16 < mag < 2.0 ** 32), mag
    if device != "cpu":  # GPU layout bytes == CPU layout bytes
        cpu = qq.prepare_decode(rebuild(data, scales, "mxfp8", "numpy"))
        np.testing.assert_array_equal(as_bytes(dw.data), as_bytes(cpu.data))


# ---------------------------------------------------------------------------
# affine: bf16 scales and biases in the layout; non-finite values
# ---------------------------------------------------------------------------

def _affine_np(cfg, n=64, k=256, tag="a"):
    """An affine QuantizedArray of a bf16 NumPy weight, its data, scales and biases copied."""
    bits, group = AFFINE[cfg]
    qa = qq.quantize(cast(make_weight(case_rng(tag, cfg), cfg, n, k), BF16), mode="affine", bits=bits,
                     group_size=group)
    return qa.data.copy(), qa.scales.copy(), qa.biases.copy()


def _affine_qa(cfg, data, scales, biases, fw):
    bits, group = AFFINE[cfg]
    return qq.QuantizedArray(to_fw(data, fw), to_fw(scales, fw), to_fw(biases, fw), mode="affine",
                             bits=bits, group_size=group)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dt", ["float16", "float32"])
def test_affine_scales_not_bf16(dt, device):
    """Scales of an fp16 / fp32 weight are not all bf16 values: NotSupportedError. The bf16
    weight's scales and biases held in fp32 (exact bf16 values) are taken, same bytes."""
    fw = "numpy" if device == "cpu" else "cuda"
    w = make_weight(case_rng("a16", dt), "a4g64", 64, 256)
    with pytest.raises(qq.NotSupportedError, match="bfloat16"):
        qq.prepare_decode(qq.quantize(to_fw(w.astype(dt), fw), mode="affine"))
    data, scales, biases = _affine_np("a4g64")
    dw16 = qq.prepare_decode(_affine_qa("a4g64", data, scales, biases, fw))
    dw32 = qq.prepare_decode(_affine_qa("a4g64", data, scales.astype(F32), biases.astype(F32), fw))
    np.testing.assert_array_equal(as_bytes(dw32.data), as_bytes(dw16.data))


def exact_reference(x, qa, bias=None):
    """x @ W.T by elementwise float64 products and sums (IEEE Inf / NaN rules, no BLAS)."""
    w = to_numpy(qq.dequantize(qa, dtype="float32")).astype(F64)
    x64 = to_numpy(x).astype(F64)
    with np.errstate(invalid="ignore", over="ignore"):
        out = (x64[:, None, :] * w[None, :, :]).sum(axis=2)
    return out + (0.0 if bias is None else to_numpy(bias).astype(F64))


def check_non_finite(got, want, x, w, route):
    """got has want's NaN / +Inf / -Inf pattern, and its finite results are within the bound
    (|x| @ |W| with the non-finite entries of x and W taken as 0)."""
    assert not np.isfinite(want).all()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"NaN pattern [{route}]")
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want), err_msg=f"+Inf pattern [{route}]")
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want), err_msg=f"-Inf pattern [{route}]")
    fin = np.isfinite(want)
    x64 = np.where(np.isfinite(x), x, 0).astype(F64)
    w64 = np.where(np.isfinite(w), w, 0).astype(F64)
    mag = np.abs(x64) @ np.abs(np.swapaxes(w64, -1, -2)) if w64.ndim == 2 else np.einsum(
        "...mk,...nk->...mn", np.abs(x64), np.abs(w64))
    msg = mismatch(got[fin], want[fin], mag[fin], rel_of("affine"))
    assert msg is None, f"[{route}] {msg}"


# (cfg, K): K = 1024 with N = 64 splits K over a 2-CTA cluster on the GPU (the recomputation
# then runs on rank 0 after the split)
NONFINITE_CASES = [("a4g64", 256), ("a4g128", 256), ("a8g32", 256), ("a4g64", 1024), ("a8g32", 1024)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [3, 20])
@pytest.mark.parametrize("what", ["x-inf", "x-nan", "scale-inf", "bias-inf", "group-nan"])
@pytest.mark.parametrize("cfg,k", NONFINITE_CASES, ids=str)
def test_affine_non_finite(cfg, k, what, m, device):
    """An Inf / NaN in x, an Inf scale (over codes 1) or bias, a NaN group (quantize's NaN
    scale and bias): the NaN / +-Inf pattern of the elementwise reference, the finite results
    within the bound. On the GPU the kernel's factored sums break there (Inf * 0 where the
    weight is b) and such results are redone weight by weight. 20 rows of x take the 32-row
    configuration (wgmma on sm_90a), 3 the 8-row one."""
    fw = "numpy" if device == "cpu" else "cuda"
    data, scales, biases = _affine_np(cfg, k=k, tag=what)
    bits, group = AFFINE[cfg]
    per = 8 // bits  # codes per byte
    g1 = slice(group // per, 2 * group // per)  # group 1's bytes
    rng = case_rng("anf", cfg, k, what)
    x = cast(np.abs(rng.standard_normal((m, k))) + 0.01, BF16)  # positive: Inf weights give +-Inf sums
    if what == "x-inf":
        x[1, 37] = np.inf
        x[2, k - 56] = -np.inf
    elif what == "x-nan":
        x[0, 5] = np.nan
    elif what == "scale-inf":
        data[3, g1] = 0x11 if bits == 4 else 1
        scales[3, 1] = np.inf
    elif what == "bias-inf":
        biases[7, 1] = -np.inf
    else:
        scales[5, 1] = biases[5, 1] = np.nan
    qa = _affine_qa(cfg, data, scales, biases, fw)
    dw = qq.prepare_decode(qa)
    xt = to_fw(x, fw)
    got = to_numpy(qq.quantized_matmul(xt, dw, dtype="float32")).astype(F64)
    route = qq.last_route()
    if device == "cuda" and decode_expected(BF16, m):
        assert route == "decode"
    check_non_finite(got, exact_reference(xt, qa), to_numpy(x).astype(F32),
                     to_numpy(qq.dequantize(qa, dtype="float32")), route)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cfg", ["a4g64", "a8g32"])
def test_affine_non_finite_gather(cfg, device):
    """gather_qmm on the layout with an Inf in x's entry 1 (expert 3) and a NaN group in expert
    2 (entry 2): the recomputation reads the right expert and x entry (the reference's pattern
    and values), K = 1024 split over a cluster on the GPU."""
    torch = torch_mod()
    fw = "torch" if device == "cpu" else "cuda"
    e, n, k = 8, 64, 1024  # 3 entries <= E / 2: the decode layout's kernel on the GPU
    bits, group = AFFINE[cfg]
    w = cast(np.stack([make_weight(case_rng("agw", cfg, i), cfg, n, k) for i in range(e)]), BF16)
    qa0 = qq.quantize(w, mode="affine", bits=bits, group_size=group)
    data, scales, biases = qa0.data.copy(), qa0.scales.copy(), qa0.biases.copy()
    scales[2, 9, 3] = biases[2, 9, 3] = np.nan
    qa = qq.QuantizedArray(to_fw(data, fw), to_fw(scales, fw), to_fw(biases, fw), mode="affine", bits=bits,
                           group_size=group)
    dw = qq.prepare_decode(qa)
    rng = case_rng("agx", cfg)
    x = cast(np.abs(rng.standard_normal((3, 1, 1, k))) + 0.01, BF16)
    x[1, 0, 0, 700] = np.inf
    idx = torch.tensor([[0], [3], [2]], dtype=torch.int32, device=device)
    got = to_numpy(qq.gather_qmm(to_fw(x, fw), dw, rhs_indices=idx, dtype="float32")).astype(F64)
    route = qq.last_route()
    if device == "cuda" and decode_expected(BF16, 1):
        assert route == "decode"
    wd = to_numpy(qq.dequantize(qa, dtype="float32"))
    i64 = to_numpy(idx)
    x64 = to_numpy(x).astype(F64)
    with np.errstate(invalid="ignore", over="ignore"):
        want = np.stack([(x64[b, 0][:, None, :] * wd[i64[b, 0]][None, :, :]).sum(axis=2)[None] for b in range(3)])
    check_non_finite(got, want, np.stack([x64[b] for b in range(3)]).astype(F32),
                     np.stack([wd[i64[b, 0]] for b in range(3)])[:, None], route)


# ---------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------

@functools.lru_cache(maxsize=16)
def gpu_weight(cfg, n, k, layout="linear"):
    qa = quantize(make_weight(case_rng("gpu", cfg, n, k), cfg, n, k), cfg, "cuda", layout)
    return qq.prepare_decode(qa)


@gpu
@pytest.mark.parametrize("with_bias", [False, True], ids=["", "bias"])
@pytest.mark.parametrize("m", [1, 2, 5, 8, 9, 16, 17, 32, 33, 64])
@pytest.mark.parametrize("n,k", GPU_SHAPES, ids=str)
@pytest.mark.parametrize("cfg", CFGS)
def test_gpu_matches(cfg, n, k, m, with_bias):
    rng = case_rng("gpu-x", cfg, n, k, m, with_bias)
    dw = gpu_weight(cfg, n, k)
    assert dw.data.is_cuda
    bias = to_fw(rng.standard_normal(n).astype(F32), "cuda") if with_bias else None
    route = "decode" if decode_expected(BF16, m) else None
    check(make_x(rng, (m, k), BF16, "cuda"), dw, bias, route=route)
    check(make_x(rng, (m, k), BF16, "cuda"), dw, bias, dtype=None, route=route)  # bf16 out


@gpu
@pytest.mark.parametrize("m", [9, 16, 17, 32, 33, 64])
@pytest.mark.parametrize("cfg", CFGS)
def test_gpu_matches_many_tiles(cfg, m):
    """N = 16384: 256 row tiles, no K split, more CTAs than SMs: x staged from 9 rows, and
    17..32 rows on the two-CTAs-per-SM configuration (the shapes above run one per SM); K
    = 1280, so that the rings wrap (racecheck runs these)."""
    rng = case_rng("many", cfg, m)
    dw = gpu_weight(cfg, 16384, 1280)  # 5 stages a CTA: the rings of 2 to 4 slots wrap
    check(make_x(rng, (m, 1280), BF16, "cuda"), dw, route="decode" if decode_expected(BF16, m) else None)


@gpu
@pytest.mark.parametrize("k", [1280, 2048])
@pytest.mark.parametrize("cfg", CFGS)
def test_gpu_past_two_waves(cfg, k):
    """N = 64 (2 SMs + 3): more row tiles than two CTAs per SM hold, where 4-bit codes at M
    <= 16 run four CTAs per SM: right against the reference at 1..16 rows, and each row the
    same bits as in the 64-row call (its 16-warp configuration). K = 1280 (5 chunks of 256):
    256-k stages, the rings wrap; K = 2048: at one row of bf16 x, or of float16 x (two
    kernel rows), 512-k stages with two rows of x a stage (qmmp.cu's X2), 4 stages round a
    ring of 2."""
    torch = torch_mod()
    n = 64 * (2 * torch.cuda.get_device_properties(0).multi_processor_count + 3)
    dw = gpu_weight(cfg, n, k)
    rng = case_rng("waves", cfg, k)
    x = make_x(rng, (64, k), BF16, "cuda")
    for m in (1, 2, 5, 8, 9, 16):
        check(x[:m].contiguous(), dw, route="decode" if decode_expected(BF16, m) else None)
    assert_rows_same_bits(x, dw, (1, 2, 5, 8, 9, 16))
    x16 = make_x(rng, (1, k), F16, "cuda")
    want, mag = reference(x16, dw.quantized, None)
    got = qq.quantized_matmul(x16, dw, dtype="float32")
    assert (qq.last_route() == "decode") == decode_expected(F16, 1), qq.last_route()
    assert mismatch(got, want, mag, rel_of(dw.mode)) is None


@gpu
@pytest.mark.parametrize("cfg", ["nvfp4", "nvfp4-gs", "mxfp4", "mxfp8", "a4g64"])
def test_gpu_two_tiles_a_cta(cfg):
    """33..64 rows where K is not split (16 stages of 256 k) and the 64-row tiles, paired,
    still fill the SMs (2 x SMs tiles): on sm_90a the fp codes take two tiles a CTA (qmmp.cu's
    NT = 2; affine 4-bit keeps one, for the contrast). Near the reference at 33, 40 and 64
    rows (a bias at 40 and 64, bfloat16 out at 64); each row the same bits as in every other M's form (1..32 rows take one tile a CTA);
    float16 x of 17..32 rows (34..64 kernel rows) near the reference; a gated weight of that
    size gives the plain product and, in one kernel, qq.swiglu of it bit for bit (each tile's
    SwiGLU barrier of its own)."""
    torch = torch_mod()
    n, k = 128 * torch.cuda.get_device_properties(0).multi_processor_count, 4096
    dw = gpu_weight(cfg, n, k)
    rng = case_rng("two-tiles", cfg)
    x = make_x(rng, (64, k), BF16, "cuda")
    bias = to_fw(rng.standard_normal(n).astype(F32), "cuda")
    for m, kw in ((33, {}), (40, {"bias": bias}), (64, {"bias": bias, "dtype": None})):  # (None: bf16 out)
        check(x[:m].contiguous(), dw, route="decode" if decode_expected(BF16, m) else None, **kw)
    assert_rows_same_bits(x, dw, (1, 9, 16, 17, 32, 33, 40))
    x16 = make_x(rng, (24, k), F16, "cuda")
    want, mag = reference(x16, dw.quantized, None)
    got = qq.quantized_matmul(x16, dw, dtype="float32")
    assert (qq.last_route() == "decode") == decode_expected(F16, 24), qq.last_route()
    assert mismatch(got, want, mag, rel_of(dw.mode)) is None
    _, dplain, dgated = gated_case(cfg, n // 2, k, "cuda")
    xg = x[:48].contiguous() * 0.25
    plain = qq.quantized_matmul(xg, dplain)
    np.testing.assert_array_equal(bits(qq.quantized_matmul(xg, dgated)), bits(plain))
    out = torch.full((48, n // 2), float("nan"), dtype=plain.dtype, device=plain.device)
    fused = qq.quantized_matmul_swiglu(xg, dgated, out=out)
    assert qq.last_route() == "decode"
    np.testing.assert_array_equal(bits(fused), bits(qq.swiglu(plain)))


@gpu
@pytest.mark.parametrize("cfg", CFGS)
def test_gpu_long_k_split(cfg):
    """K split over a cluster of 2 at M <= 8 with a long K: 4 row tiles (8 CTAs), K = 7168,
    so 14 stages per CTA go round each ring (3-4 slots at M <= 8) three times and more.
    Right against the reference, and each row the same bits as in the 64-row call."""
    n, k = 256, 7168
    dw = gpu_weight(cfg, n, k)
    rng = case_rng("long-k", cfg)
    x = make_x(rng, (64, k), BF16, "cuda")
    for m in (1, 5, 8):
        check(x[:m].contiguous(), dw, route="decode" if decode_expected(BF16, m) else None)
    assert_rows_same_bits(x, dw, (1, 5, 8))


def check_f16_out(got, want, mag, rel):
    """A float16 result: within the bound where |want| is well inside float16's range, +-Inf
    where it rounds past 65504 (the weights here reach 10^5 per group)."""
    g = to_numpy(got)
    inside, over = np.abs(want) < 60000.0, np.abs(want) >= 65520.0
    msg = mismatch(np.where(inside, g, F16(0)), np.where(inside, want, 0.0), mag, rel)  # fp16's ulp counted
    assert msg is None, msg
    np.testing.assert_array_equal(g[over].astype(F64), np.copysign(np.inf, want[over]))


@pytest.mark.parametrize("with_bias", [False, True], ids=["", "bias"])
@pytest.mark.parametrize("m", [1, 5, 9, 16, 17, 32])
@pytest.mark.parametrize("n,k", [(200, 768), (4096, 4096), (16384, 256)], ids=str)
@pytest.mark.parametrize("cfg", CFGS)
@pytest.mark.parametrize("device", DEVICES)
def test_matches_f16(device, cfg, n, k, m, with_bias):
    """float16 x (GPU: on the decode kernel, staged as bf16 high parts and exact remainders,
    twice the rows): equal to the float64 reference within the fp32 summation bound, fp32
    and fp16 out (fp16: Inf where the result overflows it)."""
    if device == "cpu" and (n, k) != (200, 768):
        pytest.skip("the CPU reads the layout as for bf16 x; one shape")
    fw = "torch" if device == "cpu" else "cuda"
    rng = case_rng("f16", cfg, n, k, m, with_bias)
    dw = gpu_weight(cfg, n, k) if device == "cuda" else qq.prepare_decode(
        quantize(make_weight(case_rng("gpu", cfg, n, k), cfg, n, k), cfg, fw))
    x = make_x(rng, (m, k), F16, fw)
    bias = to_fw(rng.standard_normal(n).astype(F32), fw) if with_bias else None
    want, mag = reference(x, dw.quantized, bias)
    got = qq.quantized_matmul(x, dw, bias=bias, dtype="float32")
    if device == "cuda":
        assert (qq.last_route() == "decode") == decode_expected(F16, m), qq.last_route()
    msg = mismatch(got, want, mag, rel_of(dw.mode))
    assert msg is None, msg
    got16 = qq.quantized_matmul(x, dw, bias=bias)
    assert to_numpy(got16).dtype == F16
    check_f16_out(got16, want, mag, rel_of(dw.mode))


@gpu
@pytest.mark.parametrize("cfg", ["nvfp4", "mxfp8", "a4g64", "a8g32"])
def test_gpu_f16_non_finite(cfg):
    """float16 x holding +Inf, -Inf and NaN: the remainder of a non-finite value is 0, so the
    result has the reference's NaN / +-Inf pattern (affine: recomputed from the fp16 x), and
    finite rows are unaffected."""
    dw = gpu_weight(cfg, 200, 768)
    x = cast(case_rng("f16nf", cfg).standard_normal((4, 768)), F16)
    x[0, 5], x[1, 700], x[2, 300] = np.inf, -np.inf, np.nan
    xt = to_fw(x, "cuda")
    got = to_numpy(qq.quantized_matmul(xt, dw, dtype="float32")).astype(F64)
    assert (qq.last_route() == "decode") == decode_expected(F16, 4), qq.last_route()
    w = to_numpy(qq.dequantize(dw.quantized, dtype="float32")).astype(F64)
    with np.errstate(invalid="ignore", over="ignore"):
        want = x.astype(F64) @ w.T
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want))
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))
    assert mismatch(got[3:], want[3:], np.abs(x[3:].astype(F64)) @ np.abs(w).T, rel_of(dw.mode)) is None


@gpu
@pytest.mark.parametrize("n,k", [(256, 1536), (16384, 512)], ids=str)
@pytest.mark.parametrize("cfg", CFGS)
def test_gpu_f16_same_bits_for_every_m(cfg, n, k):
    """float16 x: row m has the same bits whatever M is (its remainder row moves with M);
    33 rows take the packed weight (the kernel's 64 rows hold 32 of float16)."""
    dw = gpu_weight(cfg, n, k)
    x = make_x(case_rng("f16bits", cfg, k), (33, k), F16, "cuda")
    qq.quantized_matmul(x, dw, dtype="float32")
    assert qq.last_route() != "decode"
    assert_rows_same_bits(x[:32].contiguous(), dw, (1, 5, 9, 16, 17))


@gpu
@pytest.mark.parametrize("m,xdt", [(65, BF16), (100, BF16), (1, F32), (16, F32), (40, F32)],
                         ids=["65-bf16", "100-bf16", "1-f32", "16-f32", "40-f32"])
@pytest.mark.parametrize("cfg", CFGS)
def test_gpu_other_routes(cfg, m, xdt):
    """M > 64 (float16: 32) or fp32 x: another route (the packed path), same numbers."""
    dw = gpu_weight(cfg, 200, 768)
    _, route = check(make_x(case_rng("other", cfg, m), (m, 768), xdt, "cuda"), dw)
    assert route != "decode"


@gpu
@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("m", [1, 9, 40])
@pytest.mark.parametrize("cfg", CFGS)
def test_gpu_out_and_determinism(cfg, m, out_dtype):
    """out= prefilled with NaN is fully written; a second call gives the same bits."""
    torch = torch_mod()
    dw = gpu_weight(cfg, 4096, 4096)
    x = make_x(case_rng("out", cfg, m), (m, 4096), BF16, "cuda")
    out = torch.full((m, 4096), float("nan"), dtype=getattr(torch, out_dtype), device="cuda")
    got, _ = check(x, dw, dtype=out_dtype, out=out, route="decode" if decode_expected(BF16, m) else None)
    assert got is out and not out.isnan().any()
    again = qq.quantized_matmul(x, dw, dtype=out_dtype)
    np.testing.assert_array_equal(to_numpy(again).view(np.uint8), to_numpy(out).view(np.uint8))


@gpu
@pytest.mark.parametrize("layout", ["linear", "blocked"])
@pytest.mark.parametrize("cfg", CFGS)
def test_gpu_data_equals_cpu(cfg, layout):
    """The decode layout's bytes are the same whether prepared on the GPU or the CPU."""
    if cfg in AFFINE and layout == "blocked":
        pytest.skip("affine scales have no blocked layout")
    dw = gpu_weight(cfg, 200, 768, layout)
    qa = dw.quantized
    gs = None if qa.global_scale is None else qa.global_scale.cpu()
    biases = None if qa.biases is None else qa.biases.cpu()
    qa_cpu = qq.QuantizedArray(qa.data.cpu(), qa.scales.cpu(), biases, mode=qa.mode, bits=qa.bits,
                               group_size=qa.group_size, global_scale=gs, scale_layout=qa.scale_layout,
                               shape=qa.shape)
    np.testing.assert_array_equal(as_bytes(dw.data), as_bytes(qq.prepare_decode(qa_cpu).data))


@gpu
@pytest.mark.parametrize("b,mb", [(2, 4), (4, 4), (3, 1), (4, 16), (3, 7)])
@pytest.mark.parametrize("cfg", CFGS)
def test_gpu_batched_x(cfg, b, mb):
    """x [B, M/B, K]: rows are the product of the leading dims."""
    dw = gpu_weight(cfg, 200, 768)
    x = make_x(case_rng("3d", cfg, b, mb), (b, mb, 768), BF16, "cuda")
    got, _ = check(x, dw, route="decode" if decode_expected(BF16, b * mb) else None)
    assert tuple(got.shape) == (b, mb, 200)
    flat = qq.quantized_matmul(x.reshape(b * mb, 768), dw, dtype="float32")
    np.testing.assert_array_equal(to_numpy(got).reshape(b * mb, 200), to_numpy(flat))


# ---------------------------------------------------------------------------
# x's row stride, alignment, and the summation order across M (review findings)
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cfg", ["nvfp4", "mxfp8"])
def test_strided_rows(cfg, device):
    """x [B, 1, K] sliced from [B, 1, 2K]: rows B apart by 2K elements though the axis of one
    row has its own stride; and [B, R, K] slices of [B, R, 2K]. Both must equal the packed
    path (an earlier version read them K apart)."""
    torch = torch_mod()
    n, k = 192, 256
    qa = quantize(make_weight(case_rng("strided", cfg), cfg, n, k), cfg,
                  "torch" if device == "cpu" else "cuda")
    dw = qq.prepare_decode(qa)
    for shape in [(4, 1, 2 * k), (3, 2, 2 * k), (1, 5, 2 * k)]:
        base = torch.from_numpy(case_rng("sx", cfg, shape).standard_normal(shape).astype(F32))
        base = base.to(torch.bfloat16).to(device)
        x = base[..., :k]
        assert not x.is_contiguous()
        route = "decode" if device == "cuda" and decode_expected(BF16, x.shape[0] * x.shape[1]) else None
        got, _ = check(x, dw, route=route if device == "cuda" else "cpu")
        np.testing.assert_array_equal(to_numpy(got), to_numpy(qq.quantized_matmul(x.contiguous(), dw,
                                                                                   dtype="float32")))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows", [3, 24])
def test_uneven_rows_take_the_packed_weight(rows, device):
    """x whose rows are not evenly spaced across its leading axes (a slice of a batch): libqq
    answers NOT_SUPPORTED and the packed weight computes it, into the result already made.
    x not stride 1 along K: the packed weight's clear error."""
    torch = torch_mod()
    fw = "torch" if device == "cpu" else "cuda"
    qa = quantize(make_weight(case_rng("uneven"), "nvfp4", 64, 256), "nvfp4", fw)
    dw = qq.prepare_decode(qa)
    base = torch.from_numpy(case_rng("ux", rows).standard_normal((2, rows + 1, 512)).astype(F32))
    base = base.to(torch.bfloat16).to(device)
    x = base[:, :rows, :256]
    got = qq.quantized_matmul(x, dw, dtype="float32")
    assert qq.last_route() != "decode"
    want = qq.quantized_matmul(x, dw.quantized, dtype="float32")
    np.testing.assert_array_equal(to_numpy(got), to_numpy(want))
    with pytest.raises(ValueError, match=r"^quantized_matmul: argument 'x' has stride 2 on its last axis"):
        qq.quantized_matmul(base[:, :rows, ::2], dw)


def test_x_wrong_k():
    qa = quantize(make_weight(case_rng("wk"), "nvfp4", 64, 256), "nvfp4", "numpy")
    with pytest.raises(ValueError, match=r"^quantized_matmul: x has shape"):
        qq.quantized_matmul(np.zeros((1, 512), F32), qq.prepare_decode(qa))


@gpu
def test_gpu_misaligned_x_falls_back():
    """x starting 2 bytes into its buffer cannot be bulk-copied: the packed weight's route,
    the same numbers."""
    torch = torch_mod()
    dw = gpu_weight("nvfp4", 200, 768)
    base = torch.randn((3, 769), dtype=torch.bfloat16, device="cuda")
    _, route = check(base[:, 1:], dw)
    assert route != "decode"


@gpu
@pytest.mark.parametrize("n,k", [(256, 512), (256, 1536), (256, 2048), (256, 3584), (256, 8192), (16384, 512)],
                         ids=str)
@pytest.mark.parametrize("cfg", CFGS)
def test_gpu_same_bits_for_every_m(cfg, n, k):
    """Row m of the product has the same bits whatever M is (the K split, the stage size, x
    staged or copied row by row, and affine's sums of x made by the x-sum warp or the staging
    kernel may change with M only where the summation order does not): rows 0..M-1 of x at
    M = 64 against each M alone. N = 256 leaves SMs idle, so K is split over two CTAs (x
    staged from 17 rows, affine 4-bit's from 9 and 8-bit's from 13, its rows split over
    blocks; at K = 8192 four 1024-k stages a rank go round a ring of 2 at M <= 16 for the
    4-bit codes, and past 32 rows, with 16 stages a rank, one warpgroup a fragment-block
    parity takes all 64 rows on sm_90a); N = 16384 is not split (x staged from 9 rows)."""
    torch = torch_mod()
    dw = gpu_weight(cfg, n, k)
    x = make_x(case_rng("bits", cfg, k), (64, k), BF16, "cuda")
    assert_rows_same_bits(x, dw, (1, 5, 8, 9, 12, 13, 15, 16, 17, 32, 33, 63),
                          route="decode" if decode_expected(BF16, 64) else None)
    del torch


# ---------------------------------------------------------------------------
# gather_qmm on experts in the decode layout (MoE decode)
# ---------------------------------------------------------------------------

def gather_case(cfg, fw, e, n, k):
    w = np.stack([make_weight(case_rng("gw", cfg, i, n, k), cfg, n, k) for i in range(e)])
    qa = quantize(w, cfg, fw)
    return qa, qq.prepare_decode(qa)


def gather_reference(x, qa, idx, bias=None):
    """float64 per entry: x[b] @ W[idx[b]].T (+ bias), and the |.| sums."""
    w = to_numpy(qq.dequantize(qa, dtype="float32")).astype(F64)
    x64, i64 = to_numpy(x).astype(F64), to_numpy(idx)
    bshape = np.broadcast_shapes(x64.shape[:-2], i64.shape)
    xb = np.broadcast_to(x64, bshape + x64.shape[-2:])
    ib = np.broadcast_to(i64, bshape)
    want = np.einsum("...mk,...nk->...mn", xb, w[ib]) + (0.0 if bias is None else to_numpy(bias).astype(F64))
    mag = np.einsum("...mk,...nk->...mn", np.abs(xb), np.abs(w[ib]))
    return want, mag


def check_gather(cfg, x, qa, dw, idx, bias=None):
    """gather_qmm on the decode-layout experts dw equals the float64 reference and, within
    twice the bound, gather_qmm on the packed experts qa. Returns the decode call's route."""
    got = qq.gather_qmm(x, dw, rhs_indices=idx, bias=bias, dtype="float32")
    route = qq.last_route()
    want, mag = gather_reference(x, qa, idx, bias)
    rel = rel_of(mode_of(cfg))
    msg = mismatch(got, want, mag, rel)
    assert msg is None, f"[{route}] {msg}"
    packed = qq.gather_qmm(x, qa, rhs_indices=idx, bias=bias, dtype="float32")
    assert mismatch(got, to_numpy(packed).astype(F64), mag, rel=2 * rel) is None
    return route


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("t,top,m", [(1, 2, 1), (2, 2, 3), (1, 4, 16), (3, 4, 2)])
@pytest.mark.parametrize("cfg", ["nvfp4-gs", "mxfp4", "mxfp8", "a4g64", "a8g32"])
def test_gather_matches(cfg, t, top, m, device):
    """x [T, 1, M, K] against rhs_indices [T, top] (the decode call), E = 8 experts: the
    decode layout where the entries are at most E / 2 (here up to 12 > 4: both paths),
    equal to the packed experts' gather_qmm and to the float64 reference."""
    torch = torch_mod()
    fw = "torch" if device == "cpu" else "cuda"
    e, n, k = 8, 100, 512
    qa, dw = gather_case(cfg, fw, e, n, k)
    assert tuple(dw.shape) == (e, n, k) and tuple(dw.data.shape)[0] == e
    rng = case_rng("gx", cfg, t, top, m)
    x = make_x(rng, (t, 1, m, k), BF16, fw)
    idx = torch.from_numpy(np.stack([rng.permutation(e)[:top] for _ in range(t)]).astype(np.int32)).to(device)
    bias = to_fw(rng.standard_normal(n).astype(F32), fw)
    route = check_gather(cfg, x, qa, dw, idx, bias)
    if device == "cuda" and 2 * t * top <= e and decode_expected(BF16, m):
        assert route == "decode"


@gpu
@pytest.mark.parametrize("m,k", [(1, 512), (1, 1280), (16, 1280)], ids=str)
@pytest.mark.parametrize("cfg", ["nvfp4-gs", "mxfp4", "mxfp8", "a4g64"])
def test_gpu_gather_past_two_waves(cfg, m, k):
    """32 entries of 4 tokens (top-8 of 64 experts) whose row tiles are more CTAs than two
    per SM hold: 4-bit codes run four per SM there at one row per entry. K = 1280 wraps the
    rings; 16 rows per entry take the two-per-SM configurations. Against the float64
    reference and the packed experts (not bit for bit against lone calls of each expert: an
    entry's K split may differ from a lone call's, docs/formats.md)."""
    torch = torch_mod()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    e, t, top = 64, 4, 8
    n = 64 * (-(-(2 * sms + 1) // (t * top)))      # row tiles x 32 entries > 2 SMs
    qa, dw = gather_case(cfg, "cuda", e, n, k)
    rng = case_rng("gwave", cfg, m, k)
    x = make_x(rng, (t, 1, m, k), BF16, "cuda")
    idx = torch.from_numpy(np.stack([rng.permutation(e)[:top] for _ in range(t)]).astype(np.int32)).cuda()
    assert check_gather(cfg, x, qa, dw, idx) == "decode"


@gpu
@pytest.mark.parametrize("m", [1, 8, 16])
@pytest.mark.parametrize("cfg", ["nvfp4-gs", "mxfp4", "mxfp8", "a4g64", "a8g32"])
def test_gpu_gather_long_k_split(cfg, m):
    """Two entries (per-entry calls, not grouped) of 4 row tiles each leave the GPU mostly
    idle, so K is split over two CTAs; K = 8192 makes each rank's chunks whole 1024-k stages,
    the 4-bit codes' configuration there at 1..16 rows (qmmp.cu's dispatch). Against the
    float64 reference and the packed experts."""
    torch = torch_mod()
    e, n, k, t, top = 8, 256, 8192, 1, 2
    qa, dw = gather_case(cfg, "cuda", e, n, k)
    rng = case_rng("glongk", cfg, m)
    x = make_x(rng, (t, 1, m, k), BF16, "cuda")
    idx = torch.from_numpy(np.stack([rng.permutation(e)[:top] for _ in range(t)]).astype(np.int32)).cuda()
    assert check_gather(cfg, x, qa, dw, idx) == "decode"


@gpu
@pytest.mark.parametrize("t,top,m,skew", [(4, 2, 1, False), (16, 2, 1, False), (40, 2, 1, True),
                                          (8, 2, 3, False), (64, 2, 1, False), (64, 6, 1, False)], ids=str)
@pytest.mark.parametrize("cfg", ["nvfp4-gs", "mxfp4", "mxfp8", "a4g64", "a8g32"])
def test_gpu_gather_grouped(cfg, t, top, m, skew):
    """Entries that share experts (E = 8: 8 .. 384 entries) are grouped by expert before the
    decode kernel (the plan, then work items of up to 8, 16, 24 or 32 rows of one expert, their
    rows of x staged for affine and for items of 16 rows and more; 64 tokens of top-2 put ~16
    rows on an expert: the fp formats' 24-row items), each touched expert's layout read once:
    the rows of an expert past one item (skew: every token sends its first pick to expert 3,
    40 rows there), entries of 3 rows split across items, an index out of range (NaN rows,
    the others computed), against the float64 reference and the packed experts; the same bits on a second call (the plan places an expert's entries
    by atomics: a row's sums never depend on its place in a tile); captured in a CUDA graph,
    a replay on new indices equals the eager call."""
    torch = torch_mod()
    e, n, k = 8, 192, 512
    qa, dw = gather_case(cfg, "cuda", e, n, k)
    rng = case_rng("ggrp", cfg, t, top, m, skew)
    x = make_x(rng, (t, 1, m, k), BF16, "cuda")
    picks = np.stack([rng.permutation(e)[:top] for _ in range(t)]).astype(np.int32)
    if skew:
        picks[:, 0] = 3
        picks[:, 1] = np.where(picks[:, 1] == 3, 5, picks[:, 1])
    idx = torch.from_numpy(picks).cuda()
    bias = to_fw(rng.standard_normal(n).astype(F32), "cuda")
    assert check_gather(cfg, x, qa, dw, idx, bias) == "decode"
    first = to_numpy(qq.gather_qmm(x, dw, rhs_indices=idx, bias=bias, dtype="float32"))
    again = to_numpy(qq.gather_qmm(x, dw, rhs_indices=idx, bias=bias, dtype="float32"))
    np.testing.assert_array_equal(first, again)
    # indices out of range: those entries' rows NaN, the others as before
    bad = picks.copy()
    bad[0, 0], bad[t - 1, top - 1] = -1, e
    got = to_numpy(qq.gather_qmm(x, dw, rhs_indices=torch.from_numpy(bad).cuda(), bias=bias, dtype="float32"))
    assert qq.last_route() == "decode"
    assert np.isnan(got[0, 0]).all() and np.isnan(got[t - 1, top - 1]).all()
    keep = np.ones((t, top), bool)
    keep[0, 0] = keep[t - 1, top - 1] = False
    np.testing.assert_array_equal(got[keep], first[keep])
    # a CUDA graph replayed on new indices
    out = torch.empty(first.shape, dtype=torch.float32, device="cuda")
    qq.gather_qmm(x, dw, rhs_indices=idx, bias=bias, out=out, dtype="float32")  # warm-up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with capture(graph):
        qq.gather_qmm(x, dw, rhs_indices=idx, bias=bias, out=out, dtype="float32")
    idx.copy_(torch.from_numpy(np.ascontiguousarray(picks[::-1])))
    graph.replay()
    torch.cuda.synchronize()
    eager = qq.gather_qmm(x, dw, rhs_indices=idx, bias=bias, dtype="float32")
    np.testing.assert_array_equal(to_numpy(out), to_numpy(eager))


@gpu
@pytest.mark.parametrize("cfg,e,n,k,t,top,sub", [("a4g64", 256, 128, 16384, 256, 2, 64),
                                                  ("mxfp4", 8, 1024, 4096, 3584, 2, 256)],
                         ids=["affine-8-row-items", "fp-32-row-items"])
def test_gpu_gather_grouped_staged_or_not(cfg, e, n, k, t, top, sub):
    """Grouped gathers stage each work item's rows of x (qmmp.cu's gx_stage_kernel) unless that
    buffer would pass 64 MB (kGxStageMax; slots of R rows an item, and up to an item of slack
    an expert): affine's 8-row items over 256 experts at K = 16384 (512 entries: ~97 MB) and an
    fp format's 32-row items (7168 entries over 8 experts at K = 4096: 16-row items then, rows
    copied one by one) take the unstaged form. Against a float64 reference of the same
    dequantized experts; and the first `sub` tokens alone, which are staged (affine 8-row,
    fp 32-row items), give the same bits for their rows: staging, the item size and the rows'
    places in their items do not change a row's sums. (N is chosen so that both calls'
    likely work items fill the GPU without a K split, which would change the sums' order.)"""
    torch = torch_mod()
    g = torch.Generator(device="cuda").manual_seed(zlib.crc32(repr(("gstage", cfg)).encode()))
    w = torch.randn((e, n, k), device="cuda", generator=g)
    if cfg in AFFINE:
        bits, group = AFFINE[cfg]
        qa = qq.quantize(w.to(torch.bfloat16), mode="affine", bits=bits, group_size=group)
    else:
        qa = qq.quantize(w, mode=mode_of(cfg))
    del w
    dw = qq.prepare_decode(qa)
    x = torch.randn((t, 1, 1, k), device="cuda", generator=g).to(torch.bfloat16)
    idx = torch.rand((t, e), device="cuda", generator=g).topk(top, dim=1).indices.to(torch.int32)
    got = qq.gather_qmm(x, dw, rhs_indices=idx, dtype="float32")
    assert qq.last_route() == "decode"
    # the reference, expert by expert on the GPU in float64 (gather_reference's float64 copy
    # of 256 dequantized experts on the CPU would be 4.3 GB)
    wd = qq.dequantize(qa, dtype="float32")
    xs = x.reshape(t, k).double()
    want = torch.zeros((t, top, n), dtype=torch.float64, device="cuda")
    mag = torch.zeros_like(want)
    for ex in torch.unique(idx).tolist():
        tok, slot = torch.nonzero(idx == ex, as_tuple=True)
        we = wd[ex].double()
        want[tok, slot] = xs[tok] @ we.T
        mag[tok, slot] = xs[tok].abs() @ we.abs().T
    msg = mismatch(got.reshape(t, top, n), to_numpy(want), to_numpy(mag), rel_of(mode_of(cfg)))
    assert msg is None, msg
    part = qq.gather_qmm(x[:sub].contiguous(), dw, rhs_indices=idx[:sub].contiguous(), dtype="float32")
    np.testing.assert_array_equal(to_numpy(part), to_numpy(got[:sub]))


@pytest.mark.parametrize("fw", ["numpy", "torch"])
def test_decode_weight_argument_checks(fw):
    """A DecodeWeight's N is checked exactly against out= (libqq can check it only against the
    layout's size, rows rounded up to 64: out [3, 128] for N = 70 was accepted, its columns
    70.. zero); fp8_format= must agree with it; x / rhs_indices given only through __dlpack__
    are read (the packed weight's path); x and rhs_indices that do not broadcast are named;
    libqq's messages name the Python function."""
    if fw == "torch":
        torch_mod()
    qa = quantize(make_weight(case_rng("dwarg"), "nvfp4", 70, 256), "nvfp4", fw)
    dw = qq.prepare_decode(qa)
    rng = case_rng("dwarg-x")
    x = to_fw(rng.standard_normal((3, 256)).astype(F32), fw)
    for bad in ((3, 128), (3, 65)):
        out = to_fw(np.zeros(bad, F32), fw)
        with pytest.raises(ValueError, match=r"quantized_matmul: argument 'out' has shape"):
            qq.quantized_matmul(x, dw, out=out)
    with pytest.raises(ValueError, match="fp8_format='e5m2' contradicts"):
        qq.quantized_matmul(x, dw, fp8_format="e5m2")

    class DL:  # an array known only through DLPack
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, *args, **kwargs):
            return self.a.__dlpack__(*args, **kwargs)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    want = to_numpy(qq.quantized_matmul(x, dw))
    np.testing.assert_array_equal(to_numpy(qq.quantized_matmul(DL(x), dw)), want)
    with pytest.raises(TypeError, match="quantized_matmul"):
        qq.quantized_matmul([[1.0] * 256], dw)
    experts = np.stack([make_weight(case_rng("dwarg-e", i), "nvfp4", 70, 256) for i in range(4)])
    qe = quantize(experts, "nvfp4", fw)
    de = qq.prepare_decode(qe)
    xe = to_fw(rng.standard_normal((3, 1, 1, 256)).astype(F32), fw)
    idx = to_fw(np.array([[0, 2], [1, 3], [2, 2]], np.int32), fw)
    got = to_numpy(qq.gather_qmm(xe, de, rhs_indices=DL(idx)))
    np.testing.assert_array_equal(got, to_numpy(qq.gather_qmm(xe, qe, rhs_indices=idx)))
    with pytest.raises(ValueError, match=r"gather_qmm: argument 'out' has shape"):
        qq.gather_qmm(xe, de, rhs_indices=idx, out=to_fw(np.zeros((3, 2, 1, 64), F32), fw))
    with pytest.raises(ValueError, match=r"gather_qmm: the batch axes of x \(3, 1\) and the shape "
                                         r"of rhs_indices \(2, 2\) do not broadcast"):
        qq.gather_qmm(xe, de, rhs_indices=to_fw(np.array([[0, 1], [1, 0]], np.int32), fw))
    with pytest.raises(ValueError, match="^gather_qmm: "):
        qq.gather_qmm(xe, de, rhs_indices=to_fw(np.array([[0, 9], [1, 3], [2, 2]], np.int32), fw))


def test_gather_cpu_decodes_each_expert_once():
    """Entries that interleave experts (0, 1, 0, 1, ...) give the packed experts' result; the
    CPU decodes each expert's layout once (in expert order), not once per change of expert."""
    experts = np.stack([make_weight(case_rng("dwonce", i), "mxfp8", 64, 256) for i in range(2)])
    qe = quantize(experts, "mxfp8", "numpy")
    de = qq.prepare_decode(qe)
    x = case_rng("dwonce-x").standard_normal((64, 1, 1, 256)).astype(F32)
    idx = np.tile(np.array([[0], [1]], np.int32), (32, 1))
    np.testing.assert_array_equal(qq.gather_qmm(x, de, rhs_indices=idx),
                                  qq.gather_qmm(x, qe, rhs_indices=idx))


def test_gather_bad_index_cpu():
    qa, dw = gather_case("nvfp4", "numpy", 8, 64, 256)
    x = np.ones((1, 1, 1, 256), F32)
    with pytest.raises(ValueError, match="^gather_qmm: rhs_indices holds 8"):
        qq.gather_qmm(x, dw, rhs_indices=np.array([[8]], np.int32))


@gpu
@pytest.mark.parametrize("cfg", ["nvfp4", "mxfp8", "a4g64"])
def test_gpu_gather_bad_index_nan_and_graph(cfg):
    """On the GPU an index out of range gives NaN rows (no host read); captured in a CUDA
    graph, a replay on new indices equals the eager call."""
    torch = torch_mod()
    qa, dw = gather_case(cfg, "cuda", 8, 128, 256)
    x = make_x(case_rng("gb", cfg), (2, 1, 1, 256), BF16, "cuda")
    idx = torch.tensor([[1, 9], [3, -1]], dtype=torch.int32, device="cuda")
    got = qq.gather_qmm(x, dw, rhs_indices=idx, dtype="float32")
    assert qq.last_route() == "decode"
    g = to_numpy(got)
    assert np.isnan(g[0, 1]).all() and np.isnan(g[1, 1]).all()
    assert np.isfinite(g[0, 0]).all() and np.isfinite(g[1, 0]).all()
    good = torch.tensor([[1, 2], [3, 0]], dtype=torch.int32, device="cuda")
    out = torch.empty((2, 2, 1, 128), dtype=torch.float32, device="cuda")
    qq.gather_qmm(x, dw, rhs_indices=good, out=out, dtype="float32")  # warm-up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with capture(graph):
        qq.gather_qmm(x, dw, rhs_indices=good, out=out, dtype="float32")
    good.copy_(torch.tensor([[4, 2], [0, 3]], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    eager = qq.gather_qmm(x, dw, rhs_indices=good, dtype="float32")
    np.testing.assert_array_equal(to_numpy(out), to_numpy(eager))


@gpu
def test_gpu_conversion_refuses_more_than_65535_experts():
    """The GPU conversion runs one grid row per expert: 65536 experts are refused on the host,
    before any CUDA call, with a message that says how to go on."""
    torch = torch_mod()
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    e, n, k = 65536, 64, 256
    data = torch.zeros((e, n, k // 2), dtype=torch.uint8, device="cuda")
    scales = torch.zeros((e, n, k // 16), dtype=torch.uint8, device="cuda")
    qa = qq.QuantizedArray(data, scales, mode="nvfp4", shape=(e, n, k))
    with pytest.raises(qq.NotSupportedError, match="65536 experts; the GPU conversion takes at most 65535"):
        qq.prepare_decode(qa)


@gpu
@pytest.mark.parametrize("xdt", [F32, F16], ids=["f32", "f16"])
@pytest.mark.parametrize("cfg", ["nvfp4", "a4g64"])
def test_gpu_gather_other_x_dtypes(cfg, xdt):
    """gather_qmm on decode-layout experts with float32 / float16 x: libqq answers
    NOT_SUPPORTED and the packed experts compute it, into the result already made: the same
    bits as gather_qmm on the packed experts."""
    torch = torch_mod()
    qa, dw = gather_case(cfg, "cuda", 8, 100, 512)
    rng = case_rng("gxd", cfg, str(xdt))
    x = make_x(rng, (2, 1, 3, 512), xdt, "cuda")
    idx = torch.tensor([[1, 5], [7, 0]], dtype=torch.int32, device="cuda")
    got = qq.gather_qmm(x, dw, rhs_indices=idx, dtype="float32")
    assert qq.last_route() != "decode"
    want = qq.gather_qmm(x, qa, rhs_indices=idx, dtype="float32")
    np.testing.assert_array_equal(to_numpy(got), to_numpy(want))


# ---------------------------------------------------------------------------
# Gated layout: qq.prepare_decode(w, gated=True) and qq.quantized_matmul_swiglu
# ---------------------------------------------------------------------------

def gated_rows(f):
    """The weight row each row of a gated layout holds: tile t = gate rows 32t .. 32t + 31,
    then up rows 32t .. 32t + 31 (docs/formats.md, written here from the rule, not from
    libqq's function)."""
    rows = []
    for t in range(f // 32):
        rows += list(range(32 * t, 32 * t + 32)) + list(range(f + 32 * t, f + 32 * t + 32))
    return np.array(rows)


def swiglu64(v):
    """float64 silu(g) * u of [..., 2F]."""
    f = v.shape[-1] // 2
    g, u = v[..., :f], v[..., f:]
    with np.errstate(over="ignore"):
        return g / (1.0 + np.exp(-g)) * u


def bits(a):
    a = to_numpy(a)
    return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def gated_case(cfg, f, k, device):
    rng = case_rng("gated", cfg, f, k, device)
    # the largest group magnitude brought to ~10: products inside float16's range
    w = (make_weight(rng, cfg, 2 * f, k) * 10.0 ** (1 - MAGS[mode_of(cfg)][1])).astype(F32)
    qa = quantize(w, cfg, "cuda" if device == "cuda" else "torch")
    return qa, qq.prepare_decode(qa), qq.prepare_decode(qa, gated=True)


GATED_X = {"cpu": [BF16, F16, F32], "cuda": [BF16, F16, F32]}


@pytest.mark.parametrize("with_bias", [False, True], ids=["", "bias"])
@pytest.mark.parametrize("m", [1, 3, 16, 17, 64])
@pytest.mark.parametrize("f,k", [(32, 256), (96, 512), (2048, 1024), (32, 8192)], ids=str)
@pytest.mark.parametrize("cfg", CFGS)
@pytest.mark.parametrize("device", DEVICES)
def test_gated(device, cfg, f, k, m, with_bias):
    """A gated DecodeWeight: quantized_matmul gives the plain layout's product bit for bit
    (the rows back in the weight's order), quantized_matmul_swiglu gives qq.swiglu of it bit
    for bit (route "decode" on the GPU for bf16 x of at most 64 rows: one kernel up to 16
    kernel rows, the gated product and the swiglu kernel past that), and both
    are near a float64 reference. out= is poisoned first: every element is written."""
    if device == "cpu" and ((f, m) == (2048, 64) or k == 8192):
        pytest.skip("the CPU reads the layout element by element: covered by the smaller shapes")
    # (K = 8192 is for the GPU's configurations: K split over 2 with 16 stages a rank, so past
    # 32 rows one warpgroup a fragment-block parity on sm_90a; past 16 kernel rows (float16 x:
    # past 8) quantized_matmul_swiglu runs the gated product, then the swiglu kernel)
    torch = torch_mod()
    qa, dw, dg = gated_case(cfg, f, k, device)
    fw = "cuda" if device == "cuda" else "torch"
    for xdt in GATED_X[device]:
        rng = case_rng("gated-x", cfg, f, k, m, str(xdt), with_bias)
        x = make_x(rng, (m, k), xdt, fw)
        if k > 1024:  # (exact: keeps float16's products about as far inside its range as at K = 1024)
            x = x * 0.25
        bias = to_fw(rng.standard_normal(2 * f).astype(F32), fw) if with_bias else None
        plain = qq.quantized_matmul(x, dw, bias=bias)
        got = qq.quantized_matmul(x, dg, bias=bias)
        np.testing.assert_array_equal(bits(got), bits(plain))
        want = qq.swiglu(plain)
        out = torch.full((m, f), float("nan"), dtype=plain.dtype, device=plain.device)
        fused = qq.quantized_matmul_swiglu(x, dg, bias=bias, out=out)
        route = qq.last_route()
        assert fused is out
        if device == "cuda" and ((xdt == BF16 and m <= 64) or (xdt == F16 and m <= 32)):
            assert route == "decode", route
        np.testing.assert_array_equal(bits(fused), bits(want))
        if route not in ("decode", "cpu"):
            continue  # the packed weight's routes (their own tests bound them; they may round x to bf16)
        # against float64: swiglu of the reference product, within the product's bound carried
        # through silu(g) * u (|d/dg| <= 1.1 |u|, |d/du| <= |g|) and one rounding of each step
        ref, s = reference(x, qa, bias)
        fi = ml_dtypes.finfo(to_numpy(fused).dtype)
        tol_p = rel_of(mode_of(cfg)) * s + (2.0 ** -21 + float(fi.eps)) * np.abs(ref) + float(fi.smallest_subnormal)
        g, u = ref[:, :f], ref[:, f:]
        tg, tu = tol_p[:, :f], tol_p[:, f:]
        tol = 1.1 * tg * (np.abs(u) + tu) + tu * (np.abs(g) + tg) + 4 * float(fi.eps) * np.abs(swiglu64(ref)) \
            + float(fi.smallest_subnormal)
        with np.errstate(over="ignore"):
            want64 = swiglu64(ref)
        # where the product and the result are inside the dtype's range (float16 may round a
        # few to Inf, as the stored product would)
        inside = (np.abs(g) < fi.max / 2) & (np.abs(u) < fi.max / 2) & (np.abs(want64) < fi.max / 2)
        err = np.abs(to_numpy(fused).astype(F64) - want64)
        bad = inside & ~(err <= tol)
        assert not bad.any(), f"{xdt.__name__}: {bad.sum()} off; worst {np.max(np.where(bad, err - tol, 0))}"
        assert inside.mean() > 0.9


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cfg", CFGS)
def test_gated_layout_is_the_permuted_weight(cfg, device):
    """The gated layout's bytes are the plain layout's of the weight with its rows permuted
    as the rule says (data, scales and biases rows taken in gated_rows' order, in NumPy)."""
    torch = torch_mod()
    f, k = 96, 512
    qa, _, dg = gated_case(cfg, f, k, device)
    perm = gated_rows(f)
    parts = [to_numpy(a)[perm] if a is not None else None for a in (qa.data, qa.scales, qa.biases)]
    fw = "cuda" if device == "cuda" else "torch"
    pq = qq.QuantizedArray(*[to_fw(p, fw) if p is not None else None for p in parts[:2]],
                           biases=to_fw(parts[2], fw) if parts[2] is not None else None, mode=qa.mode,
                           group_size=qa.group_size, bits=qa.bits, global_scale=qa.global_scale,
                           shape=qa.shape)
    np.testing.assert_array_equal(to_numpy(dg.data), to_numpy(qq.prepare_decode(pq).data))
    if device == "cuda":  # the GPU's conversion writes the CPU's bytes
        qc = qq.QuantizedArray(*[to_fw(to_numpy(a), "torch") if a is not None else None
                                 for a in (qa.data, qa.scales)],
                               biases=to_fw(to_numpy(qa.biases), "torch") if qa.biases is not None else None,
                               mode=qa.mode, group_size=qa.group_size, bits=qa.bits,
                               global_scale=None if qa.global_scale is None else qa.global_scale.cpu(),
                               shape=qa.shape)
        np.testing.assert_array_equal(to_numpy(dg.data), to_numpy(qq.prepare_decode(qc, gated=True).data))
    assert dg.gated and not qq.prepare_decode(qa).gated
    assert "gated=True" in repr(dg)
    del torch


@pytest.mark.parametrize("device", DEVICES)
def test_gated_special_values(device):
    """Inf and NaN in x reach the fused SwiGLU as in the two ops (the bits of qq.swiglu of the
    product; NaN where either is NaN), and a huge product rounds to Inf in bf16 before
    silu, as the stored product would."""
    torch = torch_mod()
    f, k = 64, 256
    qa, dw, dg = gated_case("nvfp4", f, k, device)
    fw = "cuda" if device == "cuda" else "torch"
    x = make_x(case_rng("gsv"), (4, k), BF16, fw)
    x[0, 3] = float("inf")
    x[1, 7] = float("nan")
    x[2] *= 1e37
    want = qq.swiglu(qq.quantized_matmul(x, dw))
    got = qq.quantized_matmul_swiglu(x, dg)
    np.testing.assert_array_equal(bits(got), bits(want))
    assert torch.isnan(got[1]).all()
    assert not torch.isfinite(qq.quantized_matmul(x, dw)[2]).all()


@pytest.mark.parametrize("device", DEVICES)
def test_gated_fallbacks(device):
    """quantized_matmul_swiglu gives the bits of the two ops (quantized_matmul, then swiglu)
    for every weight form: a packed QuantizedArray, a plain DecodeWeight (two ops) and a
    gated one, which runs the gated kernel (route "decode") on the GPU for 3-D x and one row
    and the two ops for 80 rows (past the decode kernel's 64); also with out= of another
    dtype than x's (the product in out's dtype, on every path)."""
    torch = torch_mod()
    f, k = 64, 256
    qa, dw, dg = gated_case("mxfp4", f, k, device)
    fw = "cuda" if device == "cuda" else "torch"
    # each form against the two ops on the weight whose sums it shares (on the GPU the packed
    # weight's kernels and the decode layout's sum in different orders)
    pairs = [(qa, qa), (dw, dw), (dg, dw)]
    for shape in [(2, 3, k), (80, k), (1, k)]:
        x = make_x(case_rng("gfb", shape), shape, BF16, fw)
        for w, ref in pairs:
            want = qq.swiglu(qq.quantized_matmul(x, ref))
            np.testing.assert_array_equal(bits(qq.quantized_matmul_swiglu(x, w)), bits(want))
        if device == "cuda":
            assert (qq.last_route() == "decode") == (shape[-2] <= 64), (shape, qq.last_route())
        for w, ref in pairs:
            want32 = qq.swiglu(qq.quantized_matmul(x, ref, dtype="float32"))
            out = torch.full(shape[:-1] + (f,), float("nan"), dtype=torch.float32, device=x.device)
            got = qq.quantized_matmul_swiglu(x, w, out=out)
            assert got is out
            np.testing.assert_array_equal(bits(out), bits(want32))


def test_gated_errors():
    """Bad input for the gated forms: the function, the argument and the way out."""
    torch = torch_mod()
    rng = case_rng("gerr")
    qa = quantize(make_weight(rng, "nvfp4", 96, 256), "nvfp4", "torch")  # 2F = 96: F not a multiple of 32
    with pytest.raises(ValueError, match="prepare_decode: w has N = 96 rows; a gated layout"):
        qq.prepare_decode(qa, gated=True)
    with pytest.raises(TypeError, match="prepare_decode: gated must be True or False"):
        qq.prepare_decode(qa, gated=1)
    experts = quantize(np.stack([make_weight(rng, "nvfp4", 64, 256)] * 3), "nvfp4", "torch")
    with pytest.raises(ValueError, match="prepare_decode: w holds 3 experts; a gated layout is read by"):
        qq.prepare_decode(experts, gated=True)
    qa, _, dg = gated_case("nvfp4", 64, 256, "cpu")
    x = make_x(rng, (2, 256), BF16, "torch")
    with pytest.raises(ValueError, match=r"quantized_matmul_swiglu: argument 'out' has shape \(2, 128\); "
                                         r"expected \(2, 64\)"):
        qq.quantized_matmul_swiglu(x, dg, out=torch.empty((2, 128), dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="quantized_matmul_swiglu: w is a DecodeWeight, which carries"):
        qq.quantized_matmul_swiglu(x, dg, group_size=16)
    odd = quantize(make_weight(rng, "nvfp4", 3, 256), "nvfp4", "torch")
    with pytest.raises(ValueError, match="quantized_matmul_swiglu: w has N = 3 rows; a gate/up weight"):
        qq.quantized_matmul_swiglu(x, odd)
