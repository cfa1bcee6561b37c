"""Per-call time of quantized_matmul inside a CUDA graph (x bf16, or XDTYPE=float16): NW distinct weights (together larger
than the L2) multiplied back to back, as a decode step does, packed against the decode layout
(qq.prepare_decode). The graph removes host cost; back-to-back decode-layout kernels overlap
through programmatic dependent launch. Prints one line per (shape, mode, M).

    python bench/tune/decode_graph.py
    LAYOUTS=decode MS=1,16,64 SHAPES=4096x4096 MODES=nvfp4 python bench/tune/decode_graph.py
    NW=1 LAYOUTS=decode ... : one weight, called back to back (the L2's share where it fits)
    PAIR=4096x14336,6144x4096 MODES=affine8 MS=16 ... : the decode layout's shapes (two or
      more) called in turn (down, then the next layer's qkv, as in a step) against each alone: whether
      one kernel's tail keeps the next one's CTAs from starting beside it; several pairs are
      separated by ";" (PAIR="4096x14336,6144x4096;4096x4096,28672x4096")
Per-call times here can rank configurations differently from the decode step, where the
fused gate/up kernel and the step's own order shape how each kernel overlaps the one before
it (session at: PAIR over the four shapes favoured a form that made the step slower); judge
a configuration by bench_decode or profile_decode_step.py ("adds").
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import Timer, copy_bandwidth  # noqa: E402

import qq  # noqa: E402

SHAPES = [(16384, 16384), (6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]
if os.environ.get("SHAPES"):
    SHAPES = [tuple(int(v) for v in s.split("x")) for s in os.environ["SHAPES"].split(",")]
MODES = os.environ.get("MODES", "nvfp4,mxfp4,mxfp8,affine4,affine8").split(",")
# affine4 / affine8: MLX's default affine (group_size 64) at 4 / 8 bits
QUANT = {"affine4": dict(mode="affine", bits=4, group_size=64), "affine8": dict(mode="affine", bits=8, group_size=64)}
MS = [int(v) for v in os.environ.get("MS", "1,4,16").split(",")]
XDTYPE = getattr(torch, os.environ.get("XDTYPE", "bfloat16"))  # x's dtype (float16: the staged split)
LAYOUTS = os.environ.get("LAYOUTS", "packed,decode").split(",")  # LAYOUTS=decode: the decode layout alone


def graph_us(fn, reps=20):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(reps):
        g.replay()
    t1.record()
    torch.cuda.synchronize()
    return t0.elapsed_time(t1) * 1000 / reps


def copy_gbps() -> float:
    """The copy bandwidth (read + write) of the benchmark tables (harness.copy_bandwidth). A
    1 GiB copy captured in a graph, as measured here before, read ~2.7 TB/s on an H200 against
    4.2-4.3 (bench/results/qmm-decode-h100-notes.md, sessions v and aj)."""
    return copy_bandwidth(Timer())


def pair_main(shapes):
    """PAIR: per-call us of each shape alone (NW distinct weights back to back) and of the shapes
    in turn (a0 b0 a1 b1 ...), the step's order. alternating - (a + b + ...) > 0: the sequence
    loses overlap that each shape has with itself."""
    nw = int(os.environ.get("NW", 4))
    w = {s: [torch.randn(s, dtype=torch.bfloat16, device="cuda") for _ in range(nw)] for s in shapes}
    for mode in MODES:
        dw = {s: [qq.prepare_decode(qq.quantize(t, **QUANT.get(mode, dict(mode=mode)))) for t in ws]
              for s, ws in w.items()}
        for m in MS:
            xs = {s: torch.randn((m, s[1]), dtype=XDTYPE, device="cuda") for s in shapes}

            def alone(s):
                def f():
                    for t in dw[s]:
                        qq.quantized_matmul(xs[s], t)
                return graph_us(f) / nw

            def alternate():
                for i in range(nw):
                    for s in shapes:
                        qq.quantized_matmul(xs[s], dw[s][i])
            one = [alone(s) for s in shapes]
            both = graph_us(alternate) / nw
            names = " + ".join(f"{s[0]}x{s[1]} {u:6.2f}" for s, u in zip(shapes, one))
            print(f"{mode:7s} M={m:2d}: alone {names} = {sum(one):6.2f} us; alternating {both:6.2f} us "
                  f"({both - sum(one):+.2f})", flush=True)
        del dw
    torch.cuda.empty_cache()


def main():
    torch.manual_seed(0)
    if os.environ.get("PAIR"):
        for pair in os.environ["PAIR"].split(";"):
            pair_main([tuple(int(v) for v in s.split("x")) for s in pair.split(",")])
        return
    copy = copy_gbps()
    print(f"copy {copy:.0f} GB/s")
    for n, k in SHAPES:
        nw = max(2, min(8, int(160e6 // (n * k * 0.53))))  # > the 50 MB L2 in all
        nw = int(os.environ.get("NW", nw))  # NW=1: one weight called again and again (from the L2 where it fits)
        w = [torch.randn((n, k), dtype=torch.bfloat16, device="cuda") for _ in range(nw)]
        for mode in MODES:
            qw = [qq.quantize(t, **QUANT.get(mode, dict(mode=mode))) for t in w]
            dw = [qq.prepare_decode(q) for q in qw]
            q0 = qw[0]  # the packed weight's bytes (codes, scales, affine biases)
            wbytes = sum(t.numel() * t.element_size() for t in (q0.data, q0.scales, q0.biases) if t is not None)
            for m in MS:
                x = torch.randn((m, k), dtype=XDTYPE, device="cuda")
                res = {}
                for name, ws in (("packed", qw), ("decode", dw)):
                    if name not in LAYOUTS:
                        res[name] = res[name + "_eager"] = float("nan")
                        continue
                    def f(ws=ws):
                        for t in ws:
                            qq.quantized_matmul(x, t)
                    res[name] = graph_us(f) / nw
                    # eager: the same calls in a loop, then one synchronize (host cost included)
                    f()
                    torch.cuda.synchronize()
                    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    t0.record()
                    for _ in range(10):
                        f()
                    t1.record()
                    torch.cuda.synchronize()
                    res[name + "_eager"] = t0.elapsed_time(t1) * 1000 / (10 * nw)
                gb = {kk: wbytes / (v * 1e-6) / 1e9 for kk, v in res.items()}
                print(f"{mode:7s} ({n:5d},{k:5d}) M={m:2d}: packed {res['packed']:7.2f} us "
                      f"({gb['packed'] / copy:.2f} of copy)  decode {res['decode']:7.2f} us "
                      f"({gb['decode'] / copy:.2f})  x{res['packed'] / res['decode']:.2f}  eager: packed "
                      f"{res['packed_eager']:7.2f} decode {res['decode_eager']:7.2f} us", flush=True)
            del qw, dw
        del w
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
