"""qq.jax: a JAX linear layer with quantized operands (imported on demand; needs jax).

    from qq.jax import qq_linear
    y = qq_linear(x, w, b, mode="mxfp8")      # jax.custom_vjp: grads for x, w and b

The same three GEMMs as qq.torch (docs/adapters.md): y = q(x) @ q(W)^T contracting K,
dx = q(dy) @ q(W) contracting N, dW = q(dy)^T @ q(x) contracting the tokens T, each through
libqq's qqmm with fp32 accumulation. mxfp8 quantizes W with 32x32 tiles (qq.quantize_moe),
so one set of codes and scales serves both weight GEMMs; nvfp4 / mxfp4 quantize W along K
and along N (qq.quantize_colwise). wgrad operands are quantized along T, padded with zero
rows to the block.

How it runs: called on concrete arrays (eager), every step calls libqq directly on the
arrays through DLPack - on the GPU when they live there (synchronously: qq waits for its
work before returning, see docs/api.md). Under jax.jit (or grad of a jitted function, or
jax.vmap) the operands are tracers and the same qq calls become XLA FFI custom calls
(qq/_jax_ffi.py): XLA runs libqq's kernels on its own buffers and stream, on the CPU or
the GPU, with no host round trip and no synchronization. Only where those handlers cannot
be registered (qq._jax_ffi.status() says why) do the forward and the backward each run as
one jax.pure_callback on host copies with libqq's CPU backend (the same numbers, a round
trip through host memory per call). The backward quantizes W again from the saved float
weight (bit-identical to the forward's).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

import qq
from qq import _jax_ffi   # QuantizedArray as a pytree; the XLA handlers (registered on first use)

__all__ = ["qq_linear", "MODES"]

MODES = ("mxfp8", "nvfp4", "mxfp4")
_GROUP = {m: g for m, (g, _) in qq._qq._mode_defaults().items() if m != "affine"}  # libqq's defaults


def _xp(a):
    return np if isinstance(a, np.ndarray) else jnp


def _gs(a, mode):
    return qq.amax(a) if mode == "nvfp4" else None


def _weight_operands(w, mode):
    """(forward, dgrad) qqmm arguments for W [N, K] (see qq.torch._quantize_weight)."""
    xp = _xp(w)
    if mode == "mxfp8":
        # one 32x32 quantization; linear scales [1, N/32, K/32] expanded per row here
        data, s = qq.quantize_moe(w[None], scaling="32x32")      # D1 = N: codes of W, logical [1, N, K]
        codes, s = xp.asarray(data)[0], xp.asarray(s)[0]
        if xp is np:  # NumPy keeps quantize_moe's column-major layout; libqq wants unit stride along rows
            codes = np.ascontiguousarray(codes)
        fwd = {"w": codes, "scales": xp.repeat(s, 32, axis=0)}                 # [N, K], [N, K/32]
        codes_t = xp.transpose(codes)
        if xp is np:
            codes_t = np.ascontiguousarray(codes_t)
        bwd = {"w": codes_t, "scales": xp.repeat(xp.transpose(s), 32, axis=0)}  # [K, N], [K, N/32]
        return fwd, bwd
    gs = _gs(w, mode)
    return ({"w": qq.quantize(w, mode=mode, global_scale=gs)},
            {"w": qq.quantize_colwise(w, mode=mode, global_scale=gs)})


def _qqmm(a, wop, mode, dtype, bias=None):
    w = wop["w"]
    gw = w.global_scale if isinstance(w, qq.QuantizedArray) else None
    return qq.qqmm(a, w, wop.get("scales"), mode=mode, global_scale_x=_gs(a, mode), global_scale_w=gw,
                   bias=bias, dtype=dtype)


def _pad_rows(a, g):
    xp = _xp(a)
    r = (-a.shape[0]) % g if a.shape[0] else g   # no tokens: one block of zeros (a zero dW)
    return a if r == 0 else xp.concatenate([a, xp.zeros((r, a.shape[1]), a.dtype)], axis=0)


def _forward(x2, w, b, mode):
    fwd, _ = _weight_operands(w, mode)
    return _qqmm(x2, fwd, mode, str(x2.dtype), bias=b)


def _backward(x2, w, dy2, mode, bias_dtype):
    _, bwd = _weight_operands(w, mode)
    dx = _qqmm(dy2, bwd, mode, str(x2.dtype))
    g = _GROUP[mode]
    dyp, xpd = _pad_rows(dy2, g), _pad_rows(x2, g)
    qdy = qq.quantize_colwise(dyp, mode=mode, global_scale=_gs(dyp, mode))
    qx = qq.quantize_colwise(xpd, mode=mode, global_scale=_gs(xpd, mode))
    dw = qq.qqmm(qdy, qx, mode=mode, dtype=str(w.dtype))
    # the bias's gradient in the bias's dtype (JAX gives a gradient its parameter's dtype; a bias
    # may differ from w's)
    db = dy2.astype(np.float32).sum(axis=0).astype(bias_dtype) if bias_dtype is not None else None
    return dx, dw, db


_TRACER = getattr(jax.core, "Tracer", ())


def _traced(*arrays):
    """True when any operand is a tracer (inside jit / vmap / grad tracing): no data to read."""
    return any(isinstance(a, _TRACER) for a in arrays if a is not None)


def _host_fallback(*arrays):
    """Tracers, and no XLA handlers to run qq on them: the pure_callback path."""
    return _traced(*arrays) and not _jax_ffi.available()


def _host(fn, result_shapes, *args):
    """Run fn on host NumPy copies of args (libqq's CPU backend) inside a traced function."""
    def cb(*a):
        out = fn(*[None if v is None else np.asarray(v) for v in a])
        return tuple(np.asarray(o) for o in out)
    return jax.pure_callback(cb, result_shapes, *args)


def _check(x, w, b, mode):
    if mode not in MODES:
        raise ValueError(f"qq_linear: mode must be one of {MODES}; got {mode!r}")
    for name, a in (("x", x), ("w", w), ("b", b)):
        if a is not None and not (hasattr(a, "ndim") and hasattr(a, "dtype")):
            raise TypeError(f"qq_linear: {name} must be a JAX or NumPy array; got {type(a).__name__}")
    if w.ndim != 2:
        raise ValueError(f"qq_linear: w must be [out_features, in_features]; got shape {w.shape}")
    if x.ndim < 1 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"qq_linear: x's last axis must equal w's in_features ({w.shape[1]}); got {x.shape}")
    if b is not None and b.shape != (w.shape[0],):
        raise ValueError(f"qq_linear: b must have shape ({w.shape[0]},); got {b.shape}")
    for name, a in (("x", x), ("w", w), ("b", b)):
        if a is not None and jnp.dtype(a.dtype) not in (jnp.float32, jnp.bfloat16, jnp.float16):
            raise TypeError(f"qq_linear: {name} must be float32, bfloat16 or float16; got {a.dtype}")
    g = _GROUP[mode]
    if w.shape[0] % g or w.shape[1] % g or w.shape[0] <= 0 or w.shape[1] <= 0:
        raise ValueError(f"qq_linear: in_features ({w.shape[1]}) and out_features ({w.shape[0]}) must be "
                         f"positive multiples of {g} for mode {mode!r}")


