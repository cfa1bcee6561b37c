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
