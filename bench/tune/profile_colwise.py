"""One quantize_colwise call per mode on 16384x16384 bf16 (one orientation, then both),
for `ncu` to profile. Modes from the command line (default: mxfp8 nvfp4; "affine" is
4-bit, group 64). Writes nothing."""
import sys

import torch

import qq

x = torch.randn(16384, 16384, dtype=torch.bfloat16, device="cuda")
for mode in sys.argv[1:] or ("mxfp8", "nvfp4"):
    kw = {"mode": mode} if mode == "affine" else {"mode": mode, "scale_layout": "blocked"}
    qq.quantize_colwise(x, **kw)
    qq.quantize_colwise(x, rowwise=True, **kw)
torch.cuda.synchronize()
