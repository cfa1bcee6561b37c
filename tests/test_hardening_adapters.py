"""Bad input to the framework adapters (qq.torch, qq.jax, the torch custom ops) on the CPU:
each case gets an error naming the function, the argument and the fix, or the right result
- not a raw KeyError / IndexError / AttributeError from inside qq, torch's internal error,
or a silently wrong result."""

import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import qq  # noqa: E402
import qq.torch as qqt  # noqa: E402


def refused(exc, names, fn, *args, **kwargs):
    with pytest.raises(exc) as e:
        fn(*args, **kwargs)
    for n in [names] if isinstance(names, str) else names:
        assert n in str(e.value), f"{n!r} not in {str(e.value)!r}"
    return e.value


# ---- qq_linear / QQLinear / convert_linear ----------------------------------------------

def test_qq_linear_non_tensor_weight_and_bias():
    x, w = torch.randn(4, 64), torch.randn(32, 64)
    # was AttributeError: 'list' object has no attribute 'requires_grad'
    refused(TypeError, ["qq_linear", "weight"], qqt.qq_linear, x, [[1.0] * 64] * 32)
    # was "bias must be float32, bfloat16 or float16; got float32" (a NumPy bias)
    refused(TypeError, ["qq_linear", "bias", "ndarray"], qqt.qq_linear, x, w, np.zeros(32, np.float32))


def test_qq_linear_zero_features():
    # N = 0 was refused by quantize_dequantize_moe, K = 0 by torch's reshape (RuntimeError)
    refused(ValueError, ["qq_linear", "positive multiples"], qqt.qq_linear, torch.randn(4, 64), torch.randn(0, 64))
    refused(ValueError, ["qq_linear", "positive multiples"], qqt.qq_linear, torch.randn(4, 0), torch.randn(32, 0))
    refused(ValueError, ["QQLinear", "positive multiples"], qqt.QQLinear, 0, 32)
    refused(ValueError, ["QQLinear", "positive multiples"], qqt.QQLinear, 64, 0)
    refused(ValueError, ["QQLinear", "positive multiples"], qqt.QQLinear, -32, 32)
    # convert_linear leaves a zero-size layer as nn.Linear (with its warning) instead of
    # building one that fails at its first call
    m = qqt.convert_linear(nn.Sequential(nn.Linear(64, 0), nn.Linear(64, 32)))
    assert type(m[0]) is nn.Linear and isinstance(m[1], qqt.QQLinear)


@pytest.mark.parametrize("mode", qqt.MODES)
def test_qq_linear_strided_weight(mode):
    # was refused by amax / quantize_dequantize(_moe) naming their argument, not qq_linear's
    x = torch.randn(4, 64)
    for w in (torch.randn(64, 32).t(), torch.randn(1, 64).expand(32, 64)):
        refused(ValueError, ["qq_linear", "weight", ".contiguous()"], qqt.qq_linear, x, w, mode=mode)
        torch._dynamo.reset()
        f = torch.compile(lambda a, b: qqt.qq_linear(a, b, mode=mode), backend="eager", fullgraph=True)
        with pytest.raises(Exception, match=r"qq_linear: weight"):
            f(x, w)
    # a row-sliced weight (stride >= K) is read in place, as before
    wide = torch.randn(32, 80)[:, :64]
    assert torch.equal(qqt.qq_linear(x, wide, mode=mode), qqt.qq_linear(x, wide.contiguous(), mode=mode))


@pytest.mark.parametrize("grouped", [False, True])
def test_double_backward_is_refused_not_silently_zero(grouped):
    """A second backward through qq_linear's gradients (a gradient penalty) silently lost
    the term through the quantized GEMMs (their results had no grad_fn): the weight's
    gradient came out as if the penalty did not depend on it."""
    torch.manual_seed(0)
    x = torch.randn(8, 64, requires_grad=True)
    if grouped:
        w = torch.randn(2, 32, 64, requires_grad=True)
        off = torch.tensor([4, 8], dtype=torch.int32)
        y = qqt.qq_grouped_linear(x, w, off)
        func = "qq_grouped_linear"
    else:
        w = torch.randn(32, 64, requires_grad=True)
        y = qqt.qq_linear(x, w)
        func = "qq_linear"
    (g,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match=f"{func}: differentiating its gradients again"):
        (g.square().sum() + w.square().sum()).backward()


