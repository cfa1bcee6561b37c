"""One quantize_colwise call per fp mode on 16384x16384 bf16 (one orientation, then both),
for `ncu` to profile. Writes nothing."""
import torch

import qq

x = torch.randn(16384, 16384, dtype=torch.bfloat16, device="cuda")
for mode in ("mxfp8", "nvfp4"):
    qq.quantize_colwise(x, mode=mode, scale_layout="blocked")
    qq.quantize_colwise(x, mode=mode, scale_layout="blocked", rowwise=True)
torch.cuda.synchronize()
