"""qq.dequantize: out = float(elem) * float(scale) [* (global_scale / 2688)] in fp32
(affine: fma(q, scale, bias), one rounding), then one RNE rounding to the output dtype.
Inputs come from the reference (not from qq.quantize), so dequantize is judged alone."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import qq
import reference as R
from helpers import (AFFINE_PARAMS, BF16, DEVICES, DTYPES, FP_PARAMS, FpCfg,
                     assert_bits_equal, assert_quantized_equal, cast, dtype_params, poison,
                     raises, random_data, ref_dequantize_qa, to_device, to_numpy)

F32 = np.float32
OUT_DTYPES = [None] + DTYPES  # None: the default, bfloat16


def dq(device, data, scales, biases=None, **kw):
    """qq.dequantize with its array arguments on `device`."""
    if kw.get("global_scale") is not None:
        kw["global_scale"] = to_device(np.asarray(kw["global_scale"], F32), device)
    return qq.dequantize(to_device(data, device), to_device(scales, device),
                         to_device(biases, device), **kw)


def check_dequantize(device, data, scales, biases=None, what="dequantize", **kw):
    """qq.dequantize equals reference.dequantize bit for bit, for every output dtype; on the
    GPU also equal to qq's CPU answer."""
    for dt in OUT_DTYPES:
        want = R.dequantize(data, scales, biases, dtype=dt, **kw)
        got = dq(device, data, scales, biases, dtype=dt, **kw)
        assert_bits_equal(got, want, f"{what} -> {dt} [{device}]")
        if device != "cpu":
            assert_bits_equal(got, dq("cpu", data, scales, biases, dtype=dt, **kw), "GPU vs CPU")


def fp_kwargs(cfg: FpCfg, gs=None, layout="linear"):
    kw = {"mode": cfg.mode, "scale_layout": layout}
    if cfg.mode == "mxfp8":
        kw["fp8_format"] = cfg.fp8_format
    if gs is not None:
        kw["global_scale"] = gs
    return kw


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["linear", "blocked"])
@pytest.mark.parametrize("cfg", FP_PARAMS)
def test_fp_random(cfg, layout, device, rng):
    """Reference-quantized random data (extreme magnitudes included) decodes bit-exact to
    float32, float16 (overflow -> Inf, underflow -> subnormal/0) and bfloat16."""
    x = random_data(rng, (64, 256), F32, cfg.group_size)
    gs = R.amax(x) if cfg.global_scale else None
    ref = R.quantize(x, scale_layout=layout, **cfg.kwargs(gs))
    check_dequantize(device, ref.data, ref.scales, **fp_kwargs(cfg, gs, layout))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k", [10272, 12288, 14368, 16384, 20480, 24576, 40960])
