"""qq.quantize: bit for bit equal to the reference (docs/formats.md, Scales) in every mode,
rounding, scale layout and dtype, on random data spanning 1e-30..1e30 and on the edge
cases that the rules single out: zeros, exact ties, saturation, subnormals, NaN/Inf."""

from __future__ import annotations

import numpy as np
import pytest

import qq
import reference as R
from helpers import (AFFINE_PARAMS, BF16, DEVICES, FP_PARAMS, FpCfg, as_bytes, assert_bits_equal,
                     assert_quantized_equal, cast, check_quantize, dtype_params, qq_quantize,
                     random_data, to_device, to_numpy)

F32 = np.float32


# ---------------------------------------------------------------------------
# Random data, every setting
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("layout", ["linear", "blocked"])
@pytest.mark.parametrize("cfg", FP_PARAMS)
def test_fp_random(cfg, layout, dtype, device, rng):
    """128 x 512 normal data with groups scaled to extreme magnitudes (subnormal scales,
    saturated E4M3 scales, fp32/bf16 subnormal inputs): data and scales bit-exact."""
    x = random_data(rng, (128, 512), dtype, cfg.group_size)
    gs = R.amax(x) if cfg.global_scale else None
    check_quantize(x, device, scale_layout=layout, **cfg.kwargs(gs))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("bits,group_size", AFFINE_PARAMS)
def test_affine_random(bits, group_size, dtype, device, rng):
    """Affine (MLX's algorithm, round half away from zero): codes, scales and biases
    (rounded to x's dtype) bit-exact."""
    x = random_data(rng, (128, 512), dtype, group_size)
    check_quantize(x, device, group_size=group_size, bits=bits)


@pytest.mark.parametrize("dtype", dtype_params([F32, BF16]))
@pytest.mark.parametrize("kw", [
    pytest.param({"mode": "nvfp4", "gs": True}, id="nvfp4-gs"),
    pytest.param({"mode": "mxfp4", "rounding": "floor"}, id="mxfp4-floor"),
    pytest.param({"mode": "mxfp8"}, id="mxfp8"),
    pytest.param({"mode": "affine", "bits": 4, "group_size": 64}, id="affine4"),
    pytest.param({"mode": "affine", "bits": 3, "group_size": 128}, id="affine3"),
])
@pytest.mark.parametrize("device", DEVICES)
def test_larger_random(kw, dtype, device, rng):
    """300 x 1024: rows not a multiple of 128, several 128-row tiles of the blocked layout."""
    kw = dict(kw)
    layouts = ["linear"] if kw["mode"] == "affine" else ["linear", "blocked"]
    x = random_data(rng, (300, 1024), dtype, kw.get("group_size", 32))
    if kw.pop("gs", False):
        kw["global_scale"] = R.amax(x)
    for layout in layouts:
        check_quantize(x, device, scale_layout=layout, **kw)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", dtype_params([np.float16, BF16]))
@pytest.mark.parametrize("layout", ["linear", "blocked"])
@pytest.mark.parametrize("cfg", FP_PARAMS)
def test_fp_wide_rows(cfg, layout, dtype, device, rng):
    """Rows of 2048 16-bit elements (groups a row a multiple of 4: the GPU kernel's gathered
    4-byte scale stores), batch dims, rows past a 128-row tile (blocked padding rows), NaN
    and +-Inf in some groups, every fp mode; data and scales bit-exact."""
    x = random_data(rng, (2, 67, 2048), dtype, cfg.group_size)
    flat = x.reshape(-1)
    for v, at in ((np.nan, 5), (np.inf, 1030), (-np.inf, 4100), (np.nan, flat.size - 1)):
        flat[at] = v
    gs = R.amax(x[np.isfinite(x.astype(F32))]) if cfg.global_scale else None
    check_quantize(x, device, scale_layout=layout, **cfg.kwargs(gs))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["linear", "blocked"])
@pytest.mark.parametrize("cfg", FP_PARAMS)
def test_fp32_rows_through_shared_memory(cfg, layout, device, rng):
    """fp32 x, 32 elements a GPU thread: the row-wise kernel loads x coalesced through shared
    memory, 8 rows a block (blocked scales: the rows that share the layout's sectors; linear:
    consecutive rows, the last block part past the end). Batch entries of 67 rows, 33 units a
    row (the last column block has one live thread; nvfp4's odd group counts take the other
    kernel), NaN and Inf in some groups: data and scales bit-exact."""
    x = random_data(rng, (2, 67, 1056), F32, cfg.group_size)
    flat = x.reshape(-1)
    for v, at in ((np.nan, 7), (np.inf, 2000), (-np.inf, 70000), (np.nan, flat.size - 1)):
        flat[at] = v
    gs = R.amax(x[np.isfinite(x)]) if cfg.global_scale else None
    check_quantize(x, device, scale_layout=layout, **cfg.kwargs(gs))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bits,group_size", [(4, 64), (8, 32), (3, 128)])
def test_affine_fp32_whole_warps(bits, group_size, device, rng):
    """fp32 x with 64 chunks of 32 elements a row: the GPU's row-wise affine kernel gives a row
    64 threads, whole warps of one row (the shape a warp-wide load of x would take); batch
    entries of 33 rows, groups of extreme magnitudes: codes, scales and biases bit-exact."""
    x = random_data(rng, (2, 33, 2048), F32, group_size)
    check_quantize(x, device, group_size=group_size, bits=bits)


