"""Benchmark of qq.quantized_matmul (weight-only: y = x @ dequantize(w).T) on the current GPU.

For each weight shape (N, K), mode and M: bf16 x [M, K], w quantized once with
qq.quantize (linear scales, transpose=True), timed with the harness's Timer. Two rows
per point, both with peers measured in this run:
  - GB/s counting packed weights + scales (+ affine biases) + x + y, against the device
    copy bandwidth (the small-M kernels are memory bound: ratio = fraction of copy);
  - TFLOP/s (2*M*N*K) against torch bf16 `x @ w_bf16.T` on the same shape (ratio > 1:
    faster than the bf16 GEMM, which reads 4x (fp4) / 2x (fp8) more weight bytes).
M > 16 goes to a path that may not exist yet: qq raises NotSupportedError, the point is
skipped and listed at the end of the table.

Then qq.gather_qmm (MoE decode; op "gather_qmm", peer copy; its own table, gather_qmm-<gpu>):
T tokens routed to top_k of E experts (random, distinct per token), x [T, 1, 1, K] (the gate/up form) or [T, top_k, 1, K]
(the down form) against rhs_indices [T, top_k]; GB/s counts the weights of the experts the
indices touch (each once) + x + y.

Then (--only decode) the decode layout (qq.prepare_decode) against the packed weight on the
decode shapes of an 8B model and 16384^2, nvfp4 / mxfp4 / mxfp8 / affine 4- and 8-bit (group 64),
bf16 x at M = 1..64 and float16 x at M = 1 and 16 (column x_dtype): op "quantized_matmul",
variant "decode" / "packed", GB/s against copy (its own table, qmm_decode-<gpu>).
The decode-layout rows of both tables add copy_same / ratio_same (harness.same_size): a copy
of the row's own bytes, whose launch and tail weigh on these 8-300 MB calls too.

    python bench/bench_qmm.py [--quick] [--only dense|gather|decode]
    (--quick: 2 dense shapes, M in 1, 4, 16, one gather shape; < 1 min)
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Bench, Timer, copy_bandwidth, same_size  # noqa: E402

import qq  # noqa: E402

SHAPES = [(16384, 16384), (4096, 14336), (14336, 4096), (8192, 8192)]  # (N, K)
MS = [1, 2, 4, 8, 16, 32, 64, 128, 512, 4096]
MODES = [("nvfp4", {"mode": "nvfp4"}), ("mxfp4", {"mode": "mxfp4"}), ("mxfp8", {"mode": "mxfp8"}),
         ("affine4", {"mode": "affine", "bits": 4}), ("affine8", {"mode": "affine", "bits": 8})]


def nbytes(t) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="2 shapes, M in 1, 4, 16, fewer iterations")
    ap.add_argument("--only", choices=["dense", "gather", "decode"], help="one of the parts")
    args = ap.parse_args()
    shapes = SHAPES[:2] if args.quick else SHAPES
    ms = [1, 4, 16] if args.quick else MS
    timer = Timer(warmup=3 if args.quick else 5, iters=10 if args.quick else 30)
    bench = Bench("qmm")
    copy_gbps = copy_bandwidth(timer)
    print(f"device copy bandwidth: {copy_gbps:.1f} GB/s (read + write)")
    skipped: list[str] = []
    torch.manual_seed(0)
    if args.only == "decode":
        decode(timer, copy_gbps, args.quick)
        return
    for n, k in ([] if args.only == "gather" else shapes):
        w = torch.randn((n, k), dtype=torch.bfloat16, device="cuda")
        xs = {m: torch.randn((m, k), dtype=torch.bfloat16, device="cuda") for m in ms}
        # the peer: torch bf16 GEMM on the same shape, once per M
        peer_tflops = {}
        for m in ms:
            x = xs[m]
            us = timer(lambda: x @ w.t(), nbytes(x) + nbytes(w) + m * n * 2)
            peer_tflops[m] = 2 * m * n * k / (us * 1e-6) / 1e12
        for mode, kw in MODES:
            qw = qq.quantize(w, **kw)
            wbytes = nbytes(qw.data) + nbytes(qw.scales) + nbytes(getattr(qw, "biases", None))
            # one untimed pass over every M first: the first timed point of a mode came out
            # up to 3x slower than the same kernel at the next M (bench/results/
            # qmm-small-m-h100-notes.md)
            for m in ms:
                try:
                    for _ in range(3):
                        qq.quantized_matmul(xs[m], qw)
                except qq.NotSupportedError:
                    pass
            torch.cuda.synchronize()
            for m in ms:
                x = xs[m]
                try:
                    qq.quantized_matmul(x, qw)
                except qq.NotSupportedError as e:
                    skipped.append(f"{mode} M={m} (N, K)=({n}, {k}): {str(e).splitlines()[0]}")
                    continue
                moved = wbytes + nbytes(x) + m * n * 2  # y is bf16
                us = timer(lambda: qq.quantized_matmul(x, qw), moved)
                gbps = moved / (us * 1e-6) / 1e9
                tflops = 2 * m * n * k / (us * 1e-6) / 1e12
                bench.row("quantized_matmul", mode, (m, n, k), "GBps", gbps, "copy", copy_gbps,
                          us=round(us, 2))
                bench.row("quantized_matmul", mode, (m, n, k), "TFLOPs", tflops, "torch_bf16",
                          peer_tflops[m], us=round(us, 2))
            del qw
        del w, xs
        torch.cuda.empty_cache()
    if args.only != "dense":
        gb = Bench("gather_qmm")
        gather(gb, timer, copy_gbps, args.quick)
        for path in gb.save():
            print("wrote", path)
    if args.only == "gather":
        return
    json_path, md_path = bench.save()
    # skipped points, so that a reader sees which M have no GPU path yet
    if skipped:
        with open(md_path, "a") as f:
            f.write("\nSkipped (qq.NotSupportedError, no GPU path for these yet):\n\n")
            for s in skipped:
                f.write(f"- {s}\n")
    for path in (json_path, md_path):
        print("wrote", path)
    print(f"{len(skipped)} points skipped (NotSupportedError)")


DECODE_SHAPES = [(16384, 16384), (6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]


def decode(timer, copy_gbps, quick) -> None:
    """The decode layout against the packed weight, same x, same run (a loop of calls with
    the L2 flushed before each timing, as every row here)."""
    bench = Bench("qmm_decode")
    ms = [1, 4, 16, 64] if quick else [1, 2, 4, 8, 16, 32, 64]
    for n, k in DECODE_SHAPES[:2] if quick else DECODE_SHAPES:
        w = torch.randn((n, k), dtype=torch.bfloat16, device="cuda")
        for mode, kw in MODES:
            qw = qq.quantize(w, **kw)
            dw = qq.prepare_decode(qw)
            wbytes = nbytes(qw.data) + nbytes(qw.scales) + nbytes(qw.biases)
            # bf16 x at every M; float16 x (the decode kernel splits it into bf16 high parts and
            # remainders: twice the kernel rows, at most 32 rows of x) at 1 and 16
            for dt, dms in ((torch.bfloat16, ms), (torch.float16, [1, 16])):
                for m in dms:
                    x = torch.randn((m, k), dtype=dt, device="cuda")
                    for variant, wt in (("packed", qw), ("decode", dw)):
                        for _ in range(3):
                            qq.quantized_matmul(x, wt)
                        route = qq.last_route()
                        moved = wbytes + nbytes(x) + m * n * 2
                        us = timer(lambda: qq.quantized_matmul(x, wt), moved)
                        gbps = moved / (us * 1e-6) / 1e9
                        bench.row("quantized_matmul", mode, (m, n, k), "GBps", gbps,
                                  "copy", copy_gbps, us=round(us, 2), variant=variant, route=route,
                                  x_dtype=str(dt).replace("torch.", ""),
                                  **(same_size(timer, gbps, moved) if variant == "decode" else {}))
            del qw, dw
        del w
        torch.cuda.empty_cache()
    for path in bench.save():
        print("wrote", path)


# (name, E, top_k, N, K, x form): DeepSeek-V3-like routed experts (gate/up and down
# projections) and Mixtral-like
GATHER = [("deepseek-up", 256, 8, 2048, 7168, "up"), ("deepseek-down", 256, 8, 7168, 2048, "down"),
          ("mixtral-up", 8, 2, 14336, 4096, "up")]
GATHER_T = [1, 4, 16, 64]
GATHER_MODES = MODES[:4]


def gather(bench, timer, copy_gbps, quick) -> None:
    cases = GATHER[:1] if quick else GATHER
    for name, e, top, n, k, form in cases:
        gen = torch.Generator(device="cuda").manual_seed(0)
        for mode, kw in (GATHER_MODES[:1] if quick else GATHER_MODES):
            # quantized expert by expert: the bf16 [E, N, K] at once would be 7.5 GB
            parts = [qq.quantize(torch.randn((1, n, k), dtype=torch.bfloat16, device="cuda", generator=gen),
                                 torch_dtypes=False, **kw)
                     for _ in range(e)]
            data = torch.cat([p.data for p in parts])
            scales = torch.cat([p.scales for p in parts])
            biases = torch.cat([p.biases for p in parts]) if parts[0].biases is not None else None
            kwq = dict(group_size=parts[0].group_size, bits=parts[0].bits, mode=parts[0].mode)
            per_expert = (nbytes(data) + nbytes(scales) + nbytes(biases)) // e
            # the same experts in the decode layout (variant "decode" rows)
            qa = qq.QuantizedArray(data, scales, biases, shape=(e, n, k), **kwq)
            dw = qq.prepare_decode(qa)
            del parts
            for t in ([1, 16] if quick else GATHER_T):
                idx = torch.rand((t, e), device="cuda", generator=gen).topk(top, dim=1).indices.to(torch.int32)
                x = torch.randn((t, 1, 1, k) if form == "up" else (t, top, 1, k), dtype=torch.bfloat16,
                                device="cuda", generator=gen)
                touched = int(torch.unique(idx).numel())
                moved = touched * per_expert + nbytes(x) + t * top * n * 2
                fn = lambda: qq.gather_qmm(x, data, scales, biases, rhs_indices=idx, **kwq)  # noqa: E731
                fn()
                us = timer(fn, moved)
                bench.row("gather_qmm", mode, (t, top, e, n, k), "GBps", moved / (us * 1e-6) / 1e9, "copy",
                          copy_gbps, us=round(us, 2), experts_touched=touched, case=name, variant="packed")
                if dw is not None:
                    fd = lambda: qq.gather_qmm(x, dw, rhs_indices=idx)  # noqa: E731
                    fd()
                    route = qq.last_route()
                    # the same bytes counted (the touched experts once), though this path reads an
                    # expert once per entry that names it
                    us = timer(fd, moved)
                    gbps = moved / (us * 1e-6) / 1e9
                    bench.row("gather_qmm", mode, (t, top, e, n, k), "GBps", gbps, "copy",
                              copy_gbps, us=round(us, 2), experts_touched=touched, case=name, variant="decode",
                              route=route, **same_size(timer, gbps, moved))
            del data, scales, biases, dw
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
