"""qq.torch: PyTorch training and inference with quantized operands (imported on demand;
needs torch).

    import qq.torch as qqt
    report = qqt.quantize_(model, mode="nvfp4")           # inference: nn.Linear -> QuantizedLinear
    layer = qqt.QQLinear(4096, 4096, mode="mxfp8")        # or qqt.QQLinear.from_linear(linear)
    model = qqt.convert_linear(model, mode="mxfp8")       # swap every nn.Linear in place
    y = qqt.qq_linear(x, weight, bias, mode="mxfp8")      # the autograd function

A linear layer y = x @ W^T + b runs three GEMMs per training step, each through libqq's
qqmm with both operands quantized (docs/adapters.md has the table and says how each device
runs them: on the exact path - the CPU, Hopper and older - on q's bf16 values from
qq.quantize_dequantize / quantize_dequantize_moe, x's and dy's two orientations from one
call, the GEMMs reading transposed views; where block-scaled tensor cores are, on codes):

  forward  y  = q(x) @ q(W)^T       contracts K: x in 1xG blocks along K, W in blocks along K
  dgrad    dx = q(dy) @ q(W)        contracts N: dy in 1xG blocks along N, W in blocks along N
  wgrad    dW = q(dy)^T @ q(x)      contracts T (tokens): dy and x in blocks along T

G is 32 (mxfp8, mxfp4) or 16 (nvfp4, with per-tensor global scales from qq.amax). For mxfp8
the weight is quantized once per step with 32x32 tiles (qq.quantize_moe): every element of
a tile shares one scale, so the same quantized values serve the forward GEMM (blocks along
K) and the dgrad GEMM (blocks along N) - the two operands are bit-identical up to the
transpose. nvfp4 and mxfp4 have no 32x32 form: W is quantized along K for the forward and
along N (qq.quantize_colwise) for dgrad, two different roundings of W. The wgrad operands
are quantized along T (blocks of G tokens from the first; a ragged last block counts the
missing tokens as zeros, which add nothing and do not change its scale): their values from
qq.quantize_dequantize(colwise=True) on the exact path, qq.quantize_colwise's codes where the
block-scaled tensor cores are. Accumulation is fp32; outputs
are x's dtype (y, dx) and W's dtype (dW); db = dy summed over tokens in torch (fp32, then the
bias's dtype).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch import nn

import qq
from qq import _torch_ops  # noqa: F401  (registers qq's torch ops: torch.compile support)
from qq._dispatch import check_flag

__all__ = ["QQLinear", "QQLinearFunction", "convert_linear", "qq_linear", "MODES",
           "QQGroupedLinear", "QQGroupedLinearFunction", "qq_grouped_linear",
           "QuantizedLinear", "QuantizeReport", "quantize_", "INFERENCE_MODES", "save_quantized", "load_quantized"]

MODES = ("mxfp8", "nvfp4", "mxfp4")
_log = logging.getLogger("qq.torch")
_GROUP = {m: g for m, (g, _) in qq._qq._mode_defaults().items() if m in MODES}  # libqq's defaults


def _check(x: torch.Tensor, weight: torch.Tensor, bias, mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"qq_linear: mode must be one of {MODES}; got {mode!r}")
    if not isinstance(x, torch.Tensor) or not isinstance(weight, torch.Tensor):
        raise TypeError("qq_linear: x and weight must be torch tensors")
    if bias is not None and not isinstance(bias, torch.Tensor):
        raise TypeError(f"qq_linear: bias must be a torch tensor or None; got {type(bias).__name__}")
    if weight.dim() != 2:
        raise ValueError(f"qq_linear: weight must be [out_features, in_features]; got shape {tuple(weight.shape)}")
    if x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"qq_linear: x's last axis ({x.shape[-1] if x.dim() else None}) must equal weight's "
                         f"in_features ({weight.shape[1]})")
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        if t is not None and t.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise TypeError(f"qq_linear: {name} must be float32, bfloat16 or float16; got {t.dtype}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"qq_linear: bias must have shape ({weight.shape[0]},); got {tuple(bias.shape)}")
    if x.device != weight.device or (bias is not None and bias.device != weight.device):
        raise ValueError(f"qq_linear: x, weight and bias must be on one device; got x on {x.device}, "
                         f"weight on {weight.device}" + (f", bias on {bias.device}" if bias is not None else ""))
    g = _GROUP[mode]
    n, k = weight.shape
    if k % g or n % g or (mode == "mxfp8" and (n % 32 or k % 32)) or n <= 0 or k <= 0:
        raise ValueError(f"qq_linear: in_features ({k}) and out_features ({n}) must be positive multiples of "
                         f"{g} for mode {mode!r} (both GEMM directions quantize along them); pad the layer")
    if not _rows_readable(weight):
        raise ValueError(f"qq_linear: weight has strides {weight.stride()} (a transposed, expanded or "
                         f"overlapping view); libqq reads it row by row: pass weight.contiguous()")


def _rows_readable(w: torch.Tensor) -> bool:
    """A 2-D weight libqq can read row by row: unit stride along a row, rows apart by at least
    a row (row-strided slices of a wider matrix pass; transposed or expanded views do not)."""
    return w.stride(1) == 1 and w.stride(0) >= w.shape[1]


def _gs(t: torch.Tensor, mode: str):
    """nvfp4's per-tensor global scale (amax, on t's device), else None."""
    return _usable_gs(qq.amax(t)) if mode == "nvfp4" else None


def _usable_gs(g: torch.Tensor) -> torch.Tensor:
    """An amax as a global scale: one outside nvfp4's range (NaN or Inf in the tensor, or all
    of it below 1e-30) becomes 0, "no global scale", so that the step goes on and NaN / Inf
    reach the result as they do in the other modes (what AMP's GradScaler needs to see). The
    GPU kernels read such a scale that way themselves (docs/formats.md); libqq refuses it from
    host memory, where it can check it, so CPU scales are mapped here."""
    if g.device.type != "cpu":
        return g
    return torch.where(torch.isfinite(g) & (g >= 1e-30), g, torch.zeros_like(g))


def _quantize_weight(w: torch.Tensor, mode: str):
    """The weight operands of one step: (forward, dgrad), each a dict of qqmm arguments.

    mxfp8: one 32x32 quantization of W (qq.quantize_moe) read in both orientations: the
    [N, K] operand (blocks along K) and the [K, N] operand (blocks along N) hold the same
    codes and scales. Other modes: qq.quantize (along K) and qq.quantize_colwise (along N).
    """
    if mode == "mxfp8":
        # [1, K, N] view of W^T (stride 1 on dim 1): D1 = K -> data [1, K, N] column-major,
        # i.e. W's codes row-major [N, K]; blocked scales [1, R128(N), C4(K/32)]
        d1, s1 = qq.quantize_moe(w.t().unsqueeze(0), scaling="32x32", scale_layout="blocked", torch_dtypes=False)
        # [1, N, K] = W: D1 = N -> data column-major [1, N, K], i.e. codes of W^T row-major [K, N]
        d2, s2 = qq.quantize_moe(w.unsqueeze(0), scaling="32x32", scale_layout="blocked", torch_dtypes=False)
        fwd = {"w": d1[0].t(), "scales": s1[0]}
        bwd = {"w": d2[0].t(), "scales": s2[0]}
        return fwd, bwd
    gs = _gs(w, mode)
    qf = qq.quantize(w, mode=mode, global_scale=gs, scale_layout="blocked", torch_dtypes=False)
    qb = qq.quantize_colwise(w, mode=mode, global_scale=gs, scale_layout="blocked", torch_dtypes=False)
    fwd = {"w": qf.data, "scales": qf.scales, "global_scale_w": gs}
    bwd = {"w": qb.data, "scales": qb.scales, "global_scale_w": gs}
    return fwd, bwd


def _qqmm(a: torch.Tensor, wop: dict, mode: str, dtype, bias=None, gs_a=None) -> torch.Tensor:
    """a @ q(w)^T with a quantized on the fly (global scale gs_a, or qq.amax(a), for nvfp4);
    wop holds w's packed codes and blocked scales (and nvfp4's global scale)."""
    return qq.qqmm(a, wop["w"], wop["scales"], mode=mode, global_scale_x=gs_a if gs_a is not None else _gs(a, mode),
                   global_scale_w=wop.get("global_scale_w"), scale_layout="blocked", bias=bias,
                   dtype=dtype)


def _pad_rows(t: torch.Tensor, g: int) -> torch.Tensor:
    r = (-t.shape[0]) % g
    return t if r == 0 else torch.cat([t, t.new_zeros((r, t.shape[1]))], dim=0)


def _wgrad(dy: torch.Tensor, x: torch.Tensor, mode: str, dtype, gdy=None, gx=None) -> torch.Tensor:
    """dW [N, K] = q(dy)^T @ q(x), both quantized along the tokens T.

    Where qqmm runs the exact path (Hopper and older GPUs, the CPU), as qq.grouped_qqmm_wgrad
    with one expert: the same blocks along T, quantized and dequantized in one pass per operand
    in its own orientation, then one GEMM that reads them transposed. Where the block-scaled
    tensor cores are (Blackwell), through quantize_colwise's codes and qqmm's block-scaled route.
    gdy, gx: nvfp4's global scales of dy and x when the caller has them (qq.amax otherwise)."""
    if mode == "nvfp4":
        gdy = gdy if gdy is not None else _gs(dy, mode)
        gx = gx if gx is not None else _gs(x, mode)
    if not (dy.is_cuda and _torch_ops._blockscaled_cuda(dy.device.index or 0)):
        ends = torch.full((1,), dy.shape[0], dtype=torch.int32, device=dy.device)
        return qq.grouped_qqmm_wgrad(dy, x, ends, mode=mode, global_scale_x=gdy, global_scale_dy=gx,
                                     dtype=str(dtype).rpartition(".")[2])[0]
    g = _GROUP[mode]
    dy, x = _pad_rows(dy, g), _pad_rows(x, g)
    qdy = qq.quantize_colwise(dy, mode=mode, global_scale=gdy, torch_dtypes=False)   # dy^T [N, T], blocks along T
    qx = qq.quantize_colwise(x, mode=mode, global_scale=gx, torch_dtypes=False)     # x^T  [K, T], blocks along T
    return qq.qqmm(qdy, qx, mode=mode, dtype=dtype)


