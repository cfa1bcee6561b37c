"""A/B helper for the decode layout's gather_qmm (MoE decode) and a few dense decode shapes:
prints us per call and the fraction of copy bandwidth, counted as bench_qmm counts it (the
touched experts once, x and y), with bench/harness.py's Timer (L2 flushed, median). Run it
once per build and compare the two outputs line by line.

    python bench/tune/gather_ab.py [--modes nvfp4,mxfp8,affine4] [--packed]
        [--cases deepseek-up,mixtral-up] [--tokens 4,16,64] [--no-dense] [--graph]
    (H100: ~1 minute; --packed adds the packed experts' time per case)
--graph adds each case's per-call time inside a CUDA graph of 8 back-to-back calls on 4
index sets of their own (another generator: the lone calls' indices stay as they were), as
consecutive MoE layers run in a captured decode step: no launch gap, and each call's weight
prefetch overlaps the call before it (programmatic dependent launch). Counted as the lone
call is (its touched experts once).
"""
import argparse
import itertools
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from harness import Timer, copy_bandwidth, graph_us  # noqa: E402

import qq  # noqa: E402

KW = {"nvfp4": {"mode": "nvfp4"}, "mxfp4": {"mode": "mxfp4"}, "mxfp8": {"mode": "mxfp8"},
      "affine4": {"mode": "affine", "bits": 4}}
CASES = [("deepseek-up", 256, 8, 2048, 7168, "up", (1, 4, 16, 64)),
         ("deepseek-down", 256, 8, 7168, 2048, "down", (1, 4, 16, 64)),
         ("mixtral-up", 8, 2, 14336, 4096, "up", (1, 4, 16, 64))]
DENSE = [(4096, 4096), (28672, 4096), (2048, 7168)]


def nbytes(t):
    return 0 if t is None else t.numel() * t.element_size()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--modes", default="nvfp4,mxfp8,affine4")
    ap.add_argument("--packed", action="store_true")
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--tokens", default="", help="comma-separated token counts (default: each case's)")
    ap.add_argument("--no-dense", action="store_true", help="leave the dense shapes out")
    ap.add_argument("--graph", action="store_true", help="and per call inside a CUDA graph")
    args = ap.parse_args()
    timer = Timer(warmup=5, iters=30)
    copy = copy_bandwidth(timer)
    print(f"copy {copy:.0f} GB/s", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    ggen = torch.Generator(device="cuda").manual_seed(1)  # --graph's index sets
    for mode in args.modes.split(","):
        kw = KW[mode]
        for n, k in ([] if args.no_dense else DENSE):
            qa = qq.quantize(torch.randn((n, k), dtype=torch.bfloat16, device="cuda", generator=gen), **kw)
            dw = qq.prepare_decode(qa)
            x = torch.randn((1, k), dtype=torch.bfloat16, device="cuda", generator=gen)
            moved = nbytes(qa.data) + nbytes(qa.scales) + nbytes(qa.biases) + nbytes(x) + 2 * n
            us = timer(lambda: qq.quantized_matmul(x, dw), moved)
            print(f"{mode:8s} dense {n}x{k} M=1 {us:8.2f} us {moved / us / 1e3 / copy:6.3f} "
                  f"[{qq.last_route()}]", flush=True)
            del qa, dw
        for name, e, top, n, k, form, ts in CASES:
            if args.cases and name not in args.cases.split(","):
                continue
            if args.tokens:
                ts = tuple(int(t) for t in args.tokens.split(","))
            parts = [qq.quantize(torch.randn((1, n, k), dtype=torch.bfloat16, device="cuda", generator=gen),
                                 torch_dtypes=False, **kw) for _ in range(e)]
            data = torch.cat([p.data for p in parts])
            scales = torch.cat([p.scales for p in parts])
            biases = torch.cat([p.biases for p in parts]) if parts[0].biases is not None else None
            qa = qq.QuantizedArray(data, scales, biases, shape=(e, n, k), group_size=parts[0].group_size,
                                   bits=parts[0].bits, mode=parts[0].mode)
            per_expert = (nbytes(data) + nbytes(scales) + nbytes(biases)) // e
            dw = qq.prepare_decode(qa)
            del parts
            for t in ts:
                idx = torch.rand((t, e), device="cuda", generator=gen).topk(top, dim=1).indices.to(torch.int32)
                x = torch.randn((t, 1, 1, k) if form == "up" else (t, top, 1, k), dtype=torch.bfloat16,
                                device="cuda", generator=gen)
                touched = int(torch.unique(idx).numel())
                moved = touched * per_expert + nbytes(x) + t * top * n * 2
                us = timer(lambda: qq.gather_qmm(x, dw, rhs_indices=idx), moved)
                route = qq.last_route()
                extra = ""
                if args.packed:
                    kwq = dict(group_size=qa.group_size, bits=qa.bits, mode=qa.mode)
                    up = timer(lambda: qq.gather_qmm(x, data, scales, biases, rhs_indices=idx, **kwq), moved)
                    extra = f"  packed {up:8.2f} us {moved / up / 1e3 / copy:6.3f} [{qq.last_route()}]"
                if args.graph:
                    sets = [torch.rand((t, e), device="cuda", generator=ggen).topk(top, dim=1).indices.to(torch.int32)
                            for _ in range(4)]
                    gmoved = sum(int(torch.unique(i).numel()) for i in sets) / 4 * per_expert + nbytes(x) + t * top * n * 2
                    it = itertools.cycle(sets)
                    gus = graph_us(lambda: qq.gather_qmm(x, dw, rhs_indices=next(it)), 8, 5)
                    extra += f"  graph {gus:8.2f} us {gmoved / gus / 1e3 / copy:6.3f}"
                print(f"{mode:8s} {name:13s} t={t:<3d} {us:8.2f} us {moved / us / 1e3 / copy:6.3f} "
                      f"[{route}] touched={touched}{extra}", flush=True)
            del data, scales, biases, qa, dw
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
