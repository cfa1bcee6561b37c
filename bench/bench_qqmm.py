"""Benchmark of qq.qqmm (both operands quantized) on the current GPU.

For each shape (M, N, K) and mode: qq.qqmm(x, w) with x bf16 quantized on the fly
inside the call and w pre-quantized once (qq.quantize, blocked scales: what a layer
stores; variant "stored_w") or prepared once (qq.prepare_weight: on Hopper q(w)'s exact
bf16 values, variant "prepared_w"), as TFLOP/s (2*M*N*K over the whole call, x's quantization included) against
torch's bf16 matmul (cuBLAS) and torch._scaled_mm with per-tensor fp8 e4m3 operands
(cuBLAS fp8) on the same shape, all measured in this run.

    python bench/bench_qqmm.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Bench, Timer  # noqa: E402

import qq  # noqa: E402

LARGE = [(4096, 4096, 4096), (8192, 8192, 8192), (16384, 9728, 2560), (2048, 14336, 4096)]
SMALL_M = [1, 16, 128]
MODES = ["nvfp4", "mxfp8", "mxfp4"]


def tflops(m, n, k, us):
    return 2.0 * m * n * k / (us * 1e-6) / 1e12


def shapes(quick: bool):
    out = list(LARGE[:1] if quick else LARGE)
    for n, k in [(9728, 2560), (14336, 4096)][: 1 if quick else 2]:
        out += [(m, n, k) for m in SMALL_M]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    timer = Timer(warmup=3, iters=20)
    bench = Bench("qqmm")
    for (m, n, k) in shapes(args.quick):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        nbytes = 2 * (m * k + n * k + m * n)
        bf16_us = timer(lambda: x @ w.T, nbytes)
        x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
        one = torch.ones((), device="cuda")
        try:
            fp8_us = timer(lambda: torch._scaled_mm(x8, w8.T, scale_a=one, scale_b=one,
                                                    out_dtype=torch.bfloat16), nbytes)
        except RuntimeError:  # shapes cuBLAS fp8 refuses (M not a multiple of 16)
            fp8_us = float("nan")
        for mode in MODES:
            gs = qq.amax(w) if mode == "nvfp4" else None
            gx = qq.amax(x) if mode == "nvfp4" else None
            qw = qq.quantize(w, mode=mode, scale_layout="blocked", global_scale=gs)
            us = timer(lambda: qq.qqmm(x, qw, global_scale_x=gx), nbytes)
            ours = tflops(m, n, k, us)
            bench.row("qqmm", mode, (m, n, k), "TFLOPs", ours, "cublas_bf16", tflops(m, n, k, bf16_us),
                      variant="stored_w", us=round(us, 1))
            if fp8_us == fp8_us:
                bench.row("qqmm", mode, (m, n, k), "TFLOPs", ours, "cublas_fp8", tflops(m, n, k, fp8_us),
                          variant="stored_w", us=round(us, 1))
            # qq.prepare_weight: q(w) kept in the form this GPU multiplies (on Hopper its
            # exact bf16 values), so the call is q(x) + the GEMM
            pw = qq.prepare_weight(qw)
            us = timer(lambda: qq.qqmm(x, pw, global_scale_x=gx), nbytes)
            bench.row("qqmm", mode, (m, n, k), "TFLOPs", tflops(m, n, k, us), "cublas_bf16",
                      tflops(m, n, k, bf16_us), variant="prepared_w", us=round(us, 1))
            del pw, qw
    print(bench.save())


if __name__ == "__main__":
    main()