def _values_path(t: torch.Tensor) -> bool:
    """Whether qqmm runs the exact path here (the CPU, GPUs without block-scaled tensor cores:
    Hopper and older): there the step works on q's bf16 values (module docstring)."""
    return not (t.is_cuda and _torch_ops._blockscaled_cuda(t.device.index or 0))


def _weight_values(w: torch.Tensor, mode: str):
    """q(W)'s bf16 values for the exact path: (forward [N, K] along K, dgrad [N, K] along N,
    nvfp4's global scale or None). mxfp8: one 32x32 quantization, whose values serve both."""
    if mode == "mxfp8":
        v = qq.quantize_dequantize_moe(w)
        return v, v, None
    gw = _gs(w, mode)
    wr, wc = qq.quantize_dequantize(w, mode, global_scale=gw, colwise=True)
    return wr, wc, gw


# The two halves of a training step on 2-D x [T, K], shared by QQLinearFunction (eager)
# and the qq::linear / qq::linear_backward custom ops (torch.compile). What the forward
# keeps for the backward travels between them as tensors ("saved"):
#   exact path (_values_path): [q(x)'s bf16 values along T, q(W)'s bf16 values along N]
#     - the forward computes x's values in both orientations from one read (the
#     column-wise ones are what wgrad needs), so the backward never reads x;
#   block-scaled path: [x, W's codes along N, their blocked scales];
#   then, for nvfp4, [W's global scale, x's global scale] (qq.amax once a step each).

def _linear_forward(x2, weight, bias, mode, need_dw=True):
    """(y [T, N] in x's dtype, saved). need_dw False (no weight gradient will be asked: grad
    mode off, a frozen weight): x's values along T are not made (an empty stand-in is saved)."""
    if _values_path(x2):
        gx = _gs(x2, mode)
        if need_dw:
            xr, xc = qq.quantize_dequantize(x2, mode, global_scale=gx, colwise=True)
        else:
            xr = qq.quantize_dequantize(x2, mode, global_scale=gx)
            xc = x2.new_empty((0, x2.shape[1]), dtype=torch.bfloat16)
        wr, wc, gw = _weight_values(weight, mode)
        y = qq.qqmm(xr, wr, mode=mode, x_prepared=True, w_prepared=True, global_scale_x=gx,
                    global_scale_w=gw, bias=bias, dtype=x2.dtype)
        return y, [xc, wc] + ([gw, gx] if mode == "nvfp4" else [])
    wf, wd = _quantize_weight(weight, mode)
    gx = _gs(x2, mode)
    y = _qqmm(x2, wf, mode, x2.dtype, bias=bias, gs_a=gx)
    return y, [x2, wd["w"], wd["scales"]] + ([wd["global_scale_w"], gx] if mode == "nvfp4" else [])


def _linear_backward(dy2, saved, mode, need_dx, need_dw, xdtype, wdtype):
    """(dx [T, K] or None, dW [N, K] or None) for dy [T, N] (in x's dtype)."""
    dx = dw = None
    nv = mode == "nvfp4"
    gdy = _gs(dy2, mode) if (need_dx or need_dw) else None
    gw, gx = (saved[-2], saved[-1]) if nv else (None, None)
    if _values_path(dy2):
        xc, wc = saved[0], saved[1]
        if not (need_dx or need_dw):
            return dx, dw
        if need_dw and xc.shape[0] != dy2.shape[0]:
            raise RuntimeError("qq_linear: a weight gradient is asked of a forward that ran without one "
                               "(grad mode off or the weight frozen then); run the forward with "
                               "weight.requires_grad set and grad mode on")
        r = qq.quantize_dequantize(dy2, mode, global_scale=gdy, rowwise=need_dx, colwise=need_dw)
        dyr, dyc = r if (need_dx and need_dw) else ((r, None) if need_dx else (None, r))
        if need_dx:     # dy [T, N] @ W [N, K]: W's values along N, read transposed
            dx = qq.qqmm(dyr, wc.t(), mode=mode, x_prepared=True, w_prepared=True, global_scale_x=gdy,
                         global_scale_w=gw, dtype=xdtype)
        if need_dw:     # dy^T [N, T] @ x [T, K]: both along T, read transposed
            dw = qq.qqmm(dyc.t(), xc.t(), mode=mode, x_prepared=True, w_prepared=True, global_scale_x=gdy,
                         global_scale_w=gx, dtype=wdtype)
        return dx, dw
    x2 = saved[0]
    if need_dx:
        wop = {"w": saved[1], "scales": saved[2], "global_scale_w": gw}
        dx = _qqmm(dy2, wop, mode, xdtype, gs_a=gdy)
    if need_dw:
        dw = _wgrad(dy2, x2, mode, wdtype, gdy, gx)
    return dx, dw


def _once_differentiable(func: str, grads, differentiable):
    """The backward's results, made to raise a clear error if differentiated again: with
    create_graph=True the backward runs in grad mode, and qq's GEMMs have no derivative, so
    a second-order term through them would silently be zero (a gradient penalty's weight
    gradient). As torch's once_differentiable, with qq's message; `differentiable[i]`: whether
    grads[i] depends on something that requires grad (dy, or the other GEMM operand saved by
    the forward), so that a gradient whose second-order term is truly zero stays a plain
    tensor, as F.linear's would."""
    if not torch.is_grad_enabled():
        return grads
    live = [g for g, d in zip(grads, differentiable) if g is not None and d]
    if not live:
        return grads
    err = torch._C._functions.DelayedError(
        f"{func}: differentiating its gradients again (create_graph=True, then a second backward "
        f"through them) is not supported: qq's quantized GEMMs have no second derivative; compute "
        f"the higher-order term with a plain nn.Linear / F.linear".encode(), len(live))
    wrapped = err(*[g.detach().requires_grad_() for g in live])
    wrapped = iter(wrapped if isinstance(wrapped, tuple) else (wrapped,))
    return tuple(next(wrapped) if g is not None and d else g for g, d in zip(grads, differentiable))


