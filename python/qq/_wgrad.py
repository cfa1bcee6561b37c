"""grouped_qqmm_wgrad: the weight-gradient GEMM of an MoE layer, per expert
dw[e] = q(x_e)^T @ q(dy_e), both operands quantized along the tokens.

Composed from libqq calls (quantize_colwise and qqmm per expert) in Python: each expert's
rows are quantized on their own (a block never straddles two experts), zero-padded to a
multiple of the block when the group is ragged (exact: zeros add nothing and do not change
a block's amax). The offsets are read on the host once, as grouped_qqmm does. There is no
C ABI entry for it yet (docs/api.md).
"""

from __future__ import annotations

import numpy as np

from ._qq import qqmm, quantize_colwise

_GROUP = {"mxfp8": 32, "mxfp4": 32, "nvfp4": 16}


def _module(a) -> str:
    return type(a).__module__.split(".")[0]


def _host_ints(a) -> np.ndarray:
    mod = _module(a)
    if mod == "torch":
        return a.detach().cpu().numpy()
    if mod == "cupy":
        return a.get()
    return np.asarray(a)


def _pad_rows(a, rows: int):
    """a [r, c] with zero rows appended up to `rows`, in a's framework and device."""
    extra = rows - a.shape[0]
    if extra == 0:
        return a
    mod = _module(a)
    if mod == "torch":
        import torch
        return torch.cat([a, a.new_zeros((extra, a.shape[1]))], dim=0)
    if mod == "cupy":
        import cupy
        return cupy.concatenate([a, cupy.zeros((extra, a.shape[1]), a.dtype)], axis=0)
    if mod in ("jax", "jaxlib"):
        import jax.numpy as jnp
        return jnp.concatenate([a, jnp.zeros((extra, a.shape[1]), a.dtype)], axis=0)
    return np.concatenate([a, np.zeros((extra, a.shape[1]), a.dtype)], axis=0)


def _zeros(like, shape, dtype: str):
    mod = _module(like)
    if mod == "torch":
        import torch
        return torch.zeros(shape, dtype=getattr(torch, dtype), device=like.device)
    if mod == "cupy":
        import cupy
        return cupy.zeros(shape, dtype)
    if mod in ("jax", "jaxlib"):
        import jax.numpy as jnp
        return jnp.zeros(shape, dtype)
    import ml_dtypes  # noqa: F401  (numpy's name for bfloat16)
    return np.zeros(shape, np.dtype(dtype))


def grouped_qqmm_wgrad(x, dy, offsets, mode="mxfp8", *, global_scale_x=None, global_scale_dy=None,
                       rounding="ceil", fp8_format="e4m3", dtype="float32", stream=None):
    """Weight gradient of grouped_qqmm: tokens x [T, K] and output gradients dy [T, N], both
    sorted by expert, int32 offsets [E] (cumulative group ends, last = T; empty groups
    legal) -> dw [E, K, N] with dw[e] = q(x[rows of e])^T @ q(dy[rows of e]), fp32
    accumulation, both quantized along T (mxfp8 / mxfp4 blocks of 32, nvfp4 of 16 with the
    per-tensor global scales given). An empty group gives dw[e] = 0. dtype: "float32"
    (default), "bfloat16" or "float16". The result is in x's framework and device.
    """
    func = "grouped_qqmm_wgrad"
    if mode not in _GROUP:
        raise ValueError(f"{func}: mode must be one of {tuple(_GROUP)}; got {mode!r}")
    if len(x.shape) != 2 or len(dy.shape) != 2:
        raise ValueError(f"{func}: x must be [T, K] and dy [T, N]; got shapes {tuple(x.shape)} and {tuple(dy.shape)}")
    t, k = (int(v) for v in x.shape)
    if int(dy.shape[0]) != t:
        raise ValueError(f"{func}: x and dy must have the same number of tokens; got {t} and {int(dy.shape[0])}")
    n = int(dy.shape[1])
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"{func}: dtype must be 'float32', 'bfloat16' or 'float16'; got {dtype!r}")
    if mode == "nvfp4" and (global_scale_x is None) != (global_scale_dy is None):
        raise ValueError(f"{func}: give both global_scale_x and global_scale_dy (nvfp4) or neither")
    if mode != "nvfp4" and (global_scale_x is not None or global_scale_dy is not None):
        raise ValueError(f"{func}: global scales are nvfp4 only; mode is {mode!r}")
    if str(getattr(offsets, "dtype", "")).rpartition(".")[2] != "int32" or len(offsets.shape) != 1:
        raise ValueError(f"{func}: offsets must be a 1-D int32 array of cumulative group ends; got "
                         f"dtype {getattr(offsets, 'dtype', None)}, shape {tuple(getattr(offsets, 'shape', ()))}")
    ends = _host_ints(offsets).astype(np.int64)
    if ends.size == 0 or (np.diff(ends) < 0).any() or ends[0] < 0 or ends[-1] != t:
        raise ValueError(f"{func}: offsets must be non-decreasing group ends with the last equal to T = {t}; "
                         f"got {ends.tolist()[:8]}{'...' if ends.size > 8 else ''}")
    g = _GROUP[mode]
    e_count = int(ends.size)
    jax_like = _module(x) in ("jax", "jaxlib")
    dw = None if jax_like else _zeros(x, (e_count, k, n), dtype)
    parts = []
    start = 0
    qkw = {"mode": mode, "rounding": rounding, "fp8_format": fp8_format, "stream": stream}
    for e in range(e_count):
        end = int(ends[e])
        rows = end - start
        if rows == 0:
            parts.append(None)
            continue
        padded = -(-rows // g) * g
        xe = _pad_rows(x[start:end], padded)
        dye = _pad_rows(dy[start:end], padded)
        qx = quantize_colwise(xe, global_scale=global_scale_x, **qkw)      # x_e^T [K, T_e], blocks along T
        qdy = quantize_colwise(dye, global_scale=global_scale_dy, **qkw)   # dy_e^T [N, T_e]
        if jax_like:
            parts.append(qqmm(qx, qdy, mode=mode, dtype=dtype, stream=stream))
        else:
            qqmm(qx, qdy, mode=mode, dtype=dtype, out=dw[e], stream=stream)
        start = end
    if jax_like:
        import jax.numpy as jnp
        zero = jnp.zeros((k, n), dtype)
        return jnp.stack([zero if p is None else p for p in parts])
    return dw
