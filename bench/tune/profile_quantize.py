"""One call of each row-wise quantize mode, the column-wise kernel and dequantize on
8192x5120 bf16, for `ncu` to profile (scripts/gpu_session.sh build profile). Writes nothing."""
import torch

import qq

x = torch.randn(8192, 5120, dtype=torch.bfloat16, device="cuda")
for mode, kw in [("nvfp4", {}), ("mxfp8", {}), ("affine", {"bits": 4})]:
    layout = "linear" if mode == "affine" else "blocked"
    q = qq.quantize(x, mode=mode, scale_layout=layout, **kw)
    qq.quantize_colwise(x, mode=mode, scale_layout=layout, **kw)
    qq.dequantize(q, dtype=torch.bfloat16)
torch.cuda.synchronize()
