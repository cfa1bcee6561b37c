"""Every bad input listed in docs/api.md raises the documented exception type, with a
message that names the offending argument:

* TypeError: a wrong dtype, or an object that is neither a NumPy array nor has __dlpack__;
* ValueError: wrong shape, K not a multiple of group_size, unsupported group_size / bits /
  mode / rounding / layout / fp8_format, unsupported strides, mixed devices, a global
  scale outside nvfp4, wrong scale shape, an out= buffer of the wrong shape/dtype or
  read-only, affine in qqmm, blocked scales for affine.
"""

from __future__ import annotations

import numpy as np
import pytest

import qq
import reference as R
from helpers import raises, to_device

F32 = np.float32

X = np.linspace(-1, 1, 4 * 64, dtype=F32).reshape(4, 64)
W = np.linspace(-1, 1, 8 * 64, dtype=F32).reshape(8, 64)
MX = R.quantize(X, mode="mxfp8")  # data (4, 64), scales (4, 2)
NV = R.quantize(X, mode="nvfp4")  # data (4, 32), scales (4, 4)
AF = R.quantize(X, group_size=32, bits=4)  # data (4, 32), scales/biases (4, 2)
WNV = R.quantize(W, mode="nvfp4")
WAF = R.quantize(W, group_size=32, bits=4)
GS = np.array(1.0, F32)


def readonly(a):
    a = np.array(a)
    a.flags.writeable = False
    return a


