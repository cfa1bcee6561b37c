"""qq's public functions: the Cython ones, their torch custom ops while torch.compile
traces (docs/api.md, "torch.compile"), or XLA custom calls when JAX traces them (jax.jit,
vmap: qq/_jax_ffi.py).

torch.compile (Dynamo) cannot trace a Cython function: a call to one ends the graph. So
each public function that has a torch op is a small Python function that Dynamo does trace:

    if torch is imported and torch.compiler.is_compiling():   # False in eager: one check
        return qq._torch_ops.<name>(...)                       # torch.ops.qq.<name>
    return qq._qq.<name>(...)                                  # eager: unchanged

Dynamo folds `torch.compiler.is_compiling()` to True, so the compiled graph holds the op
and no trace of the check. A NumPy array as the first argument skips the check (it cannot be
a value torch.compile traces into an op): the call of torch.compiler.is_compiling was about
a third of the wrapper's cost for NumPy callers with torch imported. `import qq` never
imports torch: the check looks at sys.modules, and qq._torch_ops (which registers the ops) is imported by `import qq` when
torch is already there, by qq.torch, or by the first traced call.

JAX tracers cost the eager path nothing: the Cython function is called first, and only when
it raises (it cannot read a tracer: no __dlpack__) are the arguments looked at; if any is a
JAX tracer, the call goes to qq._jax_ffi (an ffi_call of libqq's XLA handler), else the
error stands. `import qq` never imports jax either.
"""

from __future__ import annotations

import functools
import inspect
import linecache
import sys

from numpy import bool_ as _np_bool
from numpy import ndarray as _ndarray

from . import _qq

_modules = sys.modules


def _compiling() -> bool:
    """True while torch.compile / torch.export traces: a dict lookup while torch is not
    imported, then a call of torch.compiler.is_compiling (which Dynamo folds to True).
    Used until _is_compiling below is set (torch imported after qq); nothing is written
    here: a global written while Dynamo traces would be a guard it recompiles on."""
    t = _modules.get("torch")
    return t is not None and t.compiler.is_compiling()


def check_torch_dtypes(func: str, value):
    """torch_dtypes= checked where Cython cannot run (Dynamo tracing, the JAX custom calls);
    the same rule as qq._qq's _check_torch_dtypes. Returns value."""
    if value is True or value is False or (isinstance(value, str) and value == "float4"):
        return value
    raise ValueError(f"{func}: torch_dtypes: expected True, False or 'float4', got {value!r}")


def check_flag(func: str, name: str, value) -> bool:
    """A True / False argument checked where Cython cannot run (Dynamo tracing, the JAX custom
    calls): the rule of qq._qq's _flag (NumPy's bool too; anything else is a TypeError)."""
    if value is True or value is False or isinstance(value, _np_bool):
        return bool(value)
    raise TypeError(f"{func}: {name} must be True or False; got {value!r}")


def require_indices(func: str, rhs_indices):
    """gather_qmm's indices are required: checked where Cython cannot run (Dynamo tracing,
    the JAX custom call), with the words of qq._qq.gather_qmm's check."""
    if rhs_indices is None:
        raise TypeError(f"{func}: argument 'rhs_indices' is required (int32 expert indices); "
                        f"quantized_matmul multiplies without them")


