"""Regression tests of the hostile-input probe (docs/errors.md): each test names the defect it
pins down. The C-ABI-only cases (NULL shapes, K = 2^40 allocation failure, out-of-range
enums, int64 overflow of qqQuantizedShapes, a negative CUDA device id) are in tests/c/ and
run through test_c_abi.py."""

from __future__ import annotations

import numpy as np
import pytest

import qq
import reference as R
from helpers import assert_bits_equal, raises, to_device, try_import

F32 = np.float32
F16 = np.float16
torch = try_import("torch")
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


# ---- 1. grouped_qqmm reads x_scales by token: it must have T rows -------------------------

def test_grouped_x_scales_must_have_T_rows():
    """Before: x_scales of 1 row for T = 2^22 tokens was read out of bounds (a segfault)."""
    T = 1 << 10
    raises(ValueError, "x_scales", qq.grouped_qqmm, np.zeros((T, 64), np.uint8),
           np.ones((1, 8, 64), F32), np.array([T], np.int32), x_scales=np.zeros((1, 2), np.uint8))


def test_grouped_x_scales_with_float_x_is_refused():
    raises(ValueError, "x_scales", qq.grouped_qqmm, np.zeros((4, 64), F32), np.ones((1, 8, 64), F32),
           np.array([4], np.int32), x_scales=np.zeros((4, 2), np.uint8), mode="mxfp8")


# ---- 2. a batch of 0 is validated like any other ------------------------------------------

def test_qqmm_empty_batch_still_validates():
    """Before: a 3-D w of batch 0 returned (0, 4, 8) without looking at any argument."""
    raises(TypeError, "w", qq.qqmm, np.zeros((4, 64), F32), np.zeros((0, 8, 32), np.int32), mode="mxfp8")
    raises(ValueError, ("K", "w"), qq.qqmm, np.zeros((4, 64), F32), np.zeros((0, 8, 32), F32), mode="mxfp8")
    y = qq.qqmm(np.zeros((4, 64), F32), np.zeros((0, 8, 64), F32), mode="mxfp8")
    assert y.shape == (0, 4, 8)


# ---- 3. torch's lazy negative / conjugate views -------------------------------------------

@needs_torch
def test_torch_negative_views_are_resolved():
    """Before: t._neg_view() and t.conj().imag were read as +t (a silent sign flip)."""
    t = torch.linspace(0.5, 4, 64).reshape(2, 32)
    neg = t._neg_view()
    assert neg.is_neg()
    got = qq.dequantize(qq.quantize(neg, mode="mxfp8"), mode="mxfp8", dtype="float32")
    want = qq.dequantize(qq.quantize(-t, mode="mxfp8"), mode="mxfp8", dtype="float32")
    assert torch.equal(got, want) and bool((got < 0).all())
    c = torch.complex(torch.zeros(2, 32), t)  # imag = t
    imag = c.conj().imag                        # a view of -t with the negative bit
    got = qq.dequantize(qq.quantize(imag, mode="mxfp8"), mode="mxfp8", dtype="float32")
    assert torch.equal(got, want)


@needs_torch
def test_torch_negative_bit_read_in_c_matches_is_neg():
    """The negative bit is read in C (_dlpack.pxi, _torch_neg): on this torch it must be in use
    and answer every kind of tensor as t.is_neg() does - views, detached and Parameter copies
    of negative views, conj().imag, and the small path's inputs (a small negative view is
    quantized as -t there too)."""
    assert qq._qq._torch_neg_reader() is True
    t = torch.linspace(-2, 2, 64).reshape(2, 32)
    neg = t._neg_view()
    cases = [t, neg, neg[1:], neg[:, ::2], neg.detach(), neg.t(), t[0], t.bfloat16()._neg_view(),
             torch.complex(t, t).conj().imag, torch.complex(t, t).conj().real,
             torch.nn.Parameter(t.clone()), torch.nn.Parameter(neg, requires_grad=False),
             torch.empty(0)._neg_view()]
    for c in cases:
        assert qq._qq._torch_neg_reader(c) == int(c.is_neg()), c
    assert {int(c.is_neg()) for c in cases} == {0, 1}
    x = torch.randn(1, 32)
    on, before = qq._qq._fast_path()
    got = qq.dequantize(qq.quantize(x._neg_view(), mode="nvfp4"), mode="nvfp4", dtype="float32")
    want = qq.dequantize(qq.quantize(-x, mode="nvfp4"), mode="nvfp4", dtype="float32")
    assert torch.equal(got, want)
    assert qq._qq._fast_path()[1] == before + (1 if on else 0)     # -x took it, the negative view not


