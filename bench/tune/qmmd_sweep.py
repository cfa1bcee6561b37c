"""Sweep of the decode kernel (cuda/qmma.cu qmmd_kernel) against qmma_kernel on the H100:
quantized_matmul at the decode shapes, M in {1, 4, 16}, fp modes, with the cluster split
forced through QQ_QMMD_CS (a tuning-only switch) and the old kernel through QQ_QMMD_OFF.
Prints us and the fraction of copy bandwidth that the weight bytes reach; writes JSON rows
to argv[1] when given."""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import qq  # noqa: E402
from harness import Timer, copy_bandwidth  # noqa: E402

SHAPES = [(16384, 16384), (6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]
MODES = [("nvfp4", {"mode": "nvfp4"}), ("mxfp4", {"mode": "mxfp4"}), ("mxfp8", {"mode": "mxfp8"})]
MS = [int(m) for m in os.environ.get("SWEEP_MS", "1,4,16").split(",")]
VARIANTS = os.environ.get("SWEEP_VARIANTS", "old,auto,1,2,4,8").split(",")


def nbytes(t):
    return 0 if t is None else t.numel() * t.element_size()


def set_variant(v):
    os.environ.pop("QQ_QMMD_OFF", None)
    os.environ.pop("QQ_QMMD_CS", None)
    if v == "old":
        os.environ["QQ_QMMD_OFF"] = "1"
    elif v != "auto":
        os.environ["QQ_QMMD_CS"] = v


def main():
    timer = Timer(warmup=3, iters=20)
    copy = copy_bandwidth(timer)
    print(f"copy bandwidth {copy:.0f} GB/s")
    rows = []
    torch.manual_seed(0)
    for n, k in SHAPES:
        w = torch.randn((n, k), dtype=torch.bfloat16, device="cuda")
        for mode, kw in MODES:
            qw = qq.quantize(w, **kw)
            wb = nbytes(qw.data) + nbytes(qw.scales)
            for m in MS:
                x = torch.randn((m, k), dtype=torch.bfloat16, device="cuda")
                line = [f"{mode:6s} {n:5d}x{k:5d} M={m:2d}"]
                ref = None
                for v in VARIANTS:
                    set_variant(v)
                    try:
                        y = qq.quantized_matmul(x, qw)
                        torch.cuda.synchronize()
                    except Exception as e:  # noqa: BLE001
                        line.append(f"{v}:ERR({type(e).__name__})")
                        continue
                    if ref is None:
                        ref = y.float()
                    err = (y.float() - ref).abs().max().item() / (ref.abs().max().item() + 1e-30)
                    us = timer(lambda: qq.quantized_matmul(x, qw), wb)
                    frac = wb / (us * 1e-6) / 1e9 / copy
                    line.append(f"{v}:{us:7.1f}us {frac:.2f}" + ("" if err < 1e-2 else f" DIFF{err:.1e}"))
                    rows.append(dict(mode=mode, n=n, k=k, m=m, variant=v, us=us, frac=frac, rel_diff=err))
                print("  ".join(line), flush=True)
            del qw
        del w
        torch.cuda.empty_cache()
    set_variant("auto")
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(dict(copy_gbps=copy, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