SHAPES = [(128,), (1, 128), (3, 128), (100, 128), (129, 256), (2, 3, 5, 128), (2, 1, 129, 128)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("cfg", [FpCfg("nvfp4", global_scale=True), FpCfg("mxfp4", "floor"),
                                 FpCfg("mxfp8", "ceil", "e5m2"), "affine"], ids=str)
def test_shapes(cfg, shape, device, rng):
    """1D input, 1/3/100/129 rows (not multiples of 128), 3 and 4 dims: blocked scales get
    one [roundup(M,128), roundup(K/g,4)] matrix per batch entry (a 1D x counts as M = 1)."""
    if cfg == "affine":
        x = random_data(rng, shape, F32, 64)
        check_quantize(x, device)
        return
    x = random_data(rng, shape, BF16, cfg.group_size)
    gs = R.amax(x) if cfg.global_scale else None
    for layout in ("linear", "blocked"):
        ref = check_quantize(x, device, scale_layout=layout, **cfg.kwargs(gs))
        k_groups = shape[-1] // cfg.group_size
        if layout == "linear":
            assert ref.scales.shape == shape[:-1] + (k_groups,)
        else:
            m = 1 if len(shape) == 1 else shape[-2]
            assert ref.scales.shape == shape[:-2] + (R.roundup(m, 128), R.roundup(k_groups, 4))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(300, 96), (37, 5120), (2, 129, 160), (3, 48)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("cfg", [FpCfg("nvfp4", global_scale=True), FpCfg("mxfp8"), "affine4", "affine8"],
                         ids=str)
def test_rows_packed_in_blocks(cfg, shape, device, rng):
    """The GPU's row-wise affine grid gives a row T threads (the largest power of two up to
    128 that divides the row's 32-element units) and a block 128 / T rows: rows of 3, 5 and
    160 units (T = 1, 1, 32), row counts that leave the last block part empty, batch
    entries that meet inside a block. The fp modes (T = 128: blocks part idle) on the same
    shapes, with blocked padding rows. Same bits as the reference."""
    k = shape[-1]
    if k % (16 if cfg == FpCfg("nvfp4", global_scale=True) else 32):
        pytest.skip("K is not a multiple of the group")
    if str(cfg).startswith("affine"):
        x = random_data(rng, shape, BF16, 32)
        check_quantize(x, device, group_size=32 if k % 64 else 64, bits=int(str(cfg)[-1]))
        return
    x = random_data(rng, shape, BF16, cfg.group_size)
    gs = R.amax(x) if cfg.global_scale else None
    for layout in ("linear", "blocked"):
        check_quantize(x, device, scale_layout=layout, **cfg.kwargs(gs))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cfg", [FpCfg("nvfp4"), FpCfg("mxfp4"), FpCfg("mxfp8", fp8_format="e5m2"),
                                 "affine"], ids=str)
def test_single_group(cfg, device, rng):
    """K equal to one group: one scale per row (and 3 scale columns of blocked padding)."""
    if cfg == "affine":
        x = random_data(rng, (5, 32), F32, 32)
        check_quantize(x, device, group_size=32, bits=5)
        return
    x = random_data(rng, (5, cfg.group_size), F32, cfg.group_size)
    for layout in ("linear", "blocked"):
        ref = check_quantize(x, device, scale_layout=layout, **cfg.kwargs())
    assert ref.scales.shape == (128, 4)


# ---------------------------------------------------------------------------
# Known answers
# ---------------------------------------------------------------------------

def _quantize_one(x, device="cpu", **kw):
    got = qq_quantize(x, device, **kw)
    return as_bytes(got.data) if kw.get("mode", "affine") != "affine" else to_numpy(got.data), got


@pytest.mark.parametrize("device", DEVICES)
def test_golden_scales(device):
    """Known answers: mxfp8 amax 4.8046875 -> byte 121; mxfp4 amax 1 -> byte 125;
    nvfp4 amax 1 -> scale 0x23 with 1.0 coded 7 (6); nvfp4 with global_scale 1 -> 0x7E."""
    x = np.zeros((1, 32), F32)
    x[0, 0] = 4.8046875
    assert as_bytes(qq_quantize(x, device, mode="mxfp8").scales).tolist() == [[121]]
    x[0, 0] = 1.0
    assert as_bytes(qq_quantize(x, device, mode="mxfp4").scales).tolist() == [[125]]
    x16 = np.zeros((1, 16), F32)
    x16[0, 0] = 1.0
    q = qq_quantize(x16, device, mode="nvfp4")
    assert as_bytes(q.scales).tolist() == [[0x23]]
    assert as_bytes(q.data)[0, 0] == 0x07
    q = qq_quantize(x16, device, mode="nvfp4", global_scale=np.array(1.0, F32))
    assert as_bytes(q.scales).tolist() == [[0x7E]]


@pytest.mark.parametrize("device", DEVICES)
def test_fp4_packing_golden(device):
    """nvfp4 with amax 6 has scale 1.0 (0x38) and codes = E2M1 of x: the row
    0.5,1,1.5,2,3,4,6,-0.5 packs to the little-endian uint32 0x97654321."""
    x = np.array([[0.5, 1, 1.5, 2, 3, 4, 6, -0.5] * 2], F32)
    q = qq_quantize(x, device, mode="nvfp4")
    assert as_bytes(q.scales).tolist() == [[0x38]]
    data = as_bytes(q.data)
    assert data.shape == (1, 8)
    assert int(np.ascontiguousarray(data[0, :4]).view("<u4")[0]) == 0x97654321


