"""The one benchmark harness of libqq (docs/benchmarks.md).

Every bench_<family>.py builds rows with `Bench.row(...)` and calls
`Bench.save(name)`. Timing: CUDA events, warm-up first, the median of many
runs; inputs that fit in twice the L2 are timed one call at a time with the L2
flushed before each (a write over a buffer twice the L2 size; the runs are
queued behind a sleep kernel so that host overhead is not timed), larger ones in
back-to-back batches (the cache cannot hold them anyway). Every figure is reported next to a peer
measured in the same process on the same GPU: the device copy bandwidth
(torch `copy_`), cuBLAS bf16/fp8 GEMMs or torch.compile of the same math.

Results go to bench/results/<bench>-<gpu>.json (for tools) and .md (for people),
or to $QQ_BENCH_OUT when set (the device runs write under $OUT).
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def gpu_tag() -> str:
    name = torch.cuda.get_device_name().lower()
    for tag in ("h200", "h100", "b200", "b100", "gb200", "a100", "l40s", "rtx 5090"):
        if tag in name:
            return tag.replace(" ", "")
    return name.split()[-1]


def git_commit() -> str:
    # QQ_COMMIT first: the device machine's copy of the tree may carry a stale .git
    # (a table of 2026-11-23 was stamped with an old commit that way).
    if os.environ.get("QQ_COMMIT"):
        return os.environ["QQ_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True,
                              text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("QQ_COMMIT", "unknown")


class Timer:
    """Median time in microseconds of fn() with a cold L2 before each run."""

    def __init__(self, warmup: int = 5, iters: int = 30, flush: bool = True):
        self.warmup, self.iters, self.flush = warmup, iters, flush
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        self._flush_buf = torch.empty(2 * l2 // 4 + 1024, dtype=torch.float32, device="cuda")

    def __call__(self, fn, nbytes: int | None = None) -> float:
        """nbytes: bytes the call moves. When they exceed twice the L2 size the cache
        cannot help, so calls run back to back (host overhead overlaps the GPU, as in a
        real training step) and the per-call time is the median over batches of them;
        otherwise the L2 is flushed before each single timed call."""
        for _ in range(self.warmup):
            fn()
        torch.cuda.synchronize()
        if nbytes is not None and nbytes > 4 * self._flush_buf.numel():  # > 2x L2
            per_batch = 10
            times = []
            for _ in range(max(3, self.iters // per_batch)):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                for _ in range(per_batch):
                    fn()
                e.record()
                torch.cuda.synchronize()
                times.append(s.elapsed_time(e) * 1e3 / per_batch)
            return statistics.median(times)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(self.iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(self.iters)]
        # Keep the GPU busy while the host queues every run: otherwise a call whose
        # kernels are shorter than its Python/launch overhead would be timed with the
        # GPU idling between the start event and its first kernel (host time, not
        # kernel time; it made small shapes vary by 2x between runs).
        torch.cuda._sleep(1_000_000 * self.iters)
        for s, e in zip(starts, ends):
            if self.flush:
                self._flush_buf.fill_(1.0)
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))


def training_step(layer, x, dy, params):
    """A closure running one forward + backward of layer(x) with the loss gradient dy,
    the gradients of x and params cleared first (bench_linear, bench_moe)."""
    def run():
        x.grad = None
        for p in params:
            p.grad = None
        layer(x).backward(dy)
    return run


def forward_only(layer, x):
    """A closure running layer(x) without autograd."""
    def run():
        with torch.no_grad():
            layer(x)
    return run


def replay_us(g, n: int, reps: int = 5) -> float:
    """GPU microseconds per call of a CUDA graph `g` holding n calls: the graph replayed
    between two events, median of reps replays."""
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b) * 1e3 / n)
    return statistics.median(out)


def capture(fn, n: int):
    """A CUDA graph of n calls of fn (after two calls on a side stream, as torch asks before a
    capture), replayed once; for replay_us, or for probes that interleave several graphs."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            fn()
    g.replay()
    torch.cuda.synchronize()
    return g


