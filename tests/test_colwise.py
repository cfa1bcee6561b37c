"""Quantization along the other axis (quantize_colwise) and the MoE 3D MXFP8 weights
(quantize_moe): docs/formats.md and docs/api.md (quantize_moe), issue "CUDA quantization kernels".

quantize_colwise(x) must equal quantize(x^T) bit for bit (it is defined that way); the
32x32 MoE scaling gets its own small reference below, written from docs/api.md's quantize_moe rule: one UE8M0
scale from the amax of each 32x32 tile, elements convert(x * 2^(127-b))."""

import numpy as np
import pytest

import reference as R
from helpers import (AFFINE_PARAMS, DEVICES, FP_PARAMS, as_bytes, assert_bits_equal,
                     assert_quantized_equal, dtype_params, random_data, to_device, to_numpy)

import qq

F32 = np.float32


def _gs(cfg, x):
    return R.amax(x).astype(F32) if cfg.global_scale else None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(64, 96), (128, 64), (160, 40), (2, 32, 200), (256, 8)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layout", ["linear", "blocked"])
@pytest.mark.parametrize("cfg", FP_PARAMS)
def test_colwise_fp_equals_quantize_of_transpose(rng, cfg, layout, shape, device):
    """Columns in groups of 16/32 rows: the result is quantize(x^T), scales and padding
    included; K (the columns) need not be a multiple of anything."""
    m = shape[-2]
    if m % cfg.group_size:
        pytest.skip("M must be a multiple of the group")
    x = random_data(rng, shape, np.float32, group_size=1)
    xt = np.ascontiguousarray(np.swapaxes(x, -1, -2))
    gs = _gs(cfg, x)
    ref = R.quantize(xt, scale_layout=layout, **cfg.kwargs(gs))
    kw = cfg.kwargs(None if gs is None else to_device(gs, device))
    got = qq.quantize_colwise(to_device(x, device), scale_layout=layout, **kw)
    assert got.shape == xt.shape
    assert_quantized_equal(got, ref, xt, what=f"colwise [{device}]")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("bits,group", [pytest.param(*p.values, id=p.id) for p in AFFINE_PARAMS][::3])
def test_colwise_affine(rng, bits, group, dtype, device):
    """Affine along columns: scales and biases in x's dtype, one group per `group` rows."""
    x = random_data(rng, (2 * group, 72), dtype, varied=False)
    xt = np.ascontiguousarray(x.T)
    ref = R.quantize(xt, mode="affine", bits=bits, group_size=group)
    got = qq.quantize_colwise(to_device(x, device), mode="affine", bits=bits, group_size=group)
    assert_quantized_equal(got, ref, xt, what=f"colwise affine [{device}]")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("shape", [(384, 37), (2, 128, 136), (320, 72)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("bits,group", [pytest.param(*p.values, id=p.id) for p in AFFINE_PARAMS])
def test_colwise_affine_groups(rng, bits, group, shape, dtype, device):
    """Affine along columns at every width and group, groups spanning 1-4 of the GPU's
    32-row strips (several groups per 128-row block at M = 384, a last block half full at
    M = 320), ragged K, NaN / Inf / zero columns: quantize(x^T) bit for bit, scales and
    biases in x's dtype."""
    if shape[-2] % group:
        pytest.skip("M is not a multiple of the group")
    x = _poisoned(rng, shape, dtype)
    xt = np.ascontiguousarray(np.swapaxes(x, -1, -2))
    ref = R.quantize(xt, mode="affine", bits=bits, group_size=group)
    got = qq.quantize_colwise(to_device(x, device), mode="affine", bits=bits, group_size=group)
    assert_quantized_equal(got, ref, xt, what=f"colwise affine {dtype} [{device}]")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [R.BF16, np.float16, np.float32], ids=["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("bits,group", [(4, 32), (4, 128), (8, 64)], ids=["a4g32", "a4g128", "a8g64"])
@pytest.mark.parametrize("k", [75, 129], ids=lambda k: f"K{k}")
def test_colwise_affine_ragged_columns_aligned_rows(rng, bits, group, dtype, k, device):
    """The first columns of a wider tensor: rows 16-byte aligned (the GPU's vector loads)
    but K not a multiple of 8 (16-bit) or 4 (fp32), so the last columns a thread loads are
    partly past K; two
    128-row blocks with a NaN / Inf / zero column: quantize(x^T) bit for bit."""
    full = _poisoned(rng, (256, 136), dtype)
    x = full[:, :k]
    xt = np.ascontiguousarray(x.T)
    ref = R.quantize(xt, mode="affine", bits=bits, group_size=group)
    dev_full = to_device(full, device)
    got = qq.quantize_colwise(dev_full[:, :k], mode="affine", bits=bits, group_size=group)
    assert_quantized_equal(got, ref, xt, what=f"colwise affine K={k} {dtype} [{device}]")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode,kw", [("nvfp4", {}), ("mxfp8", {"scale_layout": "blocked"}),
                                     ("mxfp4", {"rounding": "floor"}), ("affine", {"bits": 4}),
                                     ("affine", {"bits": 8, "group_size": 128})])
def test_both_orientations_from_one_call(rng, mode, kw, device):
    """rowwise=True returns (quantize(x), quantize(x^T)) from one read of x."""
    _check_both(random_data(rng, (256, 128), np.float32, group_size=16), device, mode=mode, **kw)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bits,group,shape", [(4, 32, (256, 96)), (8, 32, (2, 128, 160)), (4, 64, (384, 192)),
                                              (8, 64, (2, 256, 64))],
                         ids=["a4g32-256x96", "a8g32-2x128x160", "a4g64-384x192", "a8g64-2x256x64"])
