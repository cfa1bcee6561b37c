"""End-to-end decode step of a Llama-3-8B-shaped stack with weight-only quantized matmuls.

32 layers of random weights (per layer: fused q/k/v [6144, 4096], o [4096, 4096], fused
gate/up [28672, 4096], down [4096, 14336]); a step runs only the 4 matmuls per layer:
    qkv = x @ Wqkv.T;  a = qkv[:, :4096]  (attention-output stand-in)
    h = a @ Wo.T;      gu = h @ Wgu.T;     act = silu(gu[:, :14336]) * gu[:, 14336:]
    x = act @ Wdown.T
with bf16 activations x [M, 4096], M = 1, 4, 16 and 64 (the decode kernel's largest M). The
SwiGLU (`act`) is torch's F.silu and mul in the torch peers; in our rows (column "act",
--acts) qq.swiglu ("qq", the default: one kernel; at M = 1 the down matmul starts during it),
torch's ("torch"), or ("fused", decode layout only) qq.quantized_matmul_swiglu on the gate/up
weight prepared with qq.prepare_decode(w, gated=True): the SwiGLU made inside the gate/up
matmul's kernel.
Ours: qq.quantized_matmul on weights
quantized once with qq.quantize (nvfp4 with global_scale = qq.amax(w), mxfp4, mxfp8,
affine 4-bit group 64; linear scales). Peers, all measured in this run:
  - torch_bf16: the same step with torch bf16 `x @ w.T`, eager;
  - torch_bf16_graph: that step captured once in a CUDA graph (torch.cuda.graph), replayed;
  - limit: the bytes of the quantized weights (data + scales (+ biases)) read once at the
    device copy bandwidth (torch copy_ of 1 GiB, bytes read + written: harness.copy_bandwidth).
Eager: warm-up steps, then loops of `--iters` steps each followed by one synchronize
(wall clock, host cost included), median over 3 loops. Graphed: one step captured, then
loops of `--replays` replays + one synchronize, median over 3 loops.

Rows: op "decode_step", mode, shape [M], metric "us", value = our time per decode step
(= the time per generated token of each of the M sequences; tokens_per_s counts all M),
"graph": false/true, one row per peer, ratio = peer / ours. A qq call that cannot be
captured gives a row with value 0 and "error". Mode "bf16" rows are torch's own step
against the limit of its bf16 weights (context for the others).

    python bench/bench_decode.py                       (H100: about 1-2 minutes, ~22 GB peak)
    python bench/bench_decode.py --layers 4 --modes nvfp4 --ms 1   (quick check)
    python bench/bench_decode.py --cpu-smoke           (2 tiny layers on the CPU: code path only,
                                                        written to $QQ_BENCH_OUT or /tmp)

Writes decode-<gpu>.json/.md (e.g. decode-h100) to $QQ_BENCH_OUT or bench/results, after
every mode (a crash or time-out keeps the modes done so far).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
import traceback

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from host_timing import HostBench, cpu_name  # noqa: E402

import qq  # noqa: E402

LLAMA3_8B = dict(hidden=4096, qkv=6144, inter=14336)
SMOKE = dict(hidden=256, qkv=384, inter=256)  # K of every weight a multiple of 256 (the decode layout)
MODES = {
    "nvfp4": dict(mode="nvfp4"),
    "mxfp4": dict(mode="mxfp4"),
    "mxfp8": dict(mode="mxfp8"),
    "affine4": dict(mode="affine", bits=4, group_size=64),
    "affine8": dict(mode="affine", bits=8, group_size=64),
    # the same weights in the decode layout (qq.prepare_decode)
    "nvfp4-decode": dict(mode="nvfp4"),
    "mxfp4-decode": dict(mode="mxfp4"),
    "mxfp8-decode": dict(mode="mxfp8"),
    "affine4-decode": dict(mode="affine", bits=4, group_size=64),
    "affine8-decode": dict(mode="affine", bits=8, group_size=64),
}
HOW = ("Wall-clock time per decode step: eager = loops of steps followed by one synchronize "
       "(host cost included), graphed = loops of CUDA graph replays followed by one synchronize; "
       "median of 3 loops.")


def nbytes(t) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def make_weights(cfg, layers, device, seed=0):
    """bf16 weights [N, K] per layer: qkv, o, gate/up, down; std 1/sqrt(K)."""
    g = torch.Generator(device=device).manual_seed(seed)
    h, q, i = cfg["hidden"], cfg["qkv"], cfg["inter"]
    out = []
    for _ in range(layers):
        lw = []
        for n, k in ((q, h), (h, h), (2 * i, h), (h, i)):
            w = torch.empty((n, k), dtype=torch.bfloat16, device=device)
            w.normal_(0.0, k ** -0.5, generator=g)
            lw.append(w)
        out.append(lw)
    return out


def torch_swiglu(gu):
    i = gu.shape[-1] // 2
    return F.silu(gu[:, :i]) * gu[:, i:]


# the SwiGLU between gate/up and down: torch's silu and mul (the peer's, and qq rows with
# act "torch"), or qq.swiglu (one kernel; at one row it lets the down matmul start early)
# "fused": no separate SwiGLU (make_step's `gated`)
ACTS = {"torch": torch_swiglu, "qq": qq.swiglu, "fused": None}


def make_step(cfg, layers, mm, act_fn=torch_swiglu, gated=None):
    """gated: per layer, the gate/up weight as a gated DecodeWeight (act "fused")."""
    h = cfg["hidden"]

    def step(x):
        for li, (wqkv, wo, wgu, wdown) in enumerate(layers):
            qkv = mm(x, wqkv)
            a = qkv[:, :h]
            hh = mm(a, wo)
            if gated is not None:
                act = qq.quantized_matmul_swiglu(hh, gated[li])
            else:
                act = act_fn(mm(hh, wgu))
            x = mm(act, wdown)
        return x
    return step


def torch_mm(x, w):
    return x @ w.t()


def qq_mm_strided(x, qw):
    return qq.quantized_matmul(x, qw)


def qq_mm_contig(x, qw):
    return qq.quantized_matmul(x if x.is_contiguous() else x.contiguous(), qw)


def module_layers(weights, kw, decode_layout: bool):
    """Per layer, the four weights as qq.torch.QuantizedLinear layers (no bias), quantized
    by QuantizedLinear.from_linear as qq.torch.quantize_ does."""
    import qq.torch as qqt
    out = []
    for lw in weights:
        ml = []
        for w in lw:
            lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, device="meta", dtype=w.dtype)
            lin.weight = torch.nn.Parameter(w, requires_grad=False)
            ml.append(qqt.QuantizedLinear.from_linear(lin, kw["mode"], group_size=kw.get("group_size"),
                                                      bits=kw.get("bits"), decode_layout=decode_layout))
        out.append(ml)
    return out


def module_mm(x, layer):
    return layer(x)


def time_eager(step, x, sync, warmup, iters, reps=3) -> float:
    for _ in range(warmup):
        step(x)
    sync()
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            step(x)
        sync()
        times.append((time.perf_counter() - t0) * 1e6 / iters)
    return statistics.median(times)


def capture_graph(step, x):
    """(graph, output) of step(x) captured in a CUDA graph, after a warm-up on a side stream
    as torch's docs ask before capture. Keep the output alive while the graph is replayed."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step(x)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = step(x)
    return g, out