class QQLinearFunction(torch.autograd.Function):
    """y = x @ W^T + b with all three GEMMs on quantized operands (module docstring).
    Eager only: under torch.compile qq_linear runs the qq::linear custom op instead (the
    same computation, with torch.library.register_autograd)."""

    @staticmethod
    def forward(ctx, x, weight, bias, mode, need_dw=True):
        _check(x, weight, bias, mode)
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).contiguous()
        y, saved = _linear_forward(x2, weight.detach(), None if bias is None else bias.detach(), mode,
                                   need_dw)
        ctx.save_for_backward(*saved)
        ctx.mode, ctx.shape, ctx.xdtype = mode, shape, x.dtype
        ctx.x_grad, ctx.w_grad = x.requires_grad, weight.requires_grad  # (_once_differentiable)
        ctx.wdtype, ctx.has_bias = weight.dtype, bias is not None
        ctx.bdtype = bias.dtype if bias is not None else None
        return y.reshape(*shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, dy):
        saved = ctx.saved_tensors
        dy2 = dy.reshape(-1, dy.shape[-1]).contiguous()
        if dy2.dtype != ctx.xdtype:
            dy2 = dy2.to(ctx.xdtype)
        dx, dw = _linear_backward(dy2, saved, ctx.mode, ctx.needs_input_grad[0],
                                  ctx.needs_input_grad[1], ctx.xdtype, ctx.wdtype)
        db = None
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy2.sum(0, dtype=torch.float32).to(ctx.bdtype)
        # dx = dy W, dw = dy^T x: second-order terms through dy and the other operand
        dx, dw = _once_differentiable("qq_linear", (dx, dw), (dy.requires_grad or ctx.w_grad,
                                                              dy.requires_grad or ctx.x_grad))
        return None if dx is None else dx.reshape(ctx.shape), dw, db, None, None


# torch.compile: the two halves as custom ops (tensors in, tensors out; libqq runs in their
# eager implementations, the fake ones give shapes), tied by register_autograd.

@torch.library.custom_op("qq::linear", mutates_args=())
def _linear_op(x2: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
               mode: str, need_dw: bool) -> list[torch.Tensor]:
    # [y] + what the backward needs, less x itself on the block-scaled path: a custom op may
    # not return one of its inputs (_linear_setup saves x2 from the inputs there)
    y, saved = _linear_forward(x2, weight, bias, mode, need_dw)
    return [y] + (saved if _values_path(x2) else saved[1:])


