"""qq.torch: QQLinearFunction / QQLinear / convert_linear (docs/adapters.md).

Gradients are compared with float64 autograd on the unquantized operands (SQNR: signal
over error power, in dB); the training loop with its float twin. CPU always, CUDA with the
gpu marker.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
qqt = pytest.importorskip("qq.torch")
import qq  # noqa: E402
from helpers import raises, torch_device  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]

# SQNR floors (dB). Measured on this test's data (CPU): mxfp8 y 31.6, dx 28.5, dW 28.5;
# nvfp4 20.5 / 17.4 / 17.4; mxfp4 18.8 / 15.8 / 15.9 (dx and dW quantize two
# random-normal operands, y one random and one scaled). The issue asks 27 dB for mxfp8; the
# fp4 floors leave ~4 dB of margin.
SQNR_MIN = {"mxfp8": 27.0, "nvfp4": 13.0, "mxfp4": 12.0}


def sqnr(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.double().cpu(), ref.double().cpu()
    err = (got - ref).pow(2).sum().item()
    return math.inf if err == 0 else 10 * math.log10(ref.pow(2).sum().item() / err)


dev = torch_device


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["mxfp8", "nvfp4", "mxfp4"])
def test_gradients_vs_float64(mode, device):
    """y, dx, dW, db against float64 autograd of the unquantized layer; T = 200 (not a
    multiple of the block: the wgrad operands are padded), x with a batch axis."""
    d = dev(device)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 50, 256, generator=g)
    w = torch.randn(192, 256, generator=g) / 16
    b = torch.randn(192, generator=g)
    dy = torch.randn(4, 50, 192, generator=g)

    x64, w64, b64 = (t.double().requires_grad_() for t in (x, w, b))
    y64 = torch.nn.functional.linear(x64, w64, b64)
    y64.backward(dy.double())

    xq = x.to(d).requires_grad_()
    wq = w.to(d).requires_grad_()
    bq = b.to(d).requires_grad_()
    y = qqt.qq_linear(xq, wq, bq, mode=mode)
    y.backward(dy.to(d))
    assert y.shape == (4, 50, 192) and y.dtype == torch.float32
    floor = SQNR_MIN[mode]
    for name, got, ref in (("y", y, y64), ("dx", xq.grad, x64.grad), ("dW", wq.grad, w64.grad)):
        s = sqnr(got.detach(), ref.detach())
        assert floor <= s < 80, f"{mode} {name}: SQNR {s:.1f} dB (floor {floor}; < 80: it must be quantized)"
    assert torch.allclose(bq.grad.cpu().double(), b64.grad, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_forward_is_qqmm_and_weight_is_quantized_once(device):
    """mxfp8: the forward equals qq.qqmm of x with the 32x32-quantized weight, and the
    dgrad operand holds the same values transposed (one quantization of W per step)."""
    d = dev(device)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 128, generator=g).to(d)
    w = torch.randn(96, 128, generator=g).to(d)
    fwd, bwd = qqt._quantize_weight(w, "mxfp8")
    wf = qq.dequantize(fwd["w"], fwd["scales"], mode="mxfp8", scale_layout="blocked", dtype="float32")
    wb = qq.dequantize(bwd["w"], bwd["scales"], mode="mxfp8", scale_layout="blocked", dtype="float32")
    assert torch.equal(wf.cpu(), wb.cpu().t()), "forward and dgrad operands differ"
    assert not torch.equal(wf.cpu(), w.cpu()), "the weight was not quantized"
    y = qqt.qq_linear(x, w, None, mode="mxfp8")
    ref = qq.qqmm(x, wf, mode="mxfp8", dtype="float32")  # wf is on the fp8 grid: q(wf) = wf
    # the same products; on the GPU the two calls take different kernels (packed w: the
    # weight-only kernel; float w: dequantize + GEMM), so only the fp32 sum order differs
    assert torch.allclose(y.cpu(), ref.cpu(), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["mxfp8", "nvfp4"])
def test_training_loop_tracks_float_twin(mode, device):
    """A 2-layer MLP on synthetic regression, 150 Adam steps, fixed seed: the quantized
    model's final loss is within 25 % (mxfp8) / 60 % (nvfp4) of its float32 twin's, and both
    fall at least 5x from the start."""
    d = dev(device)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(2)
    xs = torch.randn(512, 64, generator=g)
    true_w = torch.randn(64, 32, generator=g) / 8
    ys = torch.tanh(xs @ true_w) + 0.01 * torch.randn(512, 32, generator=g)
    xs, ys = xs.to(d), ys.to(d)

    def make():
        torch.manual_seed(3)
        return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 32)).to(d)

    def train(model):
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        losses = []
        for step in range(150):
            i = (step * 128) % 512
            loss = torch.nn.functional.mse_loss(model(xs[i:i + 128]), ys[i:i + 128])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        with torch.no_grad():
            return losses[0], torch.nn.functional.mse_loss(model(xs), ys).item()

    f0, f_end = train(make())
    qmodel = qqt.convert_linear(make(), mode=mode)
    assert sum(isinstance(m, qqt.QQLinear) for m in qmodel.modules()) == 2
    q0, q_end = train(qmodel)
    margin = 1.25 if mode == "mxfp8" else 1.6
    assert f_end < f0 / 5 and q_end < q0 / 5, (f0, f_end, q0, q_end)
    assert q_end <= margin * f_end + 1e-4, f"{mode}: final loss {q_end:.5f} vs float {f_end:.5f}"


def test_from_linear_and_convert():
    lin = torch.nn.Linear(64, 32)
    q = qqt.QQLinear.from_linear(lin, mode="mxfp8")
    assert q.weight is lin.weight and q.bias is lin.bias and q.mode == "mxfp8"
    assert "mode='mxfp8'" in repr(q)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Sequential(torch.nn.Linear(32, 32)),
                                torch.nn.Linear(32, 10))  # 10 outputs: not a multiple of 32, kept
    qqt.convert_linear(model, mode="mxfp8")
    assert isinstance(model[0], qqt.QQLinear) and isinstance(model[1][0], qqt.QQLinear)
    assert type(model[2]) is torch.nn.Linear
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 32))
    qqt.convert_linear(model, filter_fn=lambda name, lin: name == "1")
    assert type(model[0]) is torch.nn.Linear and isinstance(model[1], qqt.QQLinear)
    assert isinstance(qqt.convert_linear(torch.nn.Linear(32, 32)), qqt.QQLinear)
    y = q(torch.randn(3, 64))
    assert y.shape == (3, 32)
    state = q.state_dict()
    assert set(state) == {"weight", "bias"}


def test_bad_input():
    x, w = torch.randn(4, 64), torch.randn(32, 64)
    raises(ValueError, "mode", qqt.qq_linear, x, w, None, mode="fp8")
    raises(ValueError, ("in_features", "x"), qqt.qq_linear, torch.randn(4, 63), w)
    raises(ValueError, "weight", qqt.qq_linear, x, torch.randn(2, 32, 64))
    raises(TypeError, "x", qqt.qq_linear, x.to(torch.int32), w)
    raises(ValueError, "bias", qqt.qq_linear, x, w, torch.randn(31))
    raises(ValueError, ("in_features", "out_features"), qqt.qq_linear, torch.randn(4, 48), torch.randn(32, 48))
    raises(ValueError, ("in_features", "out_features"), qqt.QQLinear, 48, 32)
    raises(ValueError, "mode", qqt.QQLinear, 64, 32, mode="int4")
    raises(TypeError, "nn.Linear", qqt.QQLinear.from_linear, torch.nn.Conv1d(3, 3, 1))
    raises(ValueError, "mode", qqt.convert_linear, torch.nn.Linear(32, 32), mode="bad")


@pytest.mark.gpu
def test_mixed_devices():
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    raises(ValueError, "device", qqt.qq_linear, torch.randn(4, 64), torch.randn(32, 64, device="cuda"))


@pytest.mark.gpu
def test_bf16_layer_on_cuda():
    """bf16 activations and weights on the GPU (the training setting): dtypes kept."""
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    layer = qqt.QQLinear(256, 128, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(4, 100, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = layer(x)
    y.float().pow(2).mean().backward()
    assert y.dtype == torch.bfloat16 and x.grad.dtype == torch.bfloat16
    assert layer.weight.grad.dtype == torch.bfloat16 and layer.bias.grad.shape == (128,)
    assert torch.isfinite(layer.weight.grad.float()).all()


@pytest.mark.parametrize("mode", ["mxfp8", "nvfp4"])
def test_forward_skips_wgrad_operand_without_weight_grad(monkeypatch, mode):
    """x's values along the tokens (wgrad's operand) are made in the forward only when a weight
    gradient can be asked: not under no_grad, not for a frozen weight; dx still flows."""
    calls = []
    real = qq.quantize_dequantize

    def spy(x, mode, **kw):
        calls.append(kw.get("colwise", False))
        return real(x, mode, **kw)

    monkeypatch.setattr(qq, "quantize_dequantize", spy)
    layer = qqt.QQLinear(64, 32, mode=mode)
    x = torch.randn(40, 64, requires_grad=True)
    with torch.no_grad():
        y0 = layer(x)
    assert calls and not calls[0], calls          # x: rows only
    calls.clear()
    layer.weight.requires_grad_(False)
    y1 = layer(x)
    assert not calls[0], calls
    y1.sum().backward()                           # dx only: dy's rows only
    assert x.grad is not None and layer.weight.grad is None
    torch.testing.assert_close(y0, y1, rtol=0, atol=0)
    calls.clear()
    layer.weight.requires_grad_(True)
    layer(x).sum().backward()
    assert calls[0] is True and layer.weight.grad is not None