def time_graph(step, x, replays, reps=3) -> float:
    g, out = capture_graph(step, x)
    try:
        g.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(replays):
                g.replay()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e6 / replays)
        return statistics.median(times)
    finally:
        del g, out


def short(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"[:300]


def cuda_ok() -> bool:
    try:
        torch.cuda.synchronize()
        return True
    except Exception:  # noqa: BLE001
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--modes", default=",".join(MODES), help="comma list of " + ", ".join(MODES))
    ap.add_argument("--ms", default="1,4,16,64", help="comma list of M (tokens per step)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20, help="eager steps per timed loop")
    ap.add_argument("--replays", type=int, default=50, help="graph replays per timed loop")
    ap.add_argument("--acts", default="qq,fused",
                    help="comma list of the SwiGLU of the qq rows: qq (qq.swiglu), torch (F.silu * "
                         "mul, as the torch peer), fused (qq.quantized_matmul_swiglu on a gated "
                         "gate/up weight; decode-layout modes only); column 'act'")
    ap.add_argument("--module", action="store_true",
                    help="also run each mode's step through qq.torch.QuantizedLinear layers (rows with impl "
                         "'module'; decode_layout=True for the -decode modes)")
    ap.add_argument("--no-graph", action="store_true")
    ap.add_argument("--budget-s", type=float, default=200.0,
                    help="start no new mode after this many seconds (the rows so far are kept)")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="2 tiny layers on the CPU, eager only: checks the code path, no meaningful numbers")
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            ap.error(f"unknown mode {m!r}; known: {', '.join(MODES)}")
    ms = [int(m) for m in args.ms.split(",") if m]
    acts = [a for a in args.acts.split(",") if a]
    if not acts:
        ap.error("--acts: name at least one of " + ", ".join(ACTS))
    for a in acts:
        if a not in ACTS:
            ap.error(f"unknown act {a!r}; known: {', '.join(ACTS)}")

    if args.cpu_smoke:
        device, cfg, n_layers, graphs = "cpu", SMOKE, min(args.layers, 2), False
        args.warmup, args.iters = min(args.warmup, 2), min(args.iters, 3)
        os.environ.setdefault("QQ_BENCH_OUT", os.path.join(tempfile.gettempdir(), "qq-bench-smoke"))
        sync = lambda: None  # noqa: E731
        dev_name, tag = cpu_name(), "cpu-smoke"
    else:
        if not torch.cuda.is_available():
            sys.exit("bench_decode: no CUDA device (use --cpu-smoke for a CPU check of the code path)")
        device, cfg, n_layers, graphs = "cuda", LLAMA3_8B, args.layers, not args.no_graph
        sync = torch.cuda.synchronize
        from harness import Timer, copy_bandwidth, gpu_tag
        dev_name, tag = torch.cuda.get_device_name(), gpu_tag()

    t_start = time.perf_counter()
    bench = HostBench("decode")
    notes: list[str] = []
    shape_note = (f"{n_layers} layers, hidden {cfg['hidden']}, qkv {cfg['qkv']}, intermediate {cfg['inter']}; "
                  f"eager: {args.warmup} warm-up steps, 3 loops of {args.iters}; "
                  + (f"graphed: 3 loops of {args.replays} replays. " if graphs else "no CUDA graphs. ")
                  + "value = us per decode step "
                  "(each of the M sequences gets one token per step).")
    notes.append(shape_note)
    notes.append("act: the SwiGLU between gate/up and down in our rows, qq = qq.swiglu (one kernel), "
                 "torch = F.silu and mul (the torch peers' own, always), fused = "
                 "qq.quantized_matmul_swiglu on a gated decode-layout gate/up weight (SwiGLU in the "
                 "gate/up kernel; decode-layout modes only).")

    def save():
        for p in bench.save(dev_name, tag, HOW, notes):
            print("wrote", p, flush=True)

    # copy bandwidth (the limit's denominator), bytes read + written
    if device == "cuda":
        copy_gbps = copy_bandwidth(Timer(warmup=3, iters=20))
    else:
        src = torch.empty(1 << 24, dtype=torch.float32).normal_()
        dst = torch.empty_like(src)
        dst.copy_(src)
        t0 = time.perf_counter()
        for _ in range(5):
            dst.copy_(src)
        copy_gbps = 2 * nbytes(src) * 5 / (time.perf_counter() - t0) / 1e9
    print(f"device {dev_name}; copy bandwidth {copy_gbps:.1f} GB/s (read + write)", flush=True)
    notes.append(f"Copy bandwidth measured in this run: {copy_gbps:.1f} GB/s (read + written); "
                 f"limit = weight bytes / that bandwidth.")

    def limit_us(wbytes: int) -> float:
        return wbytes / (copy_gbps * 1e9) * 1e6

    weights = make_weights(cfg, n_layers, device)
    bf16_bytes = sum(nbytes(w) for lw in weights for w in lw)
    print(f"{n_layers} layers, bf16 weights {bf16_bytes / 1e9:.2f} GB ({time.perf_counter() - t_start:.1f} s)",
          flush=True)
    xs = {m: torch.randn((m, cfg["hidden"]), dtype=torch.bfloat16, device=device) for m in ms}

    # peers: torch bf16 eager and graphed, once per M
    peer_eager, peer_graph = {}, {}
    torch_step = make_step(cfg, weights, torch_mm)
    for m in ms:
        peer_eager[m] = time_eager(torch_step, xs[m], sync, args.warmup, args.iters)
        bench.row("decode_step", "bf16", [m], "us", peer_eager[m], "limit", limit_us(bf16_bytes),
                  graph=False, impl="torch", weight_bytes=bf16_bytes, layers=n_layers,
                  tokens_per_s=round(m * 1e6 / peer_eager[m], 1))
        if graphs:
            try:
                peer_graph[m] = time_graph(torch_step, xs[m], args.replays)
                bench.row("decode_step", "bf16", [m], "us", peer_graph[m], "limit", limit_us(bf16_bytes),
                          graph=True, impl="torch", weight_bytes=bf16_bytes, layers=n_layers,
                          tokens_per_s=round(m * 1e6 / peer_graph[m], 1))
            except Exception as e:  # noqa: BLE001
                print("torch graph failed:", short(e), flush=True)
                notes.append(f"torch bf16 graph capture failed at M={m}: {short(e)}")
    if device == "cuda":
        torch.cuda.empty_cache()
    save()

    dead = False
    for mode in modes:
        if dead:
            break
        if time.perf_counter() - t_start > args.budget_s:
            left = modes[modes.index(mode):]
            print(f"time budget of {args.budget_s:.0f} s spent; not run: {', '.join(left)}", flush=True)
            notes.append(f"Not run (time budget of {args.budget_s:.0f} s spent): {', '.join(left)}.")
            save()
            break
        kw = MODES[mode]
        t_mode = time.perf_counter()
        qweights = None
        try:
            qweights = []
            for lw in weights:
                ql = []
                for w in lw:
                    extra = {"global_scale": qq.amax(w)} if kw["mode"] == "nvfp4" else {}
                    q = qq.quantize(w, **kw, **extra)
                    ql.append(qq.prepare_decode(q) if mode.endswith("-decode") else q)
                qweights.append(ql)
            sync()
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            notes.append(f"{mode}: quantizing the weights failed: {short(e)}")
            qweights = None
            dead = device == "cuda" and not cuda_ok()
            save()
            continue
        packed = [getattr(q, "quantized", q) for ql in qweights for q in ql]  # a DecodeWeight's bytes: its packed form's
        qbytes = sum(nbytes(q.data) + nbytes(q.scales) + nbytes(q.biases) for q in packed)
        lim = limit_us(qbytes)
        # can quantized_matmul read the strided attention stand-in qkv[:, :hidden] as it is?
        mm, x_note = qq_mm_strided, "strided"
        try:
            qkv = qq.quantized_matmul(xs[max(ms)], qweights[0][0])
            qq.quantized_matmul(qkv[:, :cfg["hidden"]], qweights[0][1])
            sync()
        except Exception as e:  # noqa: BLE001 - a general failure shows up again in the timed rows
            mm, x_note = qq_mm_contig, "contiguous copy"
            notes.append(f"{mode}: qkv[:, :hidden] refused as x ({short(e)}); a .contiguous() copy is "
                         f"made before the o projection.")
        gated = None
        if "fused" in acts and mode.endswith("-decode"):
            try:
                gated = [qq.prepare_decode(ql[2].quantized, gated=True) for ql in qweights]
                sync()
            except Exception as e:  # noqa: BLE001
                notes.append(f"{mode}: the gated gate/up layout failed: {short(e)}")
        def measure(step, common) -> bool:
            """Eager and graphed rows of `step` at every M; True when the CUDA context died."""
            for m in ms:
                x = xs[m]
                try:
                    us = time_eager(step, x, sync, args.warmup, args.iters)
                except Exception as e:  # noqa: BLE001
                    err = short(e)
                    print(f"{mode} M={m} eager failed: {err}", flush=True)
                    for peer, pv in (("torch_bf16", peer_eager[m]), ("limit", lim)):
                        bench.row("decode_step", mode, [m], "us", 0.0, peer, pv, graph=False, error=err, **common)
                    if device == "cuda" and not cuda_ok():
                        return True
                    continue
                tps = round(m * 1e6 / us, 1)
                bench.row("decode_step", mode, [m], "us", us, "torch_bf16", peer_eager[m], graph=False,
                          tokens_per_s=tps, **common)
                bench.row("decode_step", mode, [m], "us", us, "limit", lim, graph=False, tokens_per_s=tps, **common)
                if not graphs:
                    continue
                try:
                    gus = time_graph(step, x, args.replays)
                except Exception as e:  # noqa: BLE001
                    err = short(e)
                    print(f"{mode} M={m} graph capture/replay failed: {err}", flush=True)
                    for peer, pv in (("torch_bf16_graph", peer_graph.get(m, 0.0)), ("limit", lim)):
                        bench.row("decode_step", mode, [m], "us", 0.0, peer, pv, graph=True, error=err, **common)
                    if not cuda_ok():
                        notes.append(f"{mode} M={m}: the CUDA context failed after the graph error; "
                                     f"later points were not run.")
                        return True
                    continue
                gtps = round(m * 1e6 / gus, 1)
                if m in peer_graph:
                    bench.row("decode_step", mode, [m], "us", gus, "torch_bf16_graph", peer_graph[m], graph=True,
                              tokens_per_s=gtps, **common)
                bench.row("decode_step", mode, [m], "us", gus, "limit", lim, graph=True, tokens_per_s=gtps, **common)
            return False

        step = None
        for act in acts:
            if act == "fused" and gated is None:
                continue  # (packed weights: the two ops; the decode layout only)
            step = make_step(cfg, qweights, mm, ACTS[act], gated if act == "fused" else None)
            dead = measure(step, dict(layers=n_layers, weight_bytes=qbytes, attn_x=x_note, act=act))
            if dead:
                break
        if args.module and not dead:
            # the same weights through qq.torch.QuantizedLinear layers, as a model converted by
            # qq.torch.quantize_ runs them (decode_layout=True for the -decode modes)
            gated = step = mods = None
            try:
                mods = module_layers(weights, kw, mode.endswith("-decode"))
                step = make_step(cfg, mods, module_mm, qq.swiglu)
                dead = measure(step, dict(layers=n_layers, weight_bytes=qbytes, attn_x="strided", act="qq",
                                          impl="module"))
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                notes.append(f"{mode}: the QuantizedLinear rows failed: {short(e)}")
            del mods
        del step, qweights
        gc.collect()
        if device == "cuda" and not dead:
            torch.cuda.empty_cache()
        print(f"{mode}: {time.perf_counter() - t_mode:.1f} s", flush=True)
        save()

    # short table: one line per (mode, M, graph)
    print(f"\ndecode step, {n_layers} layers ({time.perf_counter() - t_start:.0f} s total)")
    print(f"{'mode':>14} {'act':>6} {'M':>3} {'graph':>5} {'us/step':>9} {'torch us':>9} {'vs torch':>8} "
          f"{'limit us':>9} {'of limit':>8}  error")
    by_key: dict = {}
    for r in bench.rows:
        act = (r.get("act") or "") + ("/mod" if r.get("impl") == "module" else "")
        by_key.setdefault((r["mode"], act, r["shape"][0], r["graph"]), []).append(r)
    for (mode, act, m, g), rows in by_key.items():
        us = rows[0]["value"]
        tp = next((r for r in rows if r["peer"].startswith("torch")), None)
        lp = next((r for r in rows if r["peer"] == "limit"), None)
        err = rows[0].get("error", "")
        torch_us = peer_graph.get(m, 0.0) if g else peer_eager.get(m, 0.0)
        print(f"{mode:>14} {act:>6} {m:>3} {str(g):>5} {us:9.1f} {torch_us:9.1f} "
              f"{(tp['ratio'] if tp else torch_us / us if us else 0):8.2f} "
              f"{(lp['peer_value'] if lp else 0):9.1f} {(lp['ratio'] if lp else 0):8.2f}  {err}")
    if dead:
        sys.exit(1)


if __name__ == "__main__":
    main()
