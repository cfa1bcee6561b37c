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
VARIANTS = os.environ.get("SWEEP_VARIANTS", "old,auto,v1,v2,v3,v3c1,v3c4,v3c8").split(",")


def nbytes(t):
    return 0 if t is None else t.numel() * t.element_size()


def set_variant(v):
    """old | auto | [vN][cN]: QQ_QMMD_VAR=N (3: permuted weight layout), QQ_QMMD_CS=N."""
    for k in ("QQ_QMMD_OFF", "QQ_QMMD_CS", "QQ_QMMD_VAR"):
        os.environ.pop(k, None)
    if v == "old":
        os.environ["QQ_QMMD_OFF"] = "1"
        return
    import re
    for key, val in re.findall(r"([vc])(\d+)", v):
        os.environ["QQ_QMMD_VAR" if key == "v" else "QQ_QMMD_CS"] = val


def permuted(qw):
    """The data of qw with 16-byte chunks in the order the decode kernel's lanes read them:
    [tile][step][r][g][q] (row 16 tile + 8 r + g, chunk 4 step + q)."""
    d = qw.data
    n, rb = d.shape
    steps = rb // 64
    return d.view(n // 16, 2, 8, steps, 4, 16).permute(0, 3, 1, 2, 4, 5).contiguous().view(n, rb)


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
                qp = None
                for v in VARIANTS:
                    set_variant(v)
                    w_in = qw
                    if "v3" in v:
                        if qp is None:
                            qp = qq.QuantizedArray(permuted(qw), qw.scales, None, **{a: getattr(qw, a) for a in (
                                "group_size", "bits", "mode", "global_scale", "scale_layout", "fp8_format")
                                if getattr(qw, a, None) is not None}) if hasattr(qq, "QuantizedArray") else None
                        w_in = qp
                    try:
                        y = qq.quantized_matmul(x, w_in)
                        torch.cuda.synchronize()
                    except Exception as e:  # noqa: BLE001
                        line.append(f"{v}:ERR({type(e).__name__})")
                        continue
                    if ref is None:
                        ref = y.float()
                    err = (y.float() - ref).abs().max().item() / (ref.abs().max().item() + 1e-30)
                    us = timer(lambda: qq.quantized_matmul(x, w_in), wb)
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
