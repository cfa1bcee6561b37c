"""Independent NumPy reference of libqq's numerics.

Written from docs/formats.md (and the decisions recorded in tests/README.md where it is
silent), never from libqq's sources, so that the test suite can compare
libqq's answers bit for bit against a second, separately written implementation.

Everything here is pure NumPy (+ ml_dtypes for bfloat16) and vectorized: quantizing a
512 x 4096 input takes a fraction of a second.

Conventions
-----------
* All arithmetic that docs/formats.md specifies "in fp32" is done on np.float32 arrays with
  np.float32 scalars, so every operation is one IEEE fp32 operation (NumPy's float32
  +, -, *, / are correctly rounded).
* Conversions to E2M1 / E4M3FN / E5M2 are done by table lookup on the exact float64
  value of an fp32 number: round to nearest, ties to the even code (the code's least
  significant bit is the mantissa's), saturate to +-max (satfinite), NaN -> 0x7F.
* UE8M0 scale bytes are computed from fp32 bit fields, never with log2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import ml_dtypes
import numpy as np

F32 = np.float32
F64 = np.float64
BF16 = np.dtype(ml_dtypes.bfloat16)
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), BF16)

MODES = ("affine", "nvfp4", "mxfp4", "mxfp8")
#: mode -> (default group_size, default bits)
DEFAULTS = {"affine": (64, 4), "nvfp4": (16, 4), "mxfp4": (32, 4), "mxfp8": (32, 8)}
AFFINE_BITS = (2, 3, 4, 5, 6, 8)
AFFINE_GROUPS = (32, 64, 128)

#: 2688 = 448 * 6, the product of the E4M3 and E2M1 maxima (nvfp4 global scale).
NVFP4_GS_DIVISOR = F32(2688.0)


# ---------------------------------------------------------------------------
# Element formats
# ---------------------------------------------------------------------------

def _e4m3fn_decode_table() -> np.ndarray:
    """float32 value of every E4M3FN byte: bias 7, 3 mantissa bits, no infinities,
    0x7F / 0xFF NaN, max 0x7E = 1.75 * 2^8 = 448, subnormals m * 2^-9."""
    out = np.empty(256, F64)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        e = (code >> 3) & 0xF
        m = code & 0x7
        if e == 0xF and m == 0x7:
            out[code] = np.nan
        elif e == 0:
            out[code] = sign * m * 2.0 ** -9
        else:
            out[code] = sign * (1.0 + m / 8.0) * 2.0 ** (e - 7)
    return out.astype(F32)


def _e5m2_decode_table() -> np.ndarray:
    """float32 value of every E5M2 byte: bias 15, 2 mantissa bits, IEEE-like:
    exponent 31 is Inf (m == 0) or NaN; max 0x7B = 1.75 * 2^15 = 57344."""
    out = np.empty(256, F64)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        e = (code >> 2) & 0x1F
        m = code & 0x3
        if e == 0x1F:
            out[code] = sign * np.inf if m == 0 else np.nan
        elif e == 0:
            out[code] = sign * m * 2.0 ** -16
        else:
            out[code] = sign * (1.0 + m / 4.0) * 2.0 ** (e - 15)
    return out.astype(F32)


#: E2M1 codes 0..7 = {0, 0.5, 1, 1.5, 2, 3, 4, 6}, bit 3 = sign.
E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], F32)
E4M3_VALUES = _e4m3fn_decode_table()
E5M2_VALUES = _e5m2_decode_table()


@dataclass(frozen=True)
class ElemFormat:
    name: str
    decode_table: np.ndarray  # float32 value of every code
    max_code: int  # largest finite positive code
    sign_bit: int
    nan_code: int  # code written for NaN input
    emax: int  # exponent of the largest power of two <= max (OCP emax_elem)

    @property
    def max(self) -> float:
        return float(self.decode_table[self.max_code])

    @property
    def positive_values(self) -> np.ndarray:
        """float64 values of codes 0..max_code, increasing."""
        return self.decode_table[: self.max_code + 1].astype(F64)


E2M1 = ElemFormat("e2m1", E2M1_VALUES, 0x7, 0x8, 0x0, 2)
E4M3 = ElemFormat("e4m3", E4M3_VALUES, 0x7E, 0x80, 0x7F, 8)
E5M2 = ElemFormat("e5m2", E5M2_VALUES, 0x7B, 0x80, 0x7F, 15)


def encode(v, fmt: ElemFormat) -> np.ndarray:
    """Round values to codes of `fmt`: nearest, ties to even, satfinite, NaN -> nan_code.

    `v` must hold the exact values to round (fp32 numbers, or float64 numbers that an
    exact operation produced); they are compared in float64, where every midpoint between
    two neighbouring codes is exact. The sign bit is copied from `v`, so negative values
    (and -0.0) that round to zero give the code of -0.
    """
    v = np.asarray(v, F64)
    nan = np.isnan(v)
    a = np.where(nan, 0.0, np.abs(v))
    table = fmt.positive_values
    n = table.size
    lo = np.searchsorted(table, a, side="right") - 1  # table[lo] <= a (a >= 0 == table[0])
    lo = np.minimum(lo, n - 1)
    hi = np.minimum(lo + 1, n - 1)
    mid = (table[lo] + table[hi]) * 0.5
    # Above the midpoint: up. On it: to the even code (lo odd -> hi is even).
    # At or above max (incl. +Inf): lo == hi == max_code, i.e. saturation.
    up = (a > mid) | ((a == mid) & ((lo & 1) == 1))
    code = np.where(up, hi, lo).astype(np.uint8)
    code |= np.where(np.signbit(v), fmt.sign_bit, 0).astype(np.uint8)
    return np.where(nan, fmt.nan_code, code).astype(np.uint8)


def decode(codes, fmt: ElemFormat) -> np.ndarray:
    """float32 values of codes (NaN for NaN codes)."""
    return fmt.decode_table[np.asarray(codes, np.uint8)]


def to_e4m3(v) -> np.ndarray:
    return encode(v, E4M3)


def to_e5m2(v) -> np.ndarray:
    return encode(v, E5M2)


def to_e2m1(v) -> np.ndarray:
    return encode(v, E2M1)


# ---------------------------------------------------------------------------
# fp32 <-> output dtypes
# ---------------------------------------------------------------------------

def f32_to_bf16(v) -> np.ndarray:
    """Round float32 to bfloat16: RNE on the fp32 bit pattern (overflow -> Inf, NaN kept)."""
    v = np.asarray(v, F32)
    u = v.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(v)
    r = np.where(nan, ((u >> 16).astype(np.uint16) | 0x0040), r).astype(np.uint16)
    return r.view(BF16)


def cast_from_f32(v, dtype) -> np.ndarray:
    """One rounding (RNE) of float32 values to a float output dtype."""
    dtype = np.dtype(dtype)
    v = np.asarray(v, F32)
    if dtype == np.float32:
        return v.copy()
    if dtype == np.float16:
        with np.errstate(over="ignore"):
            return v.astype(np.float16)
    if dtype == BF16:
        return f32_to_bf16(v)
    raise TypeError(f"unsupported output dtype {dtype}")


def fma_f32(a, b, c) -> np.ndarray:
    """fp32 fused multiply-add a * b + c with one rounding, for fp32 inputs whose product
    a * b is exact in float64 (here: a an integer code < 2^8, b an fp32 number).

    The float64 sum is made round-to-odd (TwoSum gives its exact error; an inexact sum
    whose last bit is even moves one ulp towards the error), and round-to-odd at 53 bits
    followed by one rounding to 24 bits equals a single correct rounding.
    """
    a = np.asarray(a, F64)
    b = np.asarray(b, F32).astype(F64)
    c = np.asarray(c, F32).astype(F64)
    p = a * b
    with np.errstate(invalid="ignore", over="ignore"):
        s = p + c
        bb = s - p
        err = (p - (s - bb)) + (c - bb)
        s = np.asarray(s, F64)
        bits = s.view(np.uint64)
        fix = np.isfinite(s) & np.isfinite(err) & (err != 0) & ((bits & 1) == 0)
        s_odd = np.where(fix, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
        return np.asarray(s_odd, F64).astype(F32)


# ---------------------------------------------------------------------------
# Scale encodings
# ---------------------------------------------------------------------------

def ue8m0_ceil(amax, elem_max) -> np.ndarray:
    """UE8M0 byte of the smallest power of two >= q, q = fl32(amax / elem_max).

    From q's bits: the biased exponent, plus one if the mantissa is non-zero, except for
    exponent 254 (stays 254 = 2^127) and a subnormal q <= 2^-127 (byte 0 = 2^-127); a
    subnormal q above 2^-127 gives byte 1 (2^-126).
    """
    amax = np.asarray(amax, F32)
    with np.errstate(all="ignore"):
        q = np.asarray(amax / F32(elem_max), F32)
    bits = q.view(np.uint32).astype(np.int64)
    e = (bits >> 23) & 0xFF
    m = bits & 0x7FFFFF
    byte = e + (m != 0)
    byte = np.where(e == 254, 254, byte)
    byte = np.where(e == 0, np.where(bits <= 0x00400000, 0, 1), byte)  # 0x00400000 = 2^-127
    return np.clip(byte, 0, 254).astype(np.uint8)


def ue8m0_floor(amax, emax_elem) -> np.ndarray:
    """UE8M0 byte of 2^(floor(log2 amax) - emax_elem), exponent clamped to [-127, 127].

    floor(log2 amax) is the unbiased exponent field of a normal amax; a subnormal or zero
    amax has floor(log2) <= -127, so its exponent clamps to -127 (byte 0).
    """
    amax = np.asarray(amax, F32)
    bits = amax.view(np.uint32).astype(np.int64)
    e_field = (bits >> 23) & 0xFF
    exp = np.where(e_field == 0, -127, e_field - 127 - emax_elem)
    return (np.clip(exp, -127, 127) + 127).astype(np.uint8)


def ue8m0_value(byte) -> np.ndarray:
    """float64 value of UE8M0 bytes: 2^(b - 127), 0xFF = NaN."""
    b = np.asarray(byte, np.uint8).astype(np.int64)
    v = np.ldexp(1.0, b - 127)
    return np.where(b == 0xFF, np.nan, v)


# ---------------------------------------------------------------------------
# Packing (docs/formats.md, Modes)
# ---------------------------------------------------------------------------

def pack(codes, bits: int) -> np.ndarray:
    """Pack element codes [..., K] into bytes [..., K*bits/8], one little-endian bit
    stream per row: element i occupies bits [i*bits, (i+1)*bits) counted from bit 0 of
    byte 0. For bits == 4 this is: byte b = code[2b] | code[2b+1] << 4."""
    codes = np.asarray(codes, np.uint8)
    if bits == 8:
        return codes.copy()
    k = codes.shape[-1]
    assert (k * bits) % 8 == 0
    if bits == 4:
        return (codes[..., 0::2] & 0xF) | ((codes[..., 1::2] & 0xF) << 4)
    shifts = np.arange(bits, dtype=np.uint8)
    b = ((codes[..., None] >> shifts) & 1).astype(np.uint8)  # [..., K, bits], LSB first
    b = b.reshape(codes.shape[:-1] + (k * bits,))
    return np.packbits(b, axis=-1, bitorder="little")


def unpack(data, bits: int, k: Optional[int] = None) -> np.ndarray:
    """Inverse of pack: bytes [..., K*bits/8] -> codes [..., K]."""
    data = np.asarray(data).view(np.uint8)
    if bits == 8:
        return data.copy()
    if k is None:
        k = data.shape[-1] * 8 // bits
    if bits == 4:
        out = np.empty(data.shape[:-1] + (k,), np.uint8)
        out[..., 0::2] = data & 0xF
        out[..., 1::2] = data >> 4
        return out
    b = np.unpackbits(data, axis=-1, bitorder="little")[..., : k * bits]
    b = b.reshape(data.shape[:-1] + (k, bits)).astype(np.uint16)
    weights = (1 << np.arange(bits)).astype(np.uint16)
    return (b * weights).sum(-1).astype(np.uint8)


# ---------------------------------------------------------------------------
# Blocked scale layout (docs/formats.md, Scale layouts)
# ---------------------------------------------------------------------------

def roundup(a: int, b: int) -> int:
    return -(-a // b) * b


def blocked_offsets(rows: int, cols: int) -> np.ndarray:
    """off(r, c) = (r/128)*128*C4 + (c/4)*512 + (r%32)*16 + ((r%128)/32)*4 + (c%4)
    for every r < rows, c < cols, with C4 = roundup(cols, 4)."""
    c4 = roundup(cols, 4)
    r = np.arange(rows, dtype=np.int64)[:, None]
    c = np.arange(cols, dtype=np.int64)[None, :]
    return (r // 128) * 128 * c4 + (c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + (c % 4)


def blocked_shape(linear_shape) -> tuple:
    """[B..., R, C] -> [B..., roundup(R,128), roundup(C,4)]; a 1D [C] counts as R = 1."""
    linear_shape = tuple(linear_shape)
    if len(linear_shape) == 1:
        return (128, roundup(linear_shape[0], 4))
    *batch, r, c = linear_shape
    return tuple(batch) + (roundup(r, 128), roundup(c, 4))


def swizzle(linear) -> np.ndarray:
    """Linear scales [B..., R, C] -> blocked [B..., roundup(R,128), roundup(C,4)], zero padding."""
    linear = np.asarray(linear)
    lin3 = linear.reshape((1, 1, -1)) if linear.ndim == 1 else linear.reshape((-1,) + linear.shape[-2:])
    nb, r, c = lin3.shape
    bshape = blocked_shape(linear.shape)
    out = np.zeros((nb, bshape[-2] * bshape[-1]), linear.dtype)
    out[:, blocked_offsets(r, c).ravel()] = lin3.reshape(nb, r * c)
    return out.reshape(bshape)


def unswizzle(blocked, linear_shape) -> np.ndarray:
    """Blocked scales -> linear scales of `linear_shape`."""
    blocked = np.asarray(blocked)
    linear_shape = tuple(linear_shape)
    assert blocked.shape == blocked_shape(linear_shape), (blocked.shape, linear_shape)
    if len(linear_shape) == 1:
        r, c = 1, linear_shape[0]
    else:
        r, c = linear_shape[-2:]
    flat = blocked.reshape((-1, blocked.shape[-2] * blocked.shape[-1]))
    return flat[:, blocked_offsets(r, c).ravel()].reshape(linear_shape)


# ---------------------------------------------------------------------------
# Quantize
# ---------------------------------------------------------------------------

def resolve(mode: str, group_size: Optional[int], bits: Optional[int]):
    if mode not in DEFAULTS:
        raise ValueError(f"unknown mode {mode!r}")
    g0, b0 = DEFAULTS[mode]
    return (g0 if group_size is None else group_size), (b0 if bits is None else bits)


def elem_format(mode: str, fp8_format: str = "e4m3") -> ElemFormat:
    if mode in ("nvfp4", "mxfp4"):
        return E2M1
    if mode == "mxfp8":
        return {"e4m3": E4M3, "e5m2": E5M2}[fp8_format]
    raise ValueError(mode)


def round_half_away(v) -> np.ndarray:
    """sign(v) * floor(|v| + 0.5) in exact fp32 logic: v - trunc(v) is exact, so no
    rounding can pull a value just below .5 up to the tie."""
    v = np.asarray(v, F32)
    t = np.trunc(v)
    frac = np.abs(v - t)
    return (t + np.copysign(F32(1), v) * (frac >= F32(0.5)).astype(F32)).astype(F32)


def amax(x) -> np.ndarray:
    """max |x| as a float32 0-d array; NaN anywhere -> NaN; empty -> 0."""
    x = np.asarray(x)
    if x.size == 0:
        return np.array(0, F32)
    return np.array(np.max(np.abs(x.astype(F32))), F32)


def swiglu(x) -> np.ndarray:
    """silu(g) * u of x [..., 2F] = [g | u], in float64, as float64 (the caller rounds):
    g / (1 + exp(-g)) * u, with torch's NaN for a gate of -Inf. As in the float32 evaluation
    libqq states, exp(-g) past float32's range (g < -88.72) is Inf, so the result is -0 there
    (the true value, below 2^-126 * |u|, is lost)."""
    x = np.asarray(x).astype(np.float64)
    f = x.shape[-1] // 2
    g, u = x[..., :f], x[..., f:]
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(-g)
        e = np.where(e > np.finfo(F32).max, np.inf, e)
        return g / (1.0 + e) * u


@dataclass
class RefQuantized:
    """What quantize returns, plus what the tests need to compare it.

    codes: unpacked element codes [..., K].
    linear_scales: scales in the linear layout [..., K/g].
    loose_sign: bool [..., K/g], groups whose zero codes may carry either sign (amax == 0
      in any fp mode; nvfp4 groups whose scale is 0): compare codes without the sign bit.
    """

    data: np.ndarray
    scales: np.ndarray
    biases: Optional[np.ndarray]
    codes: np.ndarray
    linear_scales: np.ndarray
    loose_sign: np.ndarray
    mode: str
    group_size: int
    bits: int
    global_scale: Optional[np.ndarray]
    rounding: str
    scale_layout: str
    fp8_format: str
    shape: tuple

    def __iter__(self):
        yield self.data
        yield self.scales
        if self.mode == "affine":
            yield self.biases


def _groups(x, g):
    x32 = np.asarray(x).astype(F32)
    k = x32.shape[-1]
    assert k % g == 0, (k, g)
    return x32.reshape(x32.shape[:-1] + (k // g, g))


def _quantize_affine(xg, bits):
    n = F32(2 ** bits - 1)
    finite = np.all(np.isfinite(xg), axis=-1)
    xs = np.where(finite[..., None], xg, F32(0)).astype(F32)
    with np.errstate(all="ignore"):
        w_min = xs.min(axis=-1)
        w_max = np.maximum(xs.max(axis=-1), F32(0))  # MLX's GPU kernels start the max at 0
        rng = (w_max - w_min).astype(F32)
        # a group spanning more than FLT_MAX: range taken as w_max/n - w_min/n (finite)
        rng_n = np.where(np.isfinite(rng), rng / n, w_max / n - w_min / n).astype(F32)
        scale = np.maximum(rng_n, F32(1e-7)).astype(F32)
        side = np.abs(w_min) > np.abs(w_max)
        edge = np.where(side, w_min, w_max).astype(F32)
        scale = np.where(side, scale, -scale).astype(F32)
        q0 = round_half_away(edge / scale)
        at_zero = q0 == 0
        scale = np.where(at_zero, scale, edge / np.where(at_zero, F32(1), q0)).astype(F32)
        bias = np.where(at_zero, F32(0), edge).astype(F32)
        q = round_half_away((xs - bias[..., None]) / scale[..., None])
        q = np.clip(q, F32(0), n)
    codes = np.where(finite[..., None], q, 0).astype(np.uint8)
    scale = np.where(finite, scale, F32(np.nan)).astype(F32)
    bias = np.where(finite, bias, F32(np.nan)).astype(F32)
    return codes, scale, bias


def _group_amax(xg):
    finite = np.all(np.isfinite(xg), axis=-1)
    xs = np.where(finite[..., None], xg, F32(0)).astype(F32)
    return finite, xs, np.max(np.abs(xs), axis=-1).astype(F32)


#: The smallest nvfp4 global scale that is used (docs/errors.md): below it, 2688 * 512 / g
#: (the element factor of the smallest E4M3 scale) overflows fp32.
NVFP4_MIN_GLOBAL_SCALE = F32(1e-30)


def effective_global_scale(global_scale):
    """The global scale nvfp4 uses: g itself when finite and >= 1e-30, else None (factor 1).

    0 (an all-zero tensor's amax), negative, NaN, +-Inf and tiny values all mean "no
    global scale", the same in quantize, dequantize and qqmm, so a round trip stays exact."""
    if global_scale is None:
        return None
    g = F32(np.asarray(global_scale, F32).reshape(()))
    if not (np.isfinite(g) and g >= NVFP4_MIN_GLOBAL_SCALE):
        return None
    return g


def _quantize_nvfp4(xg, global_scale):
    finite, xs, am = _group_amax(xg)
    global_scale = effective_global_scale(global_scale)
    if global_scale is None:
        enc = F32(1)
    else:
        with np.errstate(all="ignore"):
            enc = NVFP4_GS_DIVISOR / F32(np.asarray(global_scale, F32).reshape(()))
    with np.errstate(all="ignore"):
        sval = (am / F32(6)) * enc
        s_code = encode(sval, E4M3)
        s_code = np.where(am == 0, 0, s_code).astype(np.uint8)
        s_val = decode(s_code, E4M3)
        r = (enc / s_val).astype(F32)  # the fp32 reciprocal factor enc / float(s)
        y = (xs * r[..., None]).astype(F32)  # one fp32 multiply, then E2M1 rounding
    codes = encode(y, E2M1)
    zero_scale = s_code == 0
    codes = np.where(zero_scale[..., None], 0, codes).astype(np.uint8)
    s_code = np.where(finite, s_code, 0x7F).astype(np.uint8)
    codes = np.where(finite[..., None], codes, 0).astype(np.uint8)
    return codes, s_code, zero_scale & finite


def _quantize_mx(xg, fmt: ElemFormat, rounding: str):
    finite, xs, am = _group_amax(xg)
    if rounding == "ceil":
        byte = ue8m0_ceil(am, fmt.max)
    elif rounding == "floor":
        byte = ue8m0_floor(am, fmt.emax)
    else:
        raise ValueError(rounding)
    # x * 2^-e is exact in float64 (and equals the fp32 product wherever that could
    # reach a rounding boundary of the element format).
    y = xs.astype(F64) * np.ldexp(1.0, 127 - byte.astype(np.int64))[..., None]
    codes = encode(y, fmt)
    zero = am == 0
    codes = np.where(zero[..., None], 0, codes).astype(np.uint8)
    byte = np.where(finite, byte, 0xFF).astype(np.uint8)
    codes = np.where(finite[..., None], codes, 0x7F if fmt.sign_bit == 0x80 else 0).astype(np.uint8)
    return codes, byte, zero & finite


def quantize(x, group_size=None, bits=None, mode="affine", *, global_scale=None,
             rounding="ceil", scale_layout="linear", fp8_format="e4m3") -> RefQuantized:
    """Reference of qq.quantize (same parameters). x: NumPy float32/float16/bfloat16."""
    x = np.asarray(x)
    assert x.dtype in FLOAT_DTYPES, x.dtype
    g, b = resolve(mode, group_size, bits)
    xg = _groups(x, g)
    biases = None
    if mode == "affine":
        assert b in AFFINE_BITS and g in AFFINE_GROUPS and scale_layout == "linear"
        codes, scale32, bias32 = _quantize_affine(xg, b)
        scales = cast_from_f32(scale32, x.dtype)
        biases = cast_from_f32(bias32, x.dtype)
        loose = np.zeros(scales.shape, bool)
    elif mode == "nvfp4":
        assert g == 16 and b == 4
        codes, scales, loose = _quantize_nvfp4(xg, global_scale)
    else:
        assert g == 32 and b == (4 if mode == "mxfp4" else 8)
        codes, scales, loose = _quantize_mx(xg, elem_format(mode, fp8_format), rounding)
    codes = codes.reshape(x.shape)
    linear = scales
    if scale_layout == "blocked":
        scales = swizzle(linear)
    else:
        assert scale_layout == "linear"
    return RefQuantized(
        data=pack(codes, b), scales=scales, biases=biases, codes=codes,
        linear_scales=linear, loose_sign=loose, mode=mode, group_size=g, bits=b,
        global_scale=global_scale, rounding=rounding, scale_layout=scale_layout,
        fp8_format=fp8_format, shape=tuple(x.shape))


# ---------------------------------------------------------------------------
# Dequantize
# ---------------------------------------------------------------------------

def _linear_scales(scales, data_shape, k, g, scale_layout):
    """Scales in the linear layout [..., K/g] for data whose logical shape is data_shape[:-1]+(k,)."""
    lin_shape = tuple(data_shape[:-1]) + (k // g,)
    if scale_layout == "blocked":
        return unswizzle(scales, lin_shape)
    scales = np.asarray(scales)
    assert scales.shape == lin_shape, (scales.shape, lin_shape)
    return scales


def scale_values(scales, mode) -> np.ndarray:
    """float64 values of fp scale bytes (E4M3 for nvfp4, UE8M0 for mx)."""
    s = np.asarray(scales).view(np.uint8)
    if mode == "nvfp4":
        return decode(s, E4M3).astype(F64)
    return ue8m0_value(s)


def dequantize_exact(data, scales, group_size=None, bits=None, mode="nvfp4", *,
                     scale_layout="linear", fp8_format="e4m3") -> np.ndarray:
    """float64 elem * scale of fp-mode data, exact (no global scale, no rounding)."""
    g, b = resolve(mode, group_size, bits)
    data = np.asarray(data).view(np.uint8)
    k = data.shape[-1] * 8 // b
    codes = unpack(data, b, k)
    lin = _linear_scales(np.asarray(scales).view(np.uint8), data.shape, k, g, scale_layout)
    elem = decode(codes, elem_format(mode, fp8_format)).astype(F64)
    sv = np.repeat(scale_values(lin, mode), g, axis=-1)
    return elem * sv


def dequantize_f32(data, scales, biases=None, group_size=None, bits=None, mode="affine", *,
                   global_scale=None, scale_layout="linear", fp8_format="e4m3") -> np.ndarray:
    """The fp32 values dequantize computes before the final cast to the output dtype."""
    g, b = resolve(mode, group_size, bits)
    data = np.asarray(data).view(np.uint8)
    k = data.shape[-1] * 8 // b
    if mode == "affine":
        codes = unpack(data, b, k)
        s = np.repeat(np.asarray(scales).astype(F32), g, axis=-1)
        bi = np.repeat(np.asarray(biases).astype(F32), g, axis=-1)
        return fma_f32(codes, s, bi)  # fma(q, scale, bias): one rounding
    exact = dequantize_exact(data, scales, g, b, mode, scale_layout=scale_layout,
                             fp8_format=fp8_format)
    with np.errstate(over="ignore", invalid="ignore"):
        v = exact.astype(F32)  # exact in fp32 (at most 6 significant bits) or overflow -> Inf
        if mode == "nvfp4" and effective_global_scale(global_scale) is not None:
            factor = effective_global_scale(global_scale) / NVFP4_GS_DIVISOR
            v = (v * factor).astype(F32)
    return v


def dequantize(data, scales, biases=None, group_size=None, bits=None, mode="affine", *,
               global_scale=None, scale_layout="linear", fp8_format="e4m3", dtype=None):
    """Reference of qq.dequantize (dtype None -> bfloat16)."""
    v = dequantize_f32(data, scales, biases, group_size, bits, mode, global_scale=global_scale,
                       scale_layout=scale_layout, fp8_format=fp8_format)
    return cast_from_f32(v, BF16 if dtype is None else dtype)


def dequantize_q(q: RefQuantized, dtype=None):
    return dequantize(q.data, q.scales, q.biases, q.group_size, q.bits, q.mode,
                      global_scale=q.global_scale, scale_layout=q.scale_layout,
                      fp8_format=q.fp8_format, dtype=dtype)


# ---------------------------------------------------------------------------
# Matmuls
# ---------------------------------------------------------------------------

@dataclass
class MatmulRef:
    """A float64 result and what bounds the error of a correct fp32-accumulating GEMM.

    value: the exact (float64) result.
    abs_sum: sum_i |a_i b_i| (times |alpha|) per output element.
    alt_value: another acceptable exact result, or None (quantized_matmul: W rounded to
      x's dtype before the GEMM, as MLX's kernels do).
    """

    value: np.ndarray
    abs_sum: np.ndarray
    alt_value: Optional[np.ndarray] = None
    alt_abs_sum: Optional[np.ndarray] = None


def _gs64(gs):
    g = effective_global_scale(gs)
    return None if g is None else float(g)


def qqmm(x, w, mode="nvfp4", *, global_scale_x=None, global_scale_w=None, bias=None, c=None, beta=1.0,
         rounding="ceil", fp8_format="e4m3", group_size=None, bits=None) -> MatmulRef:
    """y = alpha * q(x) @ q(w).T (+ bias) (+ beta * c); x, w float (quantized here) or
    RefQuantized. c enters exactly (float64), as BLAS's C."""
    def dq(a, gs):
        if not isinstance(a, RefQuantized):
            a = quantize(a, group_size, bits, mode, global_scale=gs, rounding=rounding,
                         fp8_format=fp8_format)
        return dequantize_exact(a.data, a.scales, a.group_size, a.bits, a.mode,
                                scale_layout=a.scale_layout, fp8_format=a.fp8_format), a

    xq, xr = dq(x, global_scale_x)
    wq, wr = dq(w, global_scale_w)
    alpha = 1.0
    gx = _gs64(xr.global_scale if isinstance(x, RefQuantized) else global_scale_x)
    gw = _gs64(wr.global_scale if isinstance(w, RefQuantized) else global_scale_w)
    if gx is not None:
        alpha *= gx / 2688.0
    if gw is not None:
        alpha *= gw / 2688.0
    with np.errstate(all="ignore"):
        y = np.matmul(xq, np.swapaxes(wq, -1, -2)) * alpha
        s = np.matmul(np.abs(xq), np.swapaxes(np.abs(wq), -1, -2)) * abs(alpha)
    if bias is not None:
        y = y + np.asarray(bias).astype(F64)
    if c is not None:
        y = y + float(beta) * np.asarray(c).astype(F64)
    return MatmulRef(y, s)


def quantized_matmul(x, q: RefQuantized, *, transpose=True, bias=None) -> MatmulRef:
    """x @ W.T (transpose) or x @ W with W = dequantize(q) (fp32), batch axes broadcast.

    alt_value uses W rounded to x's dtype (an implementation may dequantize into x's
    dtype before a tensor-core GEMM); either is accepted.
    """
    w32 = dequantize_f32(q.data, q.scales, q.biases, q.group_size, q.bits, q.mode,
                         global_scale=q.global_scale, scale_layout=q.scale_layout,
                         fp8_format=q.fp8_format)
    return _weight_only(x, w32, transpose, bias)


def gather_qmm(x, q: RefQuantized, indices, *, transpose=True, bias=None) -> MatmulRef:
    """quantized_matmul where batch entry i... multiplies by expert indices[i...] of the
    quantized [E, ...] weight (x's batch axes and indices' shape broadcast)."""
    w32 = dequantize_f32(q.data, q.scales, q.biases, q.group_size, q.bits, q.mode,
                         global_scale=q.global_scale, scale_layout=q.scale_layout,
                         fp8_format=q.fp8_format)
    return _weight_only(x, w32[np.asarray(indices, dtype=np.int64)], transpose, bias)


def _weight_only(x, w32, transpose, bias) -> MatmulRef:
    x = np.asarray(x)
    wx = cast_from_f32(w32, x.dtype).astype(F64)
    w64 = w32.astype(F64)
    x64 = x.astype(F64)
    if transpose:
        w64, wx = np.swapaxes(w64, -1, -2), np.swapaxes(wx, -1, -2)
    with np.errstate(all="ignore"):
        y = np.matmul(x64, w64)
        s = np.matmul(np.abs(x64), np.abs(w64))
        y2 = np.matmul(x64, wx)
        s2 = np.matmul(np.abs(x64), np.abs(wx))
    if bias is not None:
        b = np.asarray(bias).astype(F64)
        y, y2 = y + b, y2 + b
    return MatmulRef(y, s, y2, s2)


_OUT_REL = {np.dtype(np.float32): 2.0 ** -23, np.dtype(np.float16): 2.0 ** -10, BF16: 2.0 ** -7}
_OUT_TINY = {np.dtype(np.float32): 2.0 ** -149, np.dtype(np.float16): 2.0 ** -24, BF16: 2.0 ** -133}


def matmul_mismatch(got, ref: MatmulRef, *, rel=1e-5) -> Optional[str]:
    """None if `got` matches ref within fp32-accumulation error, else a description.

    Bound per element: rel * sum|a_i b_i| (accumulation order), 2^-21 |y| (alpha and bias
    roundings), one ulp of the output dtype (its final rounding) and its smallest
    subnormal. Accepted if every element is within it of ref.value, or every element
    within it of ref.alt_value.
    """
    got = np.asarray(got)
    dt = got.dtype
    g = got.astype(F64)

    def check(value, abs_sum):
        if g.shape != value.shape:
            return f"shape {g.shape} != {value.shape}"
        tol = rel * abs_sum + 2.0 ** -21 * np.abs(value) + _OUT_REL[dt] * np.abs(value) + _OUT_TINY[dt]
        with np.errstate(all="ignore"):
            err = np.abs(g - value)
        # An infinity is right where the exact result overflows the output dtype.
        overflow = np.isinf(g) & (np.sign(g) == np.sign(value)) & (
            np.abs(value) >= float(ml_dtypes.finfo(dt).max))
        ok = (err <= tol) | overflow | (np.isnan(g) & np.isnan(value))
        if ok.all():
            return None
        i = np.unravel_index(np.argmax(~ok), ok.shape)
        return (f"{int((~ok).sum())} of {ok.size} elements off; first at {i}: got {g[i]!r}, "
                f"want {value[i]!r} +- {tol[i]!r}")

    m1 = check(ref.value, ref.abs_sum)
    if m1 is None or ref.alt_value is None:
        return m1
    m2 = check(ref.alt_value, ref.alt_abs_sum)
    return None if m2 is None else f"{m1} (vs W in x's dtype: {m2})"
