"""Copy bandwidth at the sizes bench_quantize measures, against the 1 GiB copy it reports as
the peer: how much of the "fraction of copy" at a smaller shape is the size itself (launch,
ramp and tail of one kernel over fewer bytes). Same timer as the benchmarks (harness.Timer).

    python bench/tune/copy_at_size.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from harness import Timer, copy_bandwidth  # noqa: E402

timer = Timer()
big = copy_bandwidth(timer)
print(f"copy 1 GiB (2 GiB moved): {big:.0f} GB/s")
for shape, dt in [((16384, 16384), torch.bfloat16), ((8192, 5120), torch.bfloat16), ((8192, 5120), torch.float32),
                  ((4096, 4096), torch.bfloat16)]:
    src = torch.randn(shape, dtype=dt, device="cuda")
    dst = torch.empty_like(src)
    moved = 2 * src.numel() * src.element_size()
    us = timer(lambda: dst.copy_(src), moved)
    gbps = moved / (us * 1e-6) / 1e9
    print(f"copy {shape} {str(dt)[6:]}: {us:8.2f} us {gbps:6.0f} GB/s = {gbps / big:.3f} of the 1 GiB copy")
