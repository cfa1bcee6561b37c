"""Where grouped_qqmm's and grouped_qqmm_wgrad's time goes, kernel by kernel (torch.profiler),
next to torch._grouped_mm on the same problem. A tuning aid, not a benchmark: prints the
kernels' summed CUDA time per call.

    python bench/tune/profile_grouped.py
"""

from __future__ import annotations

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

import qq


def kernels(fn, reps=5):
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    rows = []
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if t > 0:
            rows.append((t / reps, ev.count // reps, ev.key[:110]))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    for us, n, name in rows[:8]:
        print(f"    {us:9.1f} us  x{n:<3d} {name}")
    print(f"    {total:9.1f} us  total")


def loop_us(fn, n=20):
    """(host enqueue us per call, wall us per call of a loop of n then one synchronize)."""
    import time
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) / n * 1e6, (t2 - t0) / n * 1e6


def main():
    t = 16384
    for n, k in ((4096, 7168), (7168, 2048)):
        e = 8
        offs = torch.tensor(np.cumsum(np.full(e, t // e)), dtype=torch.int32, device="cuda")
        x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(t, n, device="cuda", dtype=torch.bfloat16)
        wq = qq.quantize(w, mode="mxfp8", scale_layout="blocked")
        pw = qq.prepare_weight(w, mode="mxfp8")
        print(f"(T, N, K) = {(t, n, k)}, E = {e}")
        print("  torch._grouped_mm forward")
        kernels(lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs))
        print("  grouped_qqmm mxfp8, packed w")
        kernels(lambda: qq.grouped_qqmm(x, wq, offs))
        print("  grouped_qqmm mxfp8, prepared w")
        kernels(lambda: qq.grouped_qqmm(x, pw, offs))
        for name, fn in (("torch", lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)),
                         ("qq prepared", lambda: qq.grouped_qqmm(x, pw, offs))):
            host, wall = loop_us(fn)
            print(f"  loop of 20, {name}: host {host:.1f} us/call, wall {wall:.1f} us/call")
        print("  torch._grouped_mm wgrad (2-D x 2-D)")
        xt = x.t()
        try:
            kernels(lambda: torch._grouped_mm(xt, dy, offs=offs))
        except RuntimeError as err:
            print("    (not available:", str(err)[:80], ")")
        print("  grouped_qqmm_wgrad mxfp8, bf16 dw")
        kernels(lambda: qq.grouped_qqmm_wgrad(x, dy, offs, dtype="bfloat16"))
        del x, w, dy, wq, pw
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