@pytest.mark.parametrize("cfg", FP_PARAMS)
def test_fp_long_rows(cfg, k, device, rng):
    """Long rows take the GPU's long-row launch where its layout gives threads 6 to 8 chunks
    (cuda/dequantize.cu: blocks of up to 256 threads): one block a row at 10272 (the last
    threads 5 chunks or none), 12288, 14368 (idle threads) and 16384; two at 24576, three at
    40960; 20480 takes the short-row launch (5 chunks a thread). Bit-exact like every other
    row length, linear and blocked scales, every output written (poisoned out=)."""
    x = random_data(rng, (3, k), F32, cfg.group_size)
    gs = R.amax(x) if cfg.global_scale else None
    for layout in ("linear", "blocked"):
        ref = R.quantize(x, scale_layout=layout, **cfg.kwargs(gs))
        kw = fp_kwargs(cfg, gs, layout)
        check_dequantize(device, ref.data, ref.scales, **kw)
        out = to_device(poison((3, k), BF16), device)
        if kw.get("global_scale") is not None:
            kw["global_scale"] = to_device(np.asarray(kw["global_scale"], F32), device)
        assert qq.dequantize(to_device(ref.data, device), to_device(ref.scales, device), out=out, **kw) is out
        assert_bits_equal(out, R.dequantize(ref.data, ref.scales, dtype=BF16, **fp_kwargs(cfg, gs, layout)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k", [12288, 14336 + 128, 16384])
@pytest.mark.parametrize("bits,group_size", [(4, 64), (8, 128), (4, 32), (8, 32)])
def test_affine_wide_rows(bits, group_size, k, device, rng):
    """Wide rows of 4- and 8-bit affine codes (several blocks a row, each chunk's group by a
    shift of its index) decode bit-exact, every output written (poisoned out=), with
    bfloat16 and float32 scales. (The fp modes' long-row launch is not taken by affine codes.)"""
    x = random_data(rng, (3, k), F32, group_size)
    for sdt in (BF16, F32):
        ref = R.quantize(x.astype(sdt), group_size=group_size, bits=bits)
        check_dequantize(device, ref.data, ref.scales, ref.biases, bits=bits, group_size=group_size)
        out = to_device(poison((3, k), BF16), device)
        got = qq.dequantize(to_device(ref.data, device), to_device(ref.scales, device),
                            to_device(ref.biases, device), bits=bits, group_size=group_size, out=out)
        assert got is out
        assert_bits_equal(out, R.dequantize(ref.data, ref.scales, ref.biases, bits=bits,
                                            group_size=group_size, dtype=BF16))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("bits,group_size", AFFINE_PARAMS)
def test_affine_random(bits, group_size, dtype, device, rng):
    """Affine: fma(q, scale, bias) in fp32 with the stored (x-dtype) scale and bias."""
    x = random_data(rng, (32, 256), dtype, group_size)
    ref = R.quantize(x, group_size=group_size, bits=bits)
    check_dequantize(device, ref.data, ref.scales, ref.biases, group_size=group_size, bits=bits,
                     mode="affine")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("bits", [3, 4, 8])
def test_affine_arbitrary_scales(bits, dtype, device, rng):
    """Random codes with scales and biases of unrelated magnitudes (not what quantize would
    make): the product and the sum round once (fma), then once more to the output dtype."""
    g = 32
    codes = rng.integers(0, 2 ** bits, size=(16, 128), dtype=np.uint8)
    lim = 12 if np.dtype(dtype) == np.float16 else 40
    scales = cast(rng.standard_normal((16, 4)) * np.exp2(rng.integers(-lim, lim // 2, (16, 4))), dtype)
    biases = cast(rng.standard_normal((16, 4)) * np.exp2(rng.integers(-lim, lim // 2, (16, 4))), dtype)
    check_dequantize(device, R.pack(codes, bits), scales, biases, group_size=g, bits=bits,
                     mode="affine")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("bits", [4, 8])
def test_affine_nonfinite_scales_and_biases(bits, dtype, device, rng):
    """Groups with an Inf / NaN scale or bias (codes 0 included: 0 * Inf = NaN), and finite
    ones whose fma overflows to +-Inf: the GPU's bf16 output tests a group's scale and bias
    for finiteness once and packs with the hardware conversion only then (its NaN is not
    the reference's); every output dtype bit for bit."""
    g = 32
    inf, nan, big = np.inf, np.nan, 3.0e38
    pairs = [(inf, 0.0), (-inf, 1.0), (nan, 0.0), (1.0, inf), (1.0, -inf), (2.0, nan), (inf, -inf),
             (big, big), (-big, -big), (big, -big), (1.0, 0.5)]
    n = len(pairs)
    codes = rng.integers(0, 2 ** bits, size=(n, g), dtype=np.uint8)
    codes[:, :2] = [0, 2 ** bits - 1]  # the smallest and largest code in every group
    scales = cast(np.array([[p[0]] for p in pairs], F32), dtype)  # (3e38 is Inf in float16)
    biases = cast(np.array([[p[1]] for p in pairs], F32), dtype)
    with np.errstate(invalid="ignore", over="ignore"):  # the reference's 0 * Inf and overflows
        check_dequantize(device, R.pack(codes, bits), scales, biases, group_size=g, bits=bits, mode="affine")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cfg", [FpCfg("nvfp4"), FpCfg("nvfp4", global_scale=True), FpCfg("mxfp4"),
                                 FpCfg("mxfp8", fp8_format="e4m3"), FpCfg("mxfp8", fp8_format="e5m2")],
                         ids=str)
def test_every_code_and_scale(cfg, device):
    """Every element code against every scale byte (UE8M0 0..255 with 0xFF = NaN; E4M3
    0x00..0xFF with 0x7F / 0xFF = NaN, the negative ones included): NaN codes and scales,
    E4M3 448 * 2^127 overflowing fp32, 2^-127 scales giving fp32 subnormals (and products
    under bf16's subnormal precision, which the GPU's bf16x2 decoding must not round for
    fp32 output); then the cast to each output dtype."""
    n_codes = 256 if cfg.bits == 8 else 16
    g = cfg.group_size
    reps = max(1, g // n_codes)
    row = np.tile(np.arange(n_codes, dtype=np.uint8), reps)  # one or more whole groups
    n_bytes = 256
    codes = np.tile(row, (n_bytes, 1))
    scales = np.repeat(np.arange(n_bytes, dtype=np.uint8)[:, None], row.size // g, axis=1)
    gs = np.array(1000.0, F32) if cfg.global_scale else None
    check_dequantize(device, R.pack(codes, cfg.bits), scales, **fp_kwargs(cfg, gs))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cfg", [FpCfg("nvfp4"), FpCfg("nvfp4", global_scale=True), FpCfg("mxfp4"),
                                 FpCfg("mxfp8"), FpCfg("mxfp8", fp8_format="e5m2")], ids=str)
def test_every_code_and_scale_long_rows(cfg, device):
    """test_every_code_and_scale's codes and scale bytes along rows of K = 12288 (the GPU's
    long-row launch, 8 chunks a thread): NaN scales, fp8 codes with an all-ones exponent and
    products under bf16's subnormal precision take its out-of-line fp32 path too. Group j of
    row r holds code block (j + r) mod (blocks) and scale byte j mod 256, so every code meets
    every scale byte."""
    n_codes = 256 if cfg.bits == 8 else 16
    g, k = cfg.group_size, 12288
    per = min(g, n_codes)            # codes a group holds
    nblk = n_codes // per            # code blocks (fp8: 8, fp4: 1)
    ng = k // g
    codes = np.empty((nblk, k), np.uint8)
    for r in range(nblk):
        cb = (np.arange(ng) + r) % nblk
        block = (cb[:, None] * per + np.arange(per)[None, :]).astype(np.uint8)   # [ng, per]
        codes[r] = np.tile(block, (1, g // per)).reshape(-1)
    scales = np.tile((np.arange(ng) % 256).astype(np.uint8), (nblk, 1))
    gs = np.array(1000.0, F32) if cfg.global_scale else None
    check_dequantize(device, R.pack(codes, cfg.bits), scales, **fp_kwargs(cfg, gs))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gs", [3.4028235e38, 1.5e38, 1e-30, 3e-8, 2688.0])
def test_nvfp4_global_scale_extremes(gs, device):
    """Every nvfp4 code against every scale byte with global scales across the valid range
    (1e-30 .. fp32's max): (elem * scale) * (gs / 2688) rounding to Inf in bfloat16 (4 values
    at the largest gs) and float16, into float16's subnormals (3e-8), and a factor of exactly
    1 (gs 2688); fp32 products stay normal at every valid gs. The GPU forms elem * scale in
    bf16x2, then scales in fp32: it must round as the CPU does."""
    codes = np.tile(np.arange(16, dtype=np.uint8), (256, 1))
    scales = np.repeat(np.arange(256, dtype=np.uint8)[:, None], 1, axis=1)
    check_dequantize(device, R.pack(codes, 4), scales, mode="nvfp4", global_scale=np.array(gs, F32))


@pytest.mark.parametrize("device", DEVICES)
def test_known_values(device):
    """mxfp8 0x38 (1.0) with byte 128 -> 2.0; nvfp4 code 7 (6) with 0x23 (0.171875) ->
    1.03125; mxfp4 code 1 (0.5) with byte 0 (2^-127) -> 2^-128: a float32 subnormal, exact
    in bfloat16, 0 in float16; E5M2 0x7C is Inf."""
    got = dq(device, np.full((1, 32), 0x38, np.uint8), np.array([[128]], np.uint8),
             mode="mxfp8", dtype="float32")
    assert (to_numpy(got) == 2.0).all()
    got = dq(device, np.full((1, 8), 0x77, np.uint8), np.array([[0x23]], np.uint8),
             mode="nvfp4", dtype="float32")
    assert (to_numpy(got) == 1.03125).all()
    data, s = np.full((1, 16), 0x11, np.uint8), np.array([[0]], np.uint8)
    assert (to_numpy(dq(device, data, s, mode="mxfp4", dtype="float32")) == F32(2.0 ** -128)).all()
    assert (to_numpy(dq(device, data, s, mode="mxfp4")).astype(F32) == F32(2.0 ** -128)).all()
    assert (to_numpy(dq(device, data, s, mode="mxfp4", dtype="float16")) == 0).all()
    e5 = np.zeros((1, 32), np.uint8)
    e5[0, :2] = [0x7C, 0xFC]
    got = to_numpy(dq(device, e5, np.array([[127]], np.uint8), mode="mxfp8", fp8_format="e5m2",
                      dtype="float32"))
    assert got[0, 0] == np.inf and got[0, 1] == -np.inf


@pytest.mark.parametrize("device", DEVICES)
def test_affine_fma_single_rounding(device):
    """fma(3, 1 + 2^-23, -2^-22) = 3 + 2^-23 exactly, half an ulp above 3 -> 3.0 (even).
    Rounding the product first would give 3 + 2^-21 - 2^-22 = 3 + 2^-22."""
    data = np.full((1, 16), 0x33, np.uint8)  # 32 codes of 3
    s = np.array([[1 + 2 ** -23]], F32)
    b = np.array([[-(2 ** -22)]], F32)
    got = to_numpy(dq(device, data, s, b, group_size=32, bits=4, dtype="float32"))
    assert got.dtype == F32 and (got == 3.0).all(), got[0, :4]


def _gs_order_example():
    """A global scale for which (elem * scale) * (gs / 2688) differs from the other
    groupings, so the test below can tell them apart."""
    e, s = F32(6.0), F32(R.E4M3_VALUES[0x5B])  # 6 * 2^4 * 1.375 = 132
    for gs in np.linspace(1, 3, 4001, dtype=F32):
        want = F32(e * s) * F32(gs / F32(2688))
        alt1 = e * F32(s * F32(gs / F32(2688)))
        alt2 = F32(F32(e * s) * gs) / F32(2688)
        if want != alt1 and want != alt2:
            return gs, want
    raise AssertionError("no distinguishing global scale found")


@pytest.mark.parametrize("device", DEVICES)
def test_nvfp4_global_scale_order(device):
    """Dequantize computes (elem * scale) * (gs / 2688) in fp32, in that order."""
    gs, want = _gs_order_example()
    data = np.full((1, 8), 0x77, np.uint8)
    s = np.array([[0x5B]], np.uint8)
    got = to_numpy(dq(device, data, s, mode="nvfp4", global_scale=np.array(gs, F32), dtype="float32"))
    assert (got == want).all(), (got[0, 0], want)


@pytest.mark.parametrize("device", DEVICES)
def test_default_dtype_is_bfloat16(device, rng):
    x = random_data(rng, (4, 64), F32, 32)
    ref = R.quantize(x, mode="mxfp8")
    got = to_numpy(dq(device, ref.data, ref.scales, mode="mxfp8"))
    assert got.dtype == BF16
    assert_bits_equal(got, R.dequantize(ref.data, ref.scales, mode="mxfp8"))


@pytest.mark.parametrize("spec,want", [
    ("float32", np.float32), ("float16", np.float16), ("bfloat16", BF16),
    (np.float32, np.float32), (np.dtype(np.float16), np.float16), (ml_dtypes.bfloat16, BF16),
])
def test_dtype_spellings(spec, want, rng):
    """dtype accepts names and NumPy/ml_dtypes dtype objects."""
    x = random_data(rng, (4, 64), F32, 64)
    ref = R.quantize(x)
    got = qq.dequantize(ref.data, ref.scales, ref.biases, dtype=spec)
    assert_bits_equal(got, R.dequantize(ref.data, ref.scales, ref.biases, dtype=want))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(64,), (3, 5, 64), (130, 32)], ids=lambda s: "x".join(map(str, s)))
def test_blocked_shapes(shape, device, rng):
    """Blocked scales: rows are data's second-to-last axis (1 for 1D data), one blocked
    matrix per batch entry."""
    x = random_data(rng, shape, F32, 16)
    ref = R.quantize(x, mode="nvfp4", scale_layout="blocked")
    check_dequantize(device, ref.data, ref.scales, mode="nvfp4", scale_layout="blocked")


@pytest.mark.parametrize("device", DEVICES)
def test_quantized_array_argument(device, rng):
    """A QuantizedArray carries scales, biases, mode, group size, bits, global scale,
    layout and fp8 format: dequantize(qa) needs nothing else."""
    x = random_data(rng, (8, 128), F32, 32)
    gs = R.amax(x)
    for kw in [dict(mode="nvfp4", global_scale=gs, scale_layout="blocked"),
               dict(mode="mxfp8", fp8_format="e5m2", rounding="floor"),
               dict(group_size=32, bits=3)]:
        ref = R.quantize(x, **kw)
        kwd = dict(kw)
        if "global_scale" in kwd:
            kwd["global_scale"] = to_device(gs, device)
        qa = qq.quantize(to_device(x, device), **kwd)
        assert_quantized_equal(qa, ref, x)
        for dt in (None, "float32"):
            assert_bits_equal(qq.dequantize(qa, dtype=dt), ref_dequantize_qa(qa, dt),
                              f"dequantize(QuantizedArray {kw}) -> {dt}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", dtype_params())
def test_out_buffer(dtype, device, rng):
    """out= is written completely (a 0xAB-poisoned buffer shows any byte left over) and is
    the object returned; its dtype is the output dtype."""
    x = random_data(rng, (2, 5, 64), F32, 32)
    ref = R.quantize(x, mode="mxfp4")
    out = to_device(poison((2, 5, 64), dtype), device)
    got = qq.dequantize(to_device(ref.data, device), to_device(ref.scales, device), mode="mxfp4",
                        out=out)
    assert got is out
    assert_bits_equal(out, R.dequantize(ref.data, ref.scales, mode="mxfp4", dtype=dtype))
    # affine too, with dtype given consistently
    ref = R.quantize(x, group_size=64, bits=5)
    out = to_device(poison((2, 5, 64), dtype), device)
    got = qq.dequantize(to_device(ref.data, device), to_device(ref.scales, device),
                        to_device(ref.biases, device), bits=5, dtype=dtype, out=out)
    assert got is out
    assert_bits_equal(out, R.dequantize(ref.data, ref.scales, ref.biases, bits=5, dtype=dtype))


def test_row_strided_data(rng):
    """Row-strided views of data and scales (last axis contiguous) are read as is."""
    x = random_data(rng, (12, 64), F32, 32)
    ref = R.quantize(x, mode="mxfp8")
    got = qq.dequantize(ref.data[::3], ref.scales[::3], mode="mxfp8", dtype="float32")
    assert_bits_equal(got, R.dequantize(ref.data[::3], ref.scales[::3], mode="mxfp8", dtype=F32))


@pytest.mark.parametrize("fp8", ["e4m3", "e5m2"])
def test_byte_dtypes_accepted(fp8, rng):
    """Packed data and fp scales may be uint8, int8 or the 1-byte float8 dtype of what
    they hold (mxfp8 data float8_e4m3fn / float8_e5m2, UE8M0 scales float8_e8m0fnu): read
    as bytes. A float8 dtype that contradicts the mode is refused, naming the argument."""
    x = random_data(rng, (4, 64), F32, 32)
    ref = R.quantize(x, mode="mxfp8", fp8_format=fp8)
    want = R.dequantize(ref.data, ref.scales, mode="mxfp8", fp8_format=fp8)
    typed = ml_dtypes.float8_e4m3fn if fp8 == "e4m3" else ml_dtypes.float8_e5m2
    other = ml_dtypes.float8_e5m2 if fp8 == "e4m3" else ml_dtypes.float8_e4m3fn
    for dv, sv in ((np.int8, np.uint8), (typed, np.uint8), (np.uint8, np.int8),
                   (np.uint8, ml_dtypes.float8_e8m0fnu), (typed, ml_dtypes.float8_e8m0fnu)):
        assert_bits_equal(qq.dequantize(ref.data.view(dv), ref.scales.view(sv), mode="mxfp8",
                                        fp8_format=fp8), want)
    raises(TypeError, ["w"], qq.dequantize, ref.data.view(other), ref.scales, mode="mxfp8", fp8_format=fp8)
    raises(TypeError, ["scales"], qq.dequantize, ref.data, ref.scales.view(ml_dtypes.float8_e4m3fn),
           mode="mxfp8", fp8_format=fp8)


def test_roundtrip_through_qq(rng):
    """qq.quantize then qq.dequantize equals the reference round trip (both halves of qq)."""
    x = random_data(rng, (16, 128), BF16, 32)
    for kw in [dict(mode="nvfp4"), dict(mode="mxfp4", rounding="floor"), dict(mode="mxfp8"),
               dict(bits=6, group_size=128)]:
        q = qq.quantize(x, **kw)
        assert_quantized_equal(q, R.quantize(x, **kw), x)
        assert_bits_equal(qq.dequantize(q), ref_dequantize_qa(q), str(kw))
