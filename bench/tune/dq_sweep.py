"""Probe: qq.dequantize to bf16 under settings of temporary environment knobs (session y's
sweeps of cuda/dequantize.cu's launch: chunks a thread, streaming stores, block width, the
long-row rule for affine codes; the knobs were patched in for the sweep and are not in the
code). One process per setting; prints us and the fraction of that process's copy bandwidth.

    python bench/tune/dq_sweep.py KNOB=VALUE [KNOB=VALUE ...]     (e.g. QQ_DQ_AL=0 QQ_DQ_AL=1)
"""
import os
import subprocess
import sys

SHAPES = [(16384, 16384), (4096, 14336), (8192, 5120)]
MODES = [("nvfp4", {}), ("mxfp4", {}), ("mxfp8", {}), ("affine4", {"bits": 4}), ("affine8", {"bits": 8})]

if len(sys.argv) > 1 and sys.argv[1] == "--one":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import torch
    from harness import Timer, copy_bandwidth
    import qq
    timer = Timer()
    copy = copy_bandwidth(timer)
    out = []
    for shape in SHAPES:
        x = torch.randn(shape, dtype=torch.bfloat16, device="cuda")
        for mode, kw in MODES:
            qmode = "affine" if mode.startswith("affine") else mode
            q = qq.quantize(x, mode=qmode, scale_layout="linear" if qmode == "affine" else "blocked", **kw)
            moved = x.numel() * 2 + sum(t.numel() * t.element_size() for t in (q.data, q.scales, q.biases)
                                        if t is not None)
            us = timer(lambda: qq.dequantize(q, dtype=torch.bfloat16), moved)
            out.append(f"{mode} {shape[0]}x{shape[1]} {us:.2f}us {moved / us / 1e3 / copy:.3f}")
    print(f"{sys.argv[2]} copy={copy:.0f} | " + " | ".join(out), flush=True)
    sys.exit(0)

for setting in sys.argv[1:]:
    k, v = setting.split("=", 1)
    subprocess.run([sys.executable, os.path.abspath(__file__), "--one", setting], env=dict(os.environ, **{k: v}),
                   check=False)