def test_create_graph_without_second_backward_still_works():
    x = torch.randn(8, 64, requires_grad=True)
    w = torch.randn(32, 64, requires_grad=True)
    (gx, gw) = torch.autograd.grad(qqt.qq_linear(x, w).sum(), (x, w), create_graph=True)
    x2, w2 = x.detach().requires_grad_(), w.detach().requires_grad_()
    qqt.qq_linear(x2, w2).sum().backward()
    assert torch.equal(gx.detach(), x2.grad) and torch.equal(gw.detach(), w2.grad)


@pytest.mark.parametrize("grouped", [False, True])
def test_create_graph_with_a_frozen_weight_is_plain(grouped):
    """Review: with a frozen weight and dy not requiring grad, dx's second-order term is truly
    zero (F.linear's gradient is a plain tensor there), so a penalty on it must work, as
    before this session's check."""
    torch.manual_seed(0)
    x = torch.randn(8, 64, requires_grad=True)
    if grouped:
        y = qqt.qq_grouped_linear(x, torch.randn(2, 32, 64), torch.tensor([4, 8], dtype=torch.int32))
    else:
        y = qqt.qq_linear(x, torch.randn(32, 64))
    (g,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    assert not g.requires_grad
    (g.square().sum() + x.square().sum()).backward()
    assert x.grad is not None


def test_numpy_bool_flags_for_quantized_linear():
    """Review: NumPy 2's bool type is named "bool", not "bool_", and was refused."""
    layer = qqt.QuantizedLinear(64, 32, mode="nvfp4", weight_only=np.True_, decode_layout=np.False_)
    assert layer.weight_only is np.True_ or bool(layer.weight_only)


def test_flags_checked_under_torch_compile():
    """Review: the compiled wrappers read a string flag by its truth value (eager refuses it)."""
    x = torch.randn(64, 64)
    f = torch.compile(lambda t: qq.quantize_dequantize(t, "mxfp8", colwise="no"), fullgraph=True)
    with pytest.raises(Exception, match="quantize_dequantize: colwise must be True or False"):
        f(x)
    g = torch.compile(lambda t: qq.quantize_colwise(t, mode="mxfp8", rowwise="yes"), fullgraph=True)
    with pytest.raises(Exception, match="quantize_colwise: rowwise must be True or False"):
        g(x)


def test_convert_linear_bad_arguments():
    refused(ValueError, ["convert_linear", "mode"], qqt.convert_linear, nn.Linear(64, 32), mode=["mxfp8"])
    refused(TypeError, ["convert_linear", "module"], qqt.convert_linear, "model")


# ---- QuantizedLinear / quantize_ ------------------------------------------------------------

def test_quantized_linear_forward_bad_x():
    layer = qqt.QuantizedLinear.from_linear(nn.Linear(64, 32), "nvfp4")
    refused(ValueError, ["QuantizedLinear", "last axis"], layer, torch.tensor(1.0))   # was IndexError
    refused(TypeError, ["QuantizedLinear", "x", "ndarray"], layer, np.zeros((4, 64), np.float32))  # AttributeError
    compiled = torch.compile(layer, backend="eager", fullgraph=True)
    with pytest.raises(Exception, match="QuantizedLinear: x's last axis"):
        compiled(torch.tensor(1.0))


@pytest.mark.parametrize("kw, exc, names", [
    ({"mode": "affine", "group_size": 0}, ValueError, ["group_size"]),       # was ZeroDivisionError
    ({"mode": "affine", "group_size": -32}, ValueError, ["group_size"]),     # torch's "zeros: Dimension size"
    ({"mode": "mxfp8", "group_size": 64}, ValueError, ["group_size=64"]),    # refused only at the first call
    ({"mode": "nvfp4", "bits": 8}, ValueError, ["bits=8"]),
    ({"mode": "affine", "bits": 4.5}, TypeError, ["bits"]),                  # was silently 4 bits
    ({"mode": "affine", "bits": "4"}, TypeError, ["bits"]),
    ({"mode": "affine", "bits": True}, TypeError, ["bits"]),
    ({"mode": "mxfp8", "weight_only": "no"}, TypeError, ["weight_only"]),    # was read as True
    ({"mode": "mxfp8", "decode_layout": 1}, TypeError, ["decode_layout"]),
])
def test_quantized_linear_parameters_checked_at_construction(kw, exc, names):
    refused(exc, ["QuantizedLinear"] + names, qqt.QuantizedLinear, 64, 32, **kw)
    refused(exc, ["quantize_"] + names, qqt.quantize_, nn.Sequential(nn.Linear(64, 32)), **kw)


def test_quantized_linear_zero_in_features():
    # was built, then refused by quantized_matmul at the first call
    refused(ValueError, ["QuantizedLinear", "in_features"], qqt.QuantizedLinear, 0, 32, mode="mxfp8")
    refused(ValueError, ["QuantizedLinear", "out_features"], qqt.QuantizedLinear, 64, -1, mode="mxfp8")
    model = nn.Sequential(nn.Linear(0, 32), nn.Linear(64, 32))
    report = qqt.quantize_(model, "mxfp8")     # was a quantize error naming its argument 'x'
    assert [n for n, _ in report.skipped] == ["0"] and type(model[0]) is nn.Linear


def test_from_linear_meta_strided_and_non_finite_weights():
    refused(ValueError, ["from_linear", "meta"], qqt.QuantizedLinear.from_linear,
            nn.Linear(64, 32, device="meta"), "mxfp8")      # was torch's "Unknown device type meta for Dlpack"
    lin = nn.Linear(64, 32)
    lin.weight.data = torch.randn(64, 32).t()
    refused(ValueError, ["from_linear", "weight", "contiguous"], qqt.QuantizedLinear.from_linear, lin, "mxfp8")
    for v in (float("nan"), float("inf")):
        lin = nn.Linear(64, 32)
        lin.weight.data[3, 5] = v
        # was "quantize: argument 'global_scale' is nan" (an argument the caller never gave)
        refused(ValueError, ["from_linear", "NaN or Inf"], qqt.QuantizedLinear.from_linear, lin, "nvfp4")


@pytest.mark.parametrize("mode", ["nvfp4", "mxfp8", "mxfp4", "affine"])
def test_load_state_dict_refuses_value_converting_dtypes(mode):
    """load_state_dict copies with copy_, which converts values: a float8-typed tensor
    (qq.quantize's default torch_dtypes=True) or a float tensor loaded into the uint8
    buffers became other bytes, and the layer computed garbage without a word."""
    lin = nn.Linear(64, 32)
    ref = qqt.QuantizedLinear.from_linear(lin, mode)
    sd = ref.state_dict()
    w = lin.weight.detach()
    typed = qq.quantize(w, mode=mode, global_scale=qq.amax(w) if mode == "nvfp4" else None)
    bad = [("weight", sd["weight"].float())]
    if typed.data.dtype != torch.uint8:
        bad.append(("weight", typed.data))
    if mode != "affine":
        bad.append(("weight_scales", typed.scales))              # float8_e8m0fnu / e4m3
    else:
        bad.append(("weight_scales", sd["weight_scales"].to(torch.int32)))
    for key, t in bad:
        layer = qqt.QuantizedLinear(64, 32, mode=mode, dtype=torch.float32)
        refused(TypeError, ["QuantizedLinear.load_state_dict", key], layer.load_state_dict, {**sd, key: t})
    # the bytes themselves load, and give the layer's results
    layer = qqt.QuantizedLinear(64, 32, mode=mode, dtype=torch.float32)
    layer.load_state_dict({**sd, "weight": typed.data.view(torch.uint8)})
    x = torch.randn(3, 64)
    assert torch.equal(layer(x), ref(x))


# ---- qq on torch tensors: meta device; custom ops called directly; compile = eager -----------

def test_meta_tensor_is_named():
    x = torch.randn(4, 64, device="meta")
    refused(ValueError, ["quantize: x", "meta device"], qq.quantize, x, mode="mxfp8")
    refused(ValueError, ["amax", "meta device"], qq.amax, x)


def test_op_torch_dtypes_string_is_checked():
    x = torch.randn(4, 64)
    ops = torch.ops.qq
    # was KeyError: 'yes'
    refused(ValueError, ["quantize", "torch_dtypes"], ops.quantize, x, None, "mxfp8", 32, 8, "ceil", "linear",
            "e4m3", "yes")
    refused(ValueError, ["quantize_colwise", "torch_dtypes"], ops.quantize_colwise, x, None, "mxfp8", 32, 8,
            "ceil", "linear", "e4m3", False, "yes")
    refused(ValueError, ["quantize_moe", "torch_dtypes"], ops.quantize_moe, torch.randn(1, 32, 32), "32x1",
            "ceil", "linear", "e4m3", "maybe")


def _errors(f, *args):
    out = []
    for fn in (f, torch.compile(f, fullgraph=True, backend="eager")):
        torch._dynamo.reset()
        with pytest.raises(Exception) as e:
            fn(*args)
        err = e.value
        while not isinstance(err, (TypeError, ValueError)) and err.__cause__ is not None:
            err = err.__cause__
        out.append(err)
    return out


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.float8_e4m3fn])
def test_quantized_matmul_non_float_x_compiled_names_x(dtype):
    """Under compile the default result dtype was x's: the op then refused dtype= (an
    argument the caller never gave) instead of x, as eager does."""
    layer = qqt.QuantizedLinear.from_linear(nn.Linear(64, 32), "nvfp4")
    x = torch.randn(4, 64).to(dtype)
    eager, compiled = _errors(lambda a: layer(a), x)
    assert type(eager) is type(compiled) is TypeError
    assert "argument 'x'" in str(eager) and "argument 'x'" in str(compiled), (eager, compiled)


