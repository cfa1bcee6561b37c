"""One dense weight gradient (grouped_qqmm_wgrad with one expert, QQLinear's shape) and one
quantize_colwise of the same x, for ncu: the colqdq kernel next to colq_kernel, which reads
x the same way.

    ncu -k regex:"colqdq|colq_kernel" --launch-count 2 python bench/tune/profile_wgrad.py
"""

import torch

import qq

t, k, n = 16384, 4096, 4096
x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)
dy = torch.randn(t, n, device="cuda", dtype=torch.bfloat16)
ends = torch.full((1,), t, dtype=torch.int32, device="cuda")
qq.grouped_qqmm_wgrad(dy, x, ends, mode="mxfp8", dtype="bfloat16")
qq.quantize_colwise(x, mode="mxfp8", scale_layout="blocked")
torch.cuda.synchronize()
