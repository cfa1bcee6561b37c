"""Self-tests of tests/reference.py: the reference must be right before it judges libqq.

Each test checks the reference against a known answer (golden vectors of the formats' rules in docs/formats.md, hand
computations) or against an independent oracle (ml_dtypes' RNE casts, exact rational
arithmetic with fractions.Fraction, the torchao-style construction of the blocked
layout). Nothing here imports qq.
"""

from __future__ import annotations

import math
import time
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import reference as R

F32 = np.float32


def f32(*v):
    return np.array(v, F32)


def all_f32_between(lo, hi, n, rng):
    """n random fp32 numbers in [lo, hi] with uniformly random bit patterns (so every
    binade, the subnormals included, is sampled), plus both signs."""
    lo_b = np.array(lo, F32).view(np.uint32)
    hi_b = np.array(hi, F32).view(np.uint32)
    b = rng.integers(int(lo_b), int(hi_b) + 1, size=n, dtype=np.uint64).astype(np.uint32)
    v = b.view(F32)
    return np.concatenate([v, -v])


# ---------------------------------------------------------------------------
# Golden vectors of docs/formats.md's rules
# ---------------------------------------------------------------------------

def test_fp4_packing_golden():
    """The row 0.5,1,1.5,2,3,4,6,-0.5 packs to the little-endian uint32 0x97654321:
    element 2b in the low nibble of byte b, element 2b+1 in the high nibble."""
    codes = R.to_e2m1(f32(0.5, 1, 1.5, 2, 3, 4, 6, -0.5))
    assert codes.tolist() == [1, 2, 3, 4, 5, 6, 7, 9]
    packed = R.pack(codes, 4)
    assert packed.tolist() == [0x21, 0x43, 0x65, 0x97]
    assert int(packed.view("<u4")[0]) == 0x97654321
    assert R.unpack(packed, 4).tolist() == codes.tolist()


def test_mxfp8_golden_scale():
    """amax 4.8046875 with E4M3 (max 448): q = 0.010724... -> ceil to 2^-6 -> byte 121."""
    x = np.zeros((1, 32), F32)
    x[0, 0] = 4.8046875
    q = R.quantize(x, mode="mxfp8")
    assert q.scales.tolist() == [[121]]
    # 4.8046875 * 2^6 = 307.5 lies between E4M3 288 (0x79) and 320 (0x7A); the
    # midpoint 304 is below 307.5, so it rounds up to 320.
    assert q.codes[0, 0] == 0x7A


def test_mxfp4_golden_scale():
    """amax 1 with E2M1 (max 6): q = 1/6 -> smallest power of two >= q is 2^-2 -> byte 125,
    and 1 * 2^2 = 4 -> code 6."""
    x = np.zeros((1, 32), F32)
    x[0, 5] = 1.0
    q = R.quantize(x, mode="mxfp4")
    assert q.scales.tolist() == [[125]]
    assert q.codes[0, 5] == 6


def test_nvfp4_golden_scale():
    """amax 1: s = E4M3(1/6) = 0.171875 (exponent -3, mantissa 3 -> byte 0x23); the element
    1.0 becomes 1 * (1/0.171875) = 5.82 -> 6 -> code 7."""
    x = np.zeros((1, 16), F32)
    x[0, 3] = 1.0
    q = R.quantize(x, mode="nvfp4")
    assert q.scales.tolist() == [[0x23]]
    assert R.E4M3_VALUES[0x23] == 0.171875
    assert q.codes[0, 3] == 7


def test_nvfp4_global_scale_golden():
    """global_scale 1 and amax 1: (1/6) * 2688 = 448 -> scale byte 0x7E."""
    x = np.zeros((1, 16), F32)
    x[0, 0] = 1.0
    q = R.quantize(x, mode="nvfp4", global_scale=np.array(1.0, F32))
    assert q.scales.tolist() == [[0x7E]]
    # element: 1 * (2688 / 448) = 6 -> code 7
    assert q.codes[0, 0] == 7


# ---------------------------------------------------------------------------
# Element conversions
# ---------------------------------------------------------------------------

def test_e2m1_ties_to_even():
    """Ties go to the even code: 0.25->0, 0.75->2 (1.0), 1.25->2, 1.75->4 (2.0), 2.5->4,
    3.5->6 (4.0), 5->6; negatives mirror with bit 3 set."""
    ties = f32(0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5)
    assert R.to_e2m1(ties).tolist() == [0, 2, 2, 4, 4, 6, 6]
    assert R.to_e2m1(-ties).tolist() == [8, 10, 10, 12, 12, 14, 14]
    # just off the ties, nearest wins
    above = np.nextafter(ties, F32(np.inf))
    below = np.nextafter(ties, F32(0))
    assert R.to_e2m1(above).tolist() == [1, 2, 3, 4, 5, 6, 7]
    assert R.to_e2m1(below).tolist() == [0, 1, 2, 3, 4, 5, 6]


