"""The gated decode layout's SwiGLU epilogue against the two ops, kernel time in CUDA graphs.

For each mode, the Llama-3-8B gate/up weight [28672, 4096] (and a small one), M = 1 / 4 / 16:
  plain   quantized_matmul(x, dw)                      (the plain layout, [M, 2F])
  gated0  quantized_matmul(x, dg)                      (the gated layout, no SwiGLU: [M, 2F])
  two     qq.swiglu(quantized_matmul(x, dw))           (what bench_decode's "qq" act runs)
  fused   qq.quantized_matmul_swiglu(x, dg)            (one kernel)
each as a graph of 20 back-to-back calls, replayed; us per call, median of 5 replays, the
variants interleaved.  python bench/tune/gated_probe.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from harness import capture, replay_us  # noqa: E402

import qq  # noqa: E402

N = 20  # calls a graph

MODES = {"nvfp4": dict(mode="nvfp4"), "mxfp8": dict(mode="mxfp8"),
         "affine4": dict(mode="affine", bits=4, group_size=64)}


def main():
    shapes = [(28672, 4096), (2048, 4096)]
    for mode, kw in MODES.items():
        for (n, k) in shapes:
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
            q = qq.quantize(w, **kw)
            dw, dg = qq.prepare_decode(q), qq.prepare_decode(q, gated=True)
            for m in (1, 4, 16):
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                fns = {"plain": lambda: qq.quantized_matmul(x, dw), "gated0": lambda: qq.quantized_matmul(x, dg),
                       "two": lambda: qq.swiglu(qq.quantized_matmul(x, dw)),
                       "fused": lambda: qq.quantized_matmul_swiglu(x, dg)}
                graphs = {name: capture(f, N) for name, f in fns.items()}
                res = {name: [] for name in fns}
                for _ in range(2):
                    for name, g in graphs.items():
                        res[name].append(replay_us(g, N))
                print(f"{mode:8s} {n}x{k} M={m:2d} " + "  ".join(f"{k2} {min(v):7.2f}" for k2, v in res.items()),
                      flush=True)
                del graphs




def mlp():
    """gate/up (+ SwiGLU) then down, the Llama-3-8B MLP, graphs of 20: "two" (matmul, qq.swiglu,
    matmul) against "fused" (quantized_matmul_swiglu, matmul)."""
    for mode, kw in MODES.items():
        wgu = torch.randn(28672, 4096, device="cuda", dtype=torch.bfloat16) / 64
        wd = torch.randn(4096, 14336, device="cuda", dtype=torch.bfloat16) / 120
        q = qq.quantize(wgu, **kw)
        dw, dg = qq.prepare_decode(q), qq.prepare_decode(q, gated=True)
        dd = qq.prepare_decode(qq.quantize(wd, **kw))
        for m in (1, 4, 16):
            x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
            fns = {"two": lambda: qq.quantized_matmul(qq.swiglu(qq.quantized_matmul(x, dw)), dd),
                   "fused": lambda: qq.quantized_matmul(qq.quantized_matmul_swiglu(x, dg), dd)}
            graphs = {name: capture(f, N) for name, f in fns.items()}
            res = {name: [] for name in fns}
            for _ in range(3):
                for name, g in graphs.items():
                    res[name].append(replay_us(g, N))
            print(f"mlp {mode:8s} M={m:2d} " + "  ".join(f"{k2} {min(v):7.2f}" for k2, v in res.items()), flush=True)
            del graphs


if __name__ == "__main__":
    sys.exit(mlp() if "--mlp" in sys.argv else main())