def test_zero_dim_x_compiled_is_eagers_value_error():
    """0-d x: eager ValueError, compiled IndexError from the fake shape rules."""
    w = qq.quantize(torch.randn(32, 64), mode="mxfp8")
    for f, msg in ((lambda a: qq.quantize(a, mode="mxfp8"), "quantize: argument 'x' has 0 dimensions"),
                   (lambda a: qq.quantized_matmul(a, w), "quantized_matmul: x: expected [..., M, K]"),
                   (lambda a: qq.qqmm(a, torch.randn(32, 64), mode="mxfp8"), None)):
        eager, compiled = _errors(f, torch.tensor(1.0))
        assert isinstance(eager, ValueError), eager
        assert not isinstance(compiled, IndexError), compiled
        assert msg is None or msg in str(eager)
        assert msg is None or re.search(re.escape(msg), str(compiled)) or \
            re.search(re.escape(msg), str(compiled.__cause__)), compiled


# ---- qq.jax ------------------------------------------------------------------------------

def test_jax_qq_linear_bad_input():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    import qq.jax as qqj
    x, w = jnp.ones((4, 64)), jnp.ones((32, 64))
    refused(TypeError, ["qq_linear", "x"], qqj.qq_linear, [[1.0] * 64] * 4, w)        # AttributeError
    refused(TypeError, ["qq_linear", "w"], qqj.qq_linear, x, [[1.0] * 64] * 32)
    refused(ValueError, ["qq_linear", "positive multiples"], qqj.qq_linear, x, jnp.ones((0, 64)))  # quantize_moe's
    refused(ValueError, ["qq_linear", "positive multiples"], qqj.qq_linear, jnp.ones((4, 0)),
            jnp.ones((32, 0)))                                                          # ZeroDivisionError