# (id, exception, names the message may use, call)
CASES = [
    # ---- quantize ----
    ("quantize-x-int32", TypeError, "x", lambda: qq.quantize(X.astype(np.int32))),
    ("quantize-x-float64", TypeError, "x", lambda: qq.quantize(X.astype(np.float64))),
    ("quantize-x-list", TypeError, "x", lambda: qq.quantize(X.tolist())),
    ("quantize-x-0d", ValueError, "x", lambda: qq.quantize(np.array(1.0, F32))),
    ("quantize-K-not-multiple-nvfp4", ValueError, ("group_size", "K"),
     lambda: qq.quantize(np.ones((4, 100), F32), mode="nvfp4")),
    ("quantize-K-not-multiple-affine", ValueError, ("group_size", "K"),
     lambda: qq.quantize(np.ones((4, 96), F32))),
    ("quantize-mode", ValueError, "mode", lambda: qq.quantize(X, mode="nvfp5")),
    ("quantize-rounding", ValueError, "rounding", lambda: qq.quantize(X, mode="mxfp8", rounding="nearest")),
    ("quantize-scale-layout", ValueError, "scale_layout",
     lambda: qq.quantize(X, mode="mxfp8", scale_layout="tiled")),
    ("quantize-fp8-format", ValueError, "fp8_format", lambda: qq.quantize(X, mode="mxfp8", fp8_format="e3m4")),
    ("quantize-fp8-format-not-mxfp8", ValueError, "fp8_format",
     lambda: qq.quantize(X, mode="nvfp4", fp8_format="e5m2")),
    ("quantize-bits-7", ValueError, "bits", lambda: qq.quantize(X, bits=7)),
    ("quantize-bits-1", ValueError, "bits", lambda: qq.quantize(X, bits=1)),
    ("quantize-group-16-affine", ValueError, "group_size", lambda: qq.quantize(X, group_size=16)),
    ("quantize-group-256-affine", ValueError, "group_size", lambda: qq.quantize(np.ones((2, 256), F32), group_size=256)),
    ("quantize-group-32-nvfp4", ValueError, "group_size", lambda: qq.quantize(X, mode="nvfp4", group_size=32)),
    ("quantize-group-16-mxfp8", ValueError, "group_size", lambda: qq.quantize(X, mode="mxfp8", group_size=16)),
    ("quantize-bits-4-mxfp8", ValueError, "bits", lambda: qq.quantize(X, mode="mxfp8", bits=4)),
    ("quantize-bits-8-nvfp4", ValueError, "bits", lambda: qq.quantize(X, mode="nvfp4", bits=8)),
    ("quantize-transposed-view", ValueError, ("x", "stride", "strides"),
     lambda: qq.quantize(np.ones((64, 64), F32).T, mode="nvfp4")),
    ("quantize-strided-last-axis", ValueError, ("x", "stride", "strides"),
     lambda: qq.quantize(np.ones((4, 128), F32)[:, ::2], mode="mxfp8")),
    ("quantize-global-scale-mxfp8", ValueError, "global_scale",
     lambda: qq.quantize(X, mode="mxfp8", global_scale=GS)),
    ("quantize-global-scale-affine", ValueError, "global_scale", lambda: qq.quantize(X, global_scale=GS)),
    ("quantize-global-scale-float64", TypeError, "global_scale",
     lambda: qq.quantize(X, mode="nvfp4", global_scale=np.array(1.0))),
    ("quantize-global-scale-shape", ValueError, "global_scale",
     lambda: qq.quantize(X, mode="nvfp4", global_scale=np.ones(2, F32))),
    ("quantize-blocked-affine", ValueError, "scale_layout", lambda: qq.quantize(X, scale_layout="blocked")),
    # ---- dequantize ----
    ("dequantize-scales-shape", ValueError, "scales",
     lambda: qq.dequantize(MX.data, MX.scales[:, :1], mode="mxfp8")),
    ("dequantize-scales-rows", ValueError, "scales",
     lambda: qq.dequantize(MX.data, MX.scales[:3], mode="mxfp8")),
    ("dequantize-blocked-scales-shape", ValueError, "scales",
     lambda: qq.dequantize(MX.data, MX.scales, mode="mxfp8", scale_layout="blocked")),
    ("dequantize-scales-float32", TypeError, "scales",
     lambda: qq.dequantize(MX.data, MX.scales.astype(F32), mode="mxfp8")),
    ("dequantize-data-float32", TypeError, ("w", "data"),
     lambda: qq.dequantize(MX.data.astype(F32), MX.scales, mode="mxfp8")),
    ("dequantize-data-width", ValueError, ("w", "data", "scales"),
     lambda: qq.dequantize(MX.data[:, :48], MX.scales, mode="mxfp8")),
    ("dequantize-affine-no-biases", ValueError, "biases",
     lambda: qq.dequantize(AF.data, AF.scales, None, group_size=32, bits=4)),
    ("dequantize-affine-biases-dtype", TypeError, "biases",
     lambda: qq.dequantize(AF.data, AF.scales, AF.biases.astype(np.float16), group_size=32, bits=4)),
    ("dequantize-affine-biases-shape", ValueError, "biases",
     lambda: qq.dequantize(AF.data, AF.scales, AF.biases[:, :1], group_size=32, bits=4)),
    ("dequantize-affine-scales-int", TypeError, "scales",
     lambda: qq.dequantize(AF.data, AF.scales.astype(np.int32), AF.biases, group_size=32, bits=4)),
    ("dequantize-mode", ValueError, "mode", lambda: qq.dequantize(MX.data, MX.scales, mode="fp8")),
    ("dequantize-fp8-format", ValueError, "fp8_format",
     lambda: qq.dequantize(MX.data, MX.scales, mode="mxfp8", fp8_format="e4m3fnuz")),
    ("dequantize-dtype", TypeError, "dtype",
     lambda: qq.dequantize(MX.data, MX.scales, mode="mxfp8", dtype="float64")),
    ("dequantize-blocked-affine", ValueError, "scale_layout",
     lambda: qq.dequantize(AF.data, AF.scales, AF.biases, group_size=32, bits=4, scale_layout="blocked")),
    ("dequantize-global-scale-mxfp8", ValueError, "global_scale",
     lambda: qq.dequantize(MX.data, MX.scales, mode="mxfp8", global_scale=GS)),
    ("dequantize-out-shape", ValueError, "out",
     lambda: qq.dequantize(MX.data, MX.scales, mode="mxfp8", out=np.empty((4, 32), F32))),
    ("dequantize-out-dtype", ValueError, "out",
     lambda: qq.dequantize(MX.data, MX.scales, mode="mxfp8", dtype="float32", out=np.empty((4, 64), np.float64))),
    ("dequantize-out-dtype-vs-dtype", ValueError, ("out", "dtype"),
     lambda: qq.dequantize(MX.data, MX.scales, mode="mxfp8", dtype="float16", out=np.empty((4, 64), F32))),
    ("dequantize-out-readonly", ValueError, "out",
     lambda: qq.dequantize(MX.data, MX.scales, mode="mxfp8", dtype="float32", out=readonly(np.empty((4, 64), F32)))),
    ("dequantize-out-not-compact", ValueError, "out",
     lambda: qq.dequantize(MX.data, MX.scales, mode="mxfp8", dtype="float32", out=np.empty((64, 4), F32).T)),
    ("dequantize-qa-contradicting-mode", ValueError, "mode",
     lambda: qq.dequantize(qq.quantize(X, mode="nvfp4"), mode="mxfp8")),
    ("dequantize-qa-contradicting-group", ValueError, "group_size",
     lambda: qq.dequantize(qq.quantize(X, group_size=32), group_size=64)),
    # ---- qqmm ----
    ("qqmm-affine", ValueError, "mode", lambda: qq.qqmm(X, W, mode="affine")),
    ("qqmm-mode", ValueError, "mode", lambda: qq.qqmm(X, W, mode="int4")),
    ("qqmm-K-mismatch", ValueError, ("w", "x", "K"), lambda: qq.qqmm(X, np.ones((8, 128), F32))),
    ("qqmm-K-not-multiple", ValueError, ("group_size", "K"),
     lambda: qq.qqmm(np.ones((4, 100), F32), np.ones((8, 100), F32))),
    ("qqmm-x-int", TypeError, "x", lambda: qq.qqmm(X.astype(np.int32), W)),
    ("qqmm-w-float64", TypeError, "w", lambda: qq.qqmm(X, W.astype(np.float64))),
    ("qqmm-w-4d", ValueError, "w", lambda: qq.qqmm(X, np.ones((2, 2, 8, 64), F32))),
    ("qqmm-w-3d-x-batch", ValueError, "w", lambda: qq.qqmm(np.ones((3, 4, 64), F32), np.ones((2, 8, 64), F32))),
    ("qqmm-bias-shape", ValueError, "bias", lambda: qq.qqmm(X, W, bias=np.ones(7, F32))),
    ("qqmm-bias-int", TypeError, "bias", lambda: qq.qqmm(X, W, bias=np.ones(8, np.int32))),
    ("qqmm-global-scale-mxfp8", ValueError, ("global_scale_x", "global_scale"),
     lambda: qq.qqmm(X, W, mode="mxfp8", global_scale_x=GS)),
    ("qqmm-global-scale-w-mxfp4", ValueError, ("global_scale_w", "global_scale"),
     lambda: qq.qqmm(X, W, mode="mxfp4", global_scale_w=GS)),
    ("qqmm-packed-w-no-scales", ValueError, "scales", lambda: qq.qqmm(X, WNV.data)),
    ("qqmm-packed-x-no-x-scales", ValueError, "x_scales", lambda: qq.qqmm(NV.data, WNV.data, WNV.scales)),
    ("qqmm-w-scales-shape", ValueError, "scales", lambda: qq.qqmm(X, WNV.data, WNV.scales[:, :2])),
    ("qqmm-w-scales-dtype", TypeError, "scales", lambda: qq.qqmm(X, WNV.data, WNV.scales.astype(F32))),
    ("qqmm-rounding", ValueError, "rounding", lambda: qq.qqmm(X, W, mode="mxfp8", rounding="up")),
    ("qqmm-scale-layout", ValueError, "scale_layout",
     lambda: qq.qqmm(X, WNV.data, WNV.scales, scale_layout="swizzled")),
    ("qqmm-out-shape", ValueError, "out", lambda: qq.qqmm(X, W, out=np.empty((4, 7), F32))),
    ("qqmm-out-readonly", ValueError, "out", lambda: qq.qqmm(X, W, out=readonly(np.empty((4, 8), F32)))),
    ("qqmm-out-dtype", ValueError, "out", lambda: qq.qqmm(X, W, out=np.empty((4, 8), np.int32))),
    ("qqmm-dtype", TypeError, "dtype", lambda: qq.qqmm(X, W, dtype="int8")),
    # ---- quantized_matmul ----
    ("qmm-K-mismatch", ValueError, ("x", "w", "K"),
     lambda: qq.quantized_matmul(np.ones((3, 32), F32), WAF.data, WAF.scales, WAF.biases, group_size=32)),
    ("qmm-batch-mismatch", ValueError, ("x", "w", "batch", "broadcast"),
     lambda: qq.quantized_matmul(np.ones((2, 3, 64), F32), np.stack([WAF.data] * 3), np.stack([WAF.scales] * 3),
                                 np.stack([WAF.biases] * 3), group_size=32)),
    ("qmm-scales-shape", ValueError, "scales",
     lambda: qq.quantized_matmul(X, WAF.data, WAF.scales[:4], WAF.biases, group_size=32)),
    ("qmm-biases-missing", ValueError, "biases",
     lambda: qq.quantized_matmul(X, WAF.data, WAF.scales, None, group_size=32)),
    ("qmm-global-scale-affine", ValueError, "global_scale",
     lambda: qq.quantized_matmul(X, WAF.data, WAF.scales, WAF.biases, group_size=32, global_scale=GS)),
    ("qmm-blocked-no-transpose", ValueError, ("scale_layout", "transpose"),
     lambda: qq.quantized_matmul(np.ones((2, 8), F32), R.quantize(np.ones((8, 64), F32), mode="mxfp8").data,
                                 R.swizzle(R.quantize(np.ones((8, 64), F32), mode="mxfp8").scales),
                                 transpose=False, mode="mxfp8", scale_layout="blocked")),
    ("qmm-blocked-affine", ValueError, "scale_layout",
     lambda: qq.quantized_matmul(X, WAF.data, WAF.scales, WAF.biases, group_size=32, scale_layout="blocked")),
    ("qmm-bias-shape", ValueError, "bias",
     lambda: qq.quantized_matmul(X, WAF.data, WAF.scales, WAF.biases, group_size=32, bias=np.ones(9, F32))),
    ("qmm-x-int", TypeError, "x",
     lambda: qq.quantized_matmul(X.astype(np.int16), WAF.data, WAF.scales, WAF.biases, group_size=32)),
    ("qmm-x-transposed", ValueError, ("x", "stride", "strides"),
     lambda: qq.quantized_matmul(np.ones((64, 4), F32).T, WAF.data, WAF.scales, WAF.biases, group_size=32)),
    ("qmm-bits", ValueError, "bits",
     lambda: qq.quantized_matmul(X, WAF.data, WAF.scales, WAF.biases, group_size=32, bits=7)),
    ("qmm-out-shape", ValueError, "out",
     lambda: qq.quantized_matmul(X, WAF.data, WAF.scales, WAF.biases, group_size=32, out=np.empty((4, 9), F32))),
    ("qmm-out-dtype", ValueError, "out",
     lambda: qq.quantized_matmul(X, WAF.data, WAF.scales, WAF.biases, group_size=32, out=np.empty((4, 8), np.float64))),
    # ---- swizzle / unswizzle / amax ----
    ("swizzle-float32", TypeError, "scales", lambda: qq.swizzle_scales(np.ones((4, 4), F32))),
    ("swizzle-out-shape", ValueError, "out",
     lambda: qq.swizzle_scales(np.ones((4, 4), np.uint8), out=np.empty((4, 4), np.uint8))),
    ("swizzle-out-readonly", ValueError, "out",
     lambda: qq.swizzle_scales(np.ones((4, 4), np.uint8), out=readonly(np.empty((128, 4), np.uint8)))),
    ("unswizzle-shape", ValueError, ("shape", "scales"),
     lambda: qq.unswizzle_scales(np.ones((128, 4), np.uint8), (129, 4))),
    ("unswizzle-shape-cols", ValueError, ("shape", "scales"),
     lambda: qq.unswizzle_scales(np.ones((128, 4), np.uint8), (100, 5))),
    ("unswizzle-out-shape", ValueError, "out",
     lambda: qq.unswizzle_scales(np.ones((128, 4), np.uint8), (100, 3), out=np.empty((100, 4), np.uint8))),
    ("amax-int", TypeError, "x", lambda: qq.amax(np.ones(4, np.int32))),
    ("amax-not-array", TypeError, "x", lambda: qq.amax(object())),
    ("amax-out-dtype", ValueError, "out", lambda: qq.amax(X, out=np.empty((), np.float64))),
    ("amax-out-shape", ValueError, "out", lambda: qq.amax(X, out=np.empty((2,), F32))),
]