def test_e2m1_saturates_and_matches_ml_dtypes(rng):
    """Above 6 (and +-Inf) saturates to +-6 (satfinite). Inside the range the codes equal
    ml_dtypes' float4_e2m1fn cast (round to nearest even)."""
    assert R.to_e2m1(f32(6, 6.5, 7, 100, np.inf, -np.inf, -1e30)).tolist() == [7, 7, 7, 7, 7, 15, 15]
    v = all_f32_between(0, 6, 20000, rng)
    want = v.astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
    np.testing.assert_array_equal(R.to_e2m1(v), want)


def test_e4m3_matches_ml_dtypes(rng):
    """fp32 -> E4M3FN equals ml_dtypes' RNE cast on every binade in range (ml_dtypes does
    not saturate, so only |x| <= 448 is compared), subnormals and ties included."""
    v = all_f32_between(0, 448, 200000, rng)
    table = R.E4M3_VALUES[:0x7F].astype(np.float64)
    mids = ((table[1:] + table[:-1]) / 2).astype(F32)  # exact ties
    extra = np.concatenate([mids, np.nextafter(mids, F32(0)), np.nextafter(mids, F32(1e9)),
                            R.E4M3_VALUES[:0x7F]])
    v = np.concatenate([v, extra, -extra])
    want = v.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    np.testing.assert_array_equal(R.to_e4m3(v), want)


def test_e4m3_saturation_and_nan():
    """satfinite: above 448 and +-Inf give +-448 (0x7E / 0xFE); NaN gives 0x7F; -0.0 and a
    negative value that rounds to zero keep the sign (0x80)."""
    got = R.to_e4m3(f32(448, 464, 480, 1e30, np.inf, -np.inf, -500, np.nan, -0.0, -1e-9, 0.0))
    assert got.tolist() == [0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0xFE, 0x7F, 0x80, 0x80, 0x00]
    # the smallest subnormal 2^-9 and the tie below it (2^-10 rounds to even = 0)
    assert R.to_e4m3(f32(2.0 ** -9, 2.0 ** -10, 1.5 * 2.0 ** -10)).tolist() == [1, 0, 1]


def test_e5m2_matches_ml_dtypes(rng):
    """fp32 -> E5M2 equals ml_dtypes' RNE cast for |x| <= 57344; above saturates."""
    v = all_f32_between(0, 57344, 200000, rng)
    table = R.E5M2_VALUES[:0x7C].astype(np.float64)
    mids = ((table[1:] + table[:-1]) / 2).astype(F32)
    extra = np.concatenate([mids, np.nextafter(mids, F32(0)), np.nextafter(mids, F32(1e9))])
    v = np.concatenate([v, extra, -extra])
    want = v.astype(ml_dtypes.float8_e5m2).view(np.uint8)
    np.testing.assert_array_equal(R.to_e5m2(v), want)
    assert R.to_e5m2(f32(57344, 61440, 1e9, np.inf, -np.inf, np.nan)).tolist() == [
        0x7B, 0x7B, 0x7B, 0x7B, 0xFB, 0x7F]


def test_decode_tables_match_ml_dtypes():
    """The decode tables equal ml_dtypes' interpretation of every byte."""
    for table, dt in [(R.E4M3_VALUES, ml_dtypes.float8_e4m3fn), (R.E5M2_VALUES, ml_dtypes.float8_e5m2)]:
        want = np.arange(256, dtype=np.uint8).view(dt).astype(F32)
        np.testing.assert_array_equal(table.view(np.uint32)[~np.isnan(table)],
                                      want.view(np.uint32)[~np.isnan(want)])
        np.testing.assert_array_equal(np.isnan(table), np.isnan(want))
    want = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(F32)
    np.testing.assert_array_equal(R.E2M1_VALUES.view(np.uint32), want.view(np.uint32))


def test_bf16_rounding_matches_ml_dtypes(rng):
    """f32 -> bf16 RNE of the bit pattern equals ml_dtypes' cast (overflow -> Inf)."""
    b = rng.integers(0, 2 ** 32, size=200000, dtype=np.uint64).astype(np.uint32)
    v = np.concatenate([b.view(F32), f32(3.3895314e38, 3.40282e38, np.inf, -np.inf, 0.0, -0.0,
                                         1 + 2 ** -8, 1 + 3 * 2 ** -8, 1e-45)])
    got = R.f32_to_bf16(v)
    with np.errstate(invalid="ignore"):
        want = v.astype(ml_dtypes.bfloat16)
    nan = np.isnan(v)
    np.testing.assert_array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan])
    assert np.isnan(got[nan].astype(F32)).all()
    # ties: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 -> even (1); 1 + 3*2^-8 -> 1 + 2^-6
    assert R.f32_to_bf16(f32(1 + 2 ** -8, 1 + 3 * 2 ** -8)).astype(F32).tolist() == [1.0, 1 + 2 ** -6]