@_linear_op.register_fake
def _(x2, weight, bias, mode, need_dw):
    (t, k), (n, _) = x2.shape, weight.shape
    g = _GROUP[mode]
    out = [x2.new_empty((t, n))]
    if _values_path(x2):    # x's values along T [T, K] (or an empty stand-in), W's along N [N, K]
        out += [x2.new_empty((t if need_dw else 0, k), dtype=torch.bfloat16),
                x2.new_empty((n, k), dtype=torch.bfloat16)]
    else:
        # W^T [K, N] quantized along N: codes [K, N*bits/8], blocked scales
        # [roundup(K, 128), roundup(N/g, 4)] (qqQuantizedShapes)
        out += [x2.new_empty((k, n if mode == "mxfp8" else n // 2), dtype=torch.uint8),
                x2.new_empty(((k + 127) // 128 * 128, (n // g + 3) // 4 * 4), dtype=torch.uint8)]
    if mode == "nvfp4":   # W's and x's global scales
        out += [x2.new_empty((), dtype=torch.float32), x2.new_empty((), dtype=torch.float32)]
    return out


@torch.library.custom_op("qq::linear_backward", mutates_args=())
def _linear_backward_op(dy2: torch.Tensor, saved: list[torch.Tensor], mode: str, need_dx: bool,
                        need_dw: bool, xdtype: torch.dtype, wdtype: torch.dtype) -> list[torch.Tensor]:
    # dy may arrive expanded (the gradient of .sum() has stride 0): libqq reads rows
    dx, dw = _linear_backward(dy2.contiguous(), [t.contiguous() for t in saved], mode, need_dx, need_dw,
                              xdtype, wdtype)
    return [t for t in (dx, dw) if t is not None]


@_linear_backward_op.register_fake
def _(dy2, saved, mode, need_dx, need_dw, xdtype, wdtype):
    (t, n), k = dy2.shape, saved[0].shape[1]
    out = []
    if need_dx:
        out.append(dy2.new_empty((t, k), dtype=xdtype))
    if need_dw:
        out.append(dy2.new_empty((n, k), dtype=wdtype))
    return out


def _linear_setup(ctx, inputs, output):
    x2, weight, bias, mode = inputs[:4]
    ctx.save_for_backward(*(([] if _values_path(x2) else [x2]) + list(output[1:])))
    ctx.mode, ctx.xdtype, ctx.wdtype, ctx.has_bias = mode, x2.dtype, weight.dtype, bias is not None
    ctx.bdtype = bias.dtype if bias is not None else None


def _linear_grad(ctx, grads):
    saved = list(ctx.saved_tensors)
    dy2 = grads[0].to(ctx.xdtype).contiguous()
    need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    # the op has no derivative: plain results, then _once_differentiable decides which refuse
    # a second backward, as QQLinearFunction's (_grouped_grad says why no_grad)
    with torch.no_grad():
        r = iter(_linear_backward_op(dy2, saved, ctx.mode, need_dx, need_dw, ctx.xdtype, ctx.wdtype))
    dx = next(r) if need_dx else None
    dw = next(r) if need_dw else None
    db = dy2.sum(0, dtype=torch.float32).to(ctx.bdtype) if ctx.has_bias and ctx.needs_input_grad[2] else None
    dx, dw = _once_differentiable("qq_linear", (dx, dw), (grads[0].requires_grad or need_dw,
                                                          grads[0].requires_grad or need_dx))
    return dx, dw, db, None, None


_linear_op.register_autograd(_linear_grad, setup_context=_linear_setup)


def qq_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
              mode: str = "mxfp8") -> torch.Tensor:
    """F.linear with quantized operands in the forward and both backward GEMMs.

    Eager: QQLinearFunction. Under torch.compile: the qq::linear custom op (same results),
    so that a compiled model traces without graph breaks, backward included."""
    # Whether a weight gradient can be asked of this call: if not, the forward skips x's
    # values along the tokens (wgrad's operand)
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"qq_linear: weight must be a torch tensor; got {type(weight).__name__}")
    need_dw = torch.is_grad_enabled() and weight.requires_grad
    if not torch.compiler.is_compiling():
        return QQLinearFunction.apply(x, weight, bias, mode, need_dw)
    _check(x, weight, bias, mode)
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    y = _linear_op(x2, weight, bias, mode, need_dw)[0]
    return y.reshape(*x.shape[:-1], weight.shape[0])


# ---- mixture of experts: grouped linear layers ------------------------------------------

def _grouped_values(weight: torch.Tensor, mode: str) -> bool:
    """Whether the grouped layer multiplies q(W)'s bf16 values (mxfp8 on the exact path)."""
    return mode == "mxfp8" and _values_path(weight)


def _grouped_weight_operands(weight: torch.Tensor, mode: str):
    """The expert weights [E, N, K] as grouped_qqmm's operands: (forward kwargs, dgrad kwargs).
    mxfp8: the 32x32 quantization (the tiles make both directions the same values, as for one
    matrix) - on the exact path its bf16 values [E, N, K] from one quantize_dequantize_moe
    call (dgrad reads them as a transposed view), where the block-scaled GEMMs are its codes
    from quantize_moe in each orientation; other modes: the float weight,
    quantized inside grouped_qqmm along the contracted axis (nvfp4 with per-expert amax)."""
    if _grouped_values(weight, mode):
        # the exact path multiplies q(W)'s bf16 values, one 32x32-tile quantization for both
        # directions: dgrad takes the same [E, N, K] values as a transposed view, which
        # grouped_qqmm's GEMM reads as stored (a transposed copy was 2 more bytes an element
        # of W written every step)
        v = qq.quantize_dequantize_moe(weight)
        return {"w": v, "values": True}, {"w": v.transpose(1, 2), "values": True}
    if mode == "mxfp8":
        # forward contracts K: quantize_moe on the [E, K, N] view (D1 = K); dgrad contracts N:
        # on W itself (D1 = N), read by grouped_qqmm as the [E, K, N] weight of dy @ W
        fd, fs = qq.quantize_moe(weight.transpose(1, 2), scaling="32x32", scale_layout="blocked", torch_dtypes=False)
        bd, bs = qq.quantize_moe(weight, scaling="32x32", scale_layout="blocked", torch_dtypes=False)
        return ({"w": (fd, fs), "moe_scaling": "32x32"}, {"w": (bd, bs), "moe_scaling": "32x32"})
    wt = weight.transpose(1, 2).contiguous()
    fwd, bwd = {"w": weight}, {"w": wt}
    if mode == "nvfp4":
        fwd["global_scale_w"] = _usable_gs(weight.detach().abs().amax(dim=(1, 2)).float())
        bwd["global_scale_w"] = fwd["global_scale_w"]
    return fwd, bwd


def _grouped(a: torch.Tensor, op: dict, offsets: torch.Tensor, mode: str, dtype) -> torch.Tensor:
    w = op["w"]
    kw = {"mode": mode, "dtype": dtype, "global_scale_x": _gs(a, mode)}
    if op.get("values"):
        return qq.grouped_qqmm(a, w, offsets, w_prepared=True, **kw)
    if "moe_scaling" in op:
        return qq.grouped_qqmm(a, w[0], offsets, w[1], scale_layout="blocked", moe_scaling=op["moe_scaling"], **kw)
    return qq.grouped_qqmm(a, w, offsets, global_scale_w=op.get("global_scale_w"), **kw)


def _grouped_backward(dy, x, offsets, bwd, mode, need_dx, need_dw, wdtype):
    """(dx [T, K] or None, dW [E, N, K] or None) for dy [T, N] (rows readable): the backward
    half shared by QQGroupedLinearFunction and the qq::grouped_linear_backward op; bwd is
    dgrad's weight operand from _grouped_weight_operands."""
    dx = dw = None
    if need_dx:
        dx = _grouped(dy, bwd, offsets, mode, x.dtype)
    if need_dw:
        # dW[e] [N, K] = q(dy_e)^T @ q(x_e): grouped_qqmm_wgrad(a, b) gives a_e^T @ b_e
        # written in the weight's dtype by the GEMM itself (one rounding, as .to() of an
        # fp32 result would give, without an fp32 [E, N, K] round trip through memory)
        gdy, gx = (_gs(dy, mode), _gs(x, mode))
        wname = str(wdtype).rpartition(".")[2]
        direct = wname in ("float32", "bfloat16", "float16")
        dw = qq.grouped_qqmm_wgrad(dy, x, offsets, mode=mode, global_scale_x=gdy, global_scale_dy=gx,
                                   dtype=wname if direct else "float32")
        if not direct:
            dw = dw.to(wdtype)
    return dx, dw


class QQGroupedLinearFunction(torch.autograd.Function):
    """Router-free MoE linear: tokens x [T, K] sorted by expert, int32 cumulative group ends
    `offsets` [E], expert weights [E, N, K] -> y [T, N], y[rows of e] = x_e @ W[e]^T. All three
    GEMMs quantized as in QQLinear (forward and dgrad through qq.grouped_qqmm, the weight
    gradient through qq.grouped_qqmm_wgrad, blocks along the tokens of each expert).
    Eager only: under torch.compile qq_grouped_linear runs the qq::grouped_linear custom op
    instead (the same computation, with torch.library.register_autograd)."""

    @staticmethod
    def forward(ctx, x, weight, offsets, mode):
        fwd, bwd = _grouped_weight_operands(weight.detach(), mode)
        y = _grouped(x, fwd, offsets, mode, x.dtype)
        ctx.save_for_backward(x, offsets)
        ctx.bwd, ctx.mode, ctx.wdtype = bwd, mode, weight.dtype
        ctx.x_grad, ctx.w_grad = x.requires_grad, weight.requires_grad  # (_once_differentiable)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, offsets = ctx.saved_tensors
        dx, dw = _grouped_backward(dy.contiguous(), x, offsets, ctx.bwd, ctx.mode, ctx.needs_input_grad[0],
                                   ctx.needs_input_grad[1], ctx.wdtype)
        # (ctx.bwd stays: a graph kept with retain_graph=True is backed through again; the
        # operands go with the graph)
        dx, dw = _once_differentiable("qq_grouped_linear", (dx, dw), (dy.requires_grad or ctx.w_grad,
                                                                      dy.requires_grad or ctx.x_grad))
        return dx, dw, None, None


# torch.compile: the grouped layer's two halves as custom ops, as qq::linear's. dgrad's weight
# operand goes from the forward op to the backward op as a list of tensors (an op returns no
# dicts, and no output may alias an input or another output):
#   mxfp8, exact path: [q(W)'s bf16 values [E, N, K]] - dgrad's transposed view of them is
#     made again in the backward;
#   mxfp8, block-scaled path: [quantize_moe's codes of W, their blocked scales];
#   nvfp4 / mxfp4: [W^T [E, K, N]], then for nvfp4 the per-expert global scales [E].
# x and the offsets, the op's inputs, are saved from there (_grouped_setup).

def _dgrad_tensors(fwd: dict, bwd: dict) -> list:
    """_grouped_weight_operands's dgrad operand as the tensors listed above."""
    if bwd.get("values"):
        return [fwd["w"]]       # the values themselves; bwd holds their transposed view
    if "moe_scaling" in bwd:
        return list(bwd["w"])
    return [bwd["w"]] + ([bwd["global_scale_w"]] if "global_scale_w" in bwd else [])


def _dgrad_operand(t: list, mode: str) -> dict:
    """The inverse of _dgrad_tensors: the dict _grouped_weight_operands gave."""
    if _grouped_values(t[0], mode):
        return {"w": t[0].transpose(1, 2), "values": True}
    if mode == "mxfp8":
        return {"w": (t[0], t[1]), "moe_scaling": "32x32"}
    return {"w": t[0], **({"global_scale_w": t[1]} if mode == "nvfp4" else {})}


# Both call grouped_qqmm, which reads the offsets on the host off Hopper: tagged as it is
# (cudagraph_unsafe)
@torch.library.custom_op("qq::grouped_linear", mutates_args=(), tags=_torch_ops._HOST_SYNC_TAGS)
def _grouped_linear_op(x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor,
                       mode: str) -> list[torch.Tensor]:
    fwd, bwd = _grouped_weight_operands(weight, mode)
    return [_grouped(x, fwd, offsets, mode, x.dtype)] + _dgrad_tensors(fwd, bwd)


@_grouped_linear_op.register_fake
def _(x, weight, offsets, mode):
    (t, _), (e, n, k) = x.shape, weight.shape
    out = [x.new_empty((t, n))]
    if _grouped_values(weight, mode):
        return out + [weight.new_empty((e, n, k), dtype=torch.bfloat16)]
    if mode == "mxfp8":     # quantize_moe's codes (column-major per expert) and scales: its fake
        return out + list(torch.ops.qq.quantize_moe(weight, "32x32", "ceil", "blocked", "e4m3", "false"))
    return out + [weight.new_empty((e, k, n))] + ([weight.new_empty((e,), dtype=torch.float32)]
                                                  if mode == "nvfp4" else [])


@torch.library.custom_op("qq::grouped_linear_backward", mutates_args=(), tags=_torch_ops._HOST_SYNC_TAGS)
def _grouped_linear_backward_op(dy: torch.Tensor, x: torch.Tensor, offsets: torch.Tensor,
                                dgrad: list[torch.Tensor], mode: str, need_dx: bool, need_dw: bool,
                                wdtype: torch.dtype) -> list[torch.Tensor]:
    # dy may arrive expanded (the gradient of .sum() has stride 0): libqq reads rows
    dx, dw = _grouped_backward(dy.contiguous(), x.contiguous(), offsets, _dgrad_operand(dgrad, mode), mode,
                               need_dx, need_dw, wdtype)
    return [t for t in (dx, dw) if t is not None]


@_grouped_linear_backward_op.register_fake
def _(dy, x, offsets, dgrad, mode, need_dx, need_dw, wdtype):
    return (([x.new_empty(x.shape)] if need_dx else [])
            + ([x.new_empty((offsets.shape[0], dy.shape[1], x.shape[1]), dtype=wdtype)] if need_dw else []))


def _grouped_setup(ctx, inputs, output):
    x, weight, offsets, mode = inputs
    ctx.save_for_backward(x, offsets, *output[1:])
    ctx.mode, ctx.wdtype = mode, weight.dtype


def _grouped_grad(ctx, grads):
    x, offsets, *dgrad = ctx.saved_tensors
    dy = grads[0]
    need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    # The op has no derivative: its results are made plain, as QQGroupedLinearFunction's
    # qq calls give them, and _once_differentiable (in grad mode: backend="eager" with
    # create_graph=True; AOTAutograd traces this without) decides which refuse a second
    # backward (without no_grad, x as an input would give dx of a frozen weight a graph)
    with torch.no_grad():
        r = iter(_grouped_linear_backward_op(dy, x, offsets, dgrad, ctx.mode, need_dx, need_dw, ctx.wdtype))
    dx = next(r) if need_dx else None
    dw = next(r) if need_dw else None
    dx, dw = _once_differentiable("qq_grouped_linear", (dx, dw), (dy.requires_grad or need_dw,
                                                                  dy.requires_grad or need_dx))
    return dx, dw, None, None


_grouped_linear_op.register_autograd(_grouped_grad, setup_context=_grouped_setup)


def qq_grouped_linear(x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor,
                      mode: str = "mxfp8") -> torch.Tensor:
    """y [T, N] of tokens x [T, K] sorted by expert through expert weights [E, N, K], with
    quantized operands in the forward and both backward GEMMs.
    offsets: int32 [E], cumulative group ends (the last = T; empty experts allowed).

    Eager: QQGroupedLinearFunction. Under torch.compile: the qq::grouped_linear custom op
    (same results), so that a compiled model traces without graph breaks, backward included."""
    if mode not in MODES:
        raise ValueError(f"qq_grouped_linear: mode must be one of {MODES}; got {mode!r}")
    for name, t in (("x", x), ("weight", weight), ("offsets", offsets)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"qq_grouped_linear: {name} must be a torch tensor; got {type(t).__name__}")
    for name, t in (("x", x), ("weight", weight)):
        if t.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise TypeError(f"qq_grouped_linear: {name} must be float32, bfloat16 or float16; got {t.dtype}")
    if offsets.dtype != torch.int32 or offsets.dim() != 1:
        raise TypeError(f"qq_grouped_linear: offsets must be int32 [E] (cumulative group ends); got "
                        f"{offsets.dtype} of shape {tuple(offsets.shape)}"
                        + (": pass offsets.to(torch.int32)" if offsets.dim() == 1 and not offsets.is_floating_point()
                           else ""))
    if x.dim() != 2 or weight.dim() != 3 or x.shape[1] != weight.shape[2]:
        raise ValueError(f"qq_grouped_linear: x must be [T, K] and weight [E, N, K] with the same K; got "
                         f"x {tuple(x.shape)}, weight {tuple(weight.shape)}")
    g = _GROUP[mode]
    if weight.shape[1] % 32 or weight.shape[2] % 32:
        raise ValueError(f"qq_grouped_linear: N ({weight.shape[1]}) and K ({weight.shape[2]}) must be multiples "
                         f"of 32 (both GEMM directions quantize along them, in blocks of {g}); pad the experts")
    if weight.shape[0] != offsets.shape[0]:
        raise ValueError(f"qq_grouped_linear: weight has {weight.shape[0]} experts but offsets {offsets.shape[0]} "
                         f"group ends; give one end per expert")
    if x.device != weight.device or offsets.device != weight.device:
        raise ValueError(f"qq_grouped_linear: x, weight and offsets must be on one device; got x on {x.device}, "
                         f"weight on {weight.device}, offsets on {offsets.device}")
    if weight.stride(2) != 1 or weight.stride(1) < weight.shape[2]:
        raise ValueError(f"qq_grouped_linear: weight has strides {weight.stride()} (a transposed, expanded or "
                         f"overlapping view); libqq reads each expert row by row: pass weight.contiguous()")
    # x (and offsets) of any strides, as nn.Linear and qq_linear take x (read row by row)
    x, offsets = x.contiguous(), offsets.contiguous()
    if not torch.compiler.is_compiling():
        return QQGroupedLinearFunction.apply(x, weight, offsets, mode)
    return _grouped_linear_op(x, weight, offsets, mode)[0]


class QQGroupedLinear(nn.Module):
    """E experts' linear layers [E, N, K] (no bias) applied to tokens sorted by expert:
    forward(x [T, K], offsets int32 [E]) -> [T, N]; see qq_grouped_linear."""

    def __init__(self, num_experts: int, in_features: int, out_features: int, mode: str = "mxfp8",
                 device=None, dtype=None):
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"QQGroupedLinear: mode must be one of {MODES}; got {mode!r}")
        self.num_experts, self.in_features, self.out_features, self.mode = num_experts, in_features, out_features, mode
        self.weight = nn.Parameter(torch.empty(num_experts, out_features, in_features, device=device, dtype=dtype))
        bound = 1.0 / in_features ** 0.5   # nn.Linear's default init, per expert
        nn.init.uniform_(self.weight, -bound, bound)

    def forward(self, x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return qq_grouped_linear(x, self.weight, offsets, self.mode)

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, in_features={self.in_features}, "
                f"out_features={self.out_features}, mode={self.mode!r}")


class QQLinear(nn.Linear):
    """nn.Linear whose forward and backward GEMMs run through qq.qqmm (module docstring).

    Same parameters and state dict as nn.Linear, plus `mode` ("mxfp8", "nvfp4" or
    "mxfp4"); in_features and out_features must be multiples of the mode's block (32; 16
    for nvfp4)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None,
                 mode: str = "mxfp8"):
        if mode not in MODES:
            raise ValueError(f"QQLinear: mode must be one of {MODES}; got {mode!r}")
        g = _GROUP[mode]
        if in_features % g or out_features % g or in_features <= 0 or out_features <= 0:
            raise ValueError(f"QQLinear: in_features ({in_features}) and out_features ({out_features}) must "
                             f"be positive multiples of {g} for mode {mode!r}")
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.mode = mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return qq_linear(x, self.weight, self.bias, self.mode)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", mode={self.mode!r}"

    @classmethod
    def from_linear(cls, linear: nn.Linear, mode: str = "mxfp8") -> "QQLinear":
        """A QQLinear sharing `linear`'s parameters (no copy)."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"QQLinear.from_linear: expected an nn.Linear; got {type(linear).__name__}")
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = linear.in_features, linear.out_features
        new.weight = linear.weight
        new.bias = linear.bias
        new.mode = mode
        if mode not in MODES:
            raise ValueError(f"QQLinear.from_linear: mode must be one of {MODES}; got {mode!r}")
        g = _GROUP[mode]
        if new.in_features % g or new.out_features % g or new.in_features <= 0 or new.out_features <= 0:
            raise ValueError(f"QQLinear.from_linear: in_features ({new.in_features}) and out_features "
                             f"({new.out_features}) must be positive multiples of {g} for mode {mode!r}")
        return new


def convert_linear(module: nn.Module, mode: str = "mxfp8", filter_fn=None) -> nn.Module:
    """Replace every nn.Linear child of `module` (recursively; `module` itself if it is one)
    by QQLinear.from_linear(child, mode), keeping its parameters. filter_fn(name, linear)
    -> bool chooses which ones (default: all whose sizes fit the mode's block). Returns the
    module (changed in place)."""
    g = _GROUP.get(mode) if isinstance(mode, str) else None
    if g is None:
        raise ValueError(f"convert_linear: mode must be one of {MODES}; got {mode!r}")
    if not isinstance(module, nn.Module):
        raise TypeError(f"convert_linear: module must be an nn.Module; got {type(module).__name__}")

    def want(name, lin):
        if filter_fn is not None:
            return filter_fn(name, lin)
        if lin.in_features % g == 0 and lin.out_features % g == 0 and lin.in_features > 0 and lin.out_features > 0:
            return True
        # not silent: a layer left in bf16 changes the model's speed and numerics
        _log.warning("convert_linear: %s (in_features=%d, out_features=%d) left as nn.Linear: both must be "
                     "positive multiples of %d for mode %r", name or "<module>", lin.in_features, lin.out_features, g, mode)
        return False

    if isinstance(module, nn.Linear) and not isinstance(module, QQLinear):
        return QQLinear.from_linear(module, mode) if want("", module) else module
    done: dict = {}  # id(linear) -> its QQLinear: a layer registered under two names stays one layer
    for name, child, cname, c in _child_slots(module):
        if isinstance(c, nn.Linear) and not isinstance(c, QQLinear):
            full = f"{name}.{cname}" if name else cname
            if id(c) in done:
                setattr(child, cname, done[id(c)])
            elif want(full, c):
                done[id(c)] = QQLinear.from_linear(c, mode)
                setattr(child, cname, done[id(c)])
    return module


def _child_slots(model: nn.Module):
    """(parent name, parent, child name, child) of every child slot below `model`, a child
    registered under two names (s.c = s.a) once for each: named_children() and
    named_modules() list a module once, which converted one of the two names and left the
    other a float layer. Listed before any is replaced."""
    return [(pname, parent, cname, child) for pname, parent in model.named_modules()
            for cname, child in list(parent._modules.items()) if child is not None]


# ---------------------------------------------------------------------------
# Inference: QuantizedLinear and quantize_ (docs/adapters.md, "Inference")
# ---------------------------------------------------------------------------


INFERENCE_MODES = ("nvfp4", "mxfp4", "mxfp8", "affine")
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def _inference_params(func: str, mode: str, group_size, bits, weight_only: bool, decode_layout: bool = False):
    """(group_size, bits) of `mode` with the caller's overrides; ValueError naming func."""
    defaults = qq._qq._mode_defaults()
    if mode not in INFERENCE_MODES:
        raise ValueError(f"{func}: mode must be one of {INFERENCE_MODES}; got {mode!r}")
    if mode == "affine" and not weight_only:
        raise ValueError(f"{func}: mode 'affine' runs weight-only (qqmm has no affine form); "
                         f"pass weight_only=True or an fp mode")
    if decode_layout and not weight_only:
        raise ValueError(f"{func}: decode_layout=True is the weight-only matmul's layout (qqmm has no decode "
                         f"form); pass weight_only=True or decode_layout=False")
    check_flag(func, "weight_only", weight_only)
    check_flag(func, "decode_layout", decode_layout)
    for name, v in (("group_size", group_size), ("bits", bits)):
        if v is not None and (isinstance(v, bool) or not hasattr(v, "__index__")):
            raise TypeError(f"{func}: {name} must be an int or None (the mode's default); got {v!r}")
    g, b = defaults[mode]
    g, b = (g if group_size is None else int(group_size)), (b if bits is None else int(bits))
    qq._qq._jax_quant_params(func, mode, g, b, "ceil", "linear", "e4m3")   # libqq's rule: ValueError naming func
    return g, b


def _refreshed(old, new, field: str):
    """`new` (a qq.DecodeWeight or PreparedWeight), or `old` holding new's bytes: when the
    tensors named `field` of both have one shape, dtype and device, new's are copied into
    old's storage (stream-ordered), so that a CUDA graph captured on `old` reads the new
    weights."""
    a = None if old is None else getattr(old, field)
    b = getattr(new, field)
    if a is None or b is None or a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return new
    a.copy_(b)
    old.quantized, old.global_scale = new.quantized, new.global_scale
    return old


class QuantizedLinear(nn.Module):
    """Inference linear layer holding a packed quantized weight: y = x @ W^T + bias with W
    = dequantize(weight), through qq.quantized_matmul (weight_only=True: x stays in its
    dtype) or qq.qqmm (weight_only=False: x is quantized per call too, fp modes only).

    The state is the packed weight as plain tensors (buffers): `weight` (uint8
    [out, in*bits/8]), `weight_scales` ([out, in/group_size]: uint8 for fp modes, the
    weight's float dtype for affine), `weight_biases` (affine only), `weight_global_scale`
    (nvfp4: float32 [], the weight's amax) and `bias`. So `state_dict()` round-trips
    through torch.save / torch.load(weights_only=True) and safetensors, and the layout is
    the MLX-compatible one docs/formats.md defines. weight_only=False keeps, in eager mode,
    qq.prepare_weight's form of the weight as a cache next to it (rebuilt when the buffers
    change; not part of the state).

    decode_layout=True (weight-only, CUDA): the layer also keeps its weight in the decode
    layout (qq.prepare_decode: the decode kernel's, faster per token than the packed
    weight's routes at decode sizes, for as much memory again as the packed weight), built
    at the first eager call on a CUDA device; not part of the state. quantized_matmul then
    takes it, and its packed weight where the decode kernel does not apply (more rows,
    float32 x, older GPUs). A weight qq.prepare_decode refuses stays packed, with one
    WARNING on the logger "qq.torch". The packed weight runs on the CPU (whose matmul reads
    the packed layout faster), under torch.compile, and inside a CUDA graph capture before
    any eager call built the layout.

    The caches (the decode layout, the prepared weight) follow the buffers' storage and
    version counters: an eager call after load_state_dict or an in-place op on a buffer
    rebuilds them, into their own storage where the shapes allow, so a CUDA graph captured
    earlier reads the new weights from its next replay after that call. Writes the counters
    do not see (through `.data`, DLPack, another library) need invalidate_caches()."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, mode: str = "nvfp4",
                 group_size: Optional[int] = None, bits: Optional[int] = None, weight_only: bool = True,
                 decode_layout: bool = False, device=None, dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        g, b = _inference_params("QuantizedLinear", mode, group_size, bits, weight_only, decode_layout)
        if in_features % g or in_features <= 0 or out_features < 0:
            raise ValueError(f"QuantizedLinear: in_features ({in_features}) must be a positive multiple of "
                             f"group_size ({g}) for mode {mode!r}, out_features ({out_features}) >= 0")
        if dtype not in _FLOATS:
            raise TypeError(f"QuantizedLinear: dtype must be float32, bfloat16 or float16; got {dtype}")
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.mode, self.group_size, self.bits, self.weight_only = mode, g, b, bool(weight_only)
        self.decode_layout = bool(decode_layout)
        fp = mode != "affine"
        self.register_buffer("weight", torch.zeros(out_features, in_features * b // 8, dtype=torch.uint8,
                                                   device=device))
        self.register_buffer("weight_scales", torch.zeros(out_features, in_features // g,
                                                          dtype=torch.uint8 if fp else dtype, device=device))
        self.register_buffer("weight_biases", None if fp else torch.zeros(out_features, in_features // g,
                                                                            dtype=dtype, device=device))
        self.register_buffer("weight_global_scale",
                             torch.ones((), dtype=torch.float32, device=device) if mode == "nvfp4" else None)
        self.register_buffer("bias", torch.zeros(out_features, dtype=dtype, device=device) if bias else None)
        self._prepared = None  # (key, qq.PreparedWeight): weight_only=False, eager
        self._decode = None    # (key, qq.DecodeWeight or None): decode_layout=True, eager
        self._capture_warned = False

    @classmethod
    def from_linear(cls, linear: nn.Linear, mode: str = "nvfp4", *, group_size: Optional[int] = None,
                    bits: Optional[int] = None, weight_only: bool = True,
                    decode_layout: bool = False) -> "QuantizedLinear":
        """Quantize `linear`'s weight (qq.quantize, linear scales; nvfp4 with the weight's
        amax as global scale) into a new QuantizedLinear on the same device, with its bias
        (and dtype) kept."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"QuantizedLinear.from_linear: expected an nn.Linear; got {type(linear).__name__}")
        w = linear.weight.detach()
        if w.dtype not in _FLOATS:
            raise TypeError(f"QuantizedLinear.from_linear: weight must be float32, bfloat16 or float16; got {w.dtype}")
        if w.is_meta:
            raise ValueError("QuantizedLinear.from_linear: weight is on the meta device (no values to quantize); "
                             "load the float weights first, or load a save_quantized file with load_quantized")
        if w.dim() == 2 and w.numel() and not _rows_readable(w):
            raise ValueError(f"QuantizedLinear.from_linear: weight has strides {w.stride()} (a transposed or "
                             f"expanded view); libqq reads it row by row: give the layer a contiguous weight")
        new = cls(linear.in_features, linear.out_features, linear.bias is not None, mode=mode,
                  group_size=group_size, bits=bits, weight_only=weight_only, decode_layout=decode_layout,
                  device=w.device, dtype=w.dtype)
        gs = qq.amax(w) if mode == "nvfp4" else None
        if gs is not None and not bool(torch.isfinite(gs)):   # once per layer, at conversion
            raise ValueError(f"QuantizedLinear.from_linear: weight holds NaN or Inf (its amax, nvfp4's global "
                             f"scale, is {float(gs)}); fix the weight before quantizing it")
        # uint8 bytes (torch_dtypes=False): the buffers' dtype, so copy_ moves bytes, not values
        q = qq.quantize(w, new.group_size, new.bits, mode, global_scale=gs, torch_dtypes=False)
        with torch.no_grad():
            new.weight.copy_(q.data)
            new.weight_scales.copy_(q.scales)
            if q.biases is not None:
                new.weight_biases.copy_(q.biases)
            if gs is not None:
                new.weight_global_scale.copy_(gs.reshape(()))
            if linear.bias is not None:
                new.bias.copy_(linear.bias.detach())
        return new

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # load_state_dict copies with copy_, which converts values: a float or float8-typed
        # tensor (qq.quantize's default torch_dtypes=True) copied into the uint8 buffers would
        # become other bytes, silently. The buffers take bytes (uint8) only; affine's scales
        # and biases, float values.
        fp = self.mode != "affine"
        for name in ("weight", "weight_scales", "weight_biases"):
            t = state_dict.get(prefix + name)
            if not isinstance(t, torch.Tensor):
                continue
            want_bytes = name == "weight" or fp
            if want_bytes and t.dtype != torch.uint8:
                fix = (f"pass its bytes: t.view(torch.uint8)" if t.element_size() == 1 else
                       "pass the uint8 buffers of a QuantizedLinear / save_quantized file (or "
                       "qq.quantize(..., torch_dtypes=False)'s)")
                raise TypeError(f"QuantizedLinear.load_state_dict: {prefix}{name} has dtype {t.dtype}; the "
                                f"{self.mode} buffer holds packed bytes (uint8), and copying would convert "
                                f"values instead of bytes; {fix}")
            if not want_bytes and not t.dtype.is_floating_point:
                raise TypeError(f"QuantizedLinear.load_state_dict: {prefix}{name} has dtype {t.dtype}; "
                                f"affine scales and biases are float values (the weight's dtype)")
        return super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _apply(self, fn, recurse=True):
        # .to(dtype) / .half() cast every float buffer; nvfp4's global scale stays float32
        # (libqq reads it as float32), taken from its value before the cast.
        gs = self.weight_global_scale
        out = super()._apply(fn, recurse)
        if gs is not None and self.weight_global_scale.dtype != torch.float32:
            self.weight_global_scale = gs.to(device=self.weight_global_scale.device, dtype=torch.float32)
        self._prepared = self._decode = None
        return out

    def _key(self) -> tuple:
        """What the weight caches depend on: each buffer's storage and version. (Read from
        _buffers: nn.Module's __getattr__ costs ~0.5 us a buffer, a hot path's share.)"""
        b = self._buffers
        w, s, bi, g = b["weight"], b["weight_scales"], b["weight_biases"], b["weight_global_scale"]
        return (w.data_ptr(), w._version, s.data_ptr(), s._version,
                bi is not None and (bi.data_ptr(), bi._version), g is not None and (g.data_ptr(), g._version))

    def _quantized(self):
        return qq.QuantizedArray(self.weight, self.weight_scales, self.weight_biases, mode=self.mode,
                                 group_size=self.group_size, bits=self.bits, global_scale=self.weight_global_scale)

    def invalidate_caches(self) -> None:
        """Mark the weight caches stale: the next eager call rebuilds them (into their own
        storage where the shapes allow, as after load_state_dict). Call it after writing
        the buffers in a way torch's version counters do not see: through `.data`, DLPack
        or another library."""
        if self._prepared is not None:
            self._prepared = (None, self._prepared[1])
        if self._decode is not None:
            self._decode = (None, self._decode[1])

    def __getstate__(self):
        # pickling and deepcopy carry the state, not the caches (device memory, rebuilt on use)
        state = self.__dict__.copy()
        state["_prepared"] = state["_decode"] = None
        return state

    def __setstate__(self, state):
        # layers pickled before decode_layout existed (torch.save(model)) get its defaults
        for k, v in (("decode_layout", False), ("_decode", None), ("_capture_warned", False), ("_prepared", None)):
            state.setdefault(k, v)
        super().__setstate__(state)

    def _prepared_weight(self):
        """qq.prepare_weight's form of the weight, cached while the buffers are unchanged."""
        key = self._key()
        c = self._prepared
        if c is None or c[0] != key:
            new = qq.prepare_weight(self._quantized())
            self._prepared = (key, _refreshed(c and c[1], new, "values"))
        return self._prepared[1]

    def _decode_weight(self):
        """The weight in the decode layout (qq.prepare_decode), cached while the buffers are
        unchanged; None where the layout refuses it or a CUDA graph is being captured with
        no current layout (prepare_decode waits for its stream once, which a capture does
        not allow)."""
        key = self._key()
        c = self._decode
        if c is not None and c[0] == key:
            return c[1]
        if self._buffers["weight"].is_cuda and torch.cuda.is_current_stream_capturing():
            if not self._capture_warned:
                self._capture_warned = True
                _log.warning("QuantizedLinear(%d -> %d, decode_layout=True): no eager call built the decode "
                             "layout of the current weights before this CUDA graph capture; the packed weight "
                             "runs in the graph (warm up before capturing)", self.in_features, self.out_features)
            return None
        try:
            dw = _refreshed(c and c[1], qq.prepare_decode(self._quantized()), "data")
        except (ValueError, qq.NotSupportedError) as e:
            _log.warning("QuantizedLinear(%d -> %d, mode %r): the decode layout refuses the weight, which "
                         "stays packed: %s", self.in_features, self.out_features, self.mode, e)
            dw = None
        self._decode = (key, dw)
        return dw

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.shape if isinstance(x, torch.Tensor) else None
        if not s or s[-1] != self.in_features:
            if s is None:
                raise TypeError(f"QuantizedLinear: x must be a torch tensor; got {type(x).__name__}")
            raise ValueError(f"QuantizedLinear: x's last axis ({s[-1] if s else None}) must equal in_features "
                             f"({self.in_features})")
        flat = x.dim() == 2
        x2 = x if flat else x.reshape(-1, self.in_features)
        if x2.numel() and not _rows_readable(x2):  # a transposed or expanded x, as nn.Linear takes
            x2 = x2.contiguous()
        if x.requires_grad and torch.is_grad_enabled() and not torch.compiler.is_compiling():
            y = _QuantizedLinearInput.apply(x2, self)   # x's gradient (adapters on a frozen base)
        else:
            y = self._matmul(x2)
        return y if flat else y.reshape(*x.shape[:-1], self.out_features)

    def _matmul(self, x2: torch.Tensor) -> torch.Tensor:
        """y [T, out] for x2 [T, in]: the layer's product, bias included."""
        if self.weight_only:
            dw = None
            if self.decode_layout and not torch.compiler.is_compiling() and self._buffers["weight"].is_cuda:
                dw = self._decode_weight()
            if dw is not None:
                y = qq.quantized_matmul(x2, dw, bias=self._buffers["bias"])
            else:
                y = qq.quantized_matmul(x2, self.weight, self.weight_scales, self.weight_biases,
                                        group_size=self.group_size, bits=self.bits, mode=self.mode,
                                        global_scale=self.weight_global_scale, bias=self.bias)
        else:
            gsx = qq.amax(x2) if self.mode == "nvfp4" else None
            if torch.compiler.is_compiling():  # packed form: the prepared cache is eager state
                y = qq.qqmm(x2, self.weight, self.weight_scales, self.group_size, self.bits, self.mode,
                            global_scale_x=gsx, global_scale_w=self.weight_global_scale, bias=self.bias)
            else:
                y = qq.qqmm(x2, self._prepared_weight(), global_scale_x=gsx, bias=self.bias)
        return y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"mode={self.mode!r}, group_size={self.group_size}, bits={self.bits}, weight_only={self.weight_only}"
                + (", decode_layout=True" if self.decode_layout else ""))


