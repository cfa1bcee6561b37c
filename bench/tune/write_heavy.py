"""What a stream of mostly writes reaches, against the 1 GiB copy that bench_quantize reports
as the peer of its "fraction of copy" rows. dequantize reads 1 byte for 4 written (fp4 and
affine 4-bit to bf16) or 1 for 2 (8-bit codes): torch's own element-wise kernels with the
same byte ratios (uint8 -> float32 is 1:4, uint8 -> bfloat16 1:2) and a fill (writes only)
say how much of the distance to 1.0 is the byte mix rather than our kernels. Same timer as
the benchmarks (harness.Timer).

    python bench/tune/write_heavy.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from harness import Timer, copy_bandwidth  # noqa: E402

timer = Timer()
big = copy_bandwidth(timer)
print(f"copy 1 GiB (2 GiB moved): {big:.0f} GB/s")


def row(name, fn, moved):
    us = timer(fn, moved)
    gbps = moved / (us * 1e-6) / 1e9
    print(f"{name:48s} {us:9.2f} us {gbps:6.0f} GB/s = {gbps / big:.3f} of the 1 GiB copy")


for rows, cols in [(16384, 16384), (8192, 5120)]:
    out = torch.empty(rows, cols, dtype=torch.bfloat16, device="cuda")
    row(f"fill {rows}x{cols} bf16 (writes only)", lambda: out.fill_(1.0), out.numel() * 2)
    q8 = torch.randint(0, 255, (rows, cols), dtype=torch.uint8, device="cuda")
    row(f"uint8 -> bf16 {rows}x{cols} (1:2)", lambda: out.copy_(q8), out.numel() * 3)
    q4 = torch.randint(0, 255, (rows, cols // 2), dtype=torch.uint8, device="cuda")
    o32 = torch.empty(rows, cols // 2, dtype=torch.float32, device="cuda")
    row(f"uint8 -> fp32 {rows}x{cols // 2} (1:4)", lambda: o32.copy_(q4), q4.numel() * 5)
    del out, q8, q4, o32