# ---------------------------------------------------------------------------
# UE8M0 scales
# ---------------------------------------------------------------------------

def _ceil_oracle(amax, elem_max):
    """Smallest k in [-127, 127] with 2^k >= fl32(amax / elem_max), by exact rationals."""
    q = Fraction(float(F32(amax) / F32(elem_max)))
    for k in range(-127, 128):
        if Fraction(2) ** k >= q:
            return k + 127
    return 254


def _floor_oracle(amax, emax):
    if amax == 0:
        return 0
    m, e = math.frexp(float(amax))  # amax = m * 2^e, 0.5 <= m < 1: floor(log2) = e - 1
    return min(max(e - 1 - emax, -127), 127) + 127


def test_ue8m0_ceil_matches_exact_oracle(rng):
    """byte = ceil(log2 q) clamped to [0, 254], checked with exact rationals on amax from
    the whole fp32 range: subnormals, exact powers of two, and their neighbours."""
    a = all_f32_between(0, 3.4e38, 3000, rng)
    a = np.abs(a[: a.size // 2])
    pows = np.ldexp(F32(1), np.arange(-149, 128)).astype(F32)
    with np.errstate(over="ignore"):
        special = np.concatenate([pows, np.nextafter(pows, F32(np.inf)), np.nextafter(pows, F32(0)),
                                  pows * 6, pows * 448, pows * 57344, f32(0)])
    a = np.concatenate([a, special[np.isfinite(special)]]).astype(F32)
    for elem_max in (6.0, 448.0, 57344.0):
        got = R.ue8m0_ceil(a, elem_max)
        want = np.array([_ceil_oracle(v, elem_max) for v in a], np.uint8)
        np.testing.assert_array_equal(got, want, err_msg=f"elem_max={elem_max}")


def test_ue8m0_ceil_edges():
    """From the bits of q: a power of two maps to its own exponent; q just above it to the
    next; a subnormal q <= 2^-127 to byte 0; between 2^-127 and 2^-126 to byte 1."""
    q = f32(1.0, np.nextafter(F32(1), F32(2)), 2.0 ** -127, 2.0 ** -126,
            np.nextafter(F32(2.0 ** -127), F32(1)), 2.0 ** -149, 0.0)
    assert R.ue8m0_ceil(q, 1.0).tolist() == [127, 128, 0, 1, 1, 0, 0]


def test_ue8m0_floor_matches_oracle(rng):
    """byte = floor(log2 amax) - emax + 127 clamped, from the exponent field."""
    a = np.abs(all_f32_between(0, 3.4e38, 5000, rng)).astype(F32)
    a = np.concatenate([a, f32(0, 1, 6, 7, 448, 500, 2.0 ** -126, 2.0 ** -127, 3.4e38)])
    for emax in (2, 8, 15):
        got = R.ue8m0_floor(a, emax)
        want = np.array([_floor_oracle(v, emax) for v in a], np.uint8)
        np.testing.assert_array_equal(got, want, err_msg=f"emax={emax}")


def test_floor_vs_ceil_block_max_500():
    """Block max 500 with mxfp8 E4M3: FLOOR gives exponent floor(log2 500) - 8 = 0 (byte
    127) and 500 saturates to 448 (0x7E); CEIL gives q = 500/448 -> 2^1 (byte 128) and
    500/2 = 250 rounds to 256 (0x78)."""
    x = np.zeros((1, 32), F32)
    x[0, 0] = 500
    x[0, 1] = -1.0
    fl = R.quantize(x, mode="mxfp8", rounding="floor")
    ce = R.quantize(x, mode="mxfp8", rounding="ceil")
    assert fl.scales.tolist() == [[127]] and fl.codes[0, 0] == 0x7E
    assert ce.scales.tolist() == [[128]] and ce.codes[0, 0] == 0x78
    assert fl.codes[0, 1] == 0xB8  # -1.0
    assert ce.codes[0, 1] == 0xB0  # -0.5
    np.testing.assert_array_equal(R.dequantize_q(fl, np.float32)[0, :2], f32(448, -1))
    np.testing.assert_array_equal(R.dequantize_q(ce, np.float32)[0, :2], f32(512, -1))


def test_mxfp4_floor_vs_ceil_amax_7():
    """amax 7 with E2M1: FLOOR: floor(log2 7) - 2 = 0, 7 saturates to 6 (code 7); CEIL:
    q = 7/6 -> 2^1 (byte 128), 7/2 = 3.5 is a tie between 3 and 4 -> even code 6 (4)."""
    x = np.zeros((1, 32), F32)
    x[0, 0] = 7
    assert R.quantize(x, mode="mxfp4", rounding="floor").codes[0, 0] == 7
    assert R.quantize(x, mode="mxfp4", rounding="floor").scales.tolist() == [[127]]
    assert R.quantize(x, mode="mxfp4").codes[0, 0] == 6
    assert R.quantize(x, mode="mxfp4").scales.tolist() == [[128]]


# ---------------------------------------------------------------------------
# Group edge cases
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("mode,kw", [("nvfp4", {}), ("nvfp4", {"global_scale": f32(3.0)}),
                                     ("mxfp4", {}), ("mxfp8", {}),
                                     ("mxfp8", {"fp8_format": "e5m2", "rounding": "floor"})])
def test_zero_and_nonfinite_groups(mode, kw):
    """amax == 0: scale byte 0, codes 0 (sign free). NaN/Inf anywhere in a group: scale
    NaN (0xFF UE8M0 / 0x7F E4M3), codes 0x7F (fp8) or 0 (fp4). Other groups unaffected."""
    g = 16 if mode == "nvfp4" else 32
    x = np.ones((4, 2 * g), F32)
    x[0, :g] = 0.0
    x[0, 1] = -0.0
    x[1, 3] = np.nan
    x[2, g + 5] = np.inf
    x[3, 0] = -np.inf
    q = R.quantize(x, mode=mode, **kw)
    nan_byte = 0x7F if mode == "nvfp4" else 0xFF
    nan_code = 0x7F if mode == "mxfp8" else 0
    s = q.scales
    assert s[0, 0] == 0 and (q.codes[0, :g] == 0).all() and q.loose_sign[0, 0]
    assert s[1, 0] == nan_byte and (q.codes[1, :g] == nan_code).all()
    assert s[2, 1] == nan_byte and (q.codes[2, g:] == nan_code).all()
    assert s[3, 0] == nan_byte
    # the all-ones groups: same answer in every row
    assert s[0, 1] == s[1, 1] == s[2, 0] == s[3, 1] != nan_byte
    d = R.dequantize_q(q, np.float32)
    assert np.isnan(d[1, :g]).all() and np.isnan(d[2, g:]).all() and np.isnan(d[3, :g]).all()
    assert (d[0, :g] == 0).all() and np.isfinite(d[0, g:]).all()


def test_nvfp4_zero_scale():
    """s = E4M3((amax/6) * enc) == 0 encodes every element as 0: amax = 6 * 2^-10 gives
    s = 2^-10, the tie between 0 and the smallest subnormal 2^-9 -> even -> 0. Just above
    it, s = 2^-9 (byte 1) and the elements are coded normally."""
    x = np.zeros((2, 16), F32)
    x[0, :2] = [6 * 2.0 ** -10, -3 * 2.0 ** -10]
    x[1, :2] = [np.nextafter(F32(6 * 2.0 ** -10), F32(1)), -3 * 2.0 ** -10]
    q = R.quantize(x, mode="nvfp4")
    assert q.scales[:, 0].tolist() == [0, 1]
    assert (q.codes[0] == 0).all() and q.loose_sign[0, 0]
    # row 1: 6*2^-10 * 2^9 = 3.0000x -> 3 (code 5); -3*2^-10 * 2^9 = -1.5 (code 0xB)
    assert q.codes[1, :2].tolist() == [5, 0xB]
    # a large global scale drives s to 0 too
    y = np.ones((1, 16), F32)
    qg = R.quantize(y, mode="nvfp4", global_scale=f32(1e10))
    assert qg.scales.tolist() == [[0]] and (qg.codes == 0).all()


def test_nvfp4_global_scale_saturates():
    """A global scale below the tensor's amax saturates s at 448 and the elements at 6:
    gs = amax/4 -> (amax/6) * 2688/gs = 1792 -> 448 (0x7E); amax * (2688/gs) / 448 = 24 -> 6."""
    x = np.full((1, 16), 2.0, F32)
    q = R.quantize(x, mode="nvfp4", global_scale=f32(0.5))
    assert q.scales.tolist() == [[0x7E]] and (q.codes == 7).all()


def test_subnormal_fp32_inputs_mxfp8():
    """Inputs around 2^-136 (fp32 subnormals): q = amax/448 is subnormal <= 2^-127 -> byte 0
    (scale 2^-127); x * 2^127 = k * 2^-9 -> E4M3 subnormal code k; 1.5 * 2^-133 * 2^127 =
    1.5 * 2^-6 -> code 0x0C."""
    x = np.zeros((1, 32), F32)
    x[0, 0] = 1.5 * 2.0 ** -133
    x[0, 1:8] = np.arange(1, 8) * 2.0 ** -136
    q = R.quantize(x, mode="mxfp8")
    assert q.scales.tolist() == [[0]]
    assert q.codes[0, :8].tolist() == [0x0C, 1, 2, 3, 4, 5, 6, 7]
    # and back: exact
    np.testing.assert_array_equal(R.dequantize_q(q, np.float32), x)


def test_ties_mxfp8_scaled_by_power_of_two():
    """amax = 448 * 2^k makes the ceil scale exactly 2^k; then every E4M3 midpoint times
    2^k is an exact tie and must go to the even code (ties to even at mantissa level,
    subnormals included)."""
    table = R.E4M3_VALUES[:0x7F].astype(np.float64)
    mids = (table[1:] + table[:-1]) / 2  # between code i and i+1
    want = np.where(np.arange(126) % 2 == 0, np.arange(126), np.arange(1, 127))
    # groups of 32: [448, 31 midpoints], five groups hold all 126 midpoints
    rows = np.zeros((5, 32))
    rows[:, 0] = 448.0
    rows[:, 1:].flat[:126] = mids
    for k in (-20, 0, 7):
        x = (rows * 2.0 ** k).astype(F32).reshape(1, 160)
        for rounding in ("ceil", "floor"):
            q = R.quantize(x, mode="mxfp8", rounding=rounding)
            assert q.scales.tolist() == [[127 + k] * 5]
            codes = q.codes.reshape(5, 32)
            assert (codes[:, 0] == 0x7E).all()
            assert codes[:, 1:].ravel()[:126].tolist() == want.tolist()


def test_round_half_away():
    """Half away from zero: 0.5 -> 1, -0.5 -> -1, 2.5 -> 3, -2.5 -> -3; the largest fp32 below
    0.5 (0.49999997) -> 0 although 0.49999997 + 0.5 rounds to 1.0 in fp32."""
    v = f32(0.5, -0.5, 1.5, 2.5, -2.5, 0.49999997, -0.49999997, 3.49, 7.0, -0.0)
    assert R.round_half_away(v).tolist() == [1, -1, 2, 3, -3, 0, 0, 3, 7, 0]
    assert F32(0.49999997) + F32(0.5) == F32(1.0)  # why floor(|v| + 0.5) would be wrong


# ---------------------------------------------------------------------------
# Affine
# ---------------------------------------------------------------------------

def test_affine_hand_example_positive_edge():
    """w = 0..15 (twice), bits 4: w_min 0, w_max 15, scale 15/15 = 1; |w_min| <= |w_max| so
    edge = 15 and scale = -1; q0 = round(15/-1) = -15, scale = 15/-15 = -1, bias = 15;
    q = (w - 15) / -1 = 15 - w. First byte packs q = 15, 14 -> 0xEF."""
    w = np.tile(np.arange(16, dtype=F32), 2).reshape(1, 32)
    q = R.quantize(w, group_size=32, bits=4)
    assert q.scales.tolist() == [[-1.0]] and q.biases.tolist() == [[15.0]]
    assert q.codes[0].tolist() == (15 - w[0]).astype(int).tolist()
    assert q.data[0, 0] == 0xEF
    np.testing.assert_array_equal(R.dequantize_q(q, np.float32), w)


def test_affine_hand_example_negative_edge():
    """w = 0, -1, ..., -15: w_max = max(0, 0) = 0, w_min = -15; |w_min| > |w_max| so
    edge = w_min = -15, scale = +1, q0 = -15, bias = -15, q = w + 15."""
    w = np.tile(-np.arange(16, dtype=F32), 2).reshape(1, 32)
    q = R.quantize(w, group_size=32, bits=4)
    assert q.scales.tolist() == [[1.0]] and q.biases.tolist() == [[-15.0]]
    assert q.codes[0].tolist() == (w[0] + 15).astype(int).tolist()


def test_affine_half_away_in_codes():
    """bits 2 (n = 3), w in {0, 3} plus 0.5, 1.5, 2.5: scale -1, bias 3, q = 3 - w:
    2.5 -> 3 (ties-to-even would give 2), 1.5 -> 2, 0.5 -> 1 (ties-to-even: 0)."""
    w = np.zeros((1, 32), F32)
    w[0, :5] = [0, 3, 0.5, 1.5, 2.5]
    q = R.quantize(w, group_size=32, bits=2)
    assert q.scales.tolist() == [[-1.0]] and q.biases.tolist() == [[3.0]]
    assert q.codes[0, :5].tolist() == [3, 0, 3, 2, 1]


def test_affine_zero_group_and_tiny_group():
    """All zeros: scale = max(0, 1e-7) = 1e-7, edge = w_max = 0 so scale = -1e-7; q0 = 0 so
    bias = 0 and every code 0. Stored in fp16, -1e-7 rounds to the subnormal -2^-23."""
    w = np.zeros((1, 64), np.float16)
    q = R.quantize(w)
    assert q.biases.tolist() == [[0.0]] and (q.codes == 0).all()
    assert q.scales.astype(F32).tolist() == [[-(2.0 ** -23)]]
    q32 = R.quantize(w.astype(F32))
    assert q32.scales.tolist() == [[-F32(1e-7)]]


def test_affine_nonfinite_group():
    """Any NaN/Inf in a group: stored scale and bias NaN, codes 0."""
    w = np.ones((1, 128), F32)
    w[0, 70] = np.inf
    q = R.quantize(w, group_size=64, bits=8)
    assert np.isnan(q.scales[0, 1]) and np.isnan(q.biases[0, 1])
    assert (q.codes[0, 64:] == 0).all() and np.isfinite(q.scales[0, 0])


def test_affine_roundtrip_error_bound(rng):
    """Sanity of the whole affine path: |w - dequantize(quantize(w))| stays within one step
    |scale| (half a step from rounding, plus MLX's clipping of the far edge by < 1 step)."""
    for bits in R.AFFINE_BITS:
        for g in R.AFFINE_GROUPS:
            w = rng.standard_normal((8, 256)).astype(F32)
            q = R.quantize(w, group_size=g, bits=bits)
            d = R.dequantize_q(q, np.float32)
            step = np.repeat(np.abs(q.scales), g, axis=-1)
            assert (np.abs(d - w) <= step * 1.0001).all(), (bits, g)
            assert (q.codes < 2 ** bits).all()


def test_fma_single_rounding_known_answer():
    """fma(3, 1 + 2^-23, -2^-22): exact 3 + 2^-23 is half an ulp above 3 -> ties to even -> 3.
    Rounding the product first gives 3 + 2^-21, then 3 + 2^-22: a different answer."""
    s, b = F32(1 + 2 ** -23), F32(-(2 ** -22))
    assert R.fma_f32(3, s, b) == F32(3.0)
    assert F32(3) * s + b == F32(3 + 2 ** -22)  # the two-rounding answer, for contrast


def _round_fraction_to_f32(fr: Fraction) -> np.float32:
    """Correctly rounded (RNE) fp32 of an exact rational, by checking neighbours."""
    c = F32(float(fr))
    cands = [np.nextafter(c, F32(-np.inf)), c, np.nextafter(c, F32(np.inf))]
    best = min(cands, key=lambda v: (abs(Fraction(float(v)) - fr),
                                     int(np.array(v, F32).view(np.uint32)) & 1))
    return best


def test_fma_matches_exact_rationals(rng):
    """fma_f32 equals the correctly rounded exact q * scale + bias on random fp32 values of
    wildly different magnitudes (where double rounding through float64 would bite)."""
    n = 3000
    q = rng.integers(0, 256, n)
    s = (rng.standard_normal(n) * np.exp2(rng.integers(-30, 30, n))).astype(F32)
    b = (rng.standard_normal(n) * np.exp2(rng.integers(-30, 30, n))).astype(F32)
    # add constructed near-ties: bias chosen so that the exact sum is near an fp32 midpoint
    got = R.fma_f32(q, s, b)
    for i in range(n):
        exact = Fraction(int(q[i])) * Fraction(float(s[i])) + Fraction(float(b[i]))
        assert got[i] == _round_fraction_to_f32(exact), i


# ---------------------------------------------------------------------------
# Packing and layout
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
def test_affine_packing_is_a_little_endian_bit_stream(bits, rng):
    """Element i occupies bits [i*bits, (i+1)*bits) of the row read as one little-endian
    integer (3 bits: 8 values in 3 bytes; 5: 8 in 5; 6: 4 in 3)."""
    codes = rng.integers(0, 2 ** bits, size=(3, 64), dtype=np.uint8)
    packed = R.pack(codes, bits)
    assert packed.shape == (3, 64 * bits // 8)
    for row in range(3):
        stream = int.from_bytes(packed[row].tobytes(), "little")
        want = sum(int(c) << (i * bits) for i, c in enumerate(codes[row]))
        assert stream == want
    np.testing.assert_array_equal(R.unpack(packed, bits), codes)


def test_affine_packing_3bit_known():
    """codes 1..7,0 in 3 bits: 1 | 2<<3 | 3<<6 | 4<<9 | 5<<12 | 6<<15 | 7<<18 = 0x1F58D1
    (0b000_111_110_101_100_011_010_001), little-endian bytes D1 58 1F: 8 values, 3 bytes."""
    packed = R.pack(np.array([[1, 2, 3, 4, 5, 6, 7, 0]], np.uint8), 3)
    assert packed[0].tolist() == [0xD1, 0x58, 0x1F]


def test_blocked_offsets_known():
    """off(r,c) = (r/128)*128*C4 + (c/4)*512 + (r%32)*16 + ((r%128)/32)*4 + c%4."""
    off = R.blocked_offsets(256, 8)  # C4 = 8
    assert off[0, 0] == 0 and off[0, 1] == 1 and off[0, 3] == 3
    assert off[1, 0] == 16 and off[31, 0] == 496
    assert off[32, 0] == 4 and off[64, 0] == 8 and off[96, 0] == 12
    assert off[0, 4] == 512 and off[127, 7] == 512 + 31 * 16 + 3 * 4 + 3
    assert off[128, 0] == 128 * 8
    assert sorted(off.ravel().tolist()) == list(range(256 * 8))  # a permutation


def _to_blocked_torchao_style(lin):
    """The construction torchao's to_blocked / MLX's swizzle use: pad to (128k, 4j), view
    as (R/128, 128, C/4, 4), permute to tile-major, then each 128x4 tile as 32x16 with
    row r at ((r%32), (r//32)*4 + c)."""
    r, c = lin.shape
    rp, cp = R.roundup(r, 128), R.roundup(c, 4)
    p = np.zeros((rp, cp), lin.dtype)
    p[:r, :c] = lin
    blocks = p.reshape(rp // 128, 128, cp // 4, 4).transpose(0, 2, 1, 3).reshape(-1, 128, 4)
    tiles = blocks.reshape(-1, 4, 32, 4).transpose(0, 2, 1, 3).reshape(-1, 32, 16)
    return tiles.reshape(rp, cp)


@pytest.mark.parametrize("shape", [(128, 4), (256, 8), (100, 3), (4, 4), (50, 10), (384, 12),
                                   (1, 1), (129, 5)])
def test_blocked_roundtrip(shape, rng):
    """swizzle -> unswizzle is the identity; the blocked matrix equals the torchao-style
    construction; padding is zero."""
    lin = rng.integers(1, 256, size=shape, dtype=np.uint8)
    blk = R.swizzle(lin)
    assert blk.shape == (R.roundup(shape[0], 128), R.roundup(shape[1], 4))
    np.testing.assert_array_equal(blk, _to_blocked_torchao_style(lin))
    np.testing.assert_array_equal(R.unswizzle(blk, shape), lin)
    assert int(np.count_nonzero(blk)) == lin.size  # every non-zero landed, padding is 0


def test_blocked_batched_and_1d(rng):
    """Batched: one blocked matrix per batch entry, back to back. 1D: R = 1."""
    lin = rng.integers(1, 256, size=(2, 3, 50, 6), dtype=np.uint8)
    blk = R.swizzle(lin)
    assert blk.shape == (2, 3, 128, 8)
    np.testing.assert_array_equal(blk[1, 2], R.swizzle(lin[1, 2]))
    np.testing.assert_array_equal(R.unswizzle(blk, lin.shape), lin)
    v = rng.integers(1, 256, size=(6,), dtype=np.uint8)
    b1 = R.swizzle(v)
    assert b1.shape == (128, 8)
    np.testing.assert_array_equal(b1, R.swizzle(v.reshape(1, 6)))


def test_blocked_quantize_equals_swizzled_linear(rng):
    x = rng.standard_normal((2, 130, 96)).astype(F32)
    a = R.quantize(x, mode="mxfp8", scale_layout="blocked")
    b = R.quantize(x, mode="mxfp8")
    np.testing.assert_array_equal(a.scales, R.swizzle(b.scales))
    assert a.scales.shape == (2, 256, 4)
    np.testing.assert_array_equal(R.dequantize_q(a), R.dequantize_q(b))


# ---------------------------------------------------------------------------
# Dequantize, amax, matmul tolerance
# ---------------------------------------------------------------------------

def test_dequantize_known_values():
    """mxfp8 code 0x38 (1.0) with byte 128 -> 2.0; nvfp4 code 7 (6) with 0x23 (0.171875)
    -> 1.03125; with global scale 2688 the factor is 1; mxfp4 code 1 (0.5) with byte 0
    -> 2^-128, a float32 subnormal, representable in bf16, 0 in fp16."""
    d = R.dequantize(np.full((1, 32), 0x38, np.uint8), np.array([[128]], np.uint8),
                     mode="mxfp8", dtype=np.float32)
    assert (d == 2.0).all()
    d = R.dequantize(np.full((1, 8), 0x77, np.uint8), np.array([[0x23]], np.uint8),
                     mode="nvfp4", dtype=np.float32)
    assert (d == 1.03125).all()
    d = R.dequantize(np.full((1, 8), 0x77, np.uint8), np.array([[0x23]], np.uint8),
                     mode="nvfp4", global_scale=f32(2688), dtype=np.float32)
    assert (d == 1.03125).all()
    data = np.full((1, 16), 0x11, np.uint8)
    s = np.array([[0]], np.uint8)
    assert (R.dequantize(data, s, mode="mxfp4", dtype=np.float32) == F32(2.0 ** -128)).all()
    assert (R.dequantize(data, s, mode="mxfp4").astype(F32) == F32(2.0 ** -128)).all()
    assert (R.dequantize(data, s, mode="mxfp4", dtype=np.float16) == 0).all()


def test_dequantize_overflow_and_nan():
    """E4M3 448 * 2^127 overflows fp32 -> Inf; scale byte 0xFF -> NaN; code 0x7F -> NaN."""
    d = R.dequantize(np.array([[0x7E] * 31 + [0x7F]], np.uint8), np.array([[254]], np.uint8),
                     mode="mxfp8", dtype=np.float32)
    assert np.isinf(d[0, :31]).all() and np.isnan(d[0, 31])
    d = R.dequantize(np.zeros((1, 32), np.uint8), np.array([[255]], np.uint8), mode="mxfp8")
    assert np.isnan(d.astype(F32)).all()


def test_amax_reference():
    assert R.amax(f32(1, -3, 2)) == 3
    assert np.isnan(R.amax(f32(1, np.nan, np.inf)))
    assert R.amax(f32(1, -np.inf)) == np.inf
    assert R.amax(np.zeros((0, 4), F32)) == 0 and R.amax(np.zeros((0, 4), F32)).dtype == F32


def test_qqmm_reference_small_known():
    """x = w = rows of ones. mxfp8 quantizes 1 exactly: q(x) @ q(w).T = K = 32.
    nvfp4 with gx = 2688 (enc 1): s = E4M3(1/6) = 0.171875, element 6 -> 1.03125;
    gw = 5376 (enc 0.5): s = E4M3(1/12) = 0.0859375, element 6 -> 0.515625;
    alpha = 2688 * 5376 / 2688^2 = 2: 32 * 1.03125 * 0.515625 * 2 = 34.03125, plus bias."""
    x = np.ones((2, 32), F32)
    w = np.ones((3, 32), F32)
    r = R.qqmm(x, w, "mxfp8")
    np.testing.assert_array_equal(r.value, np.full((2, 3), 32.0))
    r = R.qqmm(x, w, "nvfp4", global_scale_x=f32(2688), global_scale_w=f32(5376),
               bias=f32(1, 2, 3))
    np.testing.assert_array_equal(r.value, np.tile([35.03125, 36.03125, 37.03125], (2, 1)))


def test_matmul_mismatch_catches_errors(rng):
    """The tolerance accepts the float64 answer rounded to bf16 and rejects a wrong one."""
    x = rng.standard_normal((8, 64)).astype(F32)
    w = rng.standard_normal((5, 64)).astype(F32)
    r = R.qqmm(x, w, "mxfp8")
    assert R.matmul_mismatch(R.cast_from_f32(r.value.astype(F32), R.BF16), r) is None
    assert R.matmul_mismatch(r.value.astype(F32), r) is None
    bad = r.value.astype(F32).copy()
    bad[3, 2] += 0.05 * (abs(bad[3, 2]) + 1)
    assert R.matmul_mismatch(bad, r) is not None
    assert R.matmul_mismatch(r.value.astype(F32)[:, :4], r) is not None


def test_quantized_matmul_reference_transpose_and_broadcast(rng):
    """x @ W.T (transpose) and x @ W agree with a direct float64 computation; batch axes
    broadcast like NumPy."""
    x = rng.standard_normal((2, 1, 4, 64)).astype(F32)
    w = rng.standard_normal((3, 8, 64)).astype(F32)
    q = R.quantize(w, group_size=32, bits=8)
    W = R.dequantize_q(q, np.float32).astype(np.float64)
    r = R.quantized_matmul(x, q, transpose=True, bias=np.arange(8, dtype=F32))
    assert r.value.shape == (2, 3, 4, 8)
    np.testing.assert_allclose(r.value, x.astype(np.float64) @ np.swapaxes(W, -1, -2) + np.arange(8),
                               rtol=1e-12)
    wt = rng.standard_normal((64, 32)).astype(F32)  # [K, N], groups along N
    qt = R.quantize(wt, group_size=32, bits=4)
    r2 = R.quantized_matmul(x[0, 0], qt, transpose=False)
    np.testing.assert_allclose(r2.value, x[0, 0].astype(np.float64) @ R.dequantize_q(qt, np.float32),
                               rtol=1e-12)


# ---------------------------------------------------------------------------
# Speed: the suite quantizes a lot
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("mode,kw", [("nvfp4", {}), ("mxfp4", {}), ("mxfp8", {}),
                                     ("affine", {"bits": 3}), ("affine", {"bits": 8})])
def test_reference_is_fast(mode, kw, rng):
    """512 x 4096 quantizes in well under a second."""
    x = rng.standard_normal((512, 4096)).astype(F32)
    R.quantize(x[:16], mode=mode, **kw)  # warm-up
    best = np.inf
    for _ in range(3):  # best of three: a busy CI machine should not make this flaky
        t = time.perf_counter()
        R.quantize(x, mode=mode, **kw)
        best = min(best, time.perf_counter() - t)
    assert best < 1.0, f"{best:.2f} s"
