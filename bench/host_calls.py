"""Where an eager call's host time goes (torch CUDA tensors): a diagnostic, not a benchmark.

For each qq call of the decode step (bench_decode.py) and of bench_overhead.py, prints
  - host us: the time the call takes to return (perf_counter around the call, a loop of
    calls, no synchronize inside: the GPU runs behind), median of repeats;
  - blocks: whether the call waits for the GPU (a 50 ms torch.cuda._sleep is queued first;
    a call that returns after it finished synchronised with the stream);
and the same for torch's own ops on the same tensors, so the rows read as "qq costs X us
of host time where torch's op costs Y".
    python bench/host_calls.py [--out DIR]      (H100: ~30 s; writes host-calls.txt)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qq  # noqa: E402

LINES = []


def say(s=""):
    print(s, flush=True)
    LINES.append(s)


def host_us(fn, n=200, reps=7):
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        ts.append((time.perf_counter() - t0) * 1e6 / n)
        torch.cuda.synchronize()
    return statistics.median(ts)


def blocks(fn):
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)       # ~25-50 ms of GPU time queued ahead of the call
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    torch.cuda.synchronize()
    return dt > 0.01


def row(name, fn):
    say(f"{name:58s} {host_us(fn):8.2f} us   {'BLOCKS' if blocks(fn) else 'async'}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("QQ_BENCH_OUT", "/tmp"))
    args = ap.parse_args()
    dev = "cuda"
    h, qkv, inter = 4096, 6144, 14336
    g = torch.Generator(device=dev).manual_seed(0)

    def w(n, k):
        t = torch.empty((n, k), dtype=torch.bfloat16, device=dev)
        return t.normal_(0, k ** -0.5, generator=g)

    W = {"qkv": w(qkv, h), "o": w(h, h), "gu": w(2 * inter, h), "down": w(h, inter)}
    x16 = torch.randn(16, h, dtype=torch.bfloat16, device=dev)
    x1 = torch.randn(1, h, dtype=torch.bfloat16, device=dev)
    big = torch.randn(1, qkv, dtype=torch.bfloat16, device=dev)
    xs = big[:, :h]                                           # the strided slice of the step
    gu = torch.randn(1, 2 * inter, dtype=torch.bfloat16, device=dev)
    act = torch.randn(1, inter, dtype=torch.bfloat16, device=dev)
    say(f"{torch.cuda.get_device_name()}  torch {torch.__version__}")
    say("torch ops")
    row("x16 + x16", lambda: x16 + x16)
    row("x1 @ Wo.T (bf16)", lambda: x1 @ W["o"].t())
    row("big[:, :4096] (slice)", lambda: big[:, :h])
    row("silu(gu[:, :i]) * gu[:, i:]", lambda: F.silu(gu[:, :inter]) * gu[:, inter:])
    row("torch.empty((1, 4096), bf16, cuda)", lambda: torch.empty((1, h), dtype=torch.bfloat16, device=dev))
    for mode, kw in (("nvfp4", {}), ("mxfp4", {}), ("mxfp8", {}), ("affine", dict(bits=4, group_size=64))):
        say(f"qq {mode}")
        gs = qq.amax(W["o"]) if mode == "nvfp4" else None
        qo = qq.quantize(W["o"], mode=mode, global_scale=gs, **kw)
        qd = qq.quantize(W["down"], mode=mode, **kw)
        row(f"quantize x16 {mode}", lambda: qq.quantize(x16, mode=mode, **kw))
        row(f"quantized_matmul(x1, Wo) {mode}", lambda: qq.quantized_matmul(x1, qo))
        row(f"quantized_matmul(xs strided, Wo) {mode}", lambda: qq.quantized_matmul(xs, qo))
        row(f"quantized_matmul(act, Wdown) {mode}", lambda: qq.quantized_matmul(act, qd))
        row(f"_qq.quantized_matmul(x1, Wo) {mode} (no dispatch)", lambda: qq._qq.quantized_matmul(x1, qo))
        if mode != "affine":
            pw = qq.prepare_weight(W["o"], mode=mode)
            row(f"qqmm(x1, prepared Wo) {mode}", lambda: qq.qqmm(x1, pw))
    say("pieces")
    row("qq._dispatch._compiling()", qq._dispatch._compiling)
    row("torch._C._cuda_getCurrentRawStream(0)", lambda: torch._C._cuda_getCurrentRawStream(0))
    row("x1.data_ptr()", lambda: x1.data_ptr())
    row("x1.shape; x1.stride()", lambda: (x1.shape, x1.stride()))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "host-calls.txt"), "w") as f:
        f.write("\n".join(LINES) + "\n")


if __name__ == "__main__":
    main()