def qqmm_operands(func, x, w, scales, x_scales, global_scale_x, global_scale_w, mode, group_size,
                  bits, fp8_format, scale_layout, take, take_array):
    """qqmm's operands with QuantizedArrays unpacked, for the torch.compile and jax.jit forms
    (plain Python: Dynamo traces it). A QuantizedArray x or w gives its data, scales and
    global scale, and its mode, group_size, bits and fp8_format (x's where both are, which
    must then agree); an argument given next to one must agree with it (`take`,
    `take_array`: the adapter's forms of qq's rule and words). Returns (x, w, scales,
    x_scales, global_scale_x, global_scale_w, mode, group_size, bits, fp8_format, x_layout,
    w_layout, x_is_q): the scale layouts of x's and w's scales (scale_layout describes w's;
    a QuantizedArray x brings its own)."""
    x_layout = w_layout = scale_layout
    x_is_q, w_is_q = isinstance(x, _qq.QuantizedArray), isinstance(w, _qq.QuantizedArray)
    if x_is_q and w_is_q:
        for field in ("mode", "group_size", "bits", "fp8_format"):
            if getattr(x, field) != getattr(w, field):
                raise ValueError(f"{func}: x.{field}={getattr(x, field)!r} and "
                                 f"w.{field}={getattr(w, field)!r} differ; both operands "
                                 f"must be quantized alike")
    mode_, group_size_, bits_, fp8_format_ = mode, group_size, bits, fp8_format
    for qa, name, is_q in ((w, "w", w_is_q), (x, "x", x_is_q)):
        if not is_q:
            continue
        mode_ = take(func, "mode", mode, "nvfp4", qa.mode, name)
        group_size_ = take(func, "group_size", group_size, None, qa.group_size, name)
        bits_ = take(func, "bits", bits, None, qa.bits, name)
        fp8_format_ = take(func, "fp8_format", fp8_format, "e4m3", qa.fp8_format, name)
    if w_is_q:
        scales = take_array(func, "scales", scales, w.scales, "w", "scales")
        global_scale_w = take_array(func, "global_scale_w", global_scale_w, w.global_scale, "w",
                                    "global_scale")
        w_layout = take(func, "scale_layout", scale_layout, "linear", w.scale_layout, "w")
        w = w.data
    if x_is_q:
        x_scales = take_array(func, "x_scales", x_scales, x.scales, "x", "scales")
        global_scale_x = take_array(func, "global_scale_x", global_scale_x, x.global_scale, "x",
                                    "global_scale")
        x_layout = x.scale_layout
        x = x.data
    return (x, w, scales, x_scales, global_scale_x, global_scale_w, mode_, group_size_, bits_,
            fp8_format_, x_layout, w_layout, x_is_q)


def swiglu_shape_error(shape) -> str:
    """swiglu's refusal of an x of `shape` (0-d or an odd last axis), worded as libqq's
    (qqSwiglu): for the places Cython cannot run (torch's fake op, the JAX custom call)."""
    return (f"swiglu: argument 'x' has shape {tuple(shape)}; expected [..., 2F] (the gate in the "
            f"first F columns, the up projection in the last F): an even last axis")


def _torch_ops():
    from . import _torch_ops   # registers the ops on first import
    return _torch_ops


def _torch_ops_eager():
    """_torch_ops() from eager code (`import qq` with torch imported, or a wrapper's eager
    branch): also sets _is_compiling. Only here: the first import of qq._torch_ops may
    happen inside a trace (the first qq call Dynamo traces), and a global written during a
    trace fails the guard Dynamo put on it (`import qq; import torch;
    torch.compile(..., fullgraph=True)` raised on its first call)."""
    global _is_compiling, _compile_flags
    _torch_ops()
    tc = _modules["torch"].compiler
    if hasattr(tc, "is_dynamo_compiling") and isinstance(getattr(tc, "_is_compiling_flag", None), bool):
        # torch.compiler.is_compiling() holds where Dynamo traces (it folds the call to
        # True, as it folds is_dynamo_compiling()) and where torch.export's non-strict
        # tracing has set _is_compiling_flag (what the function returns when it runs, after
        # a torch.jit.is_scripting() check that never holds here). The two read directly:
        # 0.05 us a call on the 2-core CPU host instead of 0.13.
        _compile_flags = tc
        _is_compiling = tc.is_dynamo_compiling
    else:
        _is_compiling = tc.is_compiling


# torch.compiler.is_dynamo_compiling (or is_compiling, in a torch without it), set by
# _torch_ops_eager (in eager code, never while Dynamo traces): a global that does not change
# once set, so Dynamo's guard on it holds.
# Reading it saves every eager call the lookups of torch and torch.compiler.
_is_compiling = None


class _NoFlags:
    _is_compiling_flag = False


# torch.compiler where _is_compiling is its is_dynamo_compiling (its _is_compiling_flag is
# read beside it), else a stand-in whose flag is always False.
_compile_flags = _NoFlags


def _jax_ffi():
    from . import _jax_ffi     # imports jax (already imported: a tracer exists)
    return _jax_ffi


def _jax_traced(args, kwargs) -> bool:
    return "jax" in _modules and _jax_ffi().traced(args, kwargs)


