"""quantize_dequantize (row-wise q(x)'s bf16 values, the pass QQLinear and grouped_qqmm run on
x and dy) on bf16 x: us a call and the fraction of the copy bandwidth measured in the same
process (bytes: x read, the values written), for the qdq kernel's patches (session ah: mxfp8
from bf16 in bf16x2 arithmetic, 0.80 -> 0.63 of copy, not kept). Each line twice,
interleaved, to show the spread.

    python bench/tune/qdq_probe.py      (MODES: comma list, default mxfp8,nvfp4)
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from harness import Timer, copy_bandwidth  # noqa: E402

import qq  # noqa: E402

MODES = os.environ.get("MODES", "mxfp8,nvfp4").split(",")
SHAPES = [(16384, 4096), (8192, 5120), (16384, 16384)]


def main():
    timer = Timer()
    bw = copy_bandwidth(timer)
    print(f"device {torch.cuda.get_device_name()}  copy {bw:.0f} GB/s", flush=True)
    cases = []
    for m, k in SHAPES:
        x = torch.randn((m, k), dtype=torch.bfloat16, device="cuda")
        for mode in MODES:
            cases.append((f"{mode:6s} [{m}, {k}]", x, mode, x.numel() * 4))
    for rnd in range(2):
        for name, x, mode, nbytes in cases:
            us = timer(lambda: qq.quantize_dequantize(x, mode), nbytes)
            print(f"{name} round {rnd}: {us:9.1f} us  {nbytes / (us * 1e-6) / 1e9:7.0f} GB/s  "
                  f"{nbytes / (us * 1e-6) / 1e9 / bw:.3f} of copy", flush=True)


if __name__ == "__main__":
    main()