def graph_us(fn, n: int, reps: int) -> float:
    """GPU microseconds per call of fn: n calls captured in one CUDA graph (capture), replay_us
    of it."""
    return replay_us(capture(fn, n), n, reps)


def copy_bandwidth(timer: Timer, nbytes: int = 1 << 30) -> float:
    """Device copy bandwidth in GB/s, counting bytes read plus bytes written."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    us = timer(lambda: dst.copy_(src), 2 * nbytes)
    return 2 * nbytes / (us * 1e-6) / 1e9


_SAME: dict = {}


def same_size(timer: Timer, gbps: float, moved: int) -> dict:
    """Columns `copy_same` (GB/s of a device copy moving the row's own bytes, half read and half
    written) and `ratio_same` (the row against it). The peer column's copy moves 1 GiB; at
    ~100 MB and below launch and tail costs weigh on a copy too, and this says how much.
    One copy measured per MiB of size, kept for the process."""
    key = moved >> 20
    if key not in _SAME:
        _SAME[key] = copy_bandwidth(timer, max(moved // 4 * 2, 2))
    return dict(copy_same=round(_SAME[key], 1), ratio_same=round(gbps / _SAME[key], 4))


class Bench:
    def __init__(self, name: str):
        self.name = name
        self.rows: list[dict] = []

    def row(self, op: str, mode: str, shape, metric: str, value: float, peer: str, peer_value: float,
            **extra) -> dict:
        if metric == "us":
            ratio = peer_value / value if value else 0.0
        else:
            ratio = value / peer_value if peer_value else 0.0
        r = {"op": op, "mode": mode, "shape": [int(s) for s in shape], "metric": metric,
             "value": round(float(value), 3), "peer": peer, "peer_value": round(float(peer_value), 3),
             "ratio": round(float(ratio), 4)}
        r.update(extra)
        self.rows.append(r)
        print(f"{op:>18} {mode:>8} {str(tuple(r['shape'])):>22} {metric:>6} {value:10.2f}  "
              f"{peer:>14} {peer_value:10.2f}  ratio {ratio:6.3f}  "
              + " ".join(f"{k}={v}" for k, v in extra.items()), flush=True)
        return r

    def save(self) -> tuple[str, str]:
        out_dir = os.environ.get("QQ_BENCH_OUT") or os.path.join(HERE, "results")
        os.makedirs(out_dir, exist_ok=True)
        tag = gpu_tag()
        base = os.path.join(out_dir, f"{self.name}-{tag}")
        doc = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
               "commit": git_commit(), "rows": self.rows}
        with open(base + ".json", "w") as f:
            json.dump(doc, f, indent=1)
        write_md(doc, self.name, base + ".md")
        return base + ".json", base + ".md"


def write_md(doc: dict, name: str, path: str) -> None:
    """The .md table of a results document (the json's device, date, commit and rows). Also
    `python bench/harness.py results/<name>-<gpu>.json`: the .md again from a json alone (a
    device run may send back fewer files than it wrote)."""
    rows = doc["rows"]
    extra_keys = sorted({k for r in rows for k in r} - {"op", "mode", "shape", "metric", "value",
                                                        "peer", "peer_value", "ratio"})
    with open(path, "w") as f:
        f.write(f"# {name} on {doc['device']}\n\n")
        f.write(f"Date {doc['date']}, commit {doc['commit']}. Median of CUDA-event timings with the L2 "
                f"flushed before each run; ratio = ours / peer (for `us`, peer / ours): higher is better.\n\n")
        cols = ["op", "mode", "shape", "metric", "value", "peer", "peer_value", "ratio"] + extra_keys
        f.write("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n")
        for r in rows:
            f.write("| " + " | ".join(str(tuple(r[c])) if c == "shape" else str(r.get(c, ""))
                                      for c in cols) + " |\n")


if __name__ == "__main__":
    import sys

    for path in sys.argv[1:]:
        with open(path) as fh:
            document = json.load(fh)
        stem = os.path.basename(path)[: -len(".json")]
        write_md(document, stem.rpartition("-")[0], path[: -len(".json")] + ".md")
        print("wrote", path[: -len(".json")] + ".md")
