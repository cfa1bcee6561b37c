"""Blocked scale layout (docs/formats.md, Scale layouts; cuBLASLt's 1D block-scaling layout):
rows padded to 128, scale columns to 4, zero padding, and
off(r, c) = (r/128)*128*C4 + (c/4)*512 + (r%32)*16 + ((r%128)/32)*4 + (c%4).
qq.swizzle_scales / qq.unswizzle_scales convert; quantize(scale_layout="blocked") writes
the layout directly and must equal swizzle(linear)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import qq
import reference as R
from helpers import (BF16, DEVICES, FpCfg, as_bytes, assert_bits_equal, poison, qq_quantize,
                     random_data, to_device)

F32 = np.float32

SHAPES = [(128, 4), (256, 8), (100, 3), (4, 4), (50, 10), (384, 12), (1, 1), (129, 5), (7,),
          (2, 100, 3), (2, 3, 50, 10)]


def sid(shape):
    return "x".join(map(str, shape))


def swz(device, lin, **kw):
    return qq.swizzle_scales(to_device(lin, device), **kw)


@pytest.mark.parametrize("device", DEVICES)
def test_known_offsets(device):
    """Where single entries land in a 256 x 8 linear matrix (C4 = 8): (0,1) -> flat 1,
    (1,0) -> 16, (31,0) -> 496, (32,0) -> 4, (96,0) -> 12, (0,4) -> 512,
    (127,7) -> 512 + 496 + 12 + 3, (128,0) -> 1024."""
    cases = {(0, 1): 1, (1, 0): 16, (31, 0): 496, (32, 0): 4, (96, 0): 12, (0, 4): 512,
             (127, 7): 512 + 31 * 16 + 3 * 4 + 3, (128, 0): 128 * 8, (0, 0): 0}
    for (r, c), flat in cases.items():
        lin = np.zeros((256, 8), np.uint8)
        lin[r, c] = 0x5A
        blk = as_bytes(swz(device, lin))
        assert blk.shape == (256, 8)
        hits = np.flatnonzero(blk.ravel())
        assert hits.tolist() == [flat], f"({r},{c}) landed at {hits.tolist()}, expected {flat}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=sid)
def test_swizzle_matches_reference(shape, device, rng):
    """swizzle equals the reference (checked itself against the torchao construction),
    with zero padding, for 1D, 2D and batched scales."""
    lin = rng.integers(1, 256, size=shape, dtype=np.uint8)
    want = R.swizzle(lin)
    got = swz(device, lin)
    assert_bits_equal(as_bytes(got), want, "swizzle")
    back = qq.unswizzle_scales(got, shape)
    assert_bits_equal(as_bytes(back), lin, "unswizzle(swizzle(x))")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(100, 3), (2, 3, 50, 10), (7,)], ids=sid)
def test_unswizzle_reads_only_its_entries(shape, device, rng):
    """unswizzle ignores the padding: garbage there does not leak into the result."""
    lin = rng.integers(0, 256, size=shape, dtype=np.uint8)
    blk = R.swizzle(lin)
    mask = R.swizzle(np.ones(shape, np.uint8)) == 0
    blk[mask] = 0xEE
    got = qq.unswizzle_scales(to_device(blk, device), shape)
    assert_bits_equal(as_bytes(got), lin, "unswizzle")


@pytest.mark.parametrize("device", DEVICES)
def test_out_buffers_poisoned(device, rng):
    """swizzle into a 0xAB-poisoned out= must zero the padding; unswizzle must fill its out=
    completely; both return the out object."""
    lin = rng.integers(1, 256, size=(2, 50, 6), dtype=np.uint8)
    out = to_device(poison((2, 128, 8), np.uint8), device)
    got = qq.swizzle_scales(to_device(lin, device), out=out)
    assert got is out
    assert_bits_equal(as_bytes(out), R.swizzle(lin), "swizzle out=")
    out2 = to_device(poison((2, 50, 6), np.uint8), device)
    got2 = qq.unswizzle_scales(out, (2, 50, 6), out=out2)
    assert got2 is out2
    assert_bits_equal(as_bytes(out2), lin, "unswizzle out=")


@pytest.mark.parametrize("dtype", [np.uint8, ml_dtypes.float8_e8m0fnu, ml_dtypes.float8_e4m3fn])
def test_swizzle_byte_dtypes(dtype, rng):
    """Scales may be uint8 or 1-byte float8 arrays: the bytes move, whatever their type."""
    lin = rng.integers(0, 127, size=(33, 6), dtype=np.uint8)
    got = qq.swizzle_scales(lin.view(dtype))
    assert_bits_equal(as_bytes(got), R.swizzle(lin), "swizzle")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cfg", [FpCfg("nvfp4"), FpCfg("nvfp4", global_scale=True), FpCfg("mxfp4", "floor"),
                                 FpCfg("mxfp8"), FpCfg("mxfp8", "ceil", "e5m2")], ids=str)
@pytest.mark.parametrize("shape", [(1, 64), (100, 64), (129, 96), (2, 3, 40, 64), (64,), (256, 512)],
                         ids=sid)
def test_quantize_blocked_equals_swizzled_linear(shape, cfg, device, rng):
    """quantize(scale_layout="blocked") writes exactly swizzle(quantize(linear).scales), the
    same packed data, and that swizzled blocked matrix also equals qq.swizzle_scales."""
    x = random_data(rng, shape, BF16, cfg.group_size)
    gs = R.amax(x) if cfg.global_scale else None
    lin = qq_quantize(x, device, scale_layout="linear", **cfg.kwargs(gs))
    blk = qq_quantize(x, device, scale_layout="blocked", **cfg.kwargs(gs))
    want = R.swizzle(R.quantize(x, **cfg.kwargs(gs)).scales)
    assert_bits_equal(as_bytes(blk.scales), want, "blocked scales")
    assert_bits_equal(as_bytes(blk.data), as_bytes(lin.data), "data (blocked vs linear)")
    assert_bits_equal(as_bytes(qq.swizzle_scales(lin.scales)), want, "swizzle(linear)")
    assert_bits_equal(as_bytes(qq.unswizzle_scales(blk.scales, tuple(lin.scales.shape))),
                      as_bytes(lin.scales), "unswizzle(blocked)")


def test_blocked_padding_is_zero_after_quantize(rng):
    """The padding that quantize writes is zero even where real scales would be non-zero
    (rows 100..127, columns 3..3 of a 100 x 3-group matrix)."""
    x = random_data(rng, (100, 96), F32, 32, varied=False)
    q = qq.quantize(x, mode="mxfp8", scale_layout="blocked")
    blk = as_bytes(q.scales)
    pad = R.swizzle(np.ones((100, 3), np.uint8)) == 0
    assert blk.shape == (128, 4)
    assert (blk[pad] == 0).all()
    assert (blk[~pad] != 0).all()


def test_unswizzle_shape_argument(rng):
    """unswizzle takes the linear shape: a list or a tuple."""
    lin = rng.integers(1, 256, size=(3, 9), dtype=np.uint8)
    blk = R.swizzle(lin)
    for shape in ((3, 9), [3, 9]):
        assert_bits_equal(as_bytes(qq.unswizzle_scales(blk, shape)), lin, f"shape {shape!r}")