class _QuantizedLinearInput(torch.autograd.Function):
    """QuantizedLinear's product where x requires grad (eager): the layer's result, and
    x's gradient dy @ W with the packed weight itself (qq.quantized_matmul, transpose=False:
    dy [T, out] times W [out, in], W = dequantize(weight) exactly; for weight_only=False the
    straight-through estimate through q(x)). The weight and bias are buffers: no gradient.
    Without it the result had no grad_fn and x's gradient was silently lost (a LoRA adapter
    or a prefix under a frozen quantized base)."""

    @staticmethod
    def forward(ctx, x2, layer):
        ctx.layer, ctx.xdtype = layer, x2.dtype
        return layer._matmul(x2)

    @staticmethod
    def backward(ctx, dy):
        l = ctx.layer
        dx = qq.quantized_matmul(dy.contiguous(), l.weight, l.weight_scales, l.weight_biases, transpose=False,
                                 group_size=l.group_size, bits=l.bits, mode=l.mode,
                                 global_scale=l.weight_global_scale, dtype=ctx.xdtype)
        (dx,) = _once_differentiable("QuantizedLinear", (dx,), (dy.requires_grad,))
        return dx, None


@dataclass
class QuantizeReport:
    """What quantize_ did: `converted` [(name, in_features, out_features)], `skipped`
    [(name, reason)]."""
    converted: list = field(default_factory=list)
    skipped: list = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"qq.torch.quantize_: {len(self.converted)} linear layers converted, {len(self.skipped)} skipped"]
        lines += [f"  skipped {name}: {why}" for name, why in self.skipped]
        return "\n".join(lines)


