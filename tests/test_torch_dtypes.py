"""torch's own low-precision dtypes as inputs (docs/api.md, "Inputs and outputs"):
torch.float4_e2m1fn_x2 packed fp4 data and float8_e4m3fn / float8_e8m0fnu scales are read
as the bytes of libqq's layout, giving the same results as their uint8 views, on the CPU and
(gpu marker) on CUDA."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import qq  # noqa: E402
from helpers import raises, torch_device  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
SCALE_DTYPE = {"nvfp4": "float8_e4m3fn", "mxfp4": "float8_e8m0fnu", "mxfp8": "float8_e8m0fnu"}


dev = torch_device


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["nvfp4", "mxfp4", "mxfp8"])
def test_torch_byte_dtypes_equal_uint8(mode, device):
    d = dev(device)
    if not hasattr(torch, SCALE_DTYPE[mode]):
        pytest.skip(f"torch {torch.__version__} has no {SCALE_DTYPE[mode]}")
    torch.manual_seed(0)
    w = torch.randn(48, 128, dtype=torch.bfloat16, device=d)
    x = torch.randn(3, 128, dtype=torch.bfloat16, device=d)
    q = qq.quantize(w, mode=mode)
    data = q.data.view(torch.float4_e2m1fn_x2) if mode != "mxfp8" else q.data.view(torch.float8_e4m3fn)
    scales = q.scales.view(getattr(torch, SCALE_DTYPE[mode]))
    assert data.shape == q.data.shape  # torch's float4_e2m1fn_x2 counts bytes
    assert torch.equal(qq.dequantize(data, scales, mode=mode), qq.dequantize(q))
    assert torch.equal(qq.quantized_matmul(x, data, scales, mode=mode), qq.quantized_matmul(x, q))
    assert torch.equal(qq.qqmm(x, data, scales, mode=mode), qq.qqmm(x, q))
    qa = qq.QuantizedArray(data, scales, None, mode=mode)
    assert torch.equal(qq.dequantize(qa), qq.dequantize(q))


def test_float4_is_not_a_float_value():
    """Packed fp4 where float values are expected is still refused, with its name."""
    t = torch.zeros(4, 16, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    raises(TypeError, ["quantize", "x", "float4_e2m1fn_x2"], qq.quantize, t, mode="nvfp4")


# ----------------------------------------------------------------------------------------
# torch-typed results (torch_dtypes=; docs/api.md, "torch dtypes")
# ----------------------------------------------------------------------------------------

FP_MODES = ["nvfp4", "mxfp4", "mxfp8"]
TD = [True, False, "float4"]


def _expected(mode, td, fp8_format="e4m3"):
    """(data dtype, scales dtype) the docs promise for a torch caller."""
    if td is False:
        return torch.uint8, torch.uint8
    scales = getattr(torch, SCALE_DTYPE[mode])
    if mode == "mxfp8":
        data = torch.float8_e4m3fn if fp8_format == "e4m3" else torch.float8_e5m2
    else:
        data = torch.float4_e2m1fn_x2 if td == "float4" else torch.uint8
    return data, scales


def refused(exc, names, fn, *args, **kwargs):
    """fn raises exc and its message names every one of names."""
    e = raises(exc, names[0], fn, *args, **kwargs)
    missing = [n for n in names if n not in str(e)]
    assert not missing, f"message should name {missing}: {e}"


def _bytes(t):
    return t.view(torch.uint8) if t.dtype != torch.uint8 and t.element_size() == 1 else t


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["linear", "blocked"])
@pytest.mark.parametrize("td", TD)
@pytest.mark.parametrize("mode", FP_MODES)
def test_quantize_result_dtypes(mode, td, layout, device):
    """The result dtypes follow torch_dtypes=, the bytes never change, and every op reads
    the typed results back as the uint8 ones (dequantize, both matmuls, QuantizedArray)."""
    d = dev(device)
    torch.manual_seed(1)
    w = torch.randn(40, 128, dtype=torch.bfloat16, device=d) * 3
    x = torch.randn(5, 128, dtype=torch.bfloat16, device=d)
    gs = qq.amax(w) if mode == "nvfp4" else None
    ref = qq.quantize(w, mode=mode, global_scale=gs, scale_layout=layout, torch_dtypes=False)
    q = qq.quantize(w, mode=mode, global_scale=gs, scale_layout=layout, torch_dtypes=td)
    ddt, sdt = _expected(mode, td)
    assert (q.data.dtype, q.scales.dtype) == (ddt, sdt)
    assert q.data.shape == ref.data.shape and q.scales.shape == ref.scales.shape
    assert torch.equal(_bytes(q.data), ref.data) and torch.equal(_bytes(q.scales), ref.scales)
    assert torch.equal(qq.dequantize(q), qq.dequantize(ref))
    assert torch.equal(qq.qqmm(x, q), qq.qqmm(x, ref))
    if layout == "linear" or mode != "mxfp8":
        assert torch.equal(qq.quantized_matmul(x, q), qq.quantized_matmul(x, ref))


def test_default_is_typed_and_numpy_is_not():
    """torch callers get typed scales by default; NumPy callers always get uint8."""
    import numpy as np
    w = torch.randn(8, 64)
    q = qq.quantize(w, mode="mxfp8")
    assert (q.data.dtype, q.scales.dtype) == (torch.float8_e4m3fn, torch.float8_e8m0fnu)
    assert qq.quantize(w, mode="nvfp4").scales.dtype == torch.float8_e4m3fn
    qn = qq.quantize(w.numpy(), mode="mxfp8", torch_dtypes=True)
    assert qn.data.dtype == np.uint8 and qn.scales.dtype == np.uint8
    # affine scales and biases keep x's dtype whatever torch_dtypes says
    qa = qq.quantize(w.to(torch.bfloat16), torch_dtypes=True)
    assert (qa.data.dtype, qa.scales.dtype, qa.biases.dtype) == (torch.uint8, torch.bfloat16, torch.bfloat16)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_mxfp8_e5m2_data_dtype(fmt):
    w = torch.randn(4, 64) * 100
    q = qq.quantize(w, mode="mxfp8", fp8_format=fmt)
    assert q.data.dtype == _expected("mxfp8", True, fmt)[0]
    ref = qq.quantize(w, mode="mxfp8", fp8_format=fmt, torch_dtypes=False)
    assert torch.equal(q.data.view(torch.uint8), ref.data)
    # the typed e5m2 data hold the values torch reads from them: dequantize equals
    # torch's own float8 -> float conversion times the UE8M0 scales
    s = torch.exp2(ref.scales.to(torch.float32) - 127).repeat_interleave(32, dim=-1)
    assert torch.equal(qq.dequantize(q, dtype="float32"), q.data.to(torch.float32) * s)


@pytest.mark.parametrize("device", DEVICES)
def test_colwise_moe_prepare_typed(device):
    d = dev(device)
    torch.manual_seed(2)
    x = torch.randn(64, 96, dtype=torch.bfloat16, device=d)
    for mode in FP_MODES:
        gs = qq.amax(x) if mode == "nvfp4" else None
        row, col = qq.quantize_colwise(x, mode=mode, global_scale=gs, rowwise=True)
        row8, col8 = qq.quantize_colwise(x, mode=mode, global_scale=gs, rowwise=True, torch_dtypes=False)
        for a, b in ((row, row8), (col, col8)):
            assert (a.data.dtype, a.scales.dtype) == _expected(mode, True)
            assert torch.equal(_bytes(a.data), b.data) and torch.equal(_bytes(a.scales), b.scales)
            assert torch.equal(qq.dequantize(a), qq.dequantize(b))
    w = torch.randn(2, 64, 96, dtype=torch.bfloat16, device=d)
    data, scales = qq.quantize_moe(w)
    data8, scales8 = qq.quantize_moe(w, torch_dtypes=False)
    assert (data.dtype, scales.dtype) == (torch.float8_e4m3fn, torch.float8_e8m0fnu)
    assert torch.equal(data.view(torch.uint8), data8) and torch.equal(scales.view(torch.uint8), scales8)
    assert data.stride() == data8.stride()
    xm = torch.randn(3, 96, dtype=torch.bfloat16, device=d)
    wm = torch.randn(48, 96, dtype=torch.bfloat16, device=d)
    for mode in FP_MODES:
        pw = qq.prepare_weight(wm, mode=mode)
        pw8 = qq.prepare_weight(wm, mode=mode, torch_dtypes=False)
        assert pw.quantized.scales.dtype == _expected(mode, True)[1]
        assert torch.equal(qq.qqmm(xm, pw), qq.qqmm(xm, pw8))


def test_swizzle_keeps_typed_scales():
    s = qq.quantize(torch.randn(130, 64), mode="nvfp4").scales
    b = qq.swizzle_scales(s)
    assert b.dtype == torch.float8_e4m3fn
    assert torch.equal(b.view(torch.uint8), qq.swizzle_scales(s.view(torch.uint8)))
    u = qq.unswizzle_scales(b, tuple(s.shape))
    assert u.dtype == torch.float8_e4m3fn and torch.equal(u.view(torch.uint8), s.view(torch.uint8))


def test_bad_torch_dtypes_value():
    refused(ValueError, ["quantize", "torch_dtypes", "float4"], qq.quantize, torch.randn(2, 32),
           mode="mxfp4", torch_dtypes="float8")


@pytest.mark.parametrize("device", DEVICES)
def test_typed_bytes_that_contradict_the_mode(device):
    """A typed dtype is a claim about the bytes: one that contradicts the mode is refused
    (a UE8M0-typed scale read as E4M3 would be a silent misreading), naming the op, the
    argument and the dtype that fits."""
    d = dev(device)
    w = torch.randn(16, 64, device=d)
    x = torch.randn(2, 64, device=d)
    nv = qq.quantize(w, mode="nvfp4")
    mx = qq.quantize(w, mode="mxfp4")
    m8 = qq.quantize(w, mode="mxfp8")
    # scales typed for another mode
    refused(TypeError, ["dequantize", "scales", "float8_e4m3fn", "float8_e8m0fnu"],
           qq.dequantize, mx.data, nv.scales, mode="mxfp4")
    refused(TypeError, ["quantized_matmul", "scales", "float8_e8m0fnu", "float8_e4m3fn"],
           qq.quantized_matmul, x, nv.data, mx.scales, mode="nvfp4")
    refused(TypeError, ["qqmm", "scales", "float8_e8m0fnu"], qq.qqmm, x, nv.data, mx.scales, mode="nvfp4")
    # mxfp8 data read with the other fp8_format
    refused(TypeError, ["dequantize", "'w'", "float8_e4m3fn", "e5m2", "float8_e5m2"],
           qq.dequantize, m8.data, m8.scales, mode="mxfp8", fp8_format="e5m2")
    # float8 data for an fp4 mode, float4 data for mxfp8 or affine
    refused(TypeError, ["dequantize", "'w'", "float8_e4m3fn", "float4_e2m1fn_x2"],
           qq.dequantize, m8.data[:, :32], mx.scales, mode="mxfp4")
    f4 = mx.data.view(torch.float4_e2m1fn_x2)
    refused(TypeError, ["quantized_matmul", "'w'", "float4_e2m1fn_x2", "affine"],
           qq.quantized_matmul, x, f4, torch.ones(16, 1, device=d), torch.zeros(16, 1, device=d),
           group_size=64, bits=4)
    # uint8 always passes: the same bytes, no claim
    assert torch.equal(qq.dequantize(mx.data, mx.scales.view(torch.uint8), mode="mxfp4"), qq.dequantize(mx))


def test_quantized_linear_buffers_stay_uint8():
    """QuantizedLinear holds uint8 buffers (a state_dict format independent of torch's dtype
    set); its weights equal a uint8 quantize's bytes."""
    import qq.torch as qqt
    lin = torch.nn.Linear(64, 32)
    for mode in FP_MODES:
        ql = qqt.QuantizedLinear.from_linear(lin, mode=mode)
        ref = qq.quantize(lin.weight.detach(), mode=mode, torch_dtypes=False,
                          global_scale=qq.amax(lin.weight.detach()) if mode == "nvfp4" else None)
        assert ql.weight.dtype == torch.uint8 and ql.weight_scales.dtype == torch.uint8
        assert torch.equal(ql.weight, ref.data) and torch.equal(ql.weight_scales, ref.scales)


def test_bad_torch_dtypes_value_numpy_caller():
    """torch_dtypes= is checked for every caller, not only where it is used (torch)."""
    import numpy as np
    for f, kw in ((qq.quantize, {"mode": "mxfp8"}), (qq.quantize_colwise, {"mode": "mxfp8"})):
        refused(ValueError, [f.__name__, "torch_dtypes"], f, np.zeros((32, 32), np.float32), torch_dtypes="yes", **kw)
    refused(ValueError, ["quantize_moe", "torch_dtypes"], qq.quantize_moe, np.zeros((1, 32, 32), np.float32),
            torch_dtypes=1.5)
