"""Benchmark of a qq.torch.QQLinear training step (forward + backward) on the current GPU.

(T, N, K) = (16384, 4096, 4096): bf16 x [T, K], a layer of bf16 weights [N, K] with bias,
loss gradient dy given. One step = forward + backward (dx, dW, db), the weight quantized
once inside it. Peer: torch.nn.Linear in bf16 (cuBLAS) doing the same step in the same run;
ratio = peer time / our time (> 1: faster). Also the forward alone.

    python bench/bench_linear.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Bench, Timer, forward_only, training_step  # noqa: E402

import qq.torch as qqt  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    timer = Timer(warmup=3, iters=10 if args.quick else 20)
    bench = Bench("linear")
    t, n, k = 16384, 4096, 4096
    torch.manual_seed(0)
    ref = torch.nn.Linear(k, n, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(t, n, device="cuda", dtype=torch.bfloat16)
    moved = 2 * (t * k * 3 + n * k * 3 + t * n * 2)  # rough bytes of a step; > 2x L2: batched timing

    peer_step = timer(training_step(ref, x, dy, (ref.weight, ref.bias)), moved)
    peer_fwd = timer(forward_only(ref, x), moved)
    flops = 3 * 2.0 * t * n * k
    for mode in (("mxfp8",) if args.quick else ("mxfp8", "nvfp4", "mxfp4")):
        layer = qqt.QQLinear.from_linear(ref, mode=mode)
        us = timer(training_step(layer, x, dy, (layer.weight, layer.bias)), moved)
        bench.row("qqlinear_step", mode, (t, n, k), "us", us, "nn_linear_bf16", peer_step,
                  tflops=round(flops / us / 1e6, 1))
        us = timer(forward_only(layer, x), moved)
        bench.row("qqlinear_fwd", mode, (t, n, k), "us", us, "nn_linear_bf16", peer_fwd,
                  tflops=round(flops / 3 / us / 1e6, 1))
    print(bench.save())


if __name__ == "__main__":
    main()
