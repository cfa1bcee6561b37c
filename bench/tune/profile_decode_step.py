"""Where the time of one graphed decode step goes, kernel by kernel: bench_decode's 32
Llama-3-8B-shaped layers (decode-layout weights), one CUDA graph, a few replays under
torch.profiler. Kernels are taken in launch order and assigned to their place in a layer
(qkv, o, gate/up, the two SwiGLU kernels, down); printed per place: mean duration, mean gap to
the previous kernel's end (negative: programmatic dependent launch overlapped them), and the
bytes-over-time of the matmuls against a copy bandwidth measured in the same run.

    MODES=nvfp4-decode,affine4-decode M=1 ACT=qq python bench/tune/profile_decode_step.py

ACT: the SwiGLU of bench_decode's step, "qq" (qq.swiglu: one kernel; bench_decode's default
too), "torch" (F.silu and mul: two) or "fused" (decode modes: qq.quantized_matmul_swiglu on
the gate/up weight in the gated layout, the SwiGLU in the gate/up kernel: no kernel of its own).
"""
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_decode import ACTS, LLAMA3_8B, MODES, capture_graph, make_step, make_weights, qq_mm_strided  # noqa: E402

import qq  # noqa: E402

LAYERS = 32
ACT = os.environ.get("ACT", "qq")
PLACES = ["qkv", "o", "gate/up"] + {"qq": ["swiglu"], "torch": ["silu", "mul"], "fused": []}[ACT] + ["down"]


def copy_gbps():
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(10):
        b.copy_(a)
    t1.record()
    torch.cuda.synchronize()
    return 2 * a.numel() * 10 / (t0.elapsed_time(t1) * 1e-3) / 1e9


def main():
    m = int(os.environ.get("M", "1"))
    cp = copy_gbps()
    print(f"copy {cp:.0f} GB/s; M = {m}; {LAYERS} layers", flush=True)
    weights = make_weights(LLAMA3_8B, LAYERS, "cuda")
    for mode in os.environ.get("MODES", "nvfp4-decode").split(","):
        kw = MODES[mode]
        qw, wbytes = [], [0] * 4
        for lw in weights:
            ql = []
            for j, w in enumerate(lw):
                extra = {"global_scale": qq.amax(w)} if kw["mode"] == "nvfp4" else {}
                q = qq.quantize(w, **kw, **extra)
                if len(qw) == 0:
                    wbytes[j] = sum(t.numel() * t.element_size() for t in (q.data, q.scales, q.biases)
                                    if t is not None)
                ql.append(qq.prepare_decode(q) if mode.endswith("-decode") else q)
            qw.append(ql)
        gated = None
        if ACT == "fused":  # (the gated layout: decode modes only)
            gated = [qq.prepare_decode(ql[2].quantized, gated=True) for ql in qw]
        step = make_step(LLAMA3_8B, qw, qq_mm_strided, ACTS[ACT], gated)
        x = torch.randn((m, LLAMA3_8B["hidden"]), dtype=torch.bfloat16, device="cuda")
        g, y = capture_graph(step, x)
        for _ in range(5):
            g.replay()
        torch.cuda.synchronize()
        reps = 5
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                g.replay()
            torch.cuda.synchronize()
        ks = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                     and "memcpy" not in e.name.lower() and "memset" not in e.name.lower()),
                    key=lambda e: e.time_range.start)
        places = PLACES
        per = len(places)
        if len(ks) % (reps * LAYERS) == 0 and len(ks) // (reps * LAYERS) > per:
            # staged x (x_stage_kernel before some matmuls, M > 8): the places by launch order
            per = len(ks) // (reps * LAYERS)
            places = [f"k{j}" for j in range(per)]
        if len(ks) != reps * LAYERS * per:
            print(f"{mode}: {len(ks)} kernels for {reps} replays, expected {reps * LAYERS * per}; names: "
                  f"{sorted(set(e.name[:60] for e in ks))}", flush=True)
            continue
        dur = {p: [] for p in places}
        gap = {p: [] for p in places}
        adds = {p: [] for p in places}
        for i, e in enumerate(ks):
            p = places[i % per]
            dur[p].append(e.time_range.end - e.time_range.start)
            if i % (LAYERS * per):  # not the first kernel of a replay
                gap[p].append(e.time_range.start - ks[i - 1].time_range.end)
                # what this kernel adds to the step: the time from the previous kernel's end to its own
                # (kernels launched early by programmatic dependent launch wait inside their duration)
                adds[p].append(e.time_range.end - ks[i - 1].time_range.end)
        step_us = [ks[(r + 1) * LAYERS * per - 1].time_range.end - ks[r * LAYERS * per].time_range.start
                   for r in range(reps)]
        print(f"\n{mode} (act {ACT}): step {statistics.median(step_us):.1f} us (first kernel start to last end), "
              f"sum of kernel durations {sum(statistics.mean(v) for v in dur.values()) * LAYERS:.1f} us", flush=True)
        mm = {"qkv": 0, "o": 1, "gate/up": 2, "down": 3}
        for p in places:
            line = (f"  {p:8s} {statistics.mean(dur[p]):7.2f} us  gap before {statistics.mean(gap[p]):6.2f} us"
                    f"  adds {statistics.mean(adds[p]):6.2f} us")
            if p in mm:
                gbps = wbytes[mm[p]] / (statistics.mean(dur[p]) * 1e-6) / 1e9
                line += f"  {gbps:6.0f} GB/s = {gbps / cp:.2f} of copy"
            line += f"  [{ks[places.index(p)].name[:70]}]"
            print(line, flush=True)
        del g, y, qw, step, gated
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
