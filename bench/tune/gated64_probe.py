"""The gate/up + down pair at 16..64 rows: SwiGLU fused into gate/up, or two ops, in CUDA graphs.

Llama-3-8B's gate/up [28672, 4096] and down [4096, 14336] in the decode layout, per mode and M:
  two     down(qq.swiglu(quantized_matmul(x, gate_up)))          (bench_decode's act "qq")
  fused   down(qq.quantized_matmul_swiglu(x, gate_up_gated))     (act "fused")
  gated0  down(qq.swiglu(quantized_matmul(x, gate_up_gated)))    (the gated layout without the epilogue)
each a graph of 20 back-to-back pairs (harness.capture), replayed; us per pair, the best of 3
interleaved replays. (Session be ran it with a graph_of of its own: three warm-up calls, no replay
after the capture.)
Knobs come from the environment (one process per value).  python bench/tune/gated64_probe.py [M ...]
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from harness import capture, replay_us  # noqa: E402

import qq  # noqa: E402

N = 20  # pairs a graph

MODES = {"nvfp4": dict(mode="nvfp4"), "mxfp8": dict(mode="mxfp8"),
         "affine4": dict(mode="affine", bits=4, group_size=64)}


def main():
    ms = [int(a) for a in sys.argv[1:]] or [16, 32, 64]
    knob = os.environ.get("QQ_KN_SWIGLU_EARLY", "-")
    for mode, kw in MODES.items():
        gu = torch.randn(28672, 4096, device="cuda", dtype=torch.bfloat16) / 64
        dn = torch.randn(4096, 14336, device="cuda", dtype=torch.bfloat16) / 120
        qg, qd = qq.quantize(gu, **kw), qq.quantize(dn, **kw)
        dw, dg, dd = qq.prepare_decode(qg), qq.prepare_decode(qg, gated=True), qq.prepare_decode(qd)
        for m in ms:
            x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
            fns = {"two": lambda: qq.quantized_matmul(qq.swiglu(qq.quantized_matmul(x, dw)), dd),
                   "fused": lambda: qq.quantized_matmul(qq.quantized_matmul_swiglu(x, dg), dd),
                   "gated0": lambda: qq.quantized_matmul(qq.swiglu(qq.quantized_matmul(x, dg)), dd)}
            ref = fns["two"]()
            for name, f in fns.items():  # the three forms give the same bits
                torch.cuda.synchronize()
                if not torch.equal(f(), ref):
                    print(f"MISMATCH {mode} M={m} {name}", flush=True)
            graphs = {name: capture(f, N) for name, f in fns.items()}
            res = {name: [] for name in fns}
            for _ in range(3):
                for name, g in graphs.items():
                    res[name].append(replay_us(g, N))
            print(f"knob={knob} {mode:8s} M={m:2d} " + "  ".join(f"{k2} {min(v):7.2f}" for k2, v in res.items()),
                  flush=True)
            del graphs


if __name__ == "__main__":
    main()
