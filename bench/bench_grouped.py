"""Benchmark of qq.grouped_qqmm (MoE forward) on the current GPU.

T = 16384 tokens spread evenly over E experts (8 and 32), (N, K) = (4096, 7168), bf16 x
quantized inside the call, w [E, N, K] pre-quantized (qq.quantize, blocked scales).
TFLOP/s (2*T*N*K) against torch's bf16 grouped matmul on the same shapes
(torch._grouped_mm when this torch has it, else a loop of per-expert matmuls; the peer
name says which), measured in the same run.

    python bench/bench_grouped.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Bench, Timer  # noqa: E402

import qq  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    timer = Timer(warmup=2, iters=10)
    bench = Bench("grouped_qqmm")
    t, n, k = 16384, 4096, 7168
    for e in ([8] if args.quick else [8, 32]):
        x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16)
        sizes = torch.full((e,), t // e, dtype=torch.int32)
        offs = torch.cumsum(sizes, 0).to(torch.int32).cuda()
        nbytes = 2 * (t * k + e * n * k + t * n)
        flops = 2.0 * t * n * k
        if hasattr(torch, "_grouped_mm"):
            wt = w.transpose(-2, -1)
            peer_fn, peer = (lambda: torch._grouped_mm(x, wt, offs=offs)), "torch_grouped_bf16"
        else:
            chunks = list(torch.split(x, t // e))
            peer_fn, peer = (lambda: [c @ w[i].T for i, c in enumerate(chunks)]), "torch_loop_bf16"
        try:
            peer_us = timer(peer_fn, nbytes)
        except RuntimeError:
            chunks = list(torch.split(x, t // e))
            peer_fn, peer = (lambda: [c @ w[i].T for i, c in enumerate(chunks)]), "torch_loop_bf16"
            peer_us = timer(peer_fn, nbytes)
        for mode in ("mxfp8", "nvfp4", "mxfp4"):
            wq = qq.quantize(w, mode=mode, scale_layout="blocked")
            us = timer(lambda: qq.grouped_qqmm(x, wq, offs), nbytes)
            bench.row("grouped_qqmm", mode, (t, n, k), "TFLOPs", flops / us / 1e6, peer, flops / peer_us / 1e6,
                      experts=e, us=round(us, 1))
            del wq
    print(bench.save())


if __name__ == "__main__":
    main()
