"""One call each of quantized_matmul on the decode shapes, packed and decode layout, for ncu:
    ncu --kernel-name regex:"qmm" --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
        python bench/tune/profile_decode.py
"""
import sys

import torch

import qq

shapes = [(4096, 4096), (6144, 4096), (4096, 14336), (28672, 4096), (16384, 16384)]
ms = [int(a) for a in sys.argv[1:]] or [1]
for n, k in shapes:
    w = torch.randn((n, k), dtype=torch.bfloat16, device="cuda")
    for mode in ("nvfp4", "mxfp8"):
        qw = qq.quantize(w, mode=mode)
        dw = qq.prepare_decode(qw)
        for m in ms:
            x = torch.randn((m, k), dtype=torch.bfloat16, device="cuda")
            for t in (qw, dw, qw, dw):
                qq.quantized_matmul(x, t)
            torch.cuda.synchronize()