def quantize_(model: nn.Module, mode: str = "nvfp4", *, weight_only: bool = True,
              filter_fn: Optional[Callable[[nn.Module, str], bool]] = None, group_size: Optional[int] = None,
              bits: Optional[int] = None, decode_layout: bool = False) -> QuantizeReport:
    """Replace, in place, every nn.Linear of `model` (recursively; not `model` itself) by a
    QuantizedLinear holding its weight quantized in `mode` (nvfp4, mxfp4, mxfp8, affine with
    `bits`), run weight-only (qq.quantized_matmul) or with x quantized too
    (weight_only=False: qq.qqmm). `filter_fn(module, fqn) -> bool` (torchao's signature)
    picks layers; layers whose in_features is not a multiple of the group size, or whose
    weight is not float, are skipped. decode_layout=True: each layer also keeps its weight in
    the decode layout (QuantizedLinear's docstring). Returns a QuantizeReport and logs it
    (logger "qq.torch": one INFO line, one WARNING per skipped layer)."""
    g, b = _inference_params("quantize_", mode, group_size, bits, weight_only, decode_layout)
    if not isinstance(model, nn.Module):
        raise TypeError(f"quantize_: model must be an nn.Module; got {type(model).__name__}")
    report = QuantizeReport()
    done: dict = {}  # id(linear) -> its QuantizedLinear: a layer under two names stays one layer
    for parent_name, parent, cname, child in _child_slots(model):
        # (QQLinear, qq's training layer, is an nn.Linear: its float weight is quantized
        # like any other, the train-then-quantize flow)
        if not isinstance(child, nn.Linear):
            continue
        fqn = f"{parent_name}.{cname}" if parent_name else cname
        if id(child) in done:
            if done[id(child)] is not None:
                setattr(parent, cname, done[id(child)])
                report.converted.append((fqn, child.in_features, child.out_features))
            continue
        done[id(child)] = None
        if filter_fn is not None and not filter_fn(child, fqn):
            report.skipped.append((fqn, "filter_fn returned False"))
            continue
        if child.in_features % g or child.in_features <= 0:
            report.skipped.append((fqn, f"in_features ({child.in_features}) is not a positive multiple of group_size "
                                        f"{g} for mode {mode!r}"))
            continue
        if child.weight.dtype not in _FLOATS:
            report.skipped.append((fqn, f"weight dtype {child.weight.dtype} is not float32/bfloat16/float16"))
            continue
        done[id(child)] = QuantizedLinear.from_linear(child, mode, group_size=g, bits=b, weight_only=weight_only,
                                                      decode_layout=decode_layout)
        setattr(parent, cname, done[id(child)])
        report.converted.append((fqn, child.in_features, child.out_features))
    _log.info("quantize_(mode=%r, weight_only=%s): %d linear layers converted, %d skipped", mode, weight_only,
              len(report.converted), len(report.skipped))
    for name, why in report.skipped:
        _log.warning("quantize_: %s left as nn.Linear: %s", name, why)
    return report