@pytest.mark.parametrize("exc,names,call", [pytest.param(e, n, c, id=i) for i, e, n, c in CASES])
def test_bad_input(exc, names, call):
    """The documented exception, and a message naming the argument."""
    raises(exc, names, call)


def test_exception_classes():
    """qq.NotSupportedError is a NotImplementedError; qq.QQError a RuntimeError."""
    assert issubclass(qq.NotSupportedError, NotImplementedError)
    assert issubclass(qq.QQError, RuntimeError)
    assert not issubclass(qq.NotSupportedError, (ValueError, TypeError))


def test_error_does_not_poison_next_call():
    """After a failure the next valid call works and gives the right answer."""
    with pytest.raises(ValueError):
        qq.quantize(X, mode="nvfp5")
    q = qq.quantize(X, mode="mxfp8")
    np.testing.assert_array_equal(np.asarray(q.data), MX.data)


def test_out_is_not_written_on_error():
    """A rejected call leaves out= alone (validation happens before any write)."""
    out = np.full((4, 64), 7.0, F32)
    with pytest.raises(ValueError):
        qq.dequantize(MX.data, MX.scales[:, :1], mode="mxfp8", dtype="float32", out=out)
    assert (out == 7.0).all()


@pytest.mark.gpu
def test_mixed_devices():
    """A CUDA x with a CPU w (or scales) is a ValueError that names the device problem."""
    x = to_device(X, "cuda")
    raises(ValueError, ("device", "devices", "w"), qq.qqmm, x, W)
    raises(ValueError, ("device", "devices", "scales"), qq.dequantize, to_device(MX.data, "cuda"), MX.scales,
           mode="mxfp8")
    raises(ValueError, ("device", "devices", "global_scale"), qq.quantize, x, mode="nvfp4", global_scale=GS)