E2M1_TIES = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
E2M1_TIE_CODES = [0, 2, 2, 4, 4, 6, 6]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k", [-6, 0, 5])
def test_nvfp4_ties_to_even(k, device):
    """amax = 6 * 2^k gives s = 2^k exactly (E4M3 byte (k+7) << 3) and 1/s exact, so the
    E2M1 tie points times 2^k are exact ties: 0.25->0, 0.75->2, 1.25->2, 1.75->4,
    2.5->4, 3.5->6, 5->6 (and -0.25 -> -0, code 8: the sign survives)."""
    row = [6.0] + E2M1_TIES + [-t for t in E2M1_TIES] + [0.0]
    x = (np.array([row], np.float64) * 2.0 ** k).astype(F32)
    data, q = _quantize_one(x, device, mode="nvfp4")
    assert as_bytes(q.scales).tolist() == [[(k + 7) << 3]]
    codes = R.unpack(data, 4)[0].tolist()
    assert codes == [7] + E2M1_TIE_CODES + [c | 8 for c in E2M1_TIE_CODES] + [0]


def _nvfp4_near_tie_groups(rng, n_groups, gs=None):
    """Groups whose scale s is a random E4M3 value (amax = 6 * s exactly, or with a global
    scale, 6 * s / enc) and whose other elements are E2M1 tie points times s, and their
    fp32 neighbours. x * fl(enc / s) then lands a hair off the tie, on a side that depends
    on how fl(1/s) rounded: only the multiply by the fp32 reciprocal, in that order,
    reproduces the codes (x / s would sit exactly on the tie)."""
    codes = rng.integers(0x08, 0x70, size=n_groups)  # normal E4M3 scales, no overflow of 6*s
    s = R.E4M3_VALUES[codes].astype(np.float64)
    enc = 1.0 if gs is None else float(F32(2688) / F32(gs))
    ties = np.array(E2M1_TIES + [-t for t in E2M1_TIES], np.float64)
    x = np.empty((n_groups, 16), F32)
    x[:, 0] = (6 * s / enc).astype(F32)
    t = rng.choice(ties, size=(n_groups, 15))
    v = (t * s[:, None] / enc).astype(F32)
    nudge = rng.integers(-1, 2, size=v.shape)  # the tie itself or one fp32 step either way
    v = np.where(nudge > 0, np.nextafter(v, F32(np.inf)), np.where(nudge < 0, np.nextafter(v, F32(-np.inf)), v))
    x[:, 1:] = v
    return x


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("use_gs", [False, True], ids=["no-gs", "gs"])
def test_nvfp4_reciprocal_near_ties(use_gs, device, rng):
    """Elements at E2M1 ties times arbitrary scales: bit-exact with the reference, which
    multiplies by the fp32 factor enc / s; and the data set is one that a division x / s
    would get wrong (checked here, so the test keeps its teeth)."""
    gs = np.array(3.75, F32) if use_gs else None
    x = _nvfp4_near_tie_groups(rng, 512, gs).reshape(64, 128)
    ref = check_quantize(x, device, mode="nvfp4", global_scale=gs)
    # the division variant differs somewhere
    xg = x.reshape(-1, 16)
    sv = R.E4M3_VALUES[ref.linear_scales.reshape(-1)].astype(F32)
    enc = F32(1) if gs is None else F32(2688) / F32(gs)
    divided = R.to_e2m1((xg * enc / sv[:, None]).astype(F32))
    assert (divided != ref.codes.reshape(-1, 16)).any()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rounding", ["ceil", "floor"])
def test_mxfp4_ties_to_even(rounding, device):
    """amax = 6 * 2^-3: both rules give scale 2^-3 (byte 124), and the E2M1 ties times 2^-3
    round to even."""
    row = [6.0] + E2M1_TIES * 2 + [-t for t in E2M1_TIES] * 2 + [0.0] * 3
    x = (np.array([row], np.float64) * 2.0 ** -3).astype(F32)
    data, q = _quantize_one(x, device, mode="mxfp4", rounding=rounding)
    assert as_bytes(q.scales).tolist() == [[124]]
    codes = R.unpack(data, 4)[0].tolist()
    assert codes == [7] + E2M1_TIE_CODES * 2 + [c | 8 for c in E2M1_TIE_CODES] * 2 + [0] * 3