def test_both_orientations_affine_fp32_groups(rng, bits, group, shape, device):
    """rowwise=True for affine from fp32 x in groups of 32 / 64: a last 64-column tile half past K
    (K = 96, 160), several 128-row tiles, batches, NaN / Inf / zero columns;
    (quantize(x), quantize(x^T)) bit for bit."""
    _check_both(_poisoned(rng, shape, np.float32), device, mode="affine", bits=bits, group_size=group)


_DTYPE_CFGS = [c for c in FP_PARAMS if str(c.values[0]) in
               ("nvfp4", "nvfp4-gs", "mxfp4-floor", "mxfp8-e4m3-ceil", "mxfp8-e5m2-floor")]


def _poisoned(rng, shape, dtype):
    """Random data of every magnitude, one NaN, one Inf and an all-zero column."""
    x = random_data(rng, shape, dtype, group_size=1)
    x[..., 1, 2] = np.nan
    x[..., 5, 0] = -np.inf
    x[..., :, 3] = 0
    return x


def _check_both(x, device, **kw):
    """quantize_colwise(x, rowwise=True, **kw): (quantize(x), quantize(x^T)) bit for bit."""
    row, col = qq.quantize_colwise(to_device(x, device), rowwise=True, **kw)
    assert_quantized_equal(row, R.quantize(x, **kw), x, what=f"rowwise half {kw['mode']} [{device}]")
    xt = np.ascontiguousarray(np.swapaxes(x, -1, -2))
    assert_quantized_equal(col, R.quantize(xt, **kw), xt, what=f"colwise half {kw['mode']} [{device}]")


