"""Host cost of quantized_matmul on a DecodeWeight against the packed weight (GPU).

bench_decode's eager rows with decode-layout weights were host-bound at ~4.5 ms a step
(graphed 2.2 ms) while the packed weights' eager step was ~3.3 ms: the decode path's
call looked ~10 us dearer on the host. This times, on one process:
  1. per call, loops of N calls with no synchronize inside (host time: the GPU work of one
     M = 1 4096^2 call is shorter than its host cost), then one synchronize, for the packed
     weight, the DecodeWeight and torch's x + x;
  2. torch.profiler's CPU-side view of 50 calls of each (CUDA runtime calls by name: which
     driver round trips each call makes and what they cost);
  3. one eager decode step of 4 Llama-8B-shaped layers, packed against decode, host time.

    python bench/tune/decode_host_probe.py [--modes nvfp4,mxfp8,affine4]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import qq

MODES = {"nvfp4": dict(mode="nvfp4"), "mxfp4": dict(mode="mxfp4"), "mxfp8": dict(mode="mxfp8"),
         "affine4": dict(mode="affine", bits=4, group_size=64)}


def host_us(f, n=2000, reps=7):
    """(median host us per call of a loop of n calls, median us including the final sync)."""
    f()
    torch.cuda.synchronize()
    host, total = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        host.append((t1 - t0) * 1e6 / n)
        total.append((t2 - t0) * 1e6 / n)
    return statistics.median(host), statistics.median(total)


def profile_calls(f, n=50, label=""):
    from torch.profiler import ProfilerActivity, profile
    f()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            f()
        torch.cuda.synchronize()
    print(f"--- profile {label}: CPU-side events per call (self us / count over {n} calls)")
    rows = []
    for e in prof.key_averages():
        if e.self_cpu_time_total > 0 or e.count:
            rows.append((e.self_cpu_time_total / n, e.count / n, e.key))
    for us, cnt, key in sorted(rows, reverse=True)[:14]:
        print(f"   {us:7.2f} us  {cnt:5.2f}/call  {key[:70]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--modes", default="nvfp4,mxfp8,affine4")
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = "cuda"
    x = torch.randn(1, 4096, dtype=torch.bfloat16, device=dev)
    x16 = torch.randn(16, 4096, dtype=torch.bfloat16, device=dev)
    w = torch.randn(4096, 4096, dtype=torch.bfloat16, device=dev) * 0.02
    print("torch add [16,4096]: host %.2f / with sync %.2f us" % host_us(lambda: x16 + x16))
    print("torch bf16 x @ w.T M=1: host %.2f / with sync %.2f us" % host_us(lambda: x @ w.t()))
    # the overhead bench's other calls, CPU-side runtime calls of each
    q16 = qq.quantize(x16, mode="nvfp4")
    pw = qq.prepare_weight(w, mode="nvfp4")
    for label, f in (("quantize nvfp4", lambda: qq.quantize(x16, mode="nvfp4")),
                     ("dequantize nvfp4", lambda: qq.dequantize(q16)),
                     ("amax", lambda: qq.amax(x16)),
                     ("qqmm nvfp4 prepared", lambda: qq.qqmm(x, pw))):
        print(f"{label}: host %.2f / with sync %.2f us" % host_us(f))
        profile_calls(f, label=label)
    for mode in args.modes.split(","):
        kw = MODES[mode]
        extra = {"global_scale": qq.amax(w)} if mode == "nvfp4" else {}
        qw = qq.quantize(w, **kw, **extra)
        dw = qq.prepare_decode(qw)
        for _ in range(2):
            hp = host_us(lambda: qq.quantized_matmul(x, qw))
            hd = host_us(lambda: qq.quantized_matmul(x, dw))
            ha = host_us(lambda: x16 + x16)
            print(f"{mode}: packed host {hp[0]:.2f} (sync {hp[1]:.2f}) | decode host {hd[0]:.2f} "
                  f"(sync {hd[1]:.2f}) | add host {ha[0]:.2f} us")
        # pieces of the decode path, Python side
        sh = host_us(lambda: tuple(x.shape))
        qa = host_us(lambda: dw.quantized)
        print(f"   tuple(x.shape) {sh[0]:.2f} us, dw.quantized {qa[0]:.2f} us")
        profile_calls(lambda: qq.quantized_matmul(x, qw), label=f"{mode} packed")
        profile_calls(lambda: qq.quantized_matmul(x, dw), label=f"{mode} decode")

    # an eager step of 4 layers, packed against decode (nvfp4)
    cfg = dict(hidden=4096, qkv=6144, inter=14336)
    layers_p, layers_d = [], []
    for _ in range(4):
        ws = [torch.randn(n, k, dtype=torch.bfloat16, device=dev) * 0.02 for n, k in
              ((cfg["qkv"], 4096), (4096, 4096), (2 * cfg["inter"], 4096), (4096, cfg["inter"]))]
        qs = [qq.quantize(t, mode="nvfp4", global_scale=qq.amax(t)) for t in ws]
        layers_p.append(qs)
        layers_d.append([qq.prepare_decode(q) for q in qs])
        del ws

    def make_step(layers):
        h, i = cfg["hidden"], cfg["inter"]

        def step(x):
            for wqkv, wo, wgu, wdown in layers:
                qkv = qq.quantized_matmul(x, wqkv)
                a = qkv[:, :h]
                hh = qq.quantized_matmul(a, wo)
                gu = qq.quantized_matmul(hh, wgu)
                act = F.silu(gu[:, :i]) * gu[:, i:]
                x = qq.quantized_matmul(act, wdown)
            return x
        return step

    for name, layers in (("packed", layers_p), ("decode", layers_d)):
        st = make_step(layers)
        h = host_us(lambda: st(x), n=50)
        print(f"step of 4 layers, nvfp4 {name}: host {h[0]:.1f} us (sync {h[1]:.1f})")
        profile_calls(lambda: st(x), n=10, label=f"step {name} (per step)")


if __name__ == "__main__":
    main()
