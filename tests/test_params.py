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


class _Index:
    """An integer argument whose value can change (any object with __index__ is one)."""

    def __init__(self, v):
        self.v = v

    def __index__(self):
        return self.v

    def __hash__(self):
        return hash(self.v)

    def __eq__(self, other):
        return self.v == other


def test_params_follow_a_changed_argument_value():
    """Resolved parameters are cached (per value, and by identity for the last call's
    arguments), but only for plain str / int / None arguments: an argument object whose
    value changed between two calls gets the new value, and an unhashable one (a 0-d NumPy
    array) is accepted rather than refused by the cache."""
    x = np.ones((2, 128), np.float32)
    g = _Index(64)
    assert qq.quantize(x, group_size=g).group_size == 64
    g.v = 32
    assert qq.quantize(x, group_size=g).group_size == 32
    a = np.array(64)
    assert qq.quantize(x, group_size=a).group_size == 64
    a[()] = 128
    assert qq.quantize(x, group_size=a).group_size == 128
    # the same plain arguments twice, then others: each call's own values
    assert qq.quantize(x, mode="nvfp4").group_size == 16
    assert qq.quantize(x, mode="nvfp4").group_size == 16
    assert qq.quantize(x, group_size=128, bits=8).bits == 8
    assert qq.quantize(x).group_size == 64