def _finite(x):
    """x's finite values (zeros elsewhere): the global scale of a poisoned x."""
    x = x.astype(F32)
    return np.where(np.isfinite(x), x, 0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [R.BF16, np.float16, np.float32], ids=["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("bits,group", [(4, 64), (8, 128)], ids=["a4g64", "a8g128"])
def test_both_orientations_affine_aligned_batched(rng, bits, group, dtype, device):
    """rowwise=True for affine from x with aligned rows (the GPU: quantize's row-wise
    kernel, then colaff_kernel for x^T) over two batch dimensions, NaN / Inf / zero columns:
    (quantize(x), quantize(x^T)) bit for bit."""
    _check_both(_poisoned(rng, (2, 3, 256, 128), dtype), device, mode="affine", bits=bits, group_size=group)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("shape", [(48, 72), (64, 37), (96, 130), (2, 64, 520), (208, 40), (2, 384, 140)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layout", ["linear", "blocked"])
@pytest.mark.parametrize("cfg", _DTYPE_CFGS)
def test_colwise_fp_dtypes(rng, cfg, layout, shape, dtype, device):
    """Every input dtype, K not a multiple of a thread's columns (37, 130), M % 32 == 16
    (nvfp4's half strip; at M = 208 rows of x^T that are 8- but not 16-byte aligned past
    a full block of 128), NaN / Inf / zero columns: still quantize(x^T) bit for bit.
    (2, 384, 140): whole 128-row blocks with linear scales (the GPU stages their scale
    bytes in shared memory) over a batch, a block's columns past K (140 = 128 + 12)."""
    if shape[-2] % cfg.group_size:
        pytest.skip("M must be a multiple of the group")
    x = _poisoned(rng, shape, dtype)
    xt = np.ascontiguousarray(np.swapaxes(x, -1, -2))
    gs = _gs(cfg, _finite(x))
    ref = R.quantize(xt, scale_layout=layout, **cfg.kwargs(gs))
    got = qq.quantize_colwise(to_device(x, device), scale_layout=layout,
                              **cfg.kwargs(None if gs is None else to_device(gs, device)))
    assert_quantized_equal(got, ref, xt, what=f"colwise {dtype} [{device}]")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [R.BF16, np.float32], ids=["bfloat16", "float32"])
@pytest.mark.parametrize("shape", [(1216, 96), (2, 1184, 160)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mode,kw", [("nvfp4", {"scale_layout": "linear"}), ("mxfp8", {"scale_layout": "blocked"}),
                                     ("affine", {"bits": 4, "group_size": 32}),
                                     ("affine", {"bits": 8, "group_size": 32})],
                         ids=["nvfp4-linear", "mxfp8-blocked", "a4g32", "a8g32"])
def test_colwise_bands(rng, mode, kw, shape, dtype, device):
    """More than 8 tiles of 128 rows along M (1216 = 9.5 of them, 1184 = 9.25): on the GPU
    the column-wise kernels launch in bands of 8 tiles along M, so a second band with most
    of its blocks past M; a last tile of columns part past K, a batch, NaN / Inf / zero
    columns: quantize(x^T) bit for bit, and for rowwise=True quantize(x) too."""
    x = _poisoned(rng, shape, dtype)
    xt = np.ascontiguousarray(np.swapaxes(x, -1, -2))
    got = qq.quantize_colwise(to_device(x, device), mode=mode, **kw)
    assert_quantized_equal(got, R.quantize(xt, mode=mode, **kw), xt, what=f"colwise {mode} {dtype} [{device}]")
    _check_both(x, device, mode=mode, **kw)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("shape", [(96, 128), (2, 32, 64)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layout", ["linear", "blocked"])
@pytest.mark.parametrize("cfg", _DTYPE_CFGS)
def test_both_orientations_dtypes(rng, cfg, layout, shape, dtype, device):
    """rowwise=True for every dtype and fp mode: the row-wise groups span several of the
    GPU kernel's threads (their amax is combined across them)."""
    x = _poisoned(rng, shape, dtype)
    gs = _gs(cfg, _finite(x))
    kw = cfg.kwargs(None if gs is None else to_device(gs, device))
    row, col = qq.quantize_colwise(to_device(x, device), scale_layout=layout, rowwise=True, **kw)
    assert_quantized_equal(row, R.quantize(x, scale_layout=layout, **cfg.kwargs(gs)), x, what="rowwise half")
    xt = np.ascontiguousarray(np.swapaxes(x, -1, -2))
    assert_quantized_equal(col, R.quantize(xt, scale_layout=layout, **cfg.kwargs(gs)), xt, what="colwise half")


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["linear", "blocked"])
@pytest.mark.parametrize("mode", ["nvfp4", "mxfp4", "mxfp8"])
def test_both_orientations_rows_8_aligned_gpu(rng, mode, layout):
    """rowwise=True for fp modes from bf16 x whose rows are 8- but not 16-byte aligned (a column
    slice): the GPU's row-wise kernel needs 16, so both halves come from the one-read kernel
    (colq_kernel), also for the fp4 modes, which take two passes otherwise; same bytes."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    full = _poisoned(rng, (64, 68), R.BF16)
    x = full[:, 4:]
    row, col = qq.quantize_colwise(to_device(full, "cuda")[:, 4:], mode=mode, scale_layout=layout, rowwise=True)
    assert_quantized_equal(row, R.quantize(x, mode=mode, scale_layout=layout), x,
                           what="rowwise half, 8-byte aligned rows")
    xt = np.ascontiguousarray(x.T)
    assert_quantized_equal(col, R.quantize(xt, mode=mode, scale_layout=layout), xt,
                           what="colwise half, 8-byte aligned rows")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["nvfp4", "mxfp8", "affine"])
def test_colwise_misaligned_rows_gpu(rng, mode):
    """x whose rows are not 8-byte aligned (a column slice of a bf16 tensor) takes the
    element-wise path of the GPU's tile kernel (affine: group 64, 4 bits, with x^T's codes
    staged): same bytes as quantize(x^T)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    full = _poisoned(rng, (64, 67), R.BF16)
    x = full[:, 1:]
    xt = np.ascontiguousarray(x.T)
    got = qq.quantize_colwise(to_device(full, "cuda")[:, 1:], mode=mode, rowwise=False)
    assert_quantized_equal(got, R.quantize(xt, mode=mode), xt, what="misaligned colwise")


def test_colwise_edge_values_nan_inf_zero():
    """A NaN, an Inf and an all-zero column group: the NaN/Inf groups get scale 0xFF and
    codes 0x7F (mxfp8); the zero group scale 0."""
    x = np.ones((32, 4), F32)
    x[3, 0] = np.nan
    x[5, 1] = np.inf
    x[:, 2] = 0
    got = qq.quantize_colwise(x, mode="mxfp8")
    s = as_bytes(got.scales)
    assert s[0, 0] == 0xFF and s[1, 0] == 0xFF and s[2, 0] == 0, s
    d = as_bytes(got.data)
    assert (d[0] == 0x7F).all() and (d[1] == 0x7F).all() and (d[2] == 0).all()
    assert_quantized_equal(got, R.quantize(np.ascontiguousarray(x.T), mode="mxfp8"))


# ---------------------------------------------------------------------------
# MoE 3D MXFP8
# ---------------------------------------------------------------------------

def ref_moe(w, scaling, rounding="ceil", fp8_format="e4m3", layout="linear"):
    """Reference of quantize_moe from docs/api.md: (codes [E, D1, D2], linear scales, blocked
    scales). 32x1 is quantize(w[e]^T); 32x32 shares one amax per 32x32 tile."""
    w32 = np.asarray(w).astype(F32)
    e, d1, d2 = w32.shape
    fmt = R.elem_format("mxfp8", fp8_format)
    # groups along D1: [E, D1/32, 32, D2]
    g = w32.reshape(e, d1 // 32, 32, d2)
    finite = np.isfinite(g).all(axis=2)                        # [E, D1/32, D2]
    am = np.where(np.isfinite(g), np.abs(g), 0).max(axis=2)    # [E, D1/32, D2]
    if scaling == "32x32":
        t = am.reshape(e, d1 // 32, d2 // 32, 32)
        tf = finite.reshape(e, d1 // 32, d2 // 32, 32).all(axis=-1)
        am = np.repeat(t.max(axis=-1), 32, axis=-1)
        finite = np.repeat(tf, 32, axis=-1)
    am = am.astype(F32)
    byte = R.ue8m0_ceil(am, fmt.max) if rounding == "ceil" else R.ue8m0_floor(am, fmt.emax)
    y = g.astype(np.float64) * np.ldexp(1.0, 127 - byte.astype(np.int64))[:, :, None, :]
    codes = R.encode(np.where(np.isfinite(y), y, 0), fmt)
    codes = np.where((am == 0)[:, :, None, :], 0, codes)
    byte = np.where(finite, byte, 0xFF).astype(np.uint8)
    codes = np.where(finite[:, :, None, :], codes, 0x7F).astype(np.uint8).reshape(e, d1, d2)
    linear = byte if scaling == "32x1" else byte[:, :, ::32]
    blocked = np.stack([R.swizzle(np.ascontiguousarray(byte[i].T)) for i in range(e)])
    return codes, (blocked if layout == "blocked" else linear)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("transposed_view", [False, True], ids=["rowmajor", "tview"])
@pytest.mark.parametrize("layout", ["linear", "blocked"])
@pytest.mark.parametrize("rounding", ["ceil", "floor"])
@pytest.mark.parametrize("scaling", ["32x1", "32x32"])
@pytest.mark.parametrize("shape", [(1, 64, 96), (3, 160, 64), (2, 224, 96)], ids=lambda s: "x".join(map(str, s)))
def test_moe(rng, shape, scaling, rounding, layout, transposed_view, device):
    """MoE weights [E, D1, D2]: data column-major per expert (strides (D1*D2, 1, D1)),
    scales per docs/api.md (quantize_moe); the transposed view of an [E, D2, D1] tensor is
    accepted as is and gives the same bytes (D1 / 32 = 2, 5, 7 groups: the GPU's blocks of
    group pairs full, ragged and past the row; several 32-row blocks along D2)."""
    w = random_data(rng, shape, np.float32, group_size=1)
    w[0, 5, 7] = np.nan
    w[-1, 40:72, 32:64] = 0  # an all-zero tile
    codes, scales = ref_moe(w, scaling, rounding, layout=layout)
    arg = np.ascontiguousarray(w.transpose(0, 2, 1)).transpose(0, 2, 1) if transposed_view else w
    if device != "cpu":
        arg = to_device(np.ascontiguousarray(w.transpose(0, 2, 1)), device)
        arg = arg.transpose(1, 2) if transposed_view else arg.transpose(1, 2).contiguous()
    data, sc = qq.quantize_moe(arg, scaling, rounding=rounding, scale_layout=layout)
    d = as_bytes(to_numpy(data))
    assert d.shape == shape
    e, d1, d2 = shape
    if device == "cpu":
        assert d.strides == (d1 * d2, 1, d1), d.strides
    # the all-zero tile may carry either sign on its zero codes
    loose = np.zeros(shape, bool)
    loose[-1, 40:72, 32:64] = True
    assert_bits_equal(np.where(loose, d & 0x7F, d), np.where(loose, codes & 0x7F, codes), "moe data")
    assert_bits_equal(as_bytes(to_numpy(sc)), scales, "moe scales")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("layout", ["linear", "blocked"])
@pytest.mark.parametrize("transposed_view", [False, True], ids=["rowmajor", "tview"])
@pytest.mark.parametrize("scaling", ["32x1", "32x32"])
def test_moe_dtypes(rng, scaling, transposed_view, layout, dtype, device):
    """MoE weights of every dtype, row-major (the GPU reads 4 16-bit columns a thread: a
    32x32 tile's amax spans 8 threads) and as the transposed view of [E, D2, D1] (a lane
    per half group, a 32x32 tile over two warps), D1 = 96 (an odd number of groups), a NaN
    and an all-zero tile: same bytes as the reference."""
    w = random_data(rng, (2, 96, 160), dtype, group_size=1)
    w[1, 3, 33] = np.nan
    w[0, 32:64, 64:96] = 0
    codes, scales = ref_moe(w, scaling, layout=layout)
    wd = to_device(np.ascontiguousarray(np.swapaxes(w, 1, 2)) if transposed_view else w, device)
    if transposed_view:
        wd = wd.transpose(1, 2) if device != "cpu" else np.swapaxes(wd, 1, 2)
    data, sc = qq.quantize_moe(wd, scaling, scale_layout=layout)
    d = as_bytes(to_numpy(data))
    loose = np.zeros(w.shape, bool)  # the all-zero tile may carry either sign on its zero codes
    loose[0, 32:64, 64:96] = True
    assert_bits_equal(np.where(loose, d & 0x7F, d), np.where(loose, codes & 0x7F, codes), "moe data")
    assert_bits_equal(as_bytes(to_numpy(sc)), scales, "moe scales")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scaling", ["32x1", "32x32"])
def test_moe_tview_unaligned(rng, scaling, device):
    """The transposed view of a column slice (rows 2 bytes off a 16-byte boundary): the GPU
    takes the tile kernel's column-major branch instead of moe_t_kernel - same bytes."""
    w = random_data(rng, (2, 64, 96), R.BF16, group_size=1)
    phys = np.zeros((2, 96, 65), R.BF16)        # [E, D2, D1 + 1]
    phys[:, :, 1:] = np.swapaxes(w, 1, 2)
    codes, scales = ref_moe(w, scaling, layout="blocked")
    wd = to_device(phys, device)[:, :, 1:]
    wd = wd.transpose(1, 2) if device != "cpu" else np.swapaxes(wd, 1, 2)
    data, sc = qq.quantize_moe(wd, scaling, scale_layout="blocked")
    assert_bits_equal(as_bytes(to_numpy(data)), codes, "moe data")
    assert_bits_equal(as_bytes(to_numpy(sc)), scales, "moe scales")


def test_moe_32x32_uses_tile_amax():
    """32x32: a tile whose max is 448 in one column gives every column of the tile the
    same scale byte 127 (ceil of 448/448 = 1): a small column of 1.0s is not rescaled."""
    w = np.ones((1, 32, 32), F32)
    w[0, 0, 0] = 448.0
    _, s32 = qq.quantize_moe(w, "32x32")
    _, s1 = qq.quantize_moe(w, "32x1")
    assert as_bytes(s32).reshape(-1).tolist() == [127]
    assert as_bytes(s1)[0, 0, 0] == 127 and as_bytes(s1)[0, 0, 1] == 127 - 8  # 1/448 -> 2^-8


@pytest.mark.parametrize("bad", ["mode", "shape", "scaling"])
def test_moe_errors(bad):
    w = np.ones((2, 64, 64), F32)
    if bad == "shape":
        with pytest.raises(ValueError, match="D1 and D2"):
            qq.quantize_moe(np.ones((2, 48, 64), F32))
    elif bad == "scaling":
        with pytest.raises(ValueError, match="scaling"):
            qq.quantize_moe(w, "16x16")
    else:
        with pytest.raises(ValueError, match="rounding|fp8_format"):
            qq.quantize_moe(w, fp8_format="e3m4")
