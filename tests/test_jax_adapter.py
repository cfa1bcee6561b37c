"""qq.jax.qq_linear (jax.custom_vjp): gradients against float64 NumPy, eager and under
jax.jit (XLA custom calls; tests/test_jax_ffi.py has the bit-exact comparisons), on JAX's
default device. Skipped without jax."""

from __future__ import annotations

import math

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
qqj = pytest.importorskip("qq.jax")
from helpers import raises  # noqa: E402

SQNR_MIN = {"mxfp8": 27.0, "nvfp4": 13.0, "mxfp4": 12.0}  # as tests/test_torch_adapter.py


def sqnr(got, ref):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    err = ((got - ref) ** 2).sum()
    return math.inf if err == 0 else 10 * math.log10((ref ** 2).sum() / err)


def data(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((3, 40, 256)).astype(np.float32)
    w = (rng.standard_normal((128, 256)) / 16).astype(np.float32)
    b = rng.standard_normal(128).astype(np.float32)
    dy = rng.standard_normal((3, 40, 128)).astype(np.float32)
    return x, w, b, dy


def ref_grads(x, w, b, dy):
    x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
    y = x64 @ w64.T + b
    x2, dy2 = x64.reshape(-1, x.shape[-1]), dy64.reshape(-1, dy.shape[-1])
    return y, (dy2 @ w64).reshape(x.shape), dy2.T @ x2, dy2.sum(0)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("mode", ["mxfp8", "nvfp4", "mxfp4"])
def test_gradients(mode, jit):
    x, w, b, dy = data()
    y_ref, dx_ref, dw_ref, db_ref = ref_grads(x, w, b, dy)

    def f(x, w, b):
        return qqj.qq_linear(x, w, b, mode=mode)

    fn = jax.jit(f) if jit else f
    y, vjp = jax.vjp(fn, jnp.asarray(x), jnp.asarray(w), jnp.asarray(b))
    dx, dw, db = vjp(jnp.asarray(dy))
    assert y.shape == (3, 40, 128) and y.dtype == jnp.float32
    for name, got, ref in (("y", y, y_ref), ("dx", dx, dx_ref), ("dw", dw, dw_ref)):
        s = sqnr(got, ref)
        assert SQNR_MIN[mode] <= s < 80, f"{mode} {name}: SQNR {s:.1f} dB"
    assert np.allclose(np.asarray(db), db_ref, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_bias_gradient_in_the_bias_dtype(jit):
    """Each gradient in its own parameter's dtype (JAX's rule) where the bias's dtype is not
    w's: the bias's gradient is the sum of dy in float32, then the bias's dtype."""
    x, w, _, dy = data()
    for wdt, bdt in ((jnp.bfloat16, jnp.float32), (jnp.float32, jnp.bfloat16)):
        xj, wj = jnp.asarray(x, wdt), jnp.asarray(w, wdt)
        bj = jnp.asarray(np.linspace(-1, 1, 128), bdt)

        def f(x, w, b):
            return qqj.qq_linear(x, w, b, mode="mxfp8")

        fn = jax.jit(f) if jit else f
        y, vjp = jax.vjp(fn, xj, wj, bj)
        dx, dw, db = vjp(jnp.asarray(dy, y.dtype))
        assert (dx.dtype, dw.dtype, db.dtype) == (xj.dtype, wj.dtype, bj.dtype)
        want = np.asarray(jnp.asarray(dy, y.dtype), np.float32).reshape(-1, 128).sum(0)
        tol = 1e-2 if bdt == jnp.bfloat16 else 1e-5   # (the sum's order may differ from NumPy's)
        assert np.allclose(np.asarray(db, np.float32), want, rtol=tol, atol=tol)


def test_jit_matches_eager():
    """The jitted path (XLA custom calls) computes the same numbers as the eager path."""
    x, w, b, _ = data(1)
    f = lambda x, w, b: qqj.qq_linear(x, w, b, mode="mxfp8")  # noqa: E731
    a = np.asarray(f(jnp.asarray(x), jnp.asarray(w), jnp.asarray(b)))
    c = np.asarray(jax.jit(f)(jnp.asarray(x), jnp.asarray(w), jnp.asarray(b)))
    assert np.allclose(a, c, rtol=1e-6, atol=1e-6)


def test_training_steps():
    """A few SGD steps of a linear regression reduce the loss like the float model."""
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal((256, 64)).astype(np.float32))
    wt = rng.standard_normal((32, 64)).astype(np.float32) / 8
    y = x @ jnp.asarray(wt).T

    def loss(w, lin):
        return jnp.mean((lin(x, w) - y) ** 2)

    qlin = lambda x, w: qqj.qq_linear(x, w, None, mode="mxfp8")  # noqa: E731
    flin = lambda x, w: x @ w.T  # noqa: E731
    finals = []
    for lin in (flin, qlin):
        w = jnp.zeros((32, 64), jnp.float32)
        first = float(loss(w, lin))
        for _ in range(30):
            w = w - 0.5 * jax.grad(loss)(w, lin)
        finals.append((first, float(loss(w, lin))))
    (f0, f1), (q0, q1) = finals
    assert q1 < q0 / 5 and q1 <= 1.5 * f1 + 1e-3, finals


def test_bad_input():
    x, w = jnp.ones((4, 64)), jnp.ones((32, 64))
    raises(ValueError, "mode", qqj.qq_linear, x, w, None, mode="int4")
    raises(ValueError, ("in_features", "x"), qqj.qq_linear, jnp.ones((4, 63)), w)
    raises(ValueError, "b", qqj.qq_linear, x, w, jnp.ones(31))
    raises(TypeError, "x", qqj.qq_linear, jnp.ones((4, 64), jnp.int32), w)