@pytest.mark.parametrize("mode", ["mxfp8", "nvfp4", "mxfp4"])
def test_jax_zero_tokens_gradient(mode):
    """T = 0 tokens: the forward worked, the backward was refused by quantize_colwise
    (M=0); torch gives zero gradients, so does JAX now."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    import qq.jax as qqj
    x, w, b = jnp.ones((0, 64)), jnp.ones((32, 64)), jnp.ones(32)
    for f in (jax.grad(lambda a, c, d: qqj.qq_linear(a, c, d, mode=mode).sum(), argnums=(0, 1, 2)),):
        for g in (f, jax.jit(f)):
            dx, dw, db = g(x, w, b)
            assert dx.shape == (0, 64) and dw.shape == (32, 64) and not jnp.any(dw) and not jnp.any(db)


# ---- Session aa's probe of qq.torch's training side -----------------------------------------

def test_nvfp4_layers_take_nonfinite_and_tiny_values():
    """Before: on the CPU the nvfp4 layers raised 'quantize_dequantize: argument global_scale
    is inf' (an argument the user never passed) for an Inf / NaN activation or gradient or one
    below 1e-30; now such a scale means none (as on the GPU) and Inf / NaN propagate, as in
    the mxfp8 mode, which AMP's GradScaler relies on."""
    torch.manual_seed(0)
    lin = qqt.QQLinear(64, 96, mode="nvfp4")
    x = torch.randn(4, 64, requires_grad=True)
    dy = torch.ones(4, 96)
    dy[1, 2] = float("inf")
    lin(x).backward(dy)
    assert not torch.isfinite(x.grad).all()
    x.grad = None
    lin(x).backward(torch.full((4, 96), 1e-31))          # tiny but valid: goes through
    assert torch.isfinite(x.grad).all()
    xn = torch.randn(4, 64)
    xn[0, 0] = float("nan")
    assert torch.isnan(lin(xn)[0]).any()
    g = qqt.QQGroupedLinear(2, 64, 64, mode="nvfp4")
    with torch.no_grad():
        g.weight[1].mul_(1e-34)                           # an expert whose amax is below 1e-30
    xg = torch.randn(8, 64, requires_grad=True)
    g(xg, torch.tensor([3, 8], dtype=torch.int32)).backward(torch.full((8, 64), 1e-31))
    assert torch.isfinite(xg.grad).all()


