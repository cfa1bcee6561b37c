"""Probe: qq.dequantize to bf16 under the variants of a temporary QQ_DQ_V knob (session y's
sweep of dequantize_fp_kernel: chunks a thread, streaming stores, block width); one process
per variant. Prints us and GB/s against the copy bandwidth of that process.

    python bench/tune/dq_sweep.py [V ...]
"""
import os
import subprocess
import sys

if len(sys.argv) > 1 and sys.argv[1] == "--one":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import torch
    from harness import Timer, copy_bandwidth
    import qq
    timer = Timer()
    copy = copy_bandwidth(timer)
    out = []
    for shape in [(16384, 16384), (8192, 5120)]:
        x = torch.randn(shape, dtype=torch.bfloat16, device="cuda")
        for mode, gs in [("nvfp4", False), ("nvfp4", True), ("mxfp4", False), ("mxfp8", False)]:
            q = qq.quantize(x, mode=mode, scale_layout="blocked", global_scale=qq.amax(x) if gs else None)
            moved = x.numel() * 2 + q.data.numel() * q.data.element_size() + q.scales.numel()
            us = timer(lambda: qq.dequantize(q, dtype=torch.bfloat16), moved)
            out.append(f"{mode}{'+gs' if gs else ''} {shape[0]}x{shape[1]} {us:.2f} us {moved / us / 1e3 / copy:.3f}")
    print(f"V={os.environ.get('QQ_DQ_V', '0')} copy={copy:.0f} | " + " | ".join(out), flush=True)
    sys.exit(0)

for v in sys.argv[1:] or ["0", "1", "2", "3", "4", "5", "6", "7"]:
    env = dict(os.environ, QQ_DQ_V=v)
    subprocess.run([sys.executable, os.path.abspath(__file__), "--one"], env=env, check=False)
