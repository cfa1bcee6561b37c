"""Benchmark of a router-free MoE layer's training step with qq.torch.QQGroupedLinear on the
current GPU.

T = 16384 tokens already sorted by expert, spread evenly over E = 8 or 32 experts; each
expert a SwiGLU MLP of hidden size D = 4096 and expert size F = 2048: gate_up [E, 2F, D],
down [E, D, F]. One step = forward + backward (dx and both weight gradients) given dy.
qq: QQGroupedLinear in mxfp8 (weights quantized once per step in 32x32 tiles, tokens along
K; dgrad and wgrad quantized as in QQLinear). Peer: the same layer in bf16 through torch's
grouped GEMM (torch._grouped_mm, its autograd), measured in the same run; rows op
"moe_layer_step" (and "moe_layer_fwd"), metric us, peer "torch_grouped_bf16", ratio =
peer time / ours (> 1: faster). On Hopper qq's grouped calls read the offsets on the device
(one grouped GEMM each); elsewhere on the host (a stream wait per call), which is then part
of what this measures.

    python bench/bench_moe.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Bench, Timer, forward_only, training_step  # noqa: E402

import qq.torch as qqt  # noqa: E402


def swiglu(h):
    g, u = h.chunk(2, dim=-1)
    return F.silu(g) * u


def layers(e, t=16384, d=4096, f=2048):
    """The benchmark's problem for E = e experts: (x, dy, params, bf16_layer, qq_layer), the
    bf16 peer over torch._grouped_mm and the same layer through qq.torch.QQGroupedLinear
    (mxfp8), with the same weights; params are the peer's weights (the qq layer's are
    copies). Also used by bench/tune/profile_linear.py."""
    offs = torch.arange(1, e + 1, device="cuda", dtype=torch.int32) * (t // e)
    x = torch.randn(t, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(t, d, device="cuda", dtype=torch.bfloat16)
    w1 = (torch.randn(e, 2 * f, d, device="cuda", dtype=torch.bfloat16) / d ** 0.5).requires_grad_()
    w2 = (torch.randn(e, d, f, device="cuda", dtype=torch.bfloat16) / f ** 0.5).requires_grad_()
    up = qqt.QQGroupedLinear(e, d, 2 * f, mode="mxfp8", device="cuda", dtype=torch.bfloat16)
    down = qqt.QQGroupedLinear(e, f, d, mode="mxfp8", device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        up.weight.copy_(w1)
        down.weight.copy_(w2)

    def bf16_layer(x):
        h = torch._grouped_mm(x, w1.transpose(-2, -1), offs=offs)
        return torch._grouped_mm(swiglu(h), w2.transpose(-2, -1), offs=offs)

    def qq_layer(x):
        return down(swiglu(up(x, offs)), offs)

    qq_layer.params = (up.weight, down.weight)
    return x, dy, (w1, w2), bf16_layer, qq_layer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="E = 8 only, fewer iterations")
    args = ap.parse_args()
    timer = Timer(warmup=2, iters=5 if args.quick else 10)
    bench = Bench("moe")
    t, d, f = 16384, 4096, 2048
    if not hasattr(torch, "_grouped_mm"):
        print("this torch has no torch._grouped_mm: no peer, nothing measured")
        return
    for e in ((8,) if args.quick else (8, 32)):
        torch.manual_seed(0)
        x, dy, (w1, w2), bf16_layer, qq_layer = layers(e, t, d, f)

        flops = 3 * 2.0 * t * (2 * f * d + d * f)
        moved = 4 * t * d * 2 * 3  # rough bytes of a step (> 2x L2: batched timing)
        try:
            peer_step = timer(training_step(bf16_layer, x, dy, (w1, w2)), moved)
            peer_name = "torch_grouped_bf16"
        except RuntimeError as err:  # a torch whose _grouped_mm has no backward here
            print(f"torch._grouped_mm backward failed ({str(err).splitlines()[0]}): no step peer")
            peer_step, peer_name = float("nan"), "none"
        peer_fwd = timer(forward_only(bf16_layer, x), moved)
        us = timer(training_step(qq_layer, x, dy, qq_layer.params), moved)
        bench.row("moe_layer_step", "mxfp8", (t, e, d, f), "us", us, peer_name, peer_step,
                  tflops=round(flops / us / 1e6, 1), target_x=0.9)
        us = timer(forward_only(qq_layer, x), moved)
        bench.row("moe_layer_fwd", "mxfp8", (t, e, d, f), "us", us, "torch_grouped_bf16", peer_fwd,
                  tflops=round(flops / 3 / us / 1e6, 1))
        del qq_layer, bf16_layer, w1, w2, x, dy
        torch.cuda.empty_cache()
    for path in bench.save():
        print("wrote", path)


if __name__ == "__main__":
    main()
