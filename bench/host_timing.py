"""Wall-clock timing for latency-bound benchmarks (per-call host cost included).

bench/harness.py times kernels with CUDA events (what the GPU spends); the rows here
time what a user's Python loop sees instead: N calls back to back, then one
synchronize, divided by N (time.perf_counter). When the GPU work per call is shorter
than the host work this is the host cost per call; when it is longer, the GPU time.
Peers are timed the same way in the same process, interleaved with ours (A B A B ...)
so that clock or thermal drift hits both, and the median over repeats is reported.

HostBench is harness.Bench with a save() that also works without a GPU (device name
and file tag given by the caller) and says in the .md how the rows were timed.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import time

from harness import HERE, Bench, git_commit


def loop_us(fn, n: int, sync=None) -> float:
    """Microseconds per call of a loop of n calls of fn followed by one sync()."""
    if sync is not None:
        sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    if sync is not None:
        sync()
    return (time.perf_counter() - t0) * 1e6 / n


def interleaved(fns: dict, n: int, reps: int, sync=None, warmup: int = 3, stat=statistics.median) -> dict:
    """us per call of each fn in fns (name -> callable), each timed as a loop of n calls +
    one sync, the fns taking turns within every repeat; stat (default the median) over the
    repeats, or stat=None for the list of per-repeat times."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    if sync is not None:
        sync()
    times = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            times[k].append(loop_us(fn, n, sync))
    return times if stat is None else {k: stat(v) for k, v in times.items()}


def cpu_name() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"CPU {model} ({os.cpu_count()} cores)"


class HostBench(Bench):
    """Bench whose save() takes the device name and file tag (no torch.cuda needed)."""

    def save(self, device: str, tag: str, how: str, notes: list[str] | None = None) -> tuple[str, str]:
        out_dir = os.environ.get("QQ_BENCH_OUT") or os.path.join(HERE, "results")
        os.makedirs(out_dir, exist_ok=True)
        base = os.path.join(out_dir, f"{self.name}-{tag}")
        commit = git_commit()
        if commit == "unknown":
            commit = os.environ.get("QQ_COMMIT", commit)
        doc = {"device": device, "date": datetime.date.today().isoformat(), "commit": commit,
               "rows": self.rows}
        with open(base + ".json", "w") as f:
            json.dump(doc, f, indent=1)
        std = ["op", "mode", "shape", "metric", "value", "peer", "peer_value", "ratio"]
        extra_keys = sorted({k for r in self.rows for k in r} - set(std))
        cols = std + extra_keys
        with open(base + ".md", "w") as f:
            f.write(f"# {self.name} on {device}\n\n")
            f.write(f"Date {doc['date']}, commit {doc['commit']}. {how} "
                    f"ratio = ours / peer (for `us`, peer / ours): higher is better.\n\n")
            for n in notes or []:
                f.write(n.rstrip() + "\n\n")
            f.write("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n")
            for r in self.rows:
                f.write("| " + " | ".join(str(tuple(r[c])) if c == "shape" else str(r.get(c, ""))
                                          for c in cols) + " |\n")
        return base + ".json", base + ".md"