# The wrapper's body. It names the Cython function's positional parameters (the bound
# argument reaches the eager call as a plain positional one); keyword-only arguments travel in
# **kw, which is empty in the common call (mode= binds to its named parameter). A generic
# f(*args, **kwargs) packed and unpacked a tuple and a dict on every call: ~0.25 us of the
# ~2 us a NumPy quantize of [1, 32] takes (bench/bench_overhead.py).
_WRAPPER = """
def _make(_eager):
    def {name}({params}, **_qq_kw):
        if type({first}) is not _ndarray:   # (a NumPy array is never a traced torch value)
            _qq_c = _is_compiling
            if _qq_c is not None:
                if _qq_c() or _compile_flags._is_compiling_flag:
                    return getattr(_torch_ops(), "{name}")({args}, **_qq_kw)
            elif "torch" in _modules:       # torch imported after qq
                if _compiling():
                    return getattr(_torch_ops(), "{name}")({args}, **_qq_kw)
                _torch_ops_eager()          # eager: register the ops now, and set _is_compiling
        try:
            if _qq_kw:
                return _eager({args}, **_qq_kw)
            return _eager({args})
        except Exception:
            if not _jax_traced(({args},), _qq_kw):
                raise
        return _jax_ffi().op("{name}")({args}, **_qq_kw)    # outside the except: no chained error
    return {name}
"""


