"""quantize_dequantize_moe on bench_moe's expert weights (gate_up [E, 4096, 4096], down
[E, 4096, 2048], bf16, mxfp8 e4m3, 32x32 tiles): us a call and the fraction of the copy
bandwidth measured in the same process (bytes: w read, q(w)'s values written, and the
transposed copy written when asked), for the kernel patches of moe_qdq_kernel
(bench/tune/patch_ab.sh SUITE=moe). Each line twice, interleaved, to show the spread.

    python bench/tune/moe_qdq_probe.py      (ES: comma list of expert counts, default 8,32)
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from harness import Timer, copy_bandwidth  # noqa: E402

import qq  # noqa: E402

ES = [int(v) for v in os.environ.get("ES", "8,32").split(",")]


def main():
    timer = Timer()
    bw = copy_bandwidth(timer)
    print(f"device {torch.cuda.get_device_name()}  copy {bw:.0f} GB/s", flush=True)
    cases = []
    for e in ES:
        for n, k in ((4096, 4096), (4096, 2048)):
            w = torch.randn((e, n, k), dtype=torch.bfloat16, device="cuda")
            for transposed in (False, True):
                nbytes = w.numel() * 2 * (3 if transposed else 2)
                cases.append((f"E={e:3d} [{n}, {k}] transposed={transposed!s:5s}", w, transposed, nbytes))
    for rnd in range(2):
        for name, w, transposed, nbytes in cases:
            us = timer(lambda: qq.quantize_dequantize_moe(w, values=True, transposed=transposed), nbytes)
            print(f"{name} round {rnd}: {us:9.1f} us  {nbytes / (us * 1e-6) / 1e9:7.0f} GB/s  "
                  f"{nbytes / (us * 1e-6) / 1e9 / bw:.3f} of copy", flush=True)


if __name__ == "__main__":
    main()
