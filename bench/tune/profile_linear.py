"""Where a qq.torch.QQLinear training step's time goes, kernel by kernel (torch.profiler), next
to torch.nn.Linear's step on the same problem (bench_linear's shape). A tuning aid, not a
benchmark: prints each kernel's CUDA time per step.

    python bench/tune/profile_linear.py [mode ...]
    python bench/tune/profile_linear.py --moe E      (the MoE part alone, E experts)

Then the same for bench_moe's layer (E = 8, mxfp8 QQGroupedLinear up / SwiGLU / down against
torch._grouped_mm in bf16).
"""

from __future__ import annotations

import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bench_moe  # noqa: E402
from harness import training_step  # noqa: E402

import qq.torch as qqt  # noqa: E402


def kernels(fn, reps=5, top=14):
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    rows, waits = [], []
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if t > 0 and ev.device_type == torch.autograd.DeviceType.CUDA:
            rows.append((t / reps, ev.count / reps, ev.key[:120]))
        elif any(w in ev.key for w in ("Synchronize", "Memcpy", "cudaMalloc", "cudaFree", "EventQuery")):
            waits.append(f"{ev.key} x{ev.count / reps:.1f} ({ev.cpu_time_total / reps:.1f} us)")
    if waits:
        print("    host waits / copies / allocations per step: " + "; ".join(waits))
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    print(f"    host enqueue {(t1 - t0) / reps * 1e6:.0f} us a step; wall {(t2 - t0) / reps * 1e6:.0f} us a step "
          f"({reps} steps, then one synchronize)")
    idle(prof, reps)
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    for us, n, name in rows[:top]:
        print(f"    {us:9.1f} us  x{n:<4.1f} {name}")
    print(f"    {total:9.1f} us  total kernel time per step")


def idle(prof, reps, top=8):
    """GPU idle time of the traced steps: the gaps between one kernel's end and the next
    one's start on the device timeline (launch latency, host stalls, stream-ordered
    allocations), per step, with the largest gaps and the kernels on either side."""
    evs = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                  and e.time_range.end > e.time_range.start),
                 key=lambda e: e.time_range.start)
    if len(evs) < 2:
        return
    gaps, end, prev = [], evs[0].time_range.end, evs[0].name
    for e in evs[1:]:
        if e.time_range.start > end:
            gaps.append((e.time_range.start - end, prev[:50], e.name[:50]))
        if e.time_range.end > end:
            end, prev = e.time_range.end, e.name
    span = end - evs[0].time_range.start
    total = sum(g[0] for g in gaps)
    print(f"    device timeline: {span / reps:.0f} us a step from the first kernel to the last, "
          f"{total / reps:.0f} us of it idle ({len(gaps) / reps:.1f} gaps a step)")
    for g, a, b in sorted(gaps, reverse=True)[:top]:
        print(f"      gap {g:7.1f} us after {a} before {b}")


def main():
    if sys.argv[1:2] == ["--moe"]:
        moe(int(sys.argv[2]))
        return
    modes = sys.argv[1:] or ["mxfp8"]
    t, n, k = 16384, 4096, 4096
    torch.manual_seed(0)
    ref = torch.nn.Linear(k, n, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(t, n, device="cuda", dtype=torch.bfloat16)
    print(f"nn.Linear bf16 step, (T, N, K) = {(t, n, k)}")
    kernels(training_step(ref, x, dy, (ref.weight, ref.bias)))
    for mode in modes:
        layer = qqt.QQLinear.from_linear(ref, mode=mode)
        print(f"QQLinear {mode} step")
        kernels(training_step(layer, x, dy, (layer.weight, layer.bias)))
    del ref, x, dy, layer
    moe()


def moe(e=8):
    x, dy, params, bf16_layer, qq_layer = bench_moe.layers(e)
    print(f"MoE layer step, bf16 torch._grouped_mm, E = {e} (bench_moe's shapes)")
    kernels(training_step(bf16_layer, x, dy, params))
    print("MoE layer step, qq mxfp8")
    kernels(training_step(qq_layer, x, dy, qq_layer.params))


if __name__ == "__main__":
    main()