def _dispatching(name, eager=None):
    """The public function `name`: the Cython function's positional parameters with their
    defaults (keyword-only ones are checked by it), routed as the module docstring says.
    Made from _WRAPPER: one text for every function, run in this module's globals (so that
    it reads _is_compiling as _torch_ops_eager sets it)."""
    eager = eager or getattr(_qq, name)
    params = inspect.signature(eager).parameters.values()
    pos = [p for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    # what _WRAPPER can stand for: named positional parameters (at least one) and
    # keyword-only ones, none of them a name the wrapper's body uses
    if not pos or any(p.kind not in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
                      or p.name.startswith("_qq_") or p.name == "_eager" for p in params):
        raise TypeError(f"qq._dispatch: {name}'s signature {inspect.signature(eager)} needs a wrapper "
                        f"of its own (_WRAPPER takes named positional and keyword-only parameters)")
    args = ", ".join(p.name for p in pos)
    src = _WRAPPER.format(name=name, params=args, args=args, first=pos[0].name)
    filename = f"<qq._dispatch {name}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)  # for tracebacks
    scope = {}
    exec(compile(src, filename, "exec"), globals(), scope)
    f = scope["_make"](eager)
    f.__defaults__ = tuple(p.default for p in pos if p.default is not inspect.Parameter.empty) or None
    functools.update_wrapper(f, eager)
    return f


amax = _dispatching("amax")
dequantize = _dispatching("dequantize")
gather_qmm = _dispatching("gather_qmm")
grouped_qqmm = _dispatching("grouped_qqmm")
grouped_qqmm_wgrad = _dispatching("grouped_qqmm_wgrad")
prepare_weight = _dispatching("prepare_weight")
prepare_decode = _qq.prepare_decode  # no torch op: its result is used eagerly (see quantized_matmul)
qqmm = _dispatching("qqmm")
quantize = _dispatching("quantize")
quantize_colwise = _dispatching("quantize_colwise")
quantize_dequantize = _dispatching("quantize_dequantize")
quantize_dequantize_moe = _dispatching("quantize_dequantize_moe")
quantize_moe = _dispatching("quantize_moe")
quantized_matmul = _dispatching("quantized_matmul")
swiglu = _dispatching("swiglu")
swizzle_scales = _dispatching("swizzle_scales")
unswizzle_scales = _dispatching("unswizzle_scales")


def quantized_matmul_swiglu(x, w, scales=None, biases=None, group_size=None, bits=None,
                            mode="affine", *, global_scale=None, bias=None,
                            scale_layout="linear", fp8_format="e4m3", dtype=None, out=None,
                            stream=None):
    """SwiGLU of a gate/up projection: swiglu(quantized_matmul(x, w, ...)) for a w of [2F, K]
    (the gate's F rows, then the up projection's): [..., F] = silu(x @ Wg.T) * (x @ Wu.T),
    each product value rounded to the result's dtype first. With a DecodeWeight from
    qq.prepare_decode(w, gated=True), one kernel makes both (qqDecodeGatedMatmul) where the
    decode layout's kernel applies (up to 16 rows of bf16 x; past that the call runs the gated
    product, then the swiglu kernel); anywhere else (any other w, prefill, the CPU's packed
    path, torch.compile, jax.jit) the two ops run, with the same bits. Arguments as
    quantized_matmul's (transpose=True); bias is [2F]. See docs/api.md.
    """
    if isinstance(w, _qq.DecodeWeight) and w.gated and not _compiling():
        try:
            r = _qq._decode_swiglu(x, w, scales, biases, group_size, bits, mode, global_scale, bias,
                                   scale_layout, fp8_format, dtype, out, stream)
        except Exception:
            if not _jax_traced((x, bias, out), {}):
                raise
            r = None                    # a JAX tracer: the two ops' custom calls below
        if r is not None:
            return r
    if out is not None and hasattr(out, "dtype"):
        # the product in out's dtype, as quantized_matmul(x, w, out=out) and the fused kernel;
        # out said wrong is refused here, in this function's words (not as the dtype of the
        # intermediate product, nor as swiglu's out)
        od = _dtype_name(out.dtype)
        if od not in ("float32", "float16", "bfloat16"):
            raise ValueError(f"quantized_matmul_swiglu: argument 'out' has dtype {od}; expected float32, "
                             f"float16 or bfloat16")
        if dtype is None:
            dtype = out.dtype
        elif _dtype_name(dtype) != od:
            raise ValueError(f"quantized_matmul_swiglu: out has dtype {od} but dtype={dtype!r} was asked for")
    try:
        y = quantized_matmul(x, w, scales, biases, True, group_size, bits, mode,
                             global_scale=global_scale, bias=bias, scale_layout=scale_layout,
                             fp8_format=fp8_format, dtype=dtype, stream=stream)
    except (ValueError, TypeError) as e:    # named as the caller's function, not its first half
        msg = str(e)
        if not msg.startswith("quantized_matmul:"):
            raise
        raise type(e)("quantized_matmul_swiglu:" + msg[len("quantized_matmul:"):]) from None
    # said here, of w and out: swiglu's own refusals would name swiglu and its x (which is y)
    shape = tuple(y.shape)
    if len(shape) == 0 or shape[-1] % 2:
        raise ValueError(f"quantized_matmul_swiglu: w has N = {shape[-1] if shape else 0} rows; a gate/up "
                         f"weight [2F, K] (the gate's F rows, then the up projection's) has an even "
                         f"number of rows")
    want = shape[:-1] + (shape[-1] // 2,)
    if out is not None and hasattr(out, "shape") and tuple(out.shape) != want:
        raise ValueError(f"quantized_matmul_swiglu: argument 'out' has shape {tuple(out.shape)}; "
                         f"expected {want} ([..., F] for w of [2F, K])")
    try:
        return swiglu(y, stream=stream) if out is None else swiglu(y, out=out, stream=stream)
    except (ValueError, TypeError) as e:    # (its out is ours; its x is our product)
        msg = str(e)
        if not msg.startswith("swiglu:"):
            raise
        raise type(e)("quantized_matmul_swiglu:" + msg[len("swiglu:"):]) from None


def _dtype_name(d) -> str:
    """'float32', 'bfloat16', ... of a dtype given as a name, a NumPy / ml_dtypes dtype or
    type, or a torch dtype (for comparisons where Cython's _dtype_arg cannot run)."""
    text = str(d)
    if text.startswith("torch."):
        return text[len("torch."):]
    try:
        import numpy
        return numpy.dtype(d).name
    except TypeError:
        return text


# QuantizedArray's sequence protocol in Python: Dynamo traces these (unpacking
# `data, scales = qq.quantize(...)` inside a compiled function) but not the Cython methods
# of _qq.QuantizedArray, which they replace with the same behaviour.
def _qa_len(self):
    return 3 if self.mode == "affine" else 2


def _qa_iter(self):
    if self.mode == "affine":
        return iter((self.data, self.scales, self.biases))
    return iter((self.data, self.scales))


def _qa_getitem(self, index):
    return tuple(self)[index]


_qq.QuantizedArray.__len__ = _qa_len
_qq.QuantizedArray.__iter__ = _qa_iter
_qq.QuantizedArray.__getitem__ = _qa_getitem

if "torch" in _modules:
    _torch_ops_eager()
if "jax" in _modules:
    _jax_ffi()      # QuantizedArray becomes a JAX pytree (jit / vmap can return it)