def _layer_config(m: "QuantizedLinear") -> dict:
    return {"in_features": m.in_features, "out_features": m.out_features, "bias": m.bias is not None,
            "mode": m.mode, "group_size": m.group_size, "bits": m.bits, "weight_only": m.weight_only,
            "dtype": str(m.weight_scales.dtype if m.mode == "affine" else
                         (m.bias.dtype if m.bias is not None else torch.bfloat16)).replace("torch.", "")}


def save_quantized(model: nn.Module, path, metadata: Optional[dict] = None) -> None:
    """Write `model`'s state dict (after quantize_) to the safetensors file `path`, with
    what load_quantized needs to rebuild its QuantizedLinear layers. The file is also a
    qq.checkpoint file: qq.checkpoint.load reads each layer's weight as a QuantizedArray
    (docs/checkpoints.md)."""
    import json
    from . import checkpoint as ck
    try:
        from safetensors.torch import save_file
    except ImportError as e:
        raise ImportError("save_quantized: needs the safetensors package: pip install safetensors") from e
    layers = {fqn: m for fqn, m in model.named_modules() if isinstance(m, QuantizedLinear)}
    meta = {"qq.format": ck.FORMAT, "qq.torch.layers": json.dumps({f: _layer_config(m) for f, m in layers.items()})}
    for fqn, m in layers.items():
        info = {"mode": m.mode, "group_size": m.group_size, "bits": m.bits, "rounding": "ceil",
                "scale_layout": "linear", "fp8_format": "e4m3", "shape": [m.out_features, m.in_features]}
        meta[ck._META_PREFIX + (f"{fqn}.weight" if fqn else "weight")] = json.dumps(info, sort_keys=True)
    for k, v in (metadata or {}).items():
        if not isinstance(k, str) or not isinstance(v, str) or k.startswith("qq."):
            raise ValueError(f"save_quantized: metadata: str keys not starting with 'qq.' and str values; got {k!r}")
        meta[k] = v
    # safetensors refuses tensors that share memory (an embedding tied to a float lm_head, views
    # of one fused weight): each storage is written once as is, further tensors on it as copies;
    # load_quantized's load_state_dict writes tied parameters twice with the same values
    tensors, seen = {}, set()
    for k, v in model.state_dict().items():
        v = v.detach()
        ptr = v.untyped_storage().data_ptr() if v.numel() else None
        tensors[k] = v.clone() if ptr in seen else v.contiguous()
        if ptr is not None:
            seen.add(ptr)
    save_file(tensors, str(path), metadata=meta)