@needs_torch
def test_torch_negative_out_is_refused():
    q = qq.quantize(torch.ones(2, 32), mode="mxfp8")
    out = torch.empty(2, 32)._neg_view()
    raises(ValueError, "out", qq.dequantize, q, mode="mxfp8", out=out)


# ---- 6. out= and autograd -----------------------------------------------------------------

@needs_torch
def test_out_bumps_the_autograd_version():
    """Before: writing into a saved tensor through out= went unnoticed by backward()."""
    z = torch.randn(8, 64, requires_grad=True)
    u = z.exp()                                 # exp saves its output for backward
    v0 = u._version
    qq.dequantize(qq.quantize(torch.randn(8, 64), mode="mxfp8"), mode="mxfp8", out=u.detach())
    assert u._version > v0
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        u.sum().backward()


@needs_torch
def test_out_requiring_grad_is_refused():
    y = torch.randn(8, 64, requires_grad=True) * 2
    raises(ValueError, "out", qq.dequantize, qq.quantize(torch.randn(8, 64), mode="mxfp8"),
           mode="mxfp8", out=y)
    with torch.no_grad():                       # as torch's own out= ops allow
        qq.dequantize(qq.quantize(torch.randn(8, 64), mode="mxfp8"), mode="mxfp8", out=y)


@needs_torch
@pytest.mark.parametrize("device", DEVICES)
def test_out_made_under_inference_mode(device):
    """Before: an inference tensor (made under torch.inference_mode) was written through out=
    outside inference mode, which torch's own out= ops refuse (it has no version counter)."""
    q = qq.quantize(torch.randn(8, 64, device=device), mode="mxfp8")
    with torch.inference_mode():
        o = torch.full((8, 64), 7.0, device=device)
        t = torch.empty(8, 64, device=device)
    with pytest.raises(RuntimeError, match="inference"):
        torch.add(o, o, out=t)                  # the rule qq follows
    raises(ValueError, ("out", "inference_mode"), qq.dequantize, q, out=o)
    assert bool((o == 7).all()), "out untouched"
    with torch.inference_mode():                # inside inference mode it is allowed, as in torch
        qq.dequantize(q, out=o)
    assert torch.equal(o, qq.dequantize(q, dtype=torch.float32))


# ---- 7. outputs that alias inputs ---------------------------------------------------------

def test_swizzle_in_place_is_refused():
    """Before: swizzle_scales(s, out=s) zeroed every byte."""
    s = np.arange(128 * 4, dtype=np.uint8).reshape(128, 4)
    raises(ValueError, ("out", "scales"), qq.swizzle_scales, s, out=s)
    raises(ValueError, ("out", "scales"), qq.unswizzle_scales, s, (128, 4), out=s)
    assert_bits_equal(s, np.arange(128 * 4, dtype=np.uint8).reshape(128, 4), "scales untouched")


def test_dequantize_out_overlapping_data_is_refused():
    buf = np.zeros(4 * 64 * 4, np.uint8)
    x = np.linspace(-1, 1, 4 * 64, dtype=F32).reshape(4, 64)
    q = qq.quantize(x, mode="mxfp8")
    data = buf[:4 * 64].reshape(4, 64)
    data[...] = q.data
    out = buf.view(F32).reshape(4, 64)          # starts where data starts
    raises(ValueError, ("out", "w", "data"), qq.dequantize, data, q.scales, mode="mxfp8", out=out)