@partial(jax.custom_vjp, nondiff_argnums=(3,))
def _linear(x, w, b, mode):
    y, _ = _linear_fwd(x, w, b, mode)
    return y


def _linear_fwd(x, w, b, mode):
    _check(x, w, b, mode)
    shape = x.shape
    x2 = jnp.reshape(x, (-1, shape[-1]))
    if _host_fallback(x2, w, b):
        out = jax.ShapeDtypeStruct((x2.shape[0], w.shape[0]), x2.dtype)
        if b is None:
            (y,) = _host(lambda a, ww: (_forward(a, ww, None, mode),), (out,), x2, w)
        else:
            (y,) = _host(lambda a, ww, bb: (_forward(a, ww, bb, mode),), (out,), x2, w, b)
    else:
        y = jnp.asarray(_forward(x2, w, b, mode))
    # residuals: arrays only (x's shape comes back from dy's, the bias flag from b)
    return jnp.reshape(y, (*shape[:-1], w.shape[0])), (x2, w, b)


def _linear_bwd(mode, res, dy):
    x2, w, b = res
    has_bias, shape = b is not None, (*dy.shape[:-1], w.shape[1])
    dy2 = jnp.reshape(dy, (-1, dy.shape[-1])).astype(x2.dtype)
    if _host_fallback(x2, w, dy2):
        shapes = [jax.ShapeDtypeStruct(x2.shape, x2.dtype), jax.ShapeDtypeStruct(w.shape, w.dtype)]
        if has_bias:
            shapes.append(jax.ShapeDtypeStruct((w.shape[0],), b.dtype))
        bdt = b.dtype if has_bias else None
        outs = _host(lambda a, ww, d: tuple(o for o in _backward(a, ww, d, mode, bdt) if o is not None),
                     tuple(shapes), x2, w, dy2)
        dx, dw = outs[0], outs[1]
        db = outs[2] if has_bias else None
    else:
        dx, dw, db = _backward(x2, w, dy2, mode, b.dtype if has_bias else None)
        dx, dw = jnp.asarray(dx), jnp.asarray(dw)
        db = None if db is None else jnp.asarray(db)
    return jnp.reshape(dx, shape), dw, db


_linear.defvjp(_linear_fwd, _linear_bwd)


def qq_linear(x, w, b=None, mode: str = "mxfp8"):
    """x @ w.T + b with quantized operands in the forward and both backward GEMMs."""
    return _linear(x, w, b, mode)