def _fp8_tie_rows(fmt: R.ElemFormat):
    """Groups of 32: [max, 31 midpoints between consecutive codes]; the expected code of the
    midpoint between codes i and i+1 is the even one."""
    table = fmt.positive_values
    mids = (table[1:] + table[:-1]) / 2
    want = np.where(np.arange(mids.size) % 2 == 0, np.arange(mids.size), np.arange(1, mids.size + 1))
    n_groups = -(-mids.size // 31)
    rows = np.zeros((n_groups, 32))
    expect = np.zeros((n_groups, 32), np.uint8)
    rows[:, 0], expect[:, 0] = fmt.max, fmt.max_code
    rows[:, 1:].flat[: mids.size] = mids
    expect[:, 1:].flat[: mids.size] = want
    return rows, expect


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rounding", ["ceil", "floor"])
@pytest.mark.parametrize("fp8_format", ["e4m3", "e5m2"])
@pytest.mark.parametrize("k", [-100, 0, 60])
def test_mxfp8_ties_to_even(k, fp8_format, rounding, device):
    """amax = max * 2^k makes the scale exactly 2^k under both rules (byte 127 + k); every
    midpoint between neighbouring E4M3/E5M2 values, subnormals included, times 2^k is then
    an exact tie and takes the even code; negated, the same codes with 0x80."""
    fmt = R.E4M3 if fp8_format == "e4m3" else R.E5M2
    rows, expect = _fp8_tie_rows(fmt)
    exact = np.concatenate([rows, -rows]).reshape(1, -1) * 2.0 ** k
    x = exact.astype(F32)
    assert (x.astype(np.float64) == exact).all()  # every tie is an fp32 number
    data, q = _quantize_one(x, device, mode="mxfp8", fp8_format=fp8_format, rounding=rounding)
    assert (as_bytes(q.scales) == 127 + k).all()
    want = np.concatenate([expect, expect | 0x80]).reshape(1, -1)
    assert_bits_equal(data, want, "tie codes")


@pytest.mark.parametrize("device", DEVICES)
def test_mxfp8_floor_vs_ceil_block_max_500(device):
    """Block max 500: FLOOR picks 2^(floor(log2 500) - 8) = 2^0 (byte 127) and clips 500 to
    448 (0x7E); CEIL doubles the scale (q = 500/448 -> 2^1, byte 128) and 500/2 = 250 rounds
    to 256 (0x78)."""
    x = np.zeros((1, 32), F32)
    x[0, :3] = [500, -1, 3]
    fl, qf = _quantize_one(x, device, mode="mxfp8", rounding="floor")
    ce, qc = _quantize_one(x, device, mode="mxfp8", rounding="ceil")
    assert as_bytes(qf.scales).tolist() == [[127]] and fl[0, :3].tolist() == [0x7E, 0xB8, 0x44]
    assert as_bytes(qc.scales).tolist() == [[128]] and ce[0, :3].tolist() == [0x78, 0xB0, 0x3C]


@pytest.mark.parametrize("device", DEVICES)
def test_mxfp4_floor_vs_ceil_saturation(device):
    """Block max 7 with E2M1: FLOOR gives 2^(2-2) = 1 (byte 127) and 7 saturates to 6
    (code 7); CEIL gives q = 7/6 -> 2 (byte 128) and 3.5 is a tie -> 4 (code 6)."""
    x = np.zeros((1, 32), F32)
    x[0, :2] = [7, -7]
    fl, qf = _quantize_one(x, device, mode="mxfp4", rounding="floor")
    ce, qc = _quantize_one(x, device, mode="mxfp4", rounding="ceil")
    assert as_bytes(qf.scales).tolist() == [[127]] and fl[0, 0] == 0xF7
    assert as_bytes(qc.scales).tolist() == [[128]] and ce[0, 0] == 0xE6


@pytest.mark.parametrize("device", DEVICES)
def test_nvfp4_saturation(device):
    """No global scale, amax 1e30: s saturates at 448 (0x7E) and x/448 at 6 (code 7).
    Global scale below amax (gs = amax/4): (amax/6) * 2688/gs = 1792 -> 448, elements 24 -> 6."""
    x = np.full((1, 16), 1e30, F32)
    x[0, 1] = -1e30
    data, q = _quantize_one(x, device, mode="nvfp4")
    assert as_bytes(q.scales).tolist() == [[0x7E]] and data[0, 0] == 0xF7
    x = np.full((1, 16), 2.0, F32)
    data, q = _quantize_one(x, device, mode="nvfp4", global_scale=np.array(0.5, F32))
    assert as_bytes(q.scales).tolist() == [[0x7E]] and (data == 0x77).all()


@pytest.mark.parametrize("device", DEVICES)
def test_nvfp4_zero_scale(device):
    """s == 0 encodes every element as 0 (either sign): amax = 6 * 2^-10 gives s = 2^-10,
    the tie between 0 and 2^-9 -> even -> 0. Just above, s = 2^-9 (byte 1) and the
    elements code normally (6 * 2^-10 * 2^9 = 3 -> 5; -1.5 -> 0xB). A global scale of 1e10
    drives every s to 0 too."""
    x = np.zeros((2, 16), F32)
    x[0, :3] = [6 * 2.0 ** -10, -3 * 2.0 ** -10, 2.0 ** -10]
    x[1, :2] = [np.nextafter(F32(6 * 2.0 ** -10), F32(1)), -3 * 2.0 ** -10]
    data, q = _quantize_one(x, device, mode="nvfp4")
    assert as_bytes(q.scales).tolist() == [[0], [1]]
    codes = R.unpack(data, 4)
    assert ((codes[0] & 7) == 0).all()
    assert codes[1, :2].tolist() == [5, 0xB]
    data, q = _quantize_one(np.ones((1, 16), F32), device, mode="nvfp4",
                            global_scale=np.array(1e10, F32))
    assert as_bytes(q.scales).tolist() == [[0]] and ((data & 0x77) == 0).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cfg", FP_PARAMS)
def test_zero_groups(cfg, device, rng):
    """amax == 0 (all +0 or -0): scale byte 0 and element codes +-0, in every fp mode;
    neighbouring groups are unaffected."""
    g = cfg.group_size
    x = random_data(rng, (3, 4 * g), F32, g, varied=False)
    x[0, :g] = 0.0
    x[1, g:2 * g] = -0.0
    x[2, 3 * g:] = 0.0
    x[2, 3 * g + 1] = -0.0
    gs = np.array(3.0, F32) if cfg.global_scale else None
    ref = check_quantize(x, device, **cfg.kwargs(gs))
    s = ref.scales
    assert s[0, 0] == s[1, 1] == s[2, 3] == 0
    assert (s[:, 2] != 0).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cfg", FP_PARAMS + [pytest.param("affine", id="affine")])
def test_nonfinite_groups(cfg, device, rng):
    """A NaN, +Inf or -Inf anywhere in a group makes its scale NaN (0xFF UE8M0, 0x7F E4M3;
    affine: scale and bias NaN) with codes 0x7F (fp8) or 0 (fp4, affine), so the group
    decodes to NaN; the other groups of the row are unaffected."""
    g = 64 if cfg == "affine" else cfg.group_size
    x = random_data(rng, (4, 3 * g), F32, g, varied=False)
    x[0, 5] = np.nan
    x[1, g + 7] = np.inf
    x[2, 2 * g] = -np.inf
    x[3, g - 1] = np.nan
    x[3, g] = np.inf
    if cfg == "affine":
        ref = check_quantize(x, device)
        assert np.isnan(ref.scales[[0, 1, 2, 3, 3], [0, 1, 2, 0, 1]]).all()
        assert np.isfinite(ref.scales[[0, 1, 2, 3], [1, 0, 0, 2]]).all()
        return
    gs = np.array(4.0, F32) if cfg.global_scale else None
    ref = check_quantize(x, device, **cfg.kwargs(gs))
    nan_byte = 0x7F if cfg.mode == "nvfp4" else 0xFF
    assert (ref.scales[[0, 1, 2, 3, 3], [0, 1, 2, 0, 1]] == nan_byte).all()
    assert (ref.scales[[0, 1, 2, 3], [1, 0, 0, 2]] != nan_byte).all()


@pytest.mark.parametrize("device", DEVICES)
def test_subnormal_inputs_mxfp8(device):
    """fp32 subnormal inputs: q = amax/448 is a subnormal <= 2^-127 -> scale byte 0 (2^-127);
    x * 2^127 maps k * 2^-136 to the E4M3 subnormal k * 2^-9 (code k) and 1.5 * 2^-133 to
    1.5 * 2^-6 (0x0C)."""
    x = np.zeros((1, 32), F32)
    x[0, 0] = 1.5 * 2.0 ** -133
    x[0, 1:8] = np.arange(1, 8) * 2.0 ** -136
    x[0, 8:15] = -np.arange(1, 8) * 2.0 ** -136
    data, q = _quantize_one(x, device, mode="mxfp8")
    assert as_bytes(q.scales).tolist() == [[0]]
    assert data[0, :15].tolist() == [0x0C] + list(range(1, 8)) + [0x80 | k for k in range(1, 8)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", dtype_params())
def test_subnormal_scales_and_elements(dtype, device, rng):
    """Groups whose amax sits near the bottom of each dtype's range (subnormal inputs,
    UE8M0 byte 0/1, E4M3 scale 0 or subnormal), compared with the reference."""
    tiny = {np.dtype(F32): 2.0 ** -140, BF16: 2.0 ** -128, np.dtype(np.float16): 2.0 ** -20}[np.dtype(dtype)]
    x = cast(rng.standard_normal((8, 128)) * tiny, dtype)
    for cfg in [FpCfg("nvfp4"), FpCfg("mxfp4"), FpCfg("mxfp4", "floor"), FpCfg("mxfp8"),
                FpCfg("mxfp8", "floor", "e5m2")]:
        check_quantize(x, device, **cfg.kwargs())
    check_quantize(x, device, group_size=32, bits=8)


@pytest.mark.parametrize("device", DEVICES)
def test_nvfp4_global_scale_shapes(device, rng):
    """global_scale of shape () and (1,) give the same (reference) answer."""
    x = random_data(rng, (16, 64), F32, 16)
    gs = R.amax(x)
    a = qq_quantize(x, device, mode="nvfp4", global_scale=gs)
    b = qq_quantize(x, device, mode="nvfp4", global_scale=gs.reshape(1))
    ref = R.quantize(x, mode="nvfp4", global_scale=gs)
    assert_quantized_equal(a, ref, x)
    assert_quantized_equal(b, ref, x)
    # a different global scale changes the scales: the argument is really read
    c = qq_quantize(x, device, mode="nvfp4", global_scale=gs * 8)
    assert not np.array_equal(as_bytes(c.scales), as_bytes(a.scales))


# ---------------------------------------------------------------------------
# Affine known answers
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", dtype_params())
def test_affine_positive_edge(dtype, device):
    """w = 0..15 (twice), bits 4, group 32: scale -1, bias 15, q = 15 - w; first byte 0xEF."""
    w = cast(np.tile(np.arange(16, dtype=F32), 2).reshape(1, 32), dtype)
    q = qq_quantize(w, device, group_size=32, bits=4)
    assert to_numpy(q.scales).astype(F32).tolist() == [[-1.0]]
    assert to_numpy(q.biases).astype(F32).tolist() == [[15.0]]
    assert to_numpy(q.scales).dtype == np.dtype(dtype)
    data = as_bytes(q.data)
    assert data[0, 0] == 0xEF and data.shape == (1, 16)
    assert R.unpack(data, 4)[0].tolist() == [15 - i for i in range(16)] * 2


@pytest.mark.parametrize("device", DEVICES)
def test_affine_negative_edge(device):
    """w = 0, -1, ..., -15: w_max = max(0, 0) = 0 and |w_min| > |w_max|, so edge = -15,
    scale +1, bias -15, q = w + 15."""
    w = np.tile(-np.arange(16, dtype=F32), 2).reshape(1, 32)
    q = qq_quantize(w, device, group_size=32, bits=4)
    assert to_numpy(q.scales).tolist() == [[1.0]] and to_numpy(q.biases).tolist() == [[-15.0]]
    assert R.unpack(as_bytes(q.data), 4)[0].tolist() == [15 - i for i in range(16)] * 2


@pytest.mark.parametrize("device", DEVICES)
def test_affine_rounds_half_away_from_zero(device):
    """bits 2: w in {0, 3} with 0.5, 1.5, 2.5: q = 3 - w = 2.5, 1.5, 0.5 -> 3, 2, 1 (half
    away from zero; ties-to-even would give 2, 2, 0)."""
    w = np.zeros((1, 32), F32)
    w[0, :5] = [0, 3, 0.5, 1.5, 2.5]
    q = qq_quantize(w, device, group_size=32, bits=2)
    assert R.unpack(as_bytes(q.data), 2)[0, :5].tolist() == [3, 0, 3, 2, 1]


def _affine_near_ties(rng, bits, group, ngroups):
    """fp32 groups (rows of `group`) of magnitudes 2^-60 .. 2^100, each spanning 0 .. n * s, whose
    other elements sit 0-3 ulp from the values whose quotient (w - bias) / scale is k + 0.5
    (the rounding boundaries), on both sides, for random k in 0 .. n - 1."""
    n = (1 << bits) - 1
    e = rng.integers(-60, 101, ngroups)
    s = (rng.uniform(1, 2, ngroups) * np.exp2(e.astype(np.float64))).astype(F32)
    x = np.empty((ngroups, group), F32)
    x[:, 0] = 0.0
    x[:, 1] = (s.astype(np.float64) * n).astype(F32)
    k = rng.integers(0, n, (ngroups, group - 2))
    w = (x[:, 1:2].astype(np.float64) - (k + 0.5) * s[:, None].astype(np.float64)).astype(F32)
    nudge = rng.integers(-3, 4, w.shape).astype(np.int32)
    x[:, 2:] = (w.view(np.int32) + nudge).view(F32)
    return x


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["quantize", "quantize_colwise"])
@pytest.mark.parametrize("bits,group", [(4, 64), (8, 32), (2, 128)])
def test_affine_quotients_next_to_ties(bits, group, op, device, rng):
    """Quotients within a few ulp of a .5 boundary in groups of every magnitude: on the GPU
    the exact quotient without a division (codec.h affine_quotient_fma: |scale| up to 2^64)
    and the band-tested reciprocal one beyond give the CPU's and the reference's codes, row-
    and column-wise, bit for bit."""
    x = _affine_near_ties(rng, bits, group, 512)
    if op == "quantize":
        check_quantize(x, device, group_size=group, bits=bits)
        return
    xt = x.reshape(32, 16 * group)  # quantize_colwise(x^T) = quantize(xt): the same groups
    ref = R.quantize(xt, mode="affine", bits=bits, group_size=group)
    got = qq.quantize_colwise(to_device(np.ascontiguousarray(xt.T), device), mode="affine", bits=bits,
                              group_size=group)
    assert_quantized_equal(got, ref, xt, what=f"colwise affine near ties [{device}]")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("bits", [4, 8, 3])
def test_affine_group_range_edges(bits, group, dtype, device, rng):
    """The GPU takes a group's min and max two 16-bit elements at a time, with a NaN passed
    through, and finiteness from the two results. Groups with one NaN, +Inf or -Inf at
    positions of either half of a packed pair and of every 32-element thread of the group;
    all -0, mixed -0 / +0 with positives or negatives (which zero a min keeps must not
    matter), all-negative (max(0, max) = +0), one tiny positive, all equal: codes, scales
    and biases equal the reference and the CPU bit for bit."""
    rows = []

    def row():
        r = (rng.standard_normal(2 * group) * 3).astype(F32)
        rows.append(r)
        return r

    for p in sorted(q for q in {0, 1, 6, 7, 30, 31, 32, 33, 62, 63, 64, 65, 94, 95, 96, 97, group - 2, group - 1}
                    if q < group):
        for v in (np.nan, np.inf, -np.inf):
            row()[p] = v
    for g0 in (0, group):  # the first group or the second of a row
        r = row(); r[g0:g0 + group] = -0.0
        r = row(); r[g0:g0 + group] = np.abs(r[g0:g0 + group]); r[g0:g0 + group:3] = -0.0; r[g0 + 1:g0 + group:5] = 0.0
        r = row(); r[g0:g0 + group] = -np.abs(r[g0:g0 + group]); r[g0 + 2:g0 + group:4] = -0.0; r[g0 + 3] = 0.0
        r = row(); r[g0:g0 + group] = -np.abs(r[g0:g0 + group]) - 0.5
        r = row(); r[g0:g0 + group] = 0.0; r[g0 + group // 2 + 1] = 2.0 ** -20
        r = row(); r[g0:g0 + group] = -1.25
    x = cast(np.stack(rows), dtype)
    check_quantize(x, device, group_size=group, bits=bits)


def _c_abi(torch):
    """libqq's C ABI through ctypes on CUDA torch tensors: (lib, Params, dl), dl(t, shape,
    ptr) a DLTensor of t (or of `shape` bytes at `ptr`). Reaches what qq's own calls never
    pass: buffers at odd offsets."""
    import ctypes
    import re
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    with open("/proc/self/maps") as f:
        path = next((ln.split()[-1] for ln in f if re.search(r"/libqq\.so(\.\d+)*$", ln.rstrip())), None)
    if path is None:
        pytest.skip("libqq is not loaded as libqq.so (cannot reach its C ABI through ctypes)")
    lib = ctypes.CDLL(path)

    class DLDevice(ctypes.Structure):
        _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]

    class DLDataType(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]

    class DLTensor(ctypes.Structure):
        _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                    ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                    ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]

    class Params(ctypes.Structure):
        _fields_ = [("struct_size", ctypes.c_size_t)] + [
            (n, ctypes.c_int) for n in ("mode", "group_size", "bits", "rounding", "scale_layout", "fp8_format")]

    keep = []

    def dl(t, shape=None, ptr=None):
        shape = tuple(t.shape) if shape is None else shape
        sh = (ctypes.c_int64 * len(shape))(*shape)
        keep.append(sh)
        code, nbits = (4, 16) if t.dtype == torch.bfloat16 else (1, 8)  # kDLBfloat / kDLUInt
        return ctypes.byref(DLTensor(ptr or t.data_ptr(), DLDevice(2, torch.cuda.current_device()), len(shape),
                                     DLDataType(code, nbits, 1), sh, None, 0))

    return lib, Params, dl


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["quantize", "quantize_colwise"])
@pytest.mark.parametrize("bits", [4, 8])
def test_affine_data_not_16_byte_aligned_gpu(op, bits, rng):
    """The GPU kernels store 4- and 8-bit affine codes 16 bytes at a time where the data
    pointer allows (quantize: a thread's 32 codes; quantize_colwise: x^T's rows staged in
    shared memory), else narrower. qq's own outputs are always aligned, so the other path
    is reached through the C ABI (ctypes) with a data buffer 4 / 8 bytes past a 16-byte
    boundary: the same bytes as qq's own call, nothing written outside the buffer."""
    import ctypes
    torch = pytest.importorskip("torch")
    lib, Params, dl = _c_abi(torch)
    group = 64
    m, k = (72, 256) if op == "quantize" else (256, 72)  # K (quantize) / M (colwise) in groups
    x = torch.from_numpy(rng.standard_normal((m, k)).astype(F32)).to("cuda", torch.bfloat16)
    rows, cols = (m, k) if op == "quantize" else (k, m)  # the quantized operand: x or x^T
    nbytes = rows * cols * bits // 8
    off = bits  # 4 or 8 bytes past the (256-byte aligned) allocation
    buf = torch.full((nbytes + 64,), 0xAB, dtype=torch.uint8, device="cuda")
    scales = torch.full((rows, cols // group), float("nan"), dtype=torch.bfloat16, device="cuda")  # poisoned
    biases = torch.full_like(scales, float("nan"))
    p = Params()
    assert lib.qqQuantParamsInit(ctypes.byref(p), 0) == 0  # QQ_MODE_AFFINE
    p.bits, p.group_size = bits, group
    assert (buf.data_ptr() + off) % 16 == off
    td = dl(buf, (rows, nbytes // rows), buf.data_ptr() + off)
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    if op == "quantize":
        st = lib.qqQuantize(None, dl(x), ctypes.byref(p), None, td, dl(scales), dl(biases), stream)
    else:
        st = lib.qqQuantizeColwise(None, dl(x), ctypes.byref(p), None, td, dl(scales), dl(biases), None, None,
                                   None, stream)
    torch.cuda.synchronize()
    assert st == 0
    want = getattr(qq, op)(x, group_size=group, bits=bits)
    got = buf.cpu().numpy()
    assert (got[:off] == 0xAB).all() and (got[off + nbytes:] == 0xAB).all()
    assert_bits_equal(got[off:off + nbytes].reshape(rows, -1), as_bytes(want.data), "data")
    assert_bits_equal(scales, to_numpy(want.scales), "scales")
    assert_bits_equal(biases, to_numpy(want.biases), "biases")


@pytest.mark.gpu
@pytest.mark.parametrize("off", [0, 1, 4])
@pytest.mark.parametrize("layout", ["linear", "blocked"])
@pytest.mark.parametrize("mode", ["nvfp4", "mxfp8"])
def test_fp_scales_at_odd_address_gpu(mode, layout, off, rng):
    """How the GPU stores scale bytes depends on the scales buffer's address: blocked scales
    in 16-byte stores of a block's staged sectors (16-byte aligned, as every qq.quantize
    call's), else four groups' bytes in one 4-byte store (4-byte aligned), else a thread's
    two nvfp4 bytes in one 2-byte store, else byte by byte. Through the C ABI (ctypes), a
    poisoned scales buffer 0, 1 or 4 bytes past a 16-byte boundary and a poisoned data buffer
    get the reference's bytes, blocked padding included, and nothing outside them. 130 x 1056:
    the rows of a second 128-row block, 66 / 33 groups a row (the staged blocks' last column
    block has one live thread; 2 / 3 padding columns)."""
    import ctypes
    torch = pytest.importorskip("torch")
    lib, Params, dl = _c_abi(torch)
    m, k = 130, 1056
    # (not varied: no all-zero group, whose codes' sign the comparison would have to loosen)
    x = torch.from_numpy(random_data(rng, (m, k), F32, 16, varied=False)).to("cuda", torch.bfloat16)
    ref = R.quantize(to_numpy(x), mode=mode, scale_layout=layout)
    sshape = ref.scales.shape
    ns = int(np.prod(sshape))
    buf = torch.full((ns + 64,), 0xAB, dtype=torch.uint8, device="cuda")
    data = torch.full(ref.data.shape, 0xAB, dtype=torch.uint8, device="cuda")
    p = Params()
    assert lib.qqQuantParamsInit(ctypes.byref(p), {"nvfp4": 1, "mxfp8": 3}[mode]) == 0  # qqMode_t
    p.scale_layout = 0 if layout == "linear" else 1
    assert buf.data_ptr() % 16 == 0
    st = lib.qqQuantize(None, dl(x), ctypes.byref(p), None, dl(data), dl(buf, sshape, buf.data_ptr() + off), None,
                        ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    torch.cuda.synchronize()
    assert st == 0
    got = buf.cpu().numpy()
    assert (got[:off] == 0xAB).all() and (got[off + ns:] == 0xAB).all()
    assert_bits_equal(got[off:off + ns].reshape(sshape), ref.scales, "scales")
    assert_bits_equal(data.cpu().numpy(), ref.data, "data")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", dtype_params())
def test_affine_zero_group(dtype, device):
    """All zeros: scale = max(0, 1e-7) negated (edge = w_max = 0) = -1e-7 in x's dtype,
    bias 0, codes 0."""
    w = np.zeros((2, 64), dtype)
    q = qq_quantize(w, device)
    want = cast(np.array([[-1e-7], [-1e-7]], F32), dtype)
    assert_bits_equal(q.scales, want, "scales")
    assert (to_numpy(q.biases).astype(F32) == 0).all() and (as_bytes(q.data) == 0).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bits", [2, 3, 5, 6, 8])
def test_affine_packing(bits, device, rng):
    """Each row is one little-endian bit stream; element i sits in bits [i*bits, (i+1)*bits):
    checked against Python integers, not against the reference's packer."""
    x = rng.standard_normal((3, 64)).astype(F32)
    ref = R.quantize(x, group_size=32, bits=bits)
    data = as_bytes(qq_quantize(x, device, group_size=32, bits=bits).data)
    assert data.shape == (3, 64 * bits // 8)
    for r in range(3):
        stream = int.from_bytes(data[r].tobytes(), "little")
        assert stream == sum(int(c) << (i * bits) for i, c in enumerate(ref.codes[r]))


# ---------------------------------------------------------------------------
# Arguments, views, the result object
# ---------------------------------------------------------------------------

def test_defaults(rng):
    """quantize(x) is affine, group 64, 4 bits (MLX's default); nvfp4 defaults to group 16,
    mxfp4/mxfp8 to 32; data is [..., K*bits/8] uint8."""
    x = random_data(rng, (4, 128), F32, 64)
    q = qq.quantize(x)
    assert (q.mode, q.group_size, q.bits) == ("affine", 64, 4)
    assert q.data.shape == (4, 64) and q.data.dtype == np.uint8
    assert q.scales.shape == (4, 2) and q.biases.shape == (4, 2)
    assert_quantized_equal(q, R.quantize(x), x)
    for mode, g, b, nbytes in [("nvfp4", 16, 4, 64), ("mxfp4", 32, 4, 64), ("mxfp8", 32, 8, 128)]:
        q = qq.quantize(x, mode=mode)
        assert (q.mode, q.group_size, q.bits) == (mode, g, b)
        assert q.data.shape == (4, nbytes) and q.data.dtype == np.uint8
        assert q.scales.shape == (4, 128 // g) and q.scales.dtype == np.uint8
        assert q.biases is None


def test_quantized_array_fields(rng):
    x = random_data(rng, (2, 3, 64), BF16, 16)
    gs = R.amax(x)
    q = qq.quantize(x, mode="nvfp4", global_scale=gs, scale_layout="blocked")
    assert q.mode == "nvfp4" and q.group_size == 16 and q.bits == 4
    assert q.scale_layout == "blocked" and q.rounding == "ceil" and q.fp8_format == "e4m3"
    assert q.shape == (2, 3, 64) and isinstance(q.shape, tuple)
    assert float(np.asarray(q.global_scale)) == float(gs)
    assert len(q) == 2
    q = qq.quantize(x, mode="mxfp8", fp8_format="e5m2", rounding="floor")
    assert (q.fp8_format, q.rounding, q.global_scale) == ("e5m2", "floor", None)
    q = qq.quantize(x, group_size=32, bits=6)
    assert len(q) == 3 and (q.group_size, q.bits) == (32, 6)


@pytest.mark.parametrize("mode", ["nvfp4", "mxfp8", "affine"])
def test_row_strided_view(mode, rng):
    """A row-strided 2D view (x[::2], last axis contiguous) is accepted as is and gives the
    answer of its contiguous copy."""
    base = random_data(rng, (10, 128), F32, 64)
    view = base[::2]
    assert not view.flags.c_contiguous
    ref = R.quantize(np.ascontiguousarray(view), mode=mode)
    assert_quantized_equal(qq.quantize(view, mode=mode), ref, view)
    sub = base[2:7, :]  # offset view
    assert_quantized_equal(qq.quantize(sub, mode=mode), R.quantize(np.ascontiguousarray(sub), mode=mode))


def test_input_not_modified(rng):
    x = random_data(rng, (8, 64), F32, 16)
    keep = x.copy()
    qq.quantize(x, mode="nvfp4")
    qq.quantize(x)
    np.testing.assert_array_equal(x.view(np.uint32), keep.view(np.uint32))


def test_stream_ignored_on_cpu(rng):
    """CPU arrays ignore `stream` (an int or None)."""
    x = random_data(rng, (4, 64), F32, 32)
    ref = R.quantize(x, mode="mxfp8")
    assert_quantized_equal(qq.quantize(x, mode="mxfp8", stream=0), ref, x)
    assert_quantized_equal(qq.quantize(x, mode="mxfp8", stream=None), ref, x)
