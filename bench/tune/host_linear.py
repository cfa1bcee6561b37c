"""Host time of the calls in a qq.torch.QQLinear training step (CUDA, bench_linear's shape):
each call repeated back to back without a synchronize, the host's time per call (the GPU
queues behind). A tuning aid for the step's host latency, which a loop that synchronizes
every step (loss.item()) pays in full.

    python bench/tune/host_linear.py [mode]
"""
import sys

import torch
from host_calls_big import host_us  # noqa: E402  (bench/tune: the script's own directory)

import qq
import qq.torch as qqt
from qq.torch import _linear_backward, _linear_forward, _quantize_weight, _wgrad


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "mxfp8"
    t, n, k = 16384, 4096, 4096
    torch.manual_seed(0)
    ref = torch.nn.Linear(k, n, device="cuda", dtype=torch.bfloat16)
    layer = qqt.QQLinear.from_linear(ref, mode=mode)
    x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(t, n, device="cuda", dtype=torch.bfloat16)
    w, b = layer.weight.detach(), layer.bias.detach()
    xd = x.detach()
    y, wd = _linear_forward(xd, w, b, mode)
    rows = [
        ("torch x + x (the unit)", lambda: xd + xd),
        ("nn.Linear step", lambda: ref(x).backward(dy)),
        ("QQLinear step", lambda: layer(x).backward(dy)),
        ("QQLinear forward (autograd)", lambda: layer(x)),
        ("_linear_forward", lambda: _linear_forward(xd, w, b, mode)),
        ("_quantize_weight", lambda: _quantize_weight(w, mode)),
        ("_linear_backward", lambda: _linear_backward(dy, xd, wd, mode, True, True, w.dtype)),
        ("_wgrad", lambda: _wgrad(dy, xd, mode, w.dtype)),
        ("qq.amax", lambda: qq.amax(xd)),
        ("torch.full ends", lambda: torch.full((1,), t, dtype=torch.int32, device="cuda")),
        ("dy.sum(0, fp32)", lambda: dy.sum(0, dtype=torch.float32)),
    ]
    if mode == "mxfp8":
        wt = w.t().unsqueeze(0)
        rows.append(("qq.quantize_moe 32x32", lambda: qq.quantize_moe(wt, scaling="32x32", scale_layout="blocked",
                                                                     torch_dtypes=False)))
    for name, fn in rows:
        print(f"{name:32s} {host_us(fn):9.1f} us host per call")




def cprofile(mode="mxfp8"):
    """cProfile of 10 QQLinear steps (host side; the GPU queues behind)."""
    import cProfile
    import pstats
    t, n, k = 16384, 4096, 4096
    ref = torch.nn.Linear(k, n, device="cuda", dtype=torch.bfloat16)
    layer = qqt.QQLinear.from_linear(ref, mode=mode)
    x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(t, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        layer(x).backward(dy)
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(10):
        layer(x).backward(dy)
    pr.disable()
    torch.cuda.synchronize()
    pstats.Stats(pr).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    if "--cprofile" in sys.argv:
        cprofile(*[a for a in sys.argv[1:] if a != "--cprofile"])
    else:
        main()
