"""Where quantized_matmul's time goes at batched-decode and prefill sizes (M = 32..1024) on
the packed weight: the call itself (its route) beside its two parts done separately
(qq.dequantize of the weight to bf16, then torch's bf16 `x @ wd.T`: what the "exact" route
runs), the decode layout's kernel where it applies (M <= 64, column "decode") and torch's
bf16 GEMM on the float weight; CUDA events (harness.Timer), one process. The qmma / exact
crossover (kQmmaMaxM) is where "qmm" (route qmma) passes "dq+gemm".

    python bench/tune/prefill_probe.py   (MODES=nvfp4,nvfp4gs,mxfp8,affine4 MS=32,48,64,128,256,512,1024)
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from harness import Timer  # noqa: E402

import qq  # noqa: E402

KW = {"nvfp4": dict(mode="nvfp4"), "nvfp4gs": dict(mode="nvfp4"), "mxfp4": dict(mode="mxfp4"),
      "mxfp8": dict(mode="mxfp8"), "affine4": dict(mode="affine", bits=4, group_size=64)}
modes = os.environ.get("MODES", "nvfp4,nvfp4gs,mxfp8,affine4").split(",")
ms = [int(m) for m in os.environ.get("MS", "32,48,64,128,256,512,1024").split(",")]
shapes = [(16384, 16384), (28672, 4096), (4096, 14336)]
tm = Timer(warmup=3, iters=15)
print(f"{'mode':>8} {'N':>6} {'K':>6} {'M':>5} {'qmm':>8} {'route':>10} {'dq':>8} {'gemm(wd)':>9} {'dq+gemm':>8} "
      f"{'decode':>8} {'torch':>8} {'qmm/torch':>9}")
for n, k in shapes:
    w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * k ** -0.5
    for mode in modes:
        extra = {"global_scale": qq.amax(w)} if mode == "nvfp4gs" else {}
        q = qq.quantize(w, **KW[mode], **extra)
        wd = qq.dequantize(q)
        t_dq = tm(lambda: qq.dequantize(q))
        try:
            dw = qq.prepare_decode(q)
        except (ValueError, qq.NotSupportedError):
            dw = None
        for m in ms:
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            t_q = tm(lambda: qq.quantized_matmul(x, q))
            route = qq.last_route()
            t_g = tm(lambda: x @ wd.t())
            t_t = tm(lambda: x @ w.t())
            t_d = tm(lambda: qq.quantized_matmul(x, dw)) if dw is not None and m <= 64 else float("nan")
            print(f"{mode:>8} {n:>6} {k:>6} {m:>5} {t_q:8.1f} {route:>10} {t_dq:8.1f} {t_g:9.1f} {t_dq + t_g:8.1f} "
                  f"{t_d:8.1f} {t_t:8.1f} {t_q / t_t:9.2f}", flush=True)
        del q, wd, dw
    del w
    torch.cuda.empty_cache()
