"""Which CUDA runtime calls a qq call makes, and how long each takes on the host, beside
torch's `x + x` (torch.profiler's CPU-side view through CUPTI). A diagnostic for issue 11.

    python bench/tune/api_trace.py          (H100: ~10 s)
"""
import torch
from torch.profiler import ProfilerActivity, profile

import qq

dev = torch.device("cuda", 0)
x = torch.randn((16, 4096), dtype=torch.bfloat16, device=dev)
qa = qq.quantize(x, mode="nvfp4")
w = torch.randn((4096, 4096), dtype=torch.bfloat16, device=dev)
x1 = torch.randn((1, 4096), dtype=torch.bfloat16, device=dev)
pw = qq.prepare_weight(w, mode="nvfp4")
cases = {
    "x + x": lambda: x + x,
    "qq.quantize nvfp4": lambda: qq.quantize(x, mode="nvfp4"),
    "qq.dequantize nvfp4": lambda: qq.dequantize(qa),
    "qq.amax": lambda: qq.amax(x),
    "qq.qqmm nvfp4 prepared M=1": lambda: qq.qqmm(x1, pw),
}
N = 200
for name, fn in cases.items():
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(N):
            fn()
        torch.cuda.synchronize()
    print(f"== {name}: events per call, host us per event", flush=True)
    for e in sorted(prof.key_averages(), key=lambda e: -e.cpu_time_total):
        if e.count < N or e.key.startswith("ProfilerStep"):
            continue
        dev_us = getattr(e, "device_time", 0.0) or getattr(e, "cuda_time", 0.0)
        print(f"  {e.key[:60]:60s} x{e.count / N:4.1f}  cpu {e.cpu_time_total / e.count:7.2f} us"
              f"  self {e.self_cpu_time_total / e.count:7.2f}  device {dev_us:7.2f}", flush=True)
