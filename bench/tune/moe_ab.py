"""A/B of QQGroupedLinear's mxfp8 weight operands on the exact path (Hopper), in one process:
A = q(W)'s values written twice a step (quantize_dequantize_moe(values=True, transposed=True):
[E, N, K] for the forward, a transposed copy [E, K, N] for dgrad), B = written once, dgrad
reading v.transpose(1, 2) (what qq.torch does now). bench_moe's layer and timer; the two
variants alternate, three rounds, us a step (forward + backward) and a forward.

    python bench/tune/moe_ab.py
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_moe import layers  # noqa: E402
from harness import Timer, forward_only, training_step  # noqa: E402

import qq  # noqa: E402
import qq.torch as qqt  # noqa: E402

new_ops = qqt._grouped_weight_operands


def old_ops(weight, mode):
    if mode == "mxfp8" and qqt._values_path(weight):
        v, vt = qq.quantize_dequantize_moe(weight, values=True, transposed=True)
        return {"w": v, "values": True}, {"w": vt, "values": True}
    return new_ops(weight, mode)


def main():
    timer = Timer(warmup=2, iters=10)
    t, d, f = 16384, 4096, 2048
    for e in (8, 32):
        torch.manual_seed(0)
        x, dy, _, bf16_layer, qq_layer = layers(e, t, d, f)
        moved = 4 * t * d * 2 * 3
        res = {"A": [], "B": [], "Af": [], "Bf": []}
        for _ in range(3):
            for name, ops in (("A", old_ops), ("B", new_ops)):
                qqt._grouped_weight_operands = ops
                res[name].append(timer(training_step(qq_layer, x, dy, qq_layer.params), moved))
                res[name + "f"].append(timer(forward_only(qq_layer, x), moved))
        qqt._grouped_weight_operands = new_ops
        fmt = lambda v: " ".join(f"{u:8.1f}" for u in v)  # noqa: E731
        print(f"E={e:3d} step A(two copies) {fmt(res['A'])} | B(view) {fmt(res['B'])}")
        print(f"E={e:3d} fwd  A(two copies) {fmt(res['Af'])} | B(view) {fmt(res['Bf'])}")
        del qq_layer, bf16_layer, x, dy
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