def test_grouped_linear_inputs():
    """Before: a transposed x was refused (qq_linear takes it), float64 or list inputs and int64
    offsets got other functions' messages (amax, grouped_qqmm's dtype=) or an AttributeError."""
    torch.manual_seed(0)
    g = qqt.QQGroupedLinear(2, 64, 96, mode="mxfp8")
    off = torch.tensor([7, 40], dtype=torch.int32)
    xt = torch.randn(64, 40).t()
    assert torch.equal(g(xt, off), g(xt.contiguous(), off))
    refused(TypeError, ["qq_grouped_linear", "x"], g, torch.randn(40, 64, dtype=torch.float64), off)
    refused(TypeError, ["qq_grouped_linear", "x"], g, [[0.0] * 64] * 40, off)
    refused(TypeError, ["qq_grouped_linear", "offsets", "torch.int32"], g, torch.randn(40, 64), off.long())
    refused(ValueError, ["qq_grouped_linear", "weight", "contiguous"], qqt.qq_grouped_linear, torch.randn(40, 64),
            torch.randn(2, 64, 96).transpose(1, 2), off)
    ends = torch.tensor([[0, 7], [0, 40]], dtype=torch.int32)
    assert torch.equal(g(xt, ends[:, 1]), g(xt, off))       # strided offsets (they were refused)


def test_bias_gradient_in_the_bias_dtype():
    """Before: an fp32 bias beside a bf16 weight got the fp32 sum rounded to bf16."""
    torch.manual_seed(0)
    x = torch.randn(64, 64, dtype=torch.bfloat16)
    w = (torch.randn(96, 64) / 8).bfloat16().requires_grad_()
    b = torch.zeros(96, requires_grad=True)
    dy = torch.randn(64, 96).bfloat16()
    qqt.qq_linear(x, w, b, mode="mxfp8").backward(dy)
    assert b.grad.dtype == torch.float32
    assert torch.equal(b.grad, dy.float().sum(0))
