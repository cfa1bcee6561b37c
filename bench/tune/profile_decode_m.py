"""ncu target: quantized_matmul with a DecodeWeight at 16384^2 for the modes and M given:
    ncu -k regex:qmmp_kernel python bench/tune/profile_decode_m.py nvfp4,mxfp8 16,64
"""
import sys, torch, qq
n = k = 16384
w = torch.randn((n, k), dtype=torch.bfloat16, device="cuda")
for mode in sys.argv[1].split(","):
    dw = qq.prepare_decode(qq.quantize(w, mode=mode))
    for m in [int(v) for v in sys.argv[2].split(",")]:
        x = torch.randn((m, k), dtype=torch.bfloat16, device="cuda")
        for _ in range(2):
            qq.quantized_matmul(x, dw)
        torch.cuda.synchronize()