def load_quantized(model: nn.Module, path, *, strict: bool = True, decode_layout: bool = False) -> QuantizeReport:
    """Load a file written by save_quantized into `model`, which has the architecture the
    file was saved from (its nn.Linear layers still float, e.g. freshly constructed): the
    layers the file holds quantized become QuantizedLinear with the saved mode, on the
    device of the layer they replace, then the state dict is loaded (strict by default).
    decode_layout=True: the weight-only layers also keep the decode layout (not in the file:
    a choice of the machine that runs the model). Returns the report of the replaced layers."""
    import json
    try:
        from safetensors import safe_open
        from safetensors.torch import load_file
    except ImportError as e:
        raise ImportError("load_quantized: needs the safetensors package: pip install safetensors") from e
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    if "qq.torch.layers" not in meta:
        raise ValueError(f"load_quantized: {path}: no 'qq.torch.layers' metadata: not written by "
                         f"qq.torch.save_quantized")
    report = QuantizeReport()
    device = None
    for fqn, cfg in json.loads(meta["qq.torch.layers"]).items():
        if not fqn:  # the file's model was one QuantizedLinear: `model` must be one to load into
            if not isinstance(model, QuantizedLinear) or \
                    (model.in_features, model.out_features) != (cfg["in_features"], cfg["out_features"]):
                raise ValueError(f"load_quantized: {path}: the file holds one quantized layer "
                                 f"({cfg['in_features']} -> {cfg['out_features']}, saved as the whole model); "
                                 f"pass a QuantizedLinear of that shape and mode (e.g. "
                                 f"QuantizedLinear.from_linear(linear, {cfg['mode']!r}))")
            report.converted.append(("", cfg["in_features"], cfg["out_features"]))
            continue
        parent_name, _, cname = fqn.rpartition(".")
        try:
            parent = model.get_submodule(parent_name) if parent_name else model
            child = getattr(parent, cname)
        except AttributeError as e:
            raise ValueError(f"load_quantized: {path}: the file has a quantized layer {fqn!r} that the model "
                             f"lacks; build the model the file was saved from") from e
        if not isinstance(child, (nn.Linear, QuantizedLinear)) or \
                (child.in_features, child.out_features) != (cfg["in_features"], cfg["out_features"]):
            raise ValueError(f"load_quantized: {path}: layer {fqn!r} is {child!r}, the file holds a "
                             f"{cfg['in_features']} -> {cfg['out_features']} linear layer")
        dev = child.weight.device if child.weight.device.type != "meta" else torch.device("cpu")
        device = device or dev
        setattr(parent, cname, QuantizedLinear(cfg["in_features"], cfg["out_features"], cfg["bias"],
                                               mode=cfg["mode"], group_size=cfg["group_size"], bits=cfg["bits"],
                                               weight_only=cfg["weight_only"],
                                               decode_layout=decode_layout and cfg["weight_only"], device=dev,
                                               dtype=getattr(torch, cfg["dtype"])))
        report.converted.append((fqn, cfg["in_features"], cfg["out_features"]))
    model.load_state_dict(load_file(str(path), device=str(device or "cpu")), strict=strict)
    return report
