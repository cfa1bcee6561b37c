"""The M = 1 weight-only kernels at one shape, for ncu: qqmm with a prepared mxfp8 weight
(qmv with x quantized in the launch), quantized_matmul mxfp8 (qmv) and nvfp4 (qmma), each
3 warm-up calls then one call. N, K from the environment (default 4096 x 4096).
    ncu --kernel-name regex:"qmv|qmma" --launch-skip 3 --launch-count 1 ... (per op: OP=qqmm8|qmm8|qmm4)"""
import os

import torch

import qq

n, k = int(os.environ.get("N", 4096)), int(os.environ.get("K", 4096))
op = os.environ.get("OP", "qqmm8")
w = torch.randn((n, k), dtype=torch.bfloat16, device="cuda")
x = torch.randn((1, k), dtype=torch.bfloat16, device="cuda")
if op == "qqmm8":
    pw = qq.prepare_weight(w, mode="mxfp8")
    f = lambda: qq.qqmm(x, pw)  # noqa: E731
else:
    qw = qq.quantize(w, mode="mxfp8" if op == "qmm8" else "nvfp4")
    f = lambda: qq.quantized_matmul(x, qw)  # noqa: E731
for _ in range(4):
    f()
torch.cuda.synchronize()
print(op, qq.last_route())
