"""qqmm with a prepared weight (qq.prepare_weight: packed w + q(w)'s bf16 values) at small M:
libqq's choice (route auto: the packed weight through the weight-only kernels up to
kPackedOverValuesMaxM rows) against the GEMM on the values (route "exact") and torch's bf16
`x @ w.T`. NW distinct weights (together larger than the L2) multiplied back to back inside a
CUDA graph (us per call: kernel time, no host), and an eager loop of calls on one weight
followed by one synchronize at the first shape (us per call: what a user's loop sees).
Prints one line per (mode, shape, M).

    python bench/tune/qqmm_values_probe.py      (MODES, SHAPES, MS: comma lists)
"""
import os
import time

import torch
from decode_graph import graph_us  # same folder

import qq

SHAPES = [tuple(int(v) for v in s.split("x")) for s in
          os.environ.get("SHAPES", "4096x4096,6144x4096,28672x4096,4096x14336,16384x16384").split(",")]
MODES = os.environ.get("MODES", "mxfp8,nvfp4,mxfp4").split(",")
MS = [int(v) for v in os.environ.get("MS", "1,2,4,8,16,32").split(",")]


def eager_us(fn, n=2000, reps=5):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        best.append((time.perf_counter() - t0) / n * 1e6)
    return sorted(best)[len(best) // 2]


def main():
    print(f"device {torch.cuda.get_device_name()}", flush=True)
    for mode in MODES:
        for si, (n, k) in enumerate(SHAPES):
            nw = max(2, min(8, (400 << 20) // (n * k * 2) + 1))
            ws = [torch.randn((n, k), dtype=torch.bfloat16, device="cuda") for _ in range(nw)]
            pws = [qq.prepare_weight(w, mode=mode) for w in ws]
            for m in MS:
                x = torch.randn((m, k), dtype=torch.bfloat16, device="cuda")
                r = {}
                qq.qqmm(x, pws[0])
                route = qq.last_route()
                for name, f in [("auto", lambda p, w: qq.qqmm(x, p)),
                                ("exact", lambda p, w: qq.qqmm(x, p, route="exact")),
                                ("torch", lambda p, w: x @ w.t())]:
                    r[name] = graph_us(lambda: [f(p, w) for p, w in zip(pws, ws)], reps=20) / nw
                line = (f"{mode:6s} ({n:5d}, {k:5d}) M={m:3d} graph us: auto({route}) {r['auto']:8.2f} "
                        f"exact {r['exact']:8.2f} torch {r['torch']:8.2f}")
                if si == 0 and m in (1, 4, 16):
                    p0, w0 = pws[0], ws[0]
                    e = {name: eager_us(lambda: f(p0, w0)) for name, f in
                         [("auto", lambda p, w: qq.qqmm(x, p)), ("exact", lambda p, w: qq.qqmm(x, p, route="exact")),
                          ("torch", lambda p, w: x @ w.t())]}
                    line += f" | eager us: auto {e['auto']:7.2f} exact {e['exact']:7.2f} torch {e['torch']:7.2f}"
                print(line, flush=True)
            del ws, pws
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
