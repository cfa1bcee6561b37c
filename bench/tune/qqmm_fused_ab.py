"""qqmm at small M with x quantized inside the weight-only kernel's launch (ops.cuh QX)
- AUTO's choice: fused where qx_work_ok allows, else the two launches - against the two-launch form (a qdq kernel and scratch first: the unfused_qx test hook),
same process, same weights, interleaved (GPU).

Two views per case:
  loop   a loop of N calls then one synchronize (what an eager decode step sees: host cost
         included), us per call;
  graph  the same N calls captured in one CUDA graph and replayed (GPU time alone), us per call.
Peer in the same run: torch's bf16 `x @ w.T` (loop and graph).

    python bench/tune/qqmm_fused_ab.py [--quick]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from harness import graph_us  # noqa: E402
from host_timing import loop_us  # noqa: E402

import qq  # noqa: E402

SHAPES = [(4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336)]


def loop_median_us(f, n, reps):
    f()
    return statistics.median(loop_us(f, n, torch.cuda.synchronize) for _ in range(reps))


def kernels(f):
    """Kernels one call launches (torch's profiler): 1 fused, 2 with a qdq kernel first."""
    f()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        f()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and not e.name.startswith(("Memcpy", "Memset")))


def hook(v):
    return qq._qq._set_test_hook("unfused_qx", v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n, reps = (200, 5) if args.quick else (500, 9)
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}; loop of {n} calls + one sync, and {n} calls in one graph; "
          f"median of {reps}")
    print(f"{'mode':>6} {'N x K':>12} {'M':>2} | {'loop fused':>10} {'two':>7} {'torch':>7} | "
          f"{'graph fused':>11} {'two':>7} {'torch':>7} | route, kernels (AUTO)")
    rows = []
    for mode in ("nvfp4", "mxfp8"):
        for (nn, k) in SHAPES:
            w = torch.randn(nn, k, device="cuda", dtype=torch.bfloat16)
            pw = qq.prepare_weight(w, mode=mode)
            for m in (1, 4, 8):
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                f = lambda x=x, pw=pw: qq.qqmm(x, pw)  # noqa: E731
                t = lambda x=x, w=w: x @ w.T  # noqa: E731
                r = {}
                for rep in range(2):  # interleaved: fused, two, torch, twice; the later kept
                    hook(0)
                    r["lf"], r["gf"] = loop_median_us(f, n, reps), graph_us(f, n, reps)
                    f()
                    route = qq.last_route()
                    hook(1)
                    r["lt"], r["gt"] = loop_median_us(f, n, reps), graph_us(f, n, reps)
                    hook(0)
                    r["lp"], r["gp"] = loop_median_us(t, n, reps), graph_us(t, n, reps)
                rows.append((mode, nn, k, m, r, route, f))
    # kernels per call in a pass of its own: the profiler slows the host loops timed after it
    for mode, nn, k, m, r, route, f in rows:
        print(f"{mode:>6} {f'{nn}x{k}':>12} {m:>2} | {r['lf']:10.2f} {r['lt']:7.2f} {r['lp']:7.2f} | "
              f"{r['gf']:11.2f} {r['gt']:7.2f} {r['gp']:7.2f} | {route}, {kernels(f)}", flush=True)


if __name__ == "__main__":
    main()