def test_qqmm_c_in_place_and_partial_overlap():
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((4, 64)).astype(F32), rng.standard_normal((8, 64)).astype(F32)
    c = rng.standard_normal((4, 8)).astype(F32)
    want = qq.qqmm(x, w, mode="mxfp8", c=c, beta=0.5)
    cc = c.copy()
    got = qq.qqmm(x, w, mode="mxfp8", c=cc, beta=0.5, out=cc)  # exactly in place: allowed
    assert_bits_equal(got, want, "qqmm out=c")
    big = np.zeros((5, 8), F32)
    big[:4] = c
    raises(ValueError, ("c", "out"), qq.qqmm, x, w, mode="mxfp8", c=big[:4], beta=0.5, out=big[1:])
    raises(ValueError, ("out", "x"), qq.qqmm, x, w, mode="mxfp8", out=x[:, :8])


# ---- 8. misalignment and sizes beyond int64 -----------------------------------------------

def test_misaligned_float_input_is_refused():
    """Before: a float32 view at byte offset 1 was read misaligned (undefined behaviour)."""
    buf = np.zeros(4 * 64 + 4, np.uint8)
    mis = np.frombuffer(buf.data, dtype=F32, count=64, offset=1).reshape(1, 64)
    raises(ValueError, "x", qq.quantize, mis, mode="mxfp8")
    raises(ValueError, "x", qq.amax, mis)


def test_element_count_beyond_int64_is_refused():
    """Before: {2^40, 2^40, 16} wrapped to 0 elements and 'succeeded' (NumPy cannot describe
    that shape; 2^60 elements is beyond libqq's 2^56 bound all the same)."""
    x = np.lib.stride_tricks.as_strided(np.zeros(16, F32), (2**28, 2**28, 16), (0, 0, 4))
    raises(ValueError, ("x", "x_shape"), qq.quantize, x, mode="nvfp4")


# ---- 9. numeric edges ---------------------------------------------------------------------