def test_prepared_values_and_device_feature_errors():
    """w_values (qqQqmmParams_t, from a PreparedWeight) must match w's logical shape; and the
    device-feature query refuses a CPU-only build or a bad device clearly."""
    w = np.random.default_rng(0).standard_normal((24, 64)).astype(np.float32)
    pw = qq.prepare_weight(w, mode="nvfp4")
    bad = qq.PreparedWeight(pw.quantized, np.zeros((24, 32), dtype=pw.values.dtype))
    with pytest.raises(ValueError, match=r"qqmm: argument 'w_values' has shape \(24, 32\); expected \(24, 64\)"):
        qq.qqmm(np.ones((2, 64), np.float32), bad)
    if qq.device_count() == 0:
        with pytest.raises((qq.NotSupportedError, ValueError), match="qqGetDeviceFeature"):
            qq._qq._blockscaled_capability(0)
    else:
        with pytest.raises(ValueError, match="qqGetDeviceFeature"):
            qq._qq._blockscaled_capability(qq.device_count() + 3)


def test_argument_beside_a_quantized_array_without_it():
    """An argument a QuantizedArray does not carry (a global scale of an mx or nvfp4-without
    weight, biases of an fp one) is refused as such, not as "given both"; one it does carry,
    given again, as "given both"."""
    x = X[:, :64]
    mx, nv = qq.quantize(W, mode="mxfp4"), qq.quantize(W, mode="nvfp4")
    cases = [
        (lambda: qq.quantized_matmul(x, mx, global_scale=GS), "global_scale"),
        (lambda: qq.qqmm(x, nv, global_scale_w=GS), "global_scale_w"),
        (lambda: qq.qqmm(nv, W, global_scale_x=GS), "global_scale_x"),
        (lambda: qq.dequantize(mx, biases=np.zeros((8, 2), F32)), "biases"),
    ]
    for call, arg in cases:
        with pytest.raises(ValueError) as e:
            call()
        msg = str(e.value)
        assert arg in msg and "is None" in msg and "given both" not in msg, msg
    with pytest.raises(ValueError, match="given both"):
        qq.dequantize(mx, scales=np.asarray(mx.scales).copy())
