"""Parameter combinations the format specifications leave open, as decided in docs/formats.md / qq.h:
`rounding` belongs to the UE8M0 modes and `fp8_format` to mxfp8; anything else is refused
with a message naming the parameter instead of being silently ignored."""

import numpy as np
import pytest

from helpers import raises

import qq

X = np.ones((4, 64), np.float32)


@pytest.mark.parametrize("mode", ["nvfp4", "affine"])
def test_floor_rounding_only_for_mx(mode):
    """rounding='floor' is the OCP MX rule for UE8M0 scales; nvfp4 (E4M3 scale) and affine
    have no such choice."""
    raises(ValueError, "rounding", qq.quantize, X, mode=mode, rounding="floor")


@pytest.mark.parametrize("mode", ["nvfp4", "mxfp4", "affine"])
def test_e5m2_only_for_mxfp8(mode):
    raises(ValueError, "fp8_format", qq.quantize, X, mode=mode, fp8_format="e5m2")


def test_floor_accepted_for_mx():
    """mxfp4 takes both roundings. amax 7: ceil is the smallest power of two >= 7/6, i.e. 2
    (byte 128); floor is 2^(floor(log2 7) - 2) = 1 (byte 127), 7 then saturating to 6."""
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = 7.0
    c = qq.quantize(x, mode="mxfp4", rounding="ceil")
    f = qq.quantize(x, mode="mxfp4", rounding="floor")
    assert np.asarray(c.scales)[0, 0] == 128 and np.asarray(f.scales)[0, 0] == 127
