"""Decode-layout quantized_matmul per call inside a CUDA graph (distinct weights, together
larger than the L2), for a sweep over configurations chosen by environment knobs of a
temporary build (QQ_DEC_S, QQ_DEC_KS). One line per (mode, shape, M): us, fraction of copy.

    QQ_DEC_S=8 SHAPES=4096x4096 MODES=nvfp4 MS=1 python bench/tune/dec_sweep.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_graph import copy_gbps, graph_us  # noqa: E402

import qq  # noqa: E402

SHAPES = [tuple(int(v) for v in s.split("x")) for s in
          os.environ.get("SHAPES", "6144x4096,4096x4096,28672x4096,4096x14336").split(",")]
MODES = os.environ.get("MODES", "nvfp4,mxfp8").split(",")
MS = [int(v) for v in os.environ.get("MS", "1").split(",")]
QUANT = {"affine4": dict(mode="affine", bits=4, group_size=64), "affine8": dict(mode="affine", bits=8, group_size=64)}
tag = f"S={os.environ.get('QQ_DEC_S', '-')} KS={os.environ.get('QQ_DEC_KS', '-')}"
torch.manual_seed(0)
copy = copy_gbps()
tot = {}
for n, k in SHAPES:
    nw = max(4, min(16, int(200e6 // (n * k * 0.53))))
    w = [torch.randn((n, k), dtype=torch.bfloat16, device="cuda") for _ in range(nw)]
    for mode in MODES:
        qw = [qq.quantize(t, **QUANT.get(mode, dict(mode=mode))) for t in w]
        q0 = qw[0]
        wbytes = sum(t.numel() * t.element_size() for t in (q0.data, q0.scales, q0.biases) if t is not None)
        dw = [qq.prepare_decode(q) for q in qw]
        del qw
        for m in MS:
            x = torch.randn((m, k), dtype=torch.bfloat16, device="cuda")
            us = graph_us(lambda: [qq.quantized_matmul(x, t) for t in dw], reps=20) / nw
            frac = wbytes / (us * 1e-6) / 1e9 / copy
            tot[(mode, m)] = tot.get((mode, m), 0.0) + us * {(6144, 4096): 1, (4096, 4096): 1, (28672, 4096): 1,
                                                            (4096, 14336): 1}.get((n, k), 0)
            print(f"{tag:12s} {mode:7s} ({n:5d},{k:5d}) M={m:2d}: {us:7.2f} us  {frac:.3f} of copy ({copy:.0f} GB/s)",
                  flush=True)
        del dw
    del w
    torch.cuda.empty_cache()
for (mode, m), v in tot.items():
    print(f"{tag:12s} {mode:7s} M={m:2d}: layer sum {v:7.2f} us (x32 = {32 * v:7.1f})", flush=True)
