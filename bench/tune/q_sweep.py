"""Probe: row-wise qq.quantize of bf16 x under settings of temporary environment knobs. One
process per setting, each setting run twice interleaved; prints us and the fraction of that
process's copy bandwidth (harness.copy_bandwidth), bytes moved = x + data + scales (+ biases).

Session z's sweeps (bench/results/quantize-h200-profile.md) patched these knobs into
cuda/quantize.cu; none is in the code: QQ_QUNIT (elements a thread, 32 / 64), QQ_QPACK (row
packing of the fp grid), QQ_QTAB (nvfp4's factor from a shared-memory table), QQ_QSEG (a warp
per 1024-element segment, coalesced), QQ_QSTAGE (coalesced loads through shared memory),
QQ_QGATHER (four groups' scale bytes in one store: kept).

    python bench/tune/q_sweep.py KNOB=VALUE[,KNOB=VALUE] ...   (e.g. QQ_QUNIT=32 QQ_QUNIT=64)
    Q_SWEEP_MODES=nvfp4,mxfp8 narrows the modes.
"""
import os
import subprocess
import sys

SHAPES = [(16384, 16384), (8192, 5120), (4096, 14336)]
MODES = [("nvfp4", {}), ("mxfp4", {}), ("mxfp8", {}), ("affine4", {"bits": 4}), ("affine8", {"bits": 8}),
         ("affine4g128", {"bits": 4, "group_size": 128}), ("affine4g32", {"bits": 4, "group_size": 32})]

if len(sys.argv) > 1 and sys.argv[1] == "--one":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import torch
    from bench_quantize import moved_bytes, quantize_args
    from harness import Timer, copy_bandwidth
    import qq
    timer = Timer()
    copy = copy_bandwidth(timer)
    out = []
    only = os.environ.get("Q_SWEEP_MODES")  # e.g. "nvfp4,mxfp8"
    modes = [m for m in MODES if not only or m[0] in only.split(",")]
    for shape in SHAPES:
        x = torch.randn(shape, dtype=torch.bfloat16, device="cuda")
        for mode, kw in modes:
            qa = quantize_args(mode, kw)
            q = qq.quantize(x, **qa)
            moved = moved_bytes(x, q)
            us = timer(lambda: qq.quantize(x, **qa), moved)
            out.append(f"{mode} {shape[0]}x{shape[1]} {us:.2f}us {moved / us / 1e3 / copy:.3f}")
    print(f"{sys.argv[2]} copy={copy:.0f}\n  " + "\n  ".join(out), flush=True)
    sys.exit(0)

for rep in range(2):
    for setting in sys.argv[1:]:
        env = dict(os.environ)
        for kv in setting.split(","):
            k, v = kv.split("=", 1)
            env[k] = v
        subprocess.run([sys.executable, os.path.abspath(__file__), "--one", setting], env=env, check=False)
