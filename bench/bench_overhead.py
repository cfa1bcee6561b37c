"""Per-call host cost of qq's Python API, against the framework's own ops on the same inputs.

Every row times a loop of N calls followed by one synchronize (what a user's Python loop
sees, host work included; bench/host_timing.py), ours and the peer interleaved in the
same process, median over repeats. Rows: op "overhead", variant = the qq function,
metric "us" (per call), ratio = peer / ours (higher is better; 1/ratio = ours in units of
the peer, which is what the targets bound).

GPU (torch CUDA tensors, bf16):
  - quantize (nvfp4, mxfp8), dequantize (nvfp4, mxfp8), amax of x [16, 4096]
    vs torch `x + x` on that x              (peer torch_add,  target: ours <= 1.5x)
  - quantized_matmul (w from qq.quantize) and qqmm (w from qq.prepare_weight), nvfp4 and
    mxfp8, x [1, 4096], w [4096, 4096]
    vs torch bf16 `x @ w.T`                 (peer torch_bf16, target: ours <= 1.0x)
CPU (a [1, 32] x; the matmuls with a [32, 32] w):
  - NumPy float32 arrays vs NumPy `x + x`   (peer numpy_add,  target: ours <= 5x)
  - torch CPU bf16 tensors vs torch `x + x` (peer torch_add,  target: ours <= 2x)

    python bench/bench_overhead.py [--cpu-only | --gpu-only] [--quick]

Writes overhead-<gpu>.json/.md (e.g. overhead-h100) and overhead-cpu.json/.md to
$QQ_BENCH_OUT or bench/results. Runtime: GPU part well under a minute on an H100 (9 rows,
9 repeats of 1000-call loops of ours and the peer); CPU part about a minute on a 2-core
machine. On a GPU host run `--gpu-only` unless its CPU numbers are wanted too (they would
be written as overhead-cpu as well). --gpu-only exits 1 when there is no GPU part to run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import traceback

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import gpu_tag  # noqa: E402
from host_timing import HostBench, cpu_name, interleaved  # noqa: E402

import qq  # noqa: E402

HOW = ("Each value is the wall-clock time per call of a loop of N calls followed by one "
       "synchronize (host cost included), ours and the peer interleaved in one process, median "
       "of the repeats (`min_us`, `peer_min_us`: the fastest repeat); `x_peer` = ours / peer "
       "(the targets bound it). `outputs_alloc_us`: allocating the call's results alone "
       "(empty_like of each, timed in the same loops) - the framework allocator's share of "
       "the call, which the peer `x + x` pays once.")


def cases_gpu(dev: str = "cuda"):
    """(variant, mode, shape, ours, peer name, peer fn, target) on CUDA bf16 tensors."""
    torch.manual_seed(0)
    x = torch.randn((16, 4096), dtype=torch.bfloat16, device=dev)
    add = lambda: x + x  # noqa: E731
    out = []
    for mode in ("nvfp4", "mxfp8"):
        out.append(("quantize", mode, x.shape, lambda m=mode: qq.quantize(x, mode=m), "torch_add", add, 1.5))
    for mode in ("nvfp4", "mxfp8"):
        qa = qq.quantize(x, mode=mode)
        out.append(("dequantize", mode, x.shape, lambda qa=qa: qq.dequantize(qa), "torch_add", add, 1.5))
    out.append(("amax", "-", x.shape, lambda: qq.amax(x), "torch_add", add, 1.5))
    n, k = 4096, 4096
    x1 = torch.randn((1, k), dtype=torch.bfloat16, device=dev)
    w = torch.randn((n, k), dtype=torch.bfloat16, device=dev) * 0.02
    gemm = lambda: x1 @ w.t()  # noqa: E731
    for mode in ("nvfp4", "mxfp8"):
        qw = qq.quantize(w, mode=mode)
        out.append(("quantized_matmul", mode, (1, n, k), lambda qw=qw: qq.quantized_matmul(x1, qw),
                    "torch_bf16", gemm, 1.0))
    for mode in ("nvfp4", "mxfp8"):
        pw = qq.prepare_weight(w, mode=mode)
        out.append(("qqmm", mode, (1, n, k), lambda pw=pw: qq.qqmm(x1, pw), "torch_bf16", gemm, 1.0))
    return out


def cases_cpu(framework: str):
    rng = np.random.default_rng(0)
    xn = rng.standard_normal((1, 32)).astype(np.float32)
    wn = (rng.standard_normal((32, 32)) * 0.1).astype(np.float32)
    if framework == "numpy":
        x, w, peer, target = xn, wn, "numpy_add", 5.0
    else:
        x = torch.from_numpy(xn).to(torch.bfloat16)
        w = torch.from_numpy(wn).to(torch.bfloat16)
        peer, target = "torch_add", 2.0
    add = lambda: x + x  # noqa: E731
    out = []
    for mode in ("nvfp4", "mxfp8"):
        out.append(("quantize", mode, x.shape, lambda m=mode: qq.quantize(x, mode=m), peer, add, target))
    for mode in ("nvfp4", "mxfp8"):
        qa = qq.quantize(x, mode=mode)
        out.append(("dequantize", mode, x.shape, lambda qa=qa: qq.dequantize(qa), peer, add, target))
    out.append(("amax", "-", x.shape, lambda: qq.amax(x), peer, add, target))
    for mode in ("nvfp4", "mxfp8"):
        qw = qq.quantize(w, mode=mode)
        out.append(("quantized_matmul", mode, (1, 32, 32), lambda qw=qw: qq.quantized_matmul(x, qw),
                    peer, add, target))
    for mode in ("nvfp4", "mxfp8"):
        pw = qq.prepare_weight(w, mode=mode)
        out.append(("qqmm", mode, (1, 32, 32), lambda pw=pw: qq.qqmm(x, pw), peer, add, target))
    return out


def _outputs(result) -> list:
    """The arrays a call returned (a QuantizedArray's data / scales / biases, or the array)."""
    if isinstance(result, qq.QuantizedArray):
        return [a for a in (result.data, result.scales, result.biases) if a is not None]
    return [result]


def _alloc_fn(result):
    """A function that allocates what the call allocated for its results, the same shapes
    and dtypes, through the framework's own empty_like: the part of a call's host cost that
    is the framework's allocator (torch's `x + x` pays it once, quantize twice)."""
    outs = _outputs(result)
    if isinstance(outs[0], np.ndarray):
        return lambda: [np.empty_like(a) for a in outs]
    return lambda: [torch.empty_like(a) for a in outs]


def run_cases(bench: HostBench, cases, n: int, reps: int, sync, extra: dict) -> list[str]:
    errors = []
    for variant, mode, shape, ours, peer, peer_fn, target in cases:
        try:
            alloc = _alloc_fn(ours())  # fail fast (and outside the timing) if the call is refused
            runs = interleaved({"ours": ours, "peer": peer_fn, "alloc": alloc}, n=n, reps=reps,
                               sync=sync, stat=None)
        except Exception as e:  # noqa: BLE001 - record and go on
            msg = f"{variant} {mode}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            errors.append(msg)
            print("ERROR", msg, flush=True)
            if sync is not None:
                try:
                    sync()
                except Exception:  # noqa: BLE001
                    pass
            continue
        t = {k: statistics.median(v) for k, v in runs.items()}
        x_peer = t["ours"] / t["peer"]
        # the fastest repeat too: on a shared machine it is the least disturbed one
        bench.row("overhead", mode, shape, "us", t["ours"], peer, t["peer"], variant=variant,
                  x_peer=round(x_peer, 3), target_x=target, meets_target=bool(x_peer <= target),
                  min_us=round(min(runs["ours"]), 3), peer_min_us=round(min(runs["peer"]), 3),
                  x_peer_min=round(min(runs["ours"]) / min(runs["peer"]), 3),
                  outputs_alloc_us=round(t["alloc"], 3),
                  calls_per_loop=n, repeats=reps, **extra)
    return errors


def summary(bench: HostBench, title: str) -> None:
    print(f"\n{title}")
    print(f"{'variant':>17} {'mode':>6} {'fw':>6} {'ours us':>9} {'peer':>11} {'peer us':>9} "
          f"{'ours/peer':>9} {'(min)':>7} {'target':>7}  ok  {'alloc us':>8}")
    for r in bench.rows:
        print(f"{r['variant']:>17} {r['mode']:>6} {r.get('framework', ''):>6} {r['value']:9.2f} "
              f"{r['peer']:>11} {r['peer_value']:9.2f} {r['x_peer']:9.2f} {r['x_peer_min']:7.2f} "
              f"{'<=' + str(r['target_x']):>7}  "
              f"{'yes' if r['meets_target'] else 'NO':>3}  {r.get('outputs_alloc_us', 0):8.2f}")


def save(bench, device, tag, errors, notes):
    notes = list(notes)
    if errors:
        notes.append("Not measured (the call raised):\n\n" + "\n".join(f"- {e}" for e in errors))
    for p in bench.save(device, tag, HOW, notes):
        print("wrote", p)


def run_gpu(quick: bool) -> bool:
    """False when there is no GPU part to run."""
    if not torch.cuda.is_available():
        print("GPU part skipped: torch sees no CUDA device")
        return False
    if not qq.build_info().get("cuda"):
        print("GPU part skipped: this qq build has no CUDA")
        return False
    bench = HostBench("overhead")
    n, reps = (200, 3) if quick else (1000, 9)
    errors = run_cases(bench, cases_gpu(), n, reps, torch.cuda.synchronize,
                       {"framework": "torch", "device_kind": "cuda", "dtype": "bfloat16"})
    summary(bench, f"per-call cost on {torch.cuda.get_device_name()} (loop of {n} calls + one synchronize)")
    notes = ["The matmul rows reuse one weight per loop: a 4096 x 4096 bf16 weight (32 MB) and "
             "its quantized forms fit in the H100's 50 MB L2, for the peer and for us alike."]
    save(bench, torch.cuda.get_device_name(), gpu_tag(), errors, notes)
    return True


def run_cpu(quick: bool) -> None:
    bench = HostBench("overhead")
    n, reps = (500, 3) if quick else (3000, 9)
    errors = []
    load0 = os.getloadavg() if hasattr(os, "getloadavg") else None
    for fw in ("numpy", "torch"):
        dtype = "float32" if fw == "numpy" else "bfloat16"
        errors += run_cases(bench, cases_cpu(fw), n, reps, None,
                            {"framework": fw, "device_kind": "cpu", "dtype": dtype})
    summary(bench, f"per-call cost on {cpu_name()} (loop of {n} calls; torch threads {torch.get_num_threads()})")
    notes = [f"Host: {cpu_name()}, torch {torch.__version__}, numpy {np.__version__}, "
             f"torch.get_num_threads() = {torch.get_num_threads()}."]
    if load0 is not None:
        notes.append(f"1-minute load average {load0[0]:.1f} before the run, {os.getloadavg()[0]:.1f} after "
                     f"(on {os.cpu_count()} cores: above that count, other processes took turns with this one).")
    if (os.cpu_count() or 0) <= 4:
        notes.append(f"This was a {os.cpu_count()}-core CI-class machine (shared, no GPU): the "
                     "absolute numbers are slower than a workstation's; the ratios are what to read.")
    save(bench, cpu_name(), "cpu", errors, notes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--cpu-only", action="store_true", help="only the CPU part (runs anywhere)")
    g.add_argument("--gpu-only", action="store_true", help="only the CUDA part")
    ap.add_argument("--quick", action="store_true", help="fewer calls per loop and repeats")
    args = ap.parse_args()
    failed = False
    if not args.cpu_only:
        try:
            ran = run_gpu(args.quick)
            failed = args.gpu_only and not ran   # --gpu-only without a GPU part is a failure
        except Exception:  # noqa: BLE001 - the CPU part can still run
            traceback.print_exc()
            failed = True
    if not args.gpu_only:
        run_cpu(args.quick)
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
