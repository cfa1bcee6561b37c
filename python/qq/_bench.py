"""python -m qq bench: libqq's main operations timed on this machine against a peer measured
in the same run (docs/benchmarks.md, "python -m qq bench").

    python -m qq bench                  # the first CUDA device if torch sees one, else the CPU
    python -m qq bench --quick --json rows.json --plot bench.png

Each time is what a user's loop sees: a loop of calls, then one synchronize, divided by
the number of calls (median of 3 loops, after warm-up). Rows: op, variant (the mode),
shape, metric (GBps or TFLOPs), value, peer, peer_value, ratio (ours / peer for a rate),
device. Peers: a device copy of the same bytes (quantize), torch's bf16 GEMV / GEMM on the
same shape (quantized_matmul, qqmm; NumPy float32 on the CPU without torch).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

import qq


class _Env:
    def __init__(self, device: str):
        self.torch = None
        try:
            import torch
            self.torch = torch
        except ImportError:
            pass
        if device == "auto":
            device = "cuda" if self.torch is not None and self.torch.cuda.is_available() and qq.device_count() else "cpu"
        if device == "cuda" and (self.torch is None or not self.torch.cuda.is_available()):
            raise SystemExit("python -m qq bench --device cuda needs torch with CUDA")
        self.device = device
        self.name = self.torch.cuda.get_device_name(0) if device == "cuda" else "CPU"

    def randn(self, shape, rng):
        a = rng.standard_normal(shape).astype(np.float32)
        if self.torch is None:
            return a
        t = self.torch.from_numpy(a).to(self.torch.bfloat16)
        return t.cuda() if self.device == "cuda" else t

    def sync(self):
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def time_us(self, fn, calls: int) -> float:
        for _ in range(3):
            fn()
        self.sync()
        loops = []
        for _ in range(3):
            t = time.perf_counter()
            for _ in range(calls):
                fn()
            self.sync()
            loops.append((time.perf_counter() - t) / calls * 1e6)
        return statistics.median(loops)


def _nbytes(a) -> int:
    if a is None:
        return 0
    return int(a.numel() * a.element_size()) if hasattr(a, "element_size") else int(np.asarray(a).nbytes)


def run(device: str = "auto", quick: bool = False) -> tuple:
    env = _Env(device)
    rng = np.random.default_rng(0)
    gpu = env.device == "cuda"
    s = (1024 if quick else 8192) if gpu else (256 if quick else 1024)
    calls = (5 if quick else 20) if gpu else (2 if quick else 5)
    rows = []

    def row(op, mode, shape, metric, value, peer, peer_value):
        sig = lambda v: float(f"{v:.4g}")  # noqa: E731  (4 significant digits: CPU rates are tiny)
        rows.append(dict(op=op, variant=mode, shape=list(shape), metric=metric, value=sig(value),
                         peer=peer, peer_value=sig(peer_value), ratio=sig(value / peer_value), device=env.name))

    w = env.randn((s, s), rng)
    # the copy peer: the same input read and written once
    if env.torch is not None:
        dst = env.torch.empty_like(w)
        copy_us = env.time_us(lambda: dst.copy_(w), calls)
    else:
        dst = np.empty_like(w)
        copy_us = env.time_us(lambda: np.copyto(dst, w), calls)
    copy_gbps = 2 * _nbytes(w) / copy_us / 1e3
    for mode in ("nvfp4", "mxfp8"):
        q = qq.quantize(w, mode=mode)
        moved = _nbytes(w) + _nbytes(q.data) + _nbytes(q.scales)
        us = env.time_us(lambda: qq.quantize(w, mode=mode), calls)
        row("quantize", mode, (s, s), "GBps", moved / us / 1e3, "copy", copy_gbps)

    # weight-only at M = 1 (decode) against the framework's own GEMV on the float weight
    x1 = env.randn((1, s), rng)
    peer = (lambda: x1 @ w.T) if env.torch is not None else (lambda: x1 @ w.T)
    peer_us = env.time_us(peer, calls)
    for mode in ("nvfp4", "mxfp4", "mxfp8"):
        q = qq.quantize(w, mode=mode)
        wbytes = _nbytes(q.data) + _nbytes(q.scales)
        us = env.time_us(lambda: qq.quantized_matmul(x1, q), calls)
        # the peer's rate counted on the same weight bytes: ratio = peer time / our time
        row("quantized_matmul", mode, (1, s, s), "GBps", wbytes / us / 1e3, "bf16_gemv",
            wbytes / peer_us / 1e3)

    # both quantized, large M, prepared weight, against the framework's float GEMM
    m = s
    xm = env.randn((m, s), rng)
    flops = 2.0 * m * s * s
    peer_us = env.time_us(lambda: xm @ w.T, max(1, calls // 2))
    for mode in ("nvfp4", "mxfp8"):
        pw = qq.prepare_weight(w, mode=mode)
        gx = qq.amax(xm) if mode == "nvfp4" else None
        us = env.time_us(lambda: qq.qqmm(xm, pw, global_scale_x=gx), max(1, calls // 2))
        row("qqmm", mode, (m, s, s), "TFLOPs", flops / us / 1e6, "bf16_gemm", flops / peer_us / 1e6)
    return env, rows


def _plot(rows, path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    labels = [f"{r['op']}\n{r['variant']}" for r in rows]
    xs = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 1.1), 4))
    ax.bar(xs, [r["ratio"] for r in rows], 0.6, label="libqq / peer")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xticks(xs)
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("rate relative to the peer (higher is better)")
    ax.set_title(f"libqq on {rows[0]['device']}" if rows else "libqq")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m qq bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--quick", action="store_true", help="small shapes, few calls (a smoke run)")
    ap.add_argument("--json", metavar="PATH", help="write the rows as JSON")
    ap.add_argument("--plot", metavar="PATH", default="qq-bench.png",
                    help="bar plot of the ratios when matplotlib is installed (default qq-bench.png)")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    env, rows = run(args.device, args.quick)
    print(f"libqq {qq.__version__} on {env.name} (a loop of calls, then one synchronize; median of 3)")
    print(f"{'op':>17} {'variant':>7} {'shape':>18} {'metric':>6} {'libqq':>10} {'peer':>10} {'peer value':>10} "
          f"{'ratio':>6}")
    for r in rows:
        print(f"{r['op']:>17} {r['variant']:>7} {str(tuple(r['shape'])):>18} {r['metric']:>6} {r['value']:>10.2f} "
              f"{r['peer']:>10} {r['peer_value']:>10.2f} {r['ratio']:>6.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": env.name, "rows": rows}, f, indent=1)
        print("wrote", args.json)
    if not args.no_plot:
        if _plot(rows, args.plot):
            print("wrote", args.plot)
        else:
            print("(no plot: matplotlib is not installed)")
    return 0
