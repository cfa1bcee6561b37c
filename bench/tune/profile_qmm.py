"""One quantized_matmul point, for ncu (bench/results/qmm-decode-h100-notes.md): MODE, N, K, M
from the environment (defaults nvfp4, 16384, 16384, 1). Run under
`ncu --kernel-name regex:qmm ...`."""
import os

import torch

import qq

mode = os.environ.get("MODE", "nvfp4")
n, k, m = (int(os.environ.get(v, d)) for v, d in (("N", 16384), ("K", 16384), ("M", 1)))
w = torch.randn((n, k), dtype=torch.bfloat16, device="cuda")
qw = qq.quantize(w, mode=mode)
x = torch.randn((m, k), dtype=torch.bfloat16, device="cuda")
for _ in range(3):
    qq.quantized_matmul(x, qw)
torch.cuda.synchronize()
