"""The per-kernel floor inside a CUDA graph: back-to-back calls on a tiny weight (64 x 256)
of the decode layout and the packed one, and torch's own bf16 matmul of the same size, and the
4096^2 decode-layout call for comparison. Prints us per call.

    python bench/tune/graph_floor.py
"""
import torch
from decode_graph import graph_us  # same folder: a graph of fn, replayed, us per replay

import qq


for n, k in [(64, 256), (4096, 4096)]:
    w = torch.randn((n, k), dtype=torch.bfloat16, device="cuda")
    qw = qq.quantize(w, mode="nvfp4")
    dw = qq.prepare_decode(qw)
    x = torch.randn((1, k), dtype=torch.bfloat16, device="cuda")
    calls = 16
    for name, f in [("decode", lambda: qq.quantized_matmul(x, dw)), ("packed", lambda: qq.quantized_matmul(x, qw)),
                    ("torch bf16", lambda: x @ w.t())]:
        us = graph_us(lambda: [f() for _ in range(calls)], reps=50) / calls
        print(f"({n}, {k}) {name:10s} {us:6.2f} us per call in a graph of {calls}", flush=True)
