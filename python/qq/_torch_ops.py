"""qq's operations as torch custom ops (torch.library), for torch.compile (docs/api.md).

Imported on demand - by qq.torch, by `import qq` when torch is already imported, or by the
first qq call traced by torch.compile - never by `import qq` alone: qq does not need torch.

Each op takes and returns tensors only (a QuantizedArray is a Python object torch's
dispatcher cannot carry). The eager implementation calls the qq function of the same name
(qq._qq, the Cython layer); the fake implementation computes output shapes and dtypes in
Python from the same rules qqQuantizedShapes states (libqq/include/qq/qq.h), on symbolic
sizes when the batch axes are dynamic, without calling libqq (result dtypes: qq._qq._torch_result_dtypes, a pure rule).

  qq::quantize(x, global_scale?, mode, group_size, bits, rounding, scale_layout,
               fp8_format, torch_dtypes) -> [data, scales(, biases)]
  qq::quantize_colwise(... , rowwise, torch_dtypes) -> [data_t, scales_t(, biases_t)(, data, scales(, biases))]
  qq::quantize_dequantize(x, global_scale?, mode, rounding, fp8_format, rowwise, colwise)
                         -> [rows?, cols?]   bfloat16, x's shape
  qq::quantize_dequantize_moe(w, rounding, fp8_format, values, transposed) -> [values?, transposed?]
  qq::dequantize(w, scales, biases?, global_scale?, mode, group_size, bits, scale_layout,
                 fp8_format, dtype) -> Tensor
  qq::amax(x) -> Tensor                        float32, shape ()
  qq::swiglu(x) -> Tensor                      x [..., 2F] -> [..., F], x's dtype
  qq::qqmm(x, x_scales?, global_scale_x?, w, scales?, global_scale_w?, w_values?, bias?, c?,
           beta, mode, group_size, bits, rounding, x_layout, w_layout, fp8_format, dtype,
           x_prepared, w_prepared)
  qq::quantized_matmul(x, w, scales, biases?, global_scale?, bias?, transpose, n, mode,
                       group_size, bits, scale_layout, fp8_format, dtype)
  qq::gather_qmm(x, w, scales, biases?, rhs_indices, global_scale?, bias?, transpose, n,
                 mode, group_size, bits, scale_layout, fp8_format, dtype)
  qq::swizzle_scales(scales) / qq::unswizzle_scales(scales, shape)
  qq::quantize_moe(w, scaling, rounding, scale_layout, fp8_format, torch_dtypes) -> [data, scales]
  qq::grouped_qqmm(x, x_scales?, global_scale_x?, w, scales?, global_scale_w?, offsets, mode,
                   group_size, bits, rounding, x_layout, w_layout, fp8_format, moe_scaling,
                   dtype)                      the offsets may be read on the host inside the op
  qq::grouped_qqmm_wgrad(x, dy, offsets, global_scale_x?, global_scale_dy?, mode, rounding,
                         fp8_format, dtype) -> [E, K, N]

The public functions of this module (quantize, qqmm, ...) take qq's public signatures,
turn QuantizedArray / PreparedWeight arguments into tensors, call the op and rebuild the
QuantizedArray; qq's public functions call them while torch.compile traces (qq._dispatch).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import _qq
from ._qq import DecodeWeight, PreparedWeight, QuantizedArray
from ._dispatch import check_torch_dtypes as _check_torch_dtypes
from ._dispatch import check_flag, qqmm_operands, require_indices, swiglu_shape_error

# group_size and bits of each mode when not given, asked of libqq once (qqQuantParamsInit):
# the fake implementations need them as Python ints at trace time.
DEFAULTS = _qq._mode_defaults()
_FLOATS = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# torch's 1-byte float dtypes that swizzle / unswizzle keep (the rest come back uint8)
_BYTE_TYPED = {getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu")
               if hasattr(torch, n)}
_TD = {True: "true", False: "false", "float4": "float4"}
_TD_BACK = {v: k for k, v in _TD.items()}


def _torch_dtypes_arg(func, value):
    """torch_dtypes= as the ops take it (a string in their schema), checked in Python (this
    runs while Dynamo traces, which cannot call into Cython)."""
    return _TD[_check_torch_dtypes(func, value)]


def _td_back(func, td):
    """An op's torch_dtypes string back to qq's value; a string the ops never pass (a
    direct torch.ops.qq.* call) is a ValueError, not a KeyError."""
    try:
        return _TD_BACK[td]
    except (KeyError, TypeError):
        raise ValueError(f"{func}: torch_dtypes: expected 'true', 'false' or 'float4' (the op's "
                         f"spelling of True / False / 'float4'); got {td!r}") from None


def _byte_dtypes(mode, fp8_format, td, func="quantize"):
    """(data dtype, scales dtype) of a quantize result (the fake implementations; the
    rule is libqq's: qq._qq._torch_result_dtypes)."""
    d, s = _qq._torch_result_dtypes(mode, fp8_format, _td_back(func, td))
    return getattr(torch, d), getattr(torch, s)


# =========================================================================================
# Shape rules (fake implementations). Sizes may be SymInts: only +, *, // and comparisons.
# =========================================================================================

def _roundup(v, m):
    return (v + m - 1) // m * m


def _quantized_shapes(func, x_shape, group_size, bits, blocked, axis="K"):
    """(data_shape, scales_shape) of quantize(x), as qqQuantizedShapes computes them:
    data [..., K*bits/8]; linear scales [..., K/group]; blocked scales
    [B..., roundup(M, 128), roundup(K/group, 4)] for x [B..., M, K] (1-D x: M = 1).
    K must be a multiple of the group (a guard on a dynamic K)."""
    x_shape = tuple(x_shape)
    torch._check_value(len(x_shape) >= 1, lambda: f"{func}: argument 'x' has 0 dimensions; "
                                                  f"expected [..., K] with 1 to 8 dimensions")
    k = x_shape[-1]
    torch._check_value(k % group_size == 0,
                       lambda: f"{func}: {axis}={k} is not a positive multiple of group_size "
                               f"{group_size}; pad {axis} or choose another group_size")
    data = x_shape[:-1] + (k * bits // 8,)
    if not blocked:
        return data, x_shape[:-1] + (k // group_size,)
    m = x_shape[-2] if len(x_shape) >= 2 else 1
    return data, x_shape[:-2] + (_roundup(m, 128), _roundup(k // group_size, 4))


def _matmul_shape(x_shape, w_shape, n, func="qqmm"):
    """[..., M, N] for x [..., M, K] and w [..., N or K, ...]; batch axes broadcast; a
    1-D x [K] gives [..., N] (qqmm / quantized_matmul)."""
    x_shape, w_shape = tuple(x_shape), tuple(w_shape)
    torch._check_value(len(x_shape) >= 1, lambda: f"{func}: x: expected [..., M, K], got a 0-d array")
    if len(x_shape) == 1:
        return w_shape[:-2] + (n,)
    return tuple(torch.broadcast_shapes(x_shape[:-2], w_shape[:-2])) + (x_shape[-2], n)


# =========================================================================================
# The ops
# =========================================================================================

@torch.library.custom_op("qq::quantize", mutates_args=())
def _quantize_op(x: Tensor, global_scale: Optional[Tensor], mode: str, group_size: int,
                 bits: int, rounding: str, scale_layout: str, fp8_format: str,
                 torch_dtypes: str) -> list[Tensor]:
    # (each result in a storage of its own: a custom op's outputs may not alias one another)
    qa = _qq._quantize_apart(x, group_size, bits, mode, global_scale, rounding, scale_layout,
                             fp8_format, _td_back("quantize", torch_dtypes))
    return list(qa)


@_quantize_op.register_fake
def _(x, global_scale, mode, group_size, bits, rounding, scale_layout, fp8_format, torch_dtypes):
    ds, ss = _quantized_shapes("quantize", x.shape, group_size, bits, scale_layout == "blocked")
    ddt, sdt = _byte_dtypes(mode, fp8_format, torch_dtypes)
    if mode == "affine":
        sdt = x.dtype
    out = [x.new_empty(ds, dtype=ddt), x.new_empty(ss, dtype=sdt)]
    if mode == "affine":
        out.append(x.new_empty(ss, dtype=sdt))
    return out


@torch.library.custom_op("qq::quantize_colwise", mutates_args=())
def _quantize_colwise_op(x: Tensor, global_scale: Optional[Tensor], mode: str, group_size: int,
                         bits: int, rounding: str, scale_layout: str, fp8_format: str,
                         rowwise: bool, torch_dtypes: str) -> list[Tensor]:
    r = _qq.quantize_colwise(x, group_size, bits, mode, global_scale=global_scale,
                             rounding=rounding, scale_layout=scale_layout,
                             fp8_format=fp8_format, rowwise=rowwise,
                             torch_dtypes=_td_back("quantize_colwise", torch_dtypes))
    if rowwise:
        row, col = r
        return list(col) + list(row)
    return list(r)


@_quantize_colwise_op.register_fake
def _(x, global_scale, mode, group_size, bits, rounding, scale_layout, fp8_format, rowwise,
      torch_dtypes):
    xs = tuple(x.shape)
    torch._check_value(len(xs) >= 2, lambda: f"quantize_colwise: argument 'x' has shape {xs}; "
                                             f"expected [..., M, K]")
    ddt, sdt = _byte_dtypes(mode, fp8_format, torch_dtypes, "quantize_colwise")
    if mode == "affine":
        sdt = x.dtype
    out = []
    for shape, axis in ((xs[:-2] + (xs[-1], xs[-2]), "M"),) + (((xs, "K"),) if rowwise else ()):
        ds, ss = _quantized_shapes("quantize_colwise", shape, group_size, bits,
                                   scale_layout == "blocked", axis)
        out += [x.new_empty(ds, dtype=ddt), x.new_empty(ss, dtype=sdt)]
        if mode == "affine":
            out.append(x.new_empty(ss, dtype=sdt))
    return out


@torch.library.custom_op("qq::quantize_dequantize", mutates_args=())
def _quantize_dequantize_op(x: Tensor, global_scale: Optional[Tensor], mode: str, rounding: str,
                            fp8_format: str, rowwise: bool, colwise: bool) -> list[Tensor]:
    r = _qq.quantize_dequantize(x, mode, global_scale=global_scale, rowwise=rowwise,
                                colwise=colwise, rounding=rounding, fp8_format=fp8_format)
    return list(r) if rowwise and colwise else [r]


@_quantize_dequantize_op.register_fake
def _(x, global_scale, mode, rounding, fp8_format, rowwise, colwise):
    xs = tuple(x.shape)
    torch._check_value(len(xs) == 2, lambda: f"quantize_dequantize: argument 'x' has shape {xs}; "
                                             f"expected [M, K]")
    return [x.new_empty(xs, dtype=torch.bfloat16) for _ in range(int(rowwise) + int(colwise))]


@torch.library.custom_op("qq::quantize_dequantize_moe", mutates_args=())
def _quantize_dequantize_moe_op(w: Tensor, rounding: str, fp8_format: str, values: bool,
                                transposed: bool) -> list[Tensor]:
    r = _qq.quantize_dequantize_moe(w, values=values, transposed=transposed, rounding=rounding,
                                    fp8_format=fp8_format)
    return list(r) if values and transposed else [r]


@_quantize_dequantize_moe_op.register_fake
def _(w, rounding, fp8_format, values, transposed):
    ws = tuple(w.shape)
    torch._check_value(len(ws) in (2, 3), lambda: f"quantize_dequantize_moe: argument 'w' has shape {ws}; "
                                                  f"expected [E, D1, D2] or [D1, D2]")
    out = [w.new_empty(ws, dtype=torch.bfloat16)] if values else []
    if transposed:
        out.append(w.new_empty(ws[:-2] + (ws[-1], ws[-2]), dtype=torch.bfloat16))
    return out


@torch.library.custom_op("qq::dequantize", mutates_args=())
def _dequantize_op(w: Tensor, scales: Tensor, biases: Optional[Tensor],
                   global_scale: Optional[Tensor], mode: str, group_size: int, bits: int,
                   scale_layout: str, fp8_format: str, dtype: torch.dtype) -> Tensor:
    return _qq.dequantize(w, scales, biases, group_size, bits, mode, global_scale=global_scale,
                          scale_layout=scale_layout, fp8_format=fp8_format, dtype=dtype)


@_dequantize_op.register_fake
def _(w, scales, biases, global_scale, mode, group_size, bits, scale_layout, fp8_format, dtype):
    return w.new_empty(tuple(w.shape[:-1]) + (w.shape[-1] * 8 // bits,), dtype=dtype)


@torch.library.custom_op("qq::amax", mutates_args=())
def _amax_op(x: Tensor) -> Tensor:
    return _qq.amax(x)


@_amax_op.register_fake
def _(x):
    return x.new_empty((), dtype=torch.float32)


@torch.library.custom_op("qq::swiglu", mutates_args=())
def _swiglu_op(x: Tensor) -> Tensor:
    return _qq.swiglu(x)


@_swiglu_op.register_fake
def _(x):
    why = lambda: swiglu_shape_error(x.shape)  # noqa: E731
    torch._check_value(x.dim() > 0, why)
    torch._check_value(x.shape[-1] % 2 == 0, why)
    return x.new_empty(tuple(x.shape[:-1]) + (x.shape[-1] // 2,))


@torch.library.custom_op("qq::qqmm", mutates_args=())
def _qqmm_op(x: Tensor, x_scales: Optional[Tensor], global_scale_x: Optional[Tensor],
             w: Tensor, scales: Optional[Tensor], global_scale_w: Optional[Tensor],
             w_values: Optional[Tensor], bias: Optional[Tensor], c: Optional[Tensor],
             beta: float, mode: str, group_size: int, bits: int, rounding: str, x_layout: str,
             w_layout: str, fp8_format: str, dtype: torch.dtype, x_prepared: bool = False,
             w_prepared: bool = False) -> Tensor:
    # Packed operands travel as QuantizedArrays: each keeps its own scale layout, and a
    # PreparedWeight (w_values given) lets qq.qqmm pick its form per call, at run time.
    q = dict(mode=mode, group_size=group_size, bits=bits, fp8_format=fp8_format)
    if x_scales is not None:
        x = QuantizedArray(x, x_scales, global_scale=global_scale_x, scale_layout=x_layout,
                           rounding=rounding, **q)
        global_scale_x = None
    if scales is not None:
        w = QuantizedArray(w, scales, global_scale=global_scale_w, scale_layout=w_layout, **q)
        global_scale_w = None
        if w_values is not None:
            w = PreparedWeight(w, w_values)
    return _qq.qqmm(x, w, mode=mode, group_size=group_size, bits=bits,
                    global_scale_x=global_scale_x, global_scale_w=global_scale_w, bias=bias,
                    c=c, beta=beta, rounding=rounding, fp8_format=fp8_format, dtype=dtype,
                    x_prepared=x_prepared, w_prepared=w_prepared)


@_qqmm_op.register_fake
def _(x, x_scales, global_scale_x, w, scales, global_scale_w, w_values, bias, c, beta, mode,
      group_size, bits, rounding, x_layout, w_layout, fp8_format, dtype, x_prepared=False,
      w_prepared=False):
    return x.new_empty(_matmul_shape(x.shape, w.shape, w.shape[-2]), dtype=dtype)


@torch.library.custom_op("qq::quantized_matmul", mutates_args=())
def _quantized_matmul_op(x: Tensor, w: Tensor, scales: Tensor, biases: Optional[Tensor],
                         global_scale: Optional[Tensor], bias: Optional[Tensor], transpose: bool,
                         n: int, mode: str, group_size: int, bits: int, scale_layout: str,
                         fp8_format: str, dtype: torch.dtype) -> Tensor:
    return _qq.quantized_matmul(x, w, scales, biases, transpose, group_size, bits, mode,
                                global_scale=global_scale, bias=bias, scale_layout=scale_layout,
                                fp8_format=fp8_format, dtype=dtype)


@_quantized_matmul_op.register_fake
def _(x, w, scales, biases, global_scale, bias, transpose, n, mode, group_size, bits,
      scale_layout, fp8_format, dtype):
    return x.new_empty(_matmul_shape(x.shape, w.shape, n, "quantized_matmul"), dtype=dtype)


@torch.library.custom_op("qq::gather_qmm", mutates_args=())
def _gather_qmm_op(x: Tensor, w: Tensor, scales: Tensor, biases: Optional[Tensor],
                   rhs_indices: Tensor, global_scale: Optional[Tensor], bias: Optional[Tensor],
                   transpose: bool, n: int, mode: str, group_size: int, bits: int,
                   scale_layout: str, fp8_format: str, dtype: torch.dtype) -> Tensor:
    return _qq.gather_qmm(x, w, scales, biases, rhs_indices, transpose, group_size, bits, mode,
                          global_scale=global_scale, bias=bias, scale_layout=scale_layout,
                          fp8_format=fp8_format, dtype=dtype)


@_gather_qmm_op.register_fake
def _(x, w, scales, biases, rhs_indices, global_scale, bias, transpose, n, mode, group_size,
      bits, scale_layout, fp8_format, dtype):
    batch = torch.broadcast_shapes(tuple(x.shape[:-2]), tuple(rhs_indices.shape))
    return x.new_empty(tuple(batch) + (x.shape[-2], n), dtype=dtype)


@torch.library.custom_op("qq::swizzle_scales", mutates_args=())
def _swizzle_scales_op(scales: Tensor) -> Tensor:
    return _qq.swizzle_scales(scales)


@_swizzle_scales_op.register_fake
def _(scales):
    s = tuple(scales.shape)
    torch._check_value(len(s) >= 1, lambda: "swizzle_scales: scales: expected [..., R, C], "
                                            "got a 0-d array")
    r = s[-2] if len(s) >= 2 else 1
    return scales.new_empty(s[:-2] + (_roundup(r, 128), _roundup(s[-1], 4)),
                            dtype=scales.dtype if scales.dtype in _BYTE_TYPED else torch.uint8)


@torch.library.custom_op("qq::unswizzle_scales", mutates_args=())
def _unswizzle_scales_op(scales: Tensor, shape: list[int]) -> Tensor:
    return _qq.unswizzle_scales(scales, shape)


@_unswizzle_scales_op.register_fake
def _(scales, shape):
    return scales.new_empty(shape, dtype=scales.dtype if scales.dtype in _BYTE_TYPED else torch.uint8)


@torch.library.custom_op("qq::quantize_moe", mutates_args=())
def _quantize_moe_op(w: Tensor, scaling: str, rounding: str, scale_layout: str,
                     fp8_format: str, torch_dtypes: str) -> list[Tensor]:
    return list(_qq.quantize_moe(w, scaling, rounding=rounding, scale_layout=scale_layout,
                                 fp8_format=fp8_format, torch_dtypes=_td_back("quantize_moe", torch_dtypes)))


@_quantize_moe_op.register_fake
def _(w, scaling, rounding, scale_layout, fp8_format, torch_dtypes):
    e, d1, d2 = w.shape
    ddt, sdt = _byte_dtypes("mxfp8", fp8_format, torch_dtypes, "quantize_moe")
    # data [E, D1, D2] column-major per expert: the [E, D2, D1] buffer seen transposed.
    data = w.new_empty((e, d2, d1), dtype=ddt).transpose(-2, -1)
    if scale_layout == "blocked":
        s = (e, _roundup(d2, 128), _roundup(d1 // 32, 4))
    else:
        s = (e, d1 // 32, d2 // 32 if scaling == "32x32" else d2)
    return [data, w.new_empty(s, dtype=sdt)]


# Ops that may read device memory on the host (grouped_qqmm and its wgrad off Hopper) cannot
# run inside a CUDA graph there: tagged so that torch.compile's CUDA graphs
# (mode="reduce-overhead") leave them out (torch >= 2.8).
_HOST_SYNC_TAGS = (torch.Tag.cudagraph_unsafe,) if hasattr(torch.Tag, "cudagraph_unsafe") else ()


@torch.library.custom_op("qq::grouped_qqmm", mutates_args=(), tags=_HOST_SYNC_TAGS)
def _grouped_qqmm_op(x: Tensor, x_scales: Optional[Tensor], global_scale_x: Optional[Tensor],
                     w: Tensor, scales: Optional[Tensor], global_scale_w: Optional[Tensor],
                     offsets: Tensor, mode: str, group_size: int, bits: int, rounding: str,
                     x_layout: str, w_layout: str, fp8_format: str, moe_scaling: str,
                     dtype: torch.dtype, w_prepared: bool = False) -> Tensor:
    # The offsets may be read on the host inside the op (as eagerly; not on Hopper): the op
    # is opaque to the compiler, so the graph holds one call and no break; tagged
    # cudagraph_unsafe because not every device runs it without that host read.
    q = dict(mode=mode, group_size=group_size, bits=bits, fp8_format=fp8_format)
    if x_scales is not None:
        x = QuantizedArray(x, x_scales, global_scale=global_scale_x, scale_layout=x_layout,
                           rounding=rounding, **q)
        global_scale_x = None
    if moe_scaling:
        # w is quantize_moe's data [E, K, N] (column-major per expert) with its scales
        return _qq.grouped_qqmm(x, (w, scales), offsets, mode=mode, global_scale_x=global_scale_x,
                                rounding=rounding, scale_layout=w_layout, fp8_format=fp8_format,
                                moe_scaling=moe_scaling, dtype=dtype)
    if w_prepared:  # q(w)'s values [E, N, K] of a PreparedWeight (see grouped_qqmm below)
        pw = object.__new__(PreparedWeight)     # PreparedWeight.__init__ is Cython, as in _qa
        pw.quantized, pw.values, pw.mode, pw.global_scale, pw.shape = None, w, mode, global_scale_w, tuple(w.shape)
        return _qq.grouped_qqmm(x, pw, offsets, mode=mode, global_scale_x=global_scale_x, rounding=rounding,
                                fp8_format=fp8_format, dtype=dtype)
    if scales is not None:
        w = QuantizedArray(w, scales, global_scale=global_scale_w, scale_layout=w_layout, **q)
        global_scale_w = None
    return _qq.grouped_qqmm(x, w, offsets, mode=mode, group_size=group_size, bits=bits,
                            global_scale_x=global_scale_x, global_scale_w=global_scale_w,
                            rounding=rounding, fp8_format=fp8_format, dtype=dtype)


@_grouped_qqmm_op.register_fake
def _(x, x_scales, global_scale_x, w, scales, global_scale_w, offsets, mode, group_size, bits,
      rounding, x_layout, w_layout, fp8_format, moe_scaling, dtype, w_prepared=False):
    n = w.shape[-1] if moe_scaling else w.shape[1]      # moe data is [E, K, N]
    return x.new_empty((x.shape[0], n), dtype=dtype)


@torch.library.custom_op("qq::grouped_qqmm_wgrad", mutates_args=(), tags=_HOST_SYNC_TAGS)
def _grouped_qqmm_wgrad_op(x: Tensor, dy: Tensor, offsets: Tensor,
                           global_scale_x: Optional[Tensor], global_scale_dy: Optional[Tensor],
                           mode: str, rounding: str, fp8_format: str, dtype: str) -> Tensor:
    return _qq.grouped_qqmm_wgrad(x, dy, offsets, mode, global_scale_x=global_scale_x,
                     global_scale_dy=global_scale_dy, rounding=rounding, fp8_format=fp8_format,
                     dtype=dtype)


@_grouped_qqmm_wgrad_op.register_fake
def _(x, dy, offsets, global_scale_x, global_scale_dy, mode, rounding, fp8_format, dtype):
    return x.new_empty((offsets.shape[0], x.shape[1], dy.shape[1]), dtype=getattr(torch, dtype))


# =========================================================================================
# qq's public functions on torch tensors while torch.compile traces (qq._dispatch)
# =========================================================================================

def _params(func, mode, group_size, bits):
    """(group_size, bits) with the mode's defaults filled in; an unknown mode raises as
    libqq would (other invalid values raise from the op when it runs)."""
    if not isinstance(mode, str) or mode not in DEFAULTS:
        raise ValueError(f"{func}: mode: expected one of {', '.join(map(repr, DEFAULTS))}; "
                         f"got {mode!r}")
    g, b = DEFAULTS[mode]
    return (g if group_size is None else int(group_size)), (b if bits is None else int(bits))


def _dtype(func, dtype):
    """The `dtype=` argument as a torch float dtype, or None."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    name = dtype if isinstance(dtype, str) else getattr(dtype, "name", str(dtype))
    name = name[6:] if name.startswith("torch.") else name
    if name not in _FLOATS:
        raise TypeError(f"{func}: dtype: expected 'float32', 'float16' or 'bfloat16' (or the "
                        f"matching torch dtype), got {dtype!r}")
    return _FLOATS[name]


def _scalar(value, like):
    """A Python-float global scale as a float32 tensor of shape () on like's device."""
    if value is None or isinstance(value, Tensor):
        return value
    return torch.full((), float(value), dtype=torch.float32, device=like.device)


def _no_stream(func, stream):
    if stream is not None:
        raise ValueError(f"{func}: stream: under torch.compile qq runs on torch's current "
                         f"stream; pass stream=None (use torch.cuda.stream(...) around the call)")


def _take(func, arg, given, default, qa_value, qa_name):
    """qq's rule next to a QuantizedArray: an argument left at its default (or None, or
    equal) takes the QuantizedArray's value; any other value contradicts it."""
    if given is None or given == default or given == qa_value:
        return qa_value
    raise ValueError(f"{func}: {arg}={given!r} contradicts {qa_name}.{arg}={qa_value!r}; "
                     f"leave {arg} out to use the QuantizedArray's value")


def _take_array(func, arg, given, qa_value, qa_name, qa_field):
    """qq._qq's _take_array rule and words, where Cython cannot run (Dynamo tracing)."""
    if given is None or given is qa_value:
        return qa_value
    if qa_value is None:
        raise ValueError(f"{func}: {arg} was given, but {qa_name} is a QuantizedArray with no "
                         f"{qa_field} ({qa_name}.{qa_field} is None: global scales exist only for "
                         f"nvfp4, biases only for affine, and the codes were made without one); "
                         f"leave {arg} out, or quantize with it")
    raise ValueError(f"{func}: {arg} was given both as an argument and as "
                     f"{qa_name}.{qa_field} (a QuantizedArray); pass it once")


def _qa(tensors, mode, group_size, bits, global_scale, rounding, scale_layout, fp8_format,
        shape):
    """A QuantizedArray from op outputs, built field by field: torch.compile cannot trace
    QuantizedArray.__init__ (Cython), and the op has validated everything already."""
    qa = object.__new__(QuantizedArray)
    qa.data, qa.scales = tensors[0], tensors[1]
    qa.biases = tensors[2] if mode == "affine" else None
    qa.mode, qa.group_size, qa.bits = mode, group_size, bits
    qa.global_scale, qa.rounding = global_scale, rounding
    qa.scale_layout, qa.fp8_format = scale_layout, fp8_format
    qa.shape = tuple(shape)
    return qa


def _finish(func, result, out):
    """out= under torch.compile: the op's result copied into out (which is returned), out
    held to eager's rule first - a torch tensor of the result's exact shape and dtype,
    contiguous, on its device (docs/api.md) - where copy_ alone would broadcast and convert."""
    if out is None:
        return result
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{func}: out: expected a torch tensor (the inputs are torch tensors); got "
                        f"{type(out).__name__}")
    if tuple(out.shape) != tuple(result.shape):
        raise ValueError(f"{func}: argument 'out' has shape {tuple(out.shape)}; expected "
                         f"{tuple(result.shape)} (the result's shape)")
    if out.dtype != result.dtype:
        raise ValueError(f"{func}: out has dtype {out.dtype}; the result is {result.dtype} "
                         f"(pass dtype= to match out, or an out of the result's dtype)")
    if out.device != result.device:
        raise ValueError(f"{func}: out is on {out.device}; the result is on {result.device}")
    if not out.is_contiguous():
        raise ValueError(f"{func}: argument 'out' is not contiguous; pass a contiguous tensor")
    out.copy_(result)
    return out


def quantize(x, group_size=None, bits=None, mode="affine", *, global_scale=None,
             rounding="ceil", scale_layout="linear", fp8_format="e4m3", torch_dtypes=True,
             stream=None):
    func = "quantize"
    _no_stream(func, stream)
    g, b = _params(func, mode, group_size, bits)
    gs = _scalar(global_scale, x)
    t = _quantize_op(x, gs, mode, g, b, rounding, scale_layout, fp8_format,
                     _torch_dtypes_arg(func, torch_dtypes))
    return _qa(t, mode, g, b, gs, rounding, scale_layout, fp8_format, x.shape)


def quantize_dequantize(x, mode="mxfp8", *, global_scale=None, rowwise=True, colwise=False,
                        rounding="ceil", fp8_format="e4m3", stream=None):
    func = "quantize_dequantize"
    _no_stream(func, stream)
    rowwise, colwise = check_flag(func, "rowwise", rowwise), check_flag(func, "colwise", colwise)
    if not rowwise and not colwise:
        raise ValueError(f"{func}: rowwise and colwise are both False; ask for at least one")
    t = _quantize_dequantize_op(x, _scalar(global_scale, x), mode, rounding, fp8_format,
                                bool(rowwise), bool(colwise))
    return (t[0], t[1]) if rowwise and colwise else t[0]


def quantize_dequantize_moe(w, *, values=True, transposed=False, rounding="ceil", fp8_format="e4m3",
                            stream=None):
    func = "quantize_dequantize_moe"
    _no_stream(func, stream)
    values, transposed = check_flag(func, "values", values), check_flag(func, "transposed", transposed)
    if not values and not transposed:
        raise ValueError(f"{func}: values and transposed are both False; ask for at least one")
    t = _quantize_dequantize_moe_op(w, rounding, fp8_format, bool(values), bool(transposed))
    return (t[0], t[1]) if values and transposed else t[0]


def quantize_colwise(x, group_size=None, bits=None, mode="affine", *, global_scale=None,
                     rounding="ceil", scale_layout="linear", fp8_format="e4m3", rowwise=False,
                     torch_dtypes=True, stream=None):
    func = "quantize_colwise"
    _no_stream(func, stream)
    rowwise = check_flag(func, "rowwise", rowwise)
    g, b = _params(func, mode, group_size, bits)
    gs = _scalar(global_scale, x)
    t = _quantize_colwise_op(x, gs, mode, g, b, rounding, scale_layout, fp8_format, bool(rowwise),
                             _torch_dtypes_arg(func, torch_dtypes))
    xs = tuple(x.shape)
    k = 3 if mode == "affine" else 2
    col = _qa(t[:k], mode, g, b, gs, rounding, scale_layout, fp8_format,
              xs[:-2] + (xs[-1], xs[-2]))
    if not rowwise:
        return col
    return _qa(t[k:], mode, g, b, gs, rounding, scale_layout, fp8_format, xs), col


def _unpack_weight(func, w, scales, biases, global_scale, mode, group_size, bits,
                   scale_layout, fp8_format):
    if not isinstance(w, QuantizedArray):
        return (w, scales, biases, global_scale, mode, group_size, bits, scale_layout,
                fp8_format, None)
    qa = w
    return (qa.data,
            _take_array(func, "scales", scales, qa.scales, "w", "scales"),
            _take_array(func, "biases", biases, qa.biases, "w", "biases"),
            _take_array(func, "global_scale", global_scale, qa.global_scale, "w", "global_scale"),
            _take(func, "mode", mode, "affine", qa.mode, "w"),
            _take(func, "group_size", group_size, None, qa.group_size, "w"),
            _take(func, "bits", bits, None, qa.bits, "w"),
            _take(func, "scale_layout", scale_layout, "linear", qa.scale_layout, "w"),
            _take(func, "fp8_format", fp8_format, "e4m3", qa.fp8_format, "w"),
            qa.shape)


def dequantize(w, scales=None, biases=None, group_size=None, bits=None, mode="affine", *,
               global_scale=None, scale_layout="linear", fp8_format="e4m3", dtype=None,
               out=None, stream=None):
    func = "dequantize"
    _no_stream(func, stream)
    (w, scales, biases, global_scale, mode, group_size, bits, scale_layout, fp8_format,
     _) = _unpack_weight(func, w, scales, biases, global_scale, mode, group_size, bits,
                         scale_layout, fp8_format)
    g, b = _params(func, mode, group_size, bits)
    dt = _dtype(func, dtype) or (out.dtype if out is not None else torch.bfloat16)
    y = _dequantize_op(w, scales, biases, _scalar(global_scale, w), mode, g, b, scale_layout,
                       fp8_format, dt)
    return _finish("dequantize", y, out)


def amax(x, *, out=None, stream=None):
    _no_stream("amax", stream)
    return _finish("amax", _amax_op(x), out)


def swiglu(x, *, out=None, stream=None):
    _no_stream("swiglu", stream)
    return _finish("swiglu", _swiglu_op(x), out)


def _is_float(t):
    return t.dtype in (torch.float32, torch.float16, torch.bfloat16)


def qqmm(x, w, scales=None, group_size=None, bits=None, mode="nvfp4", *,
         global_scale_x=None, global_scale_w=None, x_scales=None, bias=None, c=None, beta=1.0,
         rounding="ceil", scale_layout="linear", fp8_format="e4m3", dtype=None, out=None,
         stream=None, x_prepared=False, w_prepared=False):
    func = "qqmm"
    _no_stream(func, stream)
    w_values = None
    if isinstance(w, PreparedWeight):
        w_values = w.values          # None on Blackwell: the packed form serves every call
        w = w.quantized
    (x, w, scales, x_scales, global_scale_x, global_scale_w, mode, group_size, bits, fp8_format,
     x_layout, w_layout, _) = qqmm_operands(func, x, w, scales, x_scales, global_scale_x,
                                            global_scale_w, mode, group_size, bits, fp8_format,
                                            scale_layout, _take, _take_array)
    if mode == "affine":
        raise ValueError(f"{func}: mode 'affine' has no quantized-activation GEMM; use "
                         f"qq.quantized_matmul (weight-only) for affine weights")
    g, b = _params(func, mode, group_size, bits)
    dt = _dtype(func, dtype)
    if dt is None:
        dt = out.dtype if out is not None else (x.dtype if _is_float(x) and x_scales is None
                                                else torch.bfloat16)
    if w_values is not None and scales is None:
        w_values = None
    if c is not None and isinstance(beta, (str, bytes, bytearray)):     # (float() would parse "2")
        raise TypeError(f"{func}: beta: expected a real number, got {type(beta).__name__} {beta!r}")
    y = _qqmm_op(x, x_scales, _scalar(global_scale_x, x), w, scales, _scalar(global_scale_w, x),
                 w_values, bias, c, float(beta) if c is not None else 0.0, mode, g, b,
                 rounding, x_layout, w_layout, fp8_format, dt, bool(x_prepared), bool(w_prepared))
    return _finish("qqmm", y, out)


def _weight_only_args(func, w, scales, biases, global_scale, transpose, group_size, bits, mode,
                      scale_layout, fp8_format, x):
    """The weight operands of quantized_matmul / gather_qmm's ops: (w, scales, biases,
    global scale tensor, mode, group_size, bits, scale_layout, fp8_format, N), with N from
    w [..., N, K*bits/8] (transpose) or W [..., K, N] (its logical shape, else w's packed
    last axis); symbolic sizes work while Dynamo traces."""
    (w, scales, biases, global_scale, mode, group_size, bits, scale_layout, fp8_format,
     logical) = _unpack_weight(func, w, scales, biases, global_scale, mode, group_size, bits,
                               scale_layout, fp8_format)
    g, b = _params(func, mode, group_size, bits)
    if transpose:
        n = w.shape[-2]
    else:
        n = logical[-1] if logical is not None else w.shape[-1] * 8 // b
    return w, scales, biases, _scalar(global_scale, x), mode, g, b, scale_layout, fp8_format, n


def quantized_matmul(x, w, scales=None, biases=None, transpose=True, group_size=None,
                     bits=None, mode="affine", *, global_scale=None, bias=None,
                     scale_layout="linear", fp8_format="e4m3", dtype=None, out=None,
                     stream=None):
    func = "quantized_matmul"
    _no_stream(func, stream)
    if isinstance(w, DecodeWeight):  # traced: the packed weight's op (the layout's kernel is eager)
        w = w.quantized
    w, scales, biases, gs, mode, g, b, scale_layout, fp8_format, n = _weight_only_args(
        func, w, scales, biases, global_scale, transpose, group_size, bits, mode, scale_layout,
        fp8_format, x)
    dt = _dtype(func, dtype) or (out.dtype if out is not None else
                                 (x.dtype if _is_float(x) else torch.bfloat16))
    y = _quantized_matmul_op(x, w, scales, biases, gs, bias, bool(transpose), n, mode, g, b,
                             scale_layout, fp8_format, dt)
    return _finish("quantized_matmul", y, out)


def gather_qmm(x, w, scales=None, biases=None, rhs_indices=None, transpose=True,
               group_size=None, bits=None, mode="affine", *, global_scale=None, bias=None,
               scale_layout="linear", fp8_format="e4m3", dtype=None, out=None, stream=None):
    func = "gather_qmm"
    _no_stream(func, stream)
    require_indices(func, rhs_indices)
    if isinstance(w, DecodeWeight):  # traced: the packed experts' op (the layout's kernel is eager)
        w = w.quantized
    w, scales, biases, gs, mode, g, b, scale_layout, fp8_format, n = _weight_only_args(
        func, w, scales, biases, global_scale, transpose, group_size, bits, mode, scale_layout,
        fp8_format, x)
    dt = _dtype(func, dtype) or (out.dtype if out is not None else
                                 (x.dtype if _is_float(x) else torch.bfloat16))
    y = _gather_qmm_op(x, w, scales, biases, rhs_indices, gs, bias, bool(transpose), n, mode, g,
                       b, scale_layout, fp8_format, dt)
    return _finish("gather_qmm", y, out)


def swizzle_scales(scales, *, out=None, stream=None):
    _no_stream("swizzle_scales", stream)
    return _finish("swizzle_scales", _swizzle_scales_op(scales), out)


def unswizzle_scales(scales, shape, *, out=None, stream=None):
    _no_stream("unswizzle_scales", stream)
    return _finish("unswizzle_scales", _unswizzle_scales_op(scales, list(shape)), out)


def quantize_moe(w, scaling="32x1", *, rounding="ceil", scale_layout="linear", fp8_format="e4m3",
                 torch_dtypes=True, stream=None):
    _no_stream("quantize_moe", stream)
    data, scales = _quantize_moe_op(w, scaling, rounding, scale_layout, fp8_format,
                                    _torch_dtypes_arg("quantize_moe", torch_dtypes))
    return data, scales


def grouped_qqmm(x, w, offsets, scales=None, group_size=None, bits=None, mode="mxfp8", *,
                 global_scale_x=None, global_scale_w=None, x_scales=None, rounding="ceil",
                 scale_layout="linear", fp8_format="e4m3", moe_scaling=None, dtype=None, out=None,
                 stream=None, w_prepared=False):
    func = "grouped_qqmm"
    _no_stream(func, stream)
    x_layout, w_layout = "linear", scale_layout
    w_prepared = bool(w_prepared)
    if isinstance(w, PreparedWeight):
        if w.values is not None:     # q(w)'s bf16 values, multiplied as they are
            mode = _take(func, "mode", mode, "mxfp8", w.mode, "w")
            fp8_format = _take(func, "fp8_format", fp8_format, "e4m3", w.quantized.fp8_format, "w")
            global_scale_w = _take_array(func, "global_scale_w", global_scale_w, w.global_scale,
                                         "w", "global_scale")
            w, w_prepared = w.values, True
        else:                        # Blackwell: the packed form
            w = w.quantized
    if moe_scaling is not None:
        if isinstance(w, tuple):
            w, scales = w
        mode = "mxfp8"
    elif isinstance(w, QuantizedArray):
        scales = _take_array(func, "scales", scales, w.scales, "w", "scales")
        global_scale_w = _take_array(func, "global_scale_w", global_scale_w, w.global_scale,
                                     "w", "global_scale")
        mode = _take(func, "mode", mode, "mxfp8", w.mode, "w")
        group_size = _take(func, "group_size", group_size, None, w.group_size, "w")
        bits = _take(func, "bits", bits, None, w.bits, "w")
        fp8_format = _take(func, "fp8_format", fp8_format, "e4m3", w.fp8_format, "w")
        w_layout = _take(func, "scale_layout", scale_layout, "linear", w.scale_layout, "w")
        w = w.data
    if isinstance(x, QuantizedArray):
        x_scales = _take_array(func, "x_scales", x_scales, x.scales, "x", "scales")
        global_scale_x = _take_array(func, "global_scale_x", global_scale_x, x.global_scale,
                                     "x", "global_scale")
        x_layout = x.scale_layout
        x = x.data
    g, b = _params(func, mode, group_size, bits)
    dt = _dtype(func, dtype)
    if dt is None:
        dt = out.dtype if out is not None else (x.dtype if _is_float(x) and x_scales is None
                                                else torch.bfloat16)
    y = _grouped_qqmm_op(x, x_scales, _scalar(global_scale_x, x), w, scales, _scalar(global_scale_w, x),
                         offsets, mode, g, b, rounding, x_layout, w_layout, fp8_format,
                         moe_scaling or "", dt, w_prepared)
    return _finish("grouped_qqmm", y, out)


def grouped_qqmm_wgrad(x, dy, offsets, mode="mxfp8", *, global_scale_x=None, global_scale_dy=None,
                       rounding="ceil", fp8_format="e4m3", dtype="float32", stream=None):
    _no_stream("grouped_qqmm_wgrad", stream)
    name = _dtype("grouped_qqmm_wgrad", dtype)
    name = str(name).rpartition(".")[2] if name is not None else "float32"
    return _grouped_qqmm_wgrad_op(x, dy, offsets, _scalar(global_scale_x, x),
                                  _scalar(global_scale_dy, x), mode, rounding, fp8_format, name)


@torch.compiler.assume_constant_result
def _blockscaled_cuda(index: int) -> bool:
    return _qq._blockscaled_capability(index)


def prepare_weight(w, mode="nvfp4", *, global_scale=None, rounding="ceil", fp8_format="e4m3",
                   torch_dtypes=True, stream=None):
    func = "prepare_weight"
    if isinstance(w, QuantizedArray):
        qa = w
    else:
        if mode == "affine":
            raise ValueError(f"{func}: mode 'affine' has no qqmm; use qq.quantize and "
                             f"qq.quantized_matmul for affine weights")
        qa = quantize(w, mode=mode, global_scale=global_scale, rounding=rounding,
                      scale_layout="blocked", fp8_format=fp8_format, torch_dtypes=torch_dtypes,
                      stream=stream)
    if len(qa.shape) not in (2, 3):
        raise ValueError(f"{func}: w: qqmm weights are [N, K] (or grouped_qqmm's experts [E, N, K]); "
                         f"got shape {qa.shape}")
    values = None
    if not (qa.data.is_cuda and _blockscaled_cuda(qa.data.device.index or 0)):
        values = dequantize(qa.data, qa.scales, group_size=qa.group_size, bits=qa.bits,
                            mode=qa.mode, scale_layout=qa.scale_layout,
                            fp8_format=qa.fp8_format, dtype="bfloat16", stream=stream)
    pw = object.__new__(PreparedWeight)     # PreparedWeight.__init__ is Cython, as in _qa
    pw.quantized, pw.values = qa, values
    pw.mode, pw.global_scale, pw.shape = qa.mode, qa.global_scale, qa.shape
    return pw
