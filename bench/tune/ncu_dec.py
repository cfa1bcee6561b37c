"""One decode-layout quantized_matmul shape for ncu: SHAPE=NxK MODE=nvfp4 M=1; 3 warm-up calls,
then one profiled call (ncu --launch-skip 3 --launch-count 1 -k regex:qmmp)."""
import os
import torch
import qq
n, k = (int(v) for v in os.environ.get("SHAPE", "4096x14336").split("x"))
mode = os.environ.get("MODE", "nvfp4")
kw = dict(mode="affine", bits=4, group_size=64) if mode == "affine4" else dict(mode=mode)
w = torch.randn((n, k), dtype=torch.bfloat16, device="cuda")
dw = qq.prepare_decode(qq.quantize(w, **kw))
x = torch.randn((int(os.environ.get("M", "1")), k), dtype=torch.bfloat16, device="cuda")
for _ in range(4):
    qq.quantized_matmul(x, dw)
torch.cuda.synchronize()