@pytest.mark.parametrize("gs", [-1.0, float("nan"), float("inf"), 1e-38])
def test_invalid_host_global_scale_is_refused(gs):
    raises(ValueError, "global_scale", qq.quantize, np.ones((4, 64), F32), mode="nvfp4", global_scale=gs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gs", [0.0, -1.0, float("nan"), 1e-38])
def test_invalid_global_scale_means_none(device, gs):
    """0 (an all-zero tensor's amax) everywhere, and on the GPU (where it cannot be read
    without a synchronization) every invalid value, quantizes and dequantizes as if no
    global scale were given: a round trip stays exact."""
    x = np.linspace(-3, 3, 4 * 64, dtype=F32).reshape(4, 64)
    if device == "cpu" and gs != 0.0:
        pytest.skip("refused on the host (test above)")
    g = to_device(np.array(gs, F32), device)
    q = qq.quantize(to_device(x, device), mode="nvfp4", global_scale=g)
    ref = R.quantize(x, mode="nvfp4")
    assert_bits_equal(q.data, ref.data, "data")
    assert_bits_equal(q.scales, ref.scales, "scales")
    y = qq.dequantize(q, mode="nvfp4", dtype="float32")
    assert_bits_equal(y, R.dequantize(ref.data, ref.scales, mode="nvfp4", dtype=F32), "dequantize")


@pytest.mark.parametrize("device", DEVICES)
def test_affine_group_wider_than_flt_max_stays_finite(device):
    """Before: a group spanning -3e38 .. 3e38 had scale inf and dequantized to NaN."""
    x = np.zeros((1, 32), F32)
    x[0, 0], x[0, 1], x[0, 2] = -3e38, 3e38, 1.0
    q = qq.quantize(to_device(x, device), group_size=32, bits=4)
    ref = R.quantize(x, group_size=32, bits=4)
    assert_bits_equal(q.data, ref.data, "data")
    assert_bits_equal(q.scales, ref.scales, "scales")
    y = np.asarray(qq.dequantize(q, dtype="float32") if device == "cpu"
                   else qq.dequantize(q, dtype="float32").cpu())
    assert np.isfinite(y).all(), y
    assert y[0, 0] < -2.5e38 and y[0, 1] > 2.5e38


def test_ceil_scale_near_fp16_max_dequantizes_to_inf_in_fp16():
    """Documented, not changed (docs/errors.md): with ceil scales, fp16 64000 -> scale 2^8,
    element 250 -> E4M3 256, value 65536: exact in float32, beyond float16's 65504."""
    x = np.full((1, 32), 64000, F16)
    q = qq.quantize(x, mode="mxfp8")
    assert float(qq.dequantize(q, mode="mxfp8", dtype="float32")[0, 0]) == 65536.0
    assert np.isinf(qq.dequantize(q, mode="mxfp8", dtype="float16")[0, 0])


# ---- 10. messages -------------------------------------------------------------------------

@pytest.mark.parametrize("call, exc, names", [
    (lambda: qq.quantize_colwise(np.zeros((40, 32), F32), mode="mxfp8"), ValueError, "M=40"),
    (lambda: qq.quantize(np.zeros((4, 40), F32), mode="mxfp8"), ValueError, "quantize"),
    (lambda: qq.quantize(np.zeros((4, 64), F32), group_size=2**31), ValueError, "group_size"),
    (lambda: qq.qqmm(np.zeros((4, 64), F32), np.zeros((8, 64), F32), c=np.zeros((4, 8), F32), beta="x"),
     TypeError, "beta"),
    (lambda: qq.quantize(np.zeros((4, 64), np.int64)), TypeError, "float32"),
    (lambda: qq.quantize(np.zeros((4, 64), np.float64)), TypeError, "float32"),
    (lambda: qq.grouped_qqmm(np.zeros((4, 64), F32), np.zeros((1, 8, 64), F32), np.array([4], F32)),
     TypeError, "offsets"),
    (lambda: qq.grouped_qqmm(np.zeros((4, 64), F32), np.zeros((1, 8, 64), F32), np.array([4], np.int64)),
     TypeError, "offsets"),
])
def test_messages_name_the_argument(call, exc, names):
    e = raises(exc, names, call)
    assert "quantized_shapes" not in str(e)


def test_swizzle_of_zero_columns():
    """Before: a (4, 0) array gave an error about 'x', 'K' and 'mxfp8'."""
    out = qq.swizzle_scales(np.zeros((4, 0), np.uint8))
    assert out.shape == (128, 0)


# ---- 11-13. cases the mutation test showed missing ----------------------------------------

@pytest.mark.parametrize("bits", [4, 8])
def test_affine_all_negative_group(bits):
    """The group maximum starts at 0, not at the first element: for -linspace(1, 2, 32)
    the edge is the minimum -2 and the bias -2 (a maximum started at -1 gives other codes)."""
    x = -np.linspace(1, 2, 32, dtype=F32).reshape(1, 32)
    q = qq.quantize(x, group_size=32, bits=bits)
    ref = R.quantize(x, group_size=32, bits=bits)
    assert_bits_equal(q.data, ref.data, "data")
    assert_bits_equal(q.scales, ref.scales, "scales")
    assert_bits_equal(q.biases, ref.biases, "biases")
    assert float(q.biases[0, 0]) == -2.0


def test_quantized_matmul_k_not_multiple_of_group():
    """K = 100 with group_size 32: scales [N, 3] cover 96 columns; must raise."""
    w = np.zeros((8, 50), np.uint8)  # 100 4-bit values per row
    raises(ValueError, ("K", "group_size"), qq.quantized_matmul, np.zeros((2, 100), F32), w,
           np.ones((8, 3), F32), np.zeros((8, 3), F32), group_size=32, bits=4)


@pytest.mark.parametrize("mode, emax", [("mxfp4", 6.0), ("mxfp8", 448.0)])
def test_ue8m0_ceil_exact_boundary(mode, emax):
    """amax = element max * 2^-127 needs exactly 2^-127: scale byte 0 (a '>' vs '>=' slip
    in the mantissa test gives byte 1)."""
    x = np.zeros((1, 32), F32)
    x[0, 0] = F32(np.ldexp(emax, -127))
    q = qq.quantize(x, mode=mode)
    assert int(np.asarray(q.scales).view(np.uint8)[0, 0]) == 0
    assert_bits_equal(q.scales, R.quantize(x, mode=mode).scales, "scales")
