"""One dequantize to bf16 per mode (affine 4-bit group 64, nvfp4) of a 16384^2 bf16
tensor, for ncu (--kernel-name regex:dequantize). Writes nothing."""
import torch

import qq

x = torch.randn(16384, 16384, dtype=torch.bfloat16, device="cuda")
for mode, kw in [("affine", {"bits": 4, "group_size": 64}), ("nvfp4", {})]:
    q = qq.quantize(x, mode=mode, **kw)
    torch.cuda.synchronize()
    qq.dequantize(q, dtype=torch.bfloat16)
torch.cuda.synchronize()
