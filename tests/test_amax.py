"""qq.amax(x): max |x| over all of x as a float32 array of shape (); NaN anywhere gives NaN,
+-Inf gives Inf, an empty x gives 0. It is the conventional nvfp4 global scale."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import qq
import reference as R
from helpers import (BF16, DEVICES, assert_bits_equal, assert_quantized_equal, cast, dtype_params,
                     poison, random_data, to_device, to_numpy)

F32 = np.float32


def amax(x, device="cpu", **kw):
    return to_numpy(qq.amax(to_device(x, device), **kw))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", dtype_params())
# (1 << 17,) and one more: the last size one block reduces alone (a plain store, no
# memset) and the first that takes many blocks and atomicMax (cuda/amax.cu)
@pytest.mark.parametrize("shape", [(1,), (7,), (64, 256), (3, 5, 33), (300, 1024), (1 << 20,),
                                   (1 << 17,), ((1 << 17) + 1,)],
                         ids=lambda s: "x".join(map(str, s)))
def test_random(shape, dtype, device, rng):
    """Exact max |x| (float32 of the input value), position anywhere, negative or positive."""
    x32 = rng.standard_normal(shape).astype(F32)
    # plant the maximum at a random place with a random sign, so a reduction that skips
    # a tail, a block or the sign is caught
    i = tuple(int(rng.integers(0, n)) for n in shape)
    x32[i] = -1e4 if rng.integers(2) else 1e4
    x = cast(x32, dtype)
    got = amax(x, device)
    assert got.shape == () and got.dtype == F32
    assert_bits_equal(got, R.amax(x), "amax")
    assert got == abs(float(x[i]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", dtype_params())
def test_nonfinite_and_special(dtype, device):
    """NaN anywhere -> NaN (even next to Inf); -Inf -> +Inf; all zeros -> 0; -0.0 -> +0."""
    x = np.ones((5, 40), F32)
    x[3, 17] = np.nan
    x[0, 0] = np.inf
    assert np.isnan(amax(cast(x, dtype), device))
    y = np.ones((5, 40), F32)
    y[4, 39] = -np.inf
    assert amax(cast(y, dtype), device) == np.inf
    z = np.zeros((2, 3), F32)
    z[1, 1] = -0.0
    got = amax(cast(z, dtype), device)
    assert got == 0 and not np.signbit(got)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("where", ["first", "middle", "tail"])
def test_large_nonfinite_and_tail(dtype, where, device, rng):
    """Above one block's size (the many-block vector kernel on the GPU, which reduces |x|'s
    bit patterns): a NaN, an Inf or the maximum placed at the first element, in the middle, or
    among the last elements that do not fill a 16-byte vector (the total is odd)."""
    n = (1 << 18) + 5
    at = {"first": 0, "middle": n // 2 + 3, "tail": n - 2}[where]
    x32 = rng.standard_normal(n).astype(F32)
    x32[at] = -300.0
    x = cast(x32, dtype)
    assert amax(x, device) == 300.0
    for v, want in ((np.inf, np.inf), (-np.inf, np.inf)):
        y = x.copy()
        y[at] = cast(np.array([v], F32), dtype)[0]
        assert amax(y, device) == want
    y = x.copy()
    y[at] = cast(np.array([np.nan], F32), dtype)[0]
    y[n - 1] = cast(np.array([-np.inf], F32), dtype)[0]
    assert np.isnan(amax(y, device))
    # subnormals and negative zeros only: the largest subnormal, exactly (a subnormal of
    # each dtype: bfloat16's smallest is ~9.2e-41, so float32's -3e-41 would round to 0 there)
    z = np.zeros(n, F32)
    z[::7] = -0.0
    z[at] = {np.dtype(F32): -3e-41, np.dtype(np.float16): -3e-6, BF16: -3e-39}[np.dtype(dtype)]
    zc = cast(z, dtype)
    assert zc[at] != 0 and abs(float(zc[at])) < float(ml_dtypes.finfo(zc.dtype).smallest_normal)
    got = amax(zc, device)
    assert_bits_equal(got, R.amax(zc), "amax of zeros and a subnormal")
    assert got != 0 and not np.signbit(got)


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    """An empty x gives 0."""
    got = amax(np.zeros((0, 16), F32), device)
    assert got.shape == () and got == 0


@pytest.mark.parametrize("device", DEVICES)
def test_subnormal(device):
    """Only subnormals: the largest one, exactly (no flush to zero)."""
    x = np.array([1e-45, -3e-41, 2e-41], F32)
    assert_bits_equal(amax(x, device), np.array(3e-41, F32).reshape(()), "amax")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(16, 64), (512, 512)])     # one block / many blocks
def test_out_buffer(device, shape, rng):
    """out= (float32, one element, poisoned) is written and returned."""
    x = random_data(rng, shape, BF16, 64)
    out = to_device(poison((), F32), device)
    got = qq.amax(to_device(x, device), out=out)
    assert got is out
    assert_bits_equal(to_numpy(out), R.amax(x), "amax out=")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", dtype_params())
def test_misaligned_start(dtype, device, rng):
    """A compact x that starts one element past a 16-byte boundary (the one-block GPU
    kernel reads 16-byte vectors and must not take it): exact all the same."""
    for n in (1001, (1 << 18) + 1):     # one block; many blocks (the vector kernel's size)
        x = cast(rng.standard_normal(n).astype(F32), dtype)
        x[700] = 1e4 if dtype != "float16" else 1e3
        assert_bits_equal(amax(x[1:], device), R.amax(np.ascontiguousarray(x[1:])), "amax of x[1:]")


def test_strided_view(rng):
    """A row-strided view: only the viewed rows count."""
    x = random_data(rng, (8, 64), F32, 64, varied=False)
    x[1, 5] = 1e6  # not in x[::2]
    v = x[::2]
    assert_bits_equal(amax(v), R.amax(np.ascontiguousarray(v)), "amax of a view")
    assert amax(v) < 1e6


def test_is_a_usable_global_scale(rng):
    """quantize(x, 'nvfp4', global_scale=qq.amax(x)) equals the reference with R.amax(x)."""
    x = random_data(rng, (32, 64), BF16, 16)
    gs = qq.amax(x)
    q = qq.quantize(x, mode="nvfp4", global_scale=gs)
    ref = R.quantize(x, mode="nvfp4", global_scale=R.amax(x))
    assert_quantized_equal(q, ref, x)
