"""Small-M quantized_matmul timings for tuning qmv / qmma (bench/tune/qmv_tune.sh): GB/s as
a fraction of the copy bandwidth measured in the same run, printed; nothing is written. Not
a results table: the tuned figures go through bench/bench_qmm.py. It times the build as it
is (the tuned values are constants in the sources; a candidate value is a rebuild).

    python bench/tune/qmv_sweep.py [--ms 1,4] [--shapes 16384x16384,4096x14336] [--profile]
--profile: one call per mode (for ncu), no timing.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # bench/harness.py
from harness import Timer, copy_bandwidth  # noqa: E402

import qq  # noqa: E402

MODES = [("nvfp4", {"mode": "nvfp4"}), ("mxfp4", {"mode": "mxfp4"}), ("mxfp8", {"mode": "mxfp8"}),
         ("affine4", {"mode": "affine", "bits": 4}), ("affine8", {"mode": "affine", "bits": 8})]

ap = argparse.ArgumentParser()
ap.add_argument("--ms", default="1,4")
ap.add_argument("--shapes", default="16384x16384,4096x14336,14336x4096")
ap.add_argument("--modes", default="nvfp4,mxfp4,mxfp8,affine4,affine8")
ap.add_argument("--profile", action="store_true")
args = ap.parse_args()
ms = [int(v) for v in args.ms.split(",")]
shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
modes = [m for m in MODES if m[0] in args.modes.split(",")]
timer = Timer(warmup=3, iters=20)
copy = None if args.profile else copy_bandwidth(timer)
for n, k in shapes:
    w = torch.randn((n, k), dtype=torch.bfloat16, device="cuda")
    for mode, kw in modes:
        qw = qq.quantize(w, **kw)
        wb = sum(t.numel() * t.element_size() for t in (qw.data, qw.scales, getattr(qw, "biases", None))
                 if t is not None)
        for m in ms:
            x = torch.randn((m, k), dtype=torch.bfloat16, device="cuda")
            if args.profile:
                qq.quantized_matmul(x, qw)
                continue
            moved = wb + x.numel() * 2 + m * n * 2
            us = timer(lambda: qq.quantized_matmul(x, qw), moved)
            gbps = moved / us / 1e3
            print(f"{mode:8s} M={m:3d} ({n},{k}) {us:8.1f} us {gbps:7.0f} GB/s {gbps / copy:5.2f} of copy",
                  flush=True)
torch.cuda.synchronize()
