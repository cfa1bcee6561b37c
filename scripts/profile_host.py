"""Host-side cost of one qq call on CUDA tensors (cProfile), for the device machine."""
import cProfile
import pstats
import time

import torch

import qq

x = torch.randn(16, 4096, dtype=torch.bfloat16, device="cuda")
for _ in range(50):
    qq.quantize(x, mode="mxfp8")
torch.cuda.synchronize()
n = 500
t = time.perf_counter()
for _ in range(n):
    qq.quantize(x, mode="mxfp8")
torch.cuda.synchronize()
print(f"qq.quantize host+launch: {(time.perf_counter() - t) / n * 1e6:.1f} us/call")
t = time.perf_counter()
for _ in range(n):
    torch.empty((16, 4096), dtype=torch.uint8, device="cuda")
print(f"torch.empty: {(time.perf_counter() - t) / n * 1e6:.1f} us/call")
cProfile.run("for _ in range(500): qq.quantize(x, mode='mxfp8')", "/tmp/p")
pstats.Stats("/tmp/p").sort_stats("tottime").print_stats(14)
