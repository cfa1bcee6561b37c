"""Benchmark of qq.grouped_qqmm (MoE forward / dgrad) on the current GPU.

The shapes of the training issue: T = 16384 tokens over E = 8, 32 and 128 experts,
(N, K) = (4096, 7168) and (7168, 2048), balanced and Zipf-skewed routing; and E = 256 with
8..64 tokens per expert. bf16 x quantized inside the call; w [E, N, K] either packed
(qq.quantize, blocked scales: dequantized to bf16 per call) or prepared (qq.prepare_weight:
q(w)'s bf16 values kept, nothing per call). TFLOP/s (2*T*N*K) against torch's bf16
`torch._grouped_mm` on the same problem (same routing), measured in the same run: rows op
"grouped_qqmm", peer "torch_grouped_bf16", extra columns experts, routing, w_form, us. The
weight gradient too: grouped_qqmm_wgrad (x, dy [T, K / N] -> bf16 dw [E, K, N]) against
torch._grouped_mm's 2-D x 2-D form, rows op "grouped_qqmm_wgrad".

    python bench/bench_grouped.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Bench, Timer  # noqa: E402

import qq  # noqa: E402


def routing(t: int, e: int, kind: str, seed: int = 0) -> np.ndarray:
    """Tokens per expert, summing to t: equal shares, or Zipf (share ~ 1 / rank, experts
    in a random order; the tail gets few or no tokens)."""
    if kind == "balanced":
        sizes = np.full(e, t // e, np.int64)
        sizes[: t - sizes.sum()] += 1
        return sizes
    w = 1.0 / np.arange(1, e + 1)
    sizes = np.floor(w / w.sum() * t).astype(np.int64)
    sizes[0] += t - sizes.sum()
    return np.random.default_rng(seed).permutation(sizes)


def run_case(bench, timer, t, n, k, e, kind, forms, modes):
    sizes = routing(t, e, kind)
    offs = torch.tensor(np.cumsum(sizes), dtype=torch.int32, device="cuda")
    x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16)
    flops = 2.0 * t * n * k
    nbytes = 2 * (t * k + e * n * k + t * n)
    wt = w.transpose(-2, -1)
    peer_us = timer(lambda: torch._grouped_mm(x, wt, offs=offs), nbytes)
    peer_tf = flops / peer_us / 1e6
    for mode in modes:
        for form in forms:
            if form == "prepared":
                wq = qq.prepare_weight(w, mode=mode)
            else:
                wq = qq.quantize(w, mode=mode, scale_layout="blocked")
            us = timer(lambda: qq.grouped_qqmm(x, wq, offs, mode=mode), nbytes)
            bench.row("grouped_qqmm", mode, (t, n, k), "TFLOPs", flops / us / 1e6, "torch_grouped_bf16", peer_tf,
                      experts=e, routing=kind, w_form=form, us=round(us, 1), peer_us=round(peer_us, 1),
                      target_x=0.95)
            del wq
            torch.cuda.empty_cache()
    del x, w, wt


def run_wgrad(bench, timer, t, n, k, e, kind, modes):
    """dw[e] = q(x_e)^T q(dy_e) [E, K, N] against torch._grouped_mm's 2-D x 2-D form (offsets
    split the reduction axis) on the bf16 x^T and dy."""
    sizes = routing(t, e, kind)
    offs = torch.tensor(np.cumsum(sizes), dtype=torch.int32, device="cuda")
    x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(t, n, device="cuda", dtype=torch.bfloat16)
    flops = 2.0 * t * n * k
    nbytes = 2 * (t * k + t * n) + 4 * e * n * k
    peer = None
    for xt in (x.t(), x.t().contiguous()):     # what this torch's _grouped_mm takes
        try:
            torch._grouped_mm(xt, dy, offs=offs)
            peer = (lambda xt=xt: torch._grouped_mm(xt, dy, offs=offs))
            break
        except RuntimeError:
            continue
    if peer is None:
        print("bench_grouped: torch._grouped_mm has no 2-D x 2-D form here; wgrad rows skipped")
        return
    peer_us = timer(peer, nbytes)
    for mode in modes:
        us = timer(lambda: qq.grouped_qqmm_wgrad(x, dy, offs, mode=mode, dtype="bfloat16"), nbytes)
        bench.row("grouped_qqmm_wgrad", mode, (t, n, k), "TFLOPs", flops / us / 1e6, "torch_grouped_bf16",
                  flops / peer_us / 1e6, experts=e, routing=kind, us=round(us, 1), peer_us=round(peer_us, 1),
                  target_x=0.95)
    del x, dy


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if not hasattr(torch, "_grouped_mm"):
        sys.exit("bench_grouped: this torch has no torch._grouped_mm (the peer)")
    timer = Timer(warmup=2, iters=10)
    bench = Bench("grouped_qqmm")
    t = 16384
    shapes = [(4096, 7168), (7168, 2048)]
    experts = [8, 32] if args.quick else [8, 32, 128]
    for n, k in shapes:
        for e in experts:
            for kind in ("balanced", "zipf"):
                modes = ("mxfp8", "nvfp4") if e == 8 and kind == "balanced" else ("mxfp8",)
                run_case(bench, timer, t, n, k, e, kind, ("packed", "prepared"), modes)
    # E = 256, few tokens per expert: the bf16 weights dominate (15 GB for (4096, 7168)),
    # so only the prepared form is a fair comparison (packed w would be dequantized per call).
    for n, k in ([(7168, 2048)] if args.quick else shapes):
        for per in ((8, 64) if args.quick else (8, 16, 32, 64)):
            run_case(bench, timer, 256 * per, n, k, 256, "balanced", ("prepared",), ("mxfp8",))
    # the weight gradient (bf16 dw, as torch's)
    for n, k in shapes:
        for e in experts:
            run_wgrad(bench, timer, t, n, k, e, "balanced", ("mxfp8",))
        run_wgrad(bench, timer, t, n, k, 32, "zipf", ("mxfp8",))
    print(bench.save())


if __name__ == "__main__":
    main()
