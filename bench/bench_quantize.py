"""Benchmark of the quantization kernels (cuda/quantize.cu, colwise.cu, dequantize.cu) on the
current GPU.

For each shape and mode: qq.quantize on bf16 input with blocked scales (affine:
linear, its only layout), reported as GB/s (bytes read + written) against the
device copy bandwidth and against torch.compile of the same quantization written
in torch ops, both measured in this run; also qq.dequantize back to bf16. At the
two large shapes also fp32 input and the fp modes' linear scales (rows' columns "x"
and "scales"; quantize_colwise likewise, one orientation and both). The peer copy moves
1 GiB; columns copy_same / ratio_same give a copy of the row's own size and the row
against it (same_size).

    python bench/bench_quantize.py [--quick] [--only quantize|dequantize|colwise|moe|amax]

qq.amax (the nvfp4 global scale of a whole tensor; bytes read against the copy bandwidth, and
torch's x.abs().amax() in the same run) goes to its own table, amax-<gpu>.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Bench, Timer, copy_bandwidth, same_size  # noqa: E402

import qq  # noqa: E402

SHAPES = [(16384, 16384), (8192, 5120), (16, 4096)]
MODES = [("nvfp4", {}), ("mxfp4", {}), ("mxfp8", {}), ("affine4", {"bits": 4}), ("affine8", {"bits": 8})]


def quantize_args(mode: str, kw: dict, layout: str = "blocked") -> dict:
    """qq.quantize's arguments for a mode name of MODES (and bench/tune/q_sweep.py's):
    "affine..." is mode "affine" with linear scales (its only layout); fp modes take `layout`."""
    qmode = "affine" if mode.startswith("affine") else mode
    return dict(kw, mode=qmode, scale_layout="linear" if qmode == "affine" else layout)


def variants(shape):
    """(x dtype, scale layout) pairs measured at a shape: bf16 blocked everywhere; fp32 input and
    linear scales at the two large shapes (the issue's 16384^2 and 8192 x 5120)."""
    if shape not in SHAPES[:2]:
        return [(torch.bfloat16, "blocked")]
    return [(dt, lay) for dt in (torch.bfloat16, torch.float32) for lay in ("blocked", "linear")]


def dtype_name(dt) -> str:
    return str(dt).rpartition(".")[2].replace("bfloat16", "bf16").replace("float32", "fp32")


def cases(shape):
    """(x, variant layout, mode, qq arguments, the row's x / scales columns) for every variant
    and mode at a shape (affine in the "blocked" variant only: its one layout is linear); one
    random x per variant."""
    for xdt, layout in variants(shape):
        x = torch.randn(shape, dtype=xdt, device="cuda")
        for mode, kw in MODES:
            if layout == "linear" and mode.startswith("affine"):
                continue
            qa = quantize_args(mode, kw, layout)
            yield x, layout, mode, qa, dict(x=dtype_name(xdt), scales=qa["scale_layout"])
        del x


def moved_bytes(x, q) -> int:
    """The bytes one quantization of x into q moves: x read; data, scales (, biases) written."""
    return nbytes(x) + sum(nbytes(t) for t in (q.data, q.scales, q.biases) if t is not None)


# ---- torch-op versions of the same quantizations (the torch.compile peer) ----
def _ceil_pow2_exponent(q: torch.Tensor) -> torch.Tensor:
    """Biased UE8M0 exponent of the smallest power of two >= q (q >= 0, fp32)."""
    b = q.view(torch.int32)
    e = (b >> 23) & 0xFF
    m = b & 0x7FFFFF
    return torch.where((m != 0) & (e < 254) & (e > 0), e + 1, e)


def _e2m1_codes(y: torch.Tensor) -> torch.Tensor:
    a = y.abs()
    bounds = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], device=y.device)
    c = torch.bucketize(a, bounds, right=False).to(torch.uint8)
    return c | ((y < 0).to(torch.uint8) << 3)


def _pack4(c: torch.Tensor) -> torch.Tensor:
    return c[..., 0::2] | (c[..., 1::2] << 4)


def torch_mx(x: torch.Tensor, fp4: bool):
    m, k = x.shape
    xg = x.float().view(m, k // 32, 32)
    amax = xg.abs().amax(-1, keepdim=True)
    e = _ceil_pow2_exponent(amax / (6.0 if fp4 else 448.0))
    inv = ((254 - e).clamp(min=1) << 23).view(torch.float32)
    y = xg * inv
    if fp4:
        data = _pack4(_e2m1_codes(y).view(m, k))
    else:
        data = y.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8).view(m, k)
    return data, e.to(torch.uint8).view(m, k // 32)


def torch_nvfp4(x: torch.Tensor):
    m, k = x.shape
    xg = x.float().view(m, k // 16, 16)
    amax = xg.abs().amax(-1, keepdim=True)
    s = (amax / 6.0).clamp(max=448.0).to(torch.float8_e4m3fn)
    f = torch.where(s.float() > 0, 1.0 / s.float(), 0.0)
    data = _pack4(_e2m1_codes(xg * f).view(m, k))
    return data, s.view(torch.uint8).view(m, k // 16)


def torch_affine(x: torch.Tensor, bits: int):
    m, k = x.shape
    xg = x.float().view(m, k // 64, 64)
    wmin = xg.amin(-1, keepdim=True)
    wmax = xg.amax(-1, keepdim=True).clamp(min=0)
    n = (1 << bits) - 1
    scale = ((wmax - wmin) / n).clamp(min=1e-7)
    q = ((xg - wmin) / scale).round().clamp(0, n).to(torch.uint8).view(m, k)
    if bits == 4:
        q = _pack4(q)
    return q, scale.to(x.dtype).view(m, -1), wmin.to(x.dtype).view(m, -1)


def peer_fn(mode: str):
    if mode == "nvfp4":
        return torch_nvfp4
    if mode == "mxfp4":
        return lambda x: torch_mx(x, True)
    if mode == "mxfp8":
        return lambda x: torch_mx(x, False)
    return lambda x: torch_affine(x, int(mode[len("affine"):]))


def torch_mx_cols(x: torch.Tensor, fp4: bool):
    """Column-wise: the same quantization of x^T (torch.compile fuses the transpose)."""
    return torch_mx(x.t(), fp4)


def torch_moe(w: torch.Tensor, tile32: bool):
    """MXFP8 of w [E, D1, D2] along D1, 32x1 or 32x32 scales, data column-major."""
    e, d1, d2 = w.shape
    g = w.float().view(e, d1 // 32, 32, d2)
    amax = g.abs().amax(2, keepdim=True)
    if tile32:
        amax = amax.view(e, d1 // 32, 1, d2 // 32, 32).amax(-1, keepdim=True).expand(
            e, d1 // 32, 1, d2 // 32, 32).reshape(e, d1 // 32, 1, d2)
    ex = _ceil_pow2_exponent(amax / 448.0)
    inv = ((254 - ex).clamp(min=1) << 23).view(torch.float32)
    y = (g * inv).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8).view(e, d1, d2)
    return y.transpose(1, 2).contiguous(), ex.to(torch.uint8)


def nbytes(t) -> int:
    return t.numel() * t.element_size()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer iterations, no torch.compile peer")
    ap.add_argument("--only", choices=["quantize", "dequantize", "colwise", "moe", "amax"], help="one kernel family")
    args = ap.parse_args()
    want = lambda part: args.only is None or args.only == part  # noqa: E731
    timer = Timer(warmup=3 if args.quick else 10, iters=10 if args.quick else 50)
    bench = Bench("quantize")
    copy_gbps = copy_bandwidth(timer)
    print(f"device copy bandwidth: {copy_gbps:.1f} GB/s (read + write)")
    torch.manual_seed(0)
    for shape in SHAPES:
        for x, layout, mode, qa, cols in cases(shape):
            q = qq.quantize(x, **qa)
            moved = moved_bytes(x, q)
            if want("quantize"):
                us = timer(lambda: qq.quantize(x, **qa), moved)
                gbps = moved / (us * 1e-6) / 1e9
                bench.row("quantize", mode, shape, "GBps", gbps, "copy", copy_gbps, us=round(us, 2), **cols,
                          **same_size(timer, gbps, moved))
            # the torch.compile peer: compile time, so one shape and the blocked variant
            if want("quantize") and not args.quick and shape == SHAPES[0] and layout == "blocked":
                fn = torch.compile(peer_fn(mode), dynamic=False)
                fn(x)
                us_tc = timer(lambda: fn(x), moved)
                bench.row("quantize", mode, shape, "us", us, "torch_compile", us_tc, **cols)
            # dequantize back to bf16 (from bf16 x: the codes do not depend on x's dtype, but
            # affine's scale dtype does): bytes = packed + scales (+ biases) + the bf16 output
            dq_moved = moved - nbytes(x) + x.numel() * 2
            if not want("dequantize") or (x.dtype != torch.bfloat16 and not mode.startswith("affine")):
                continue
            us_dq = timer(lambda: qq.dequantize(q, dtype=torch.bfloat16), dq_moved)
            gbps = dq_moved / (us_dq * 1e-6) / 1e9
            bench.row("dequantize", mode, shape, "GBps", gbps, "copy", copy_gbps, us=round(us_dq, 2), **cols,
                      **same_size(timer, gbps, dq_moved))
            if mode == "nvfp4" and layout == "blocked" and x.dtype == torch.bfloat16:
                # with a global scale, as nvfp4 checkpoints have (variant "global_scale")
                qg = qq.quantize(x, **qa, global_scale=qq.amax(x))
                us_g = timer(lambda: qq.dequantize(qg, dtype=torch.bfloat16), dq_moved + 4)
                bench.row("dequantize", mode, shape, "GBps", (dq_moved + 4) / (us_g * 1e-6) / 1e9, "copy",
                          copy_gbps, us=round(us_g, 2), variant="global_scale", **cols)
                del qg
    # ---- the other orientation (scales per group of rows), and both from one read
    for shape in (SHAPES[:2] if want("colwise") else []):
        for x, layout, mode, qa, cols in cases(shape):
            col = qq.quantize_colwise(x, **qa)
            moved = moved_bytes(x, col)
            del col
            us = timer(lambda: qq.quantize_colwise(x, **qa), moved)
            gbps = moved / (us * 1e-6) / 1e9
            bench.row("quantize_colwise", mode, shape, "GBps", gbps, "copy", copy_gbps, us=round(us, 2), **cols,
                      **same_size(timer, gbps, moved))
            if not args.quick and qa["mode"] in ("mxfp4", "mxfp8") and shape == SHAPES[0] and layout == "blocked":
                fn = torch.compile(lambda t, fp4=(qa["mode"] == "mxfp4"): torch_mx_cols(t, fp4), dynamic=False)
                fn(x)
                bench.row("quantize_colwise", mode, shape, "us", us, "torch_compile", timer(lambda: fn(x), moved),
                          **cols)
            moved2 = moved * 2 - nbytes(x)  # one read, both outputs written
            us2 = timer(lambda: qq.quantize_colwise(x, rowwise=True, **qa), moved2)
            gbps2 = moved2 / (us2 * 1e-6) / 1e9
            bench.row("quantize_colwise", mode, shape, "GBps", gbps2, "copy", copy_gbps, us=round(us2, 2),
                      variant="both", **cols, **same_size(timer, gbps2, moved2))
    # ---- MoE 3D MXFP8
    for shape in ([(1, 8192, 5120), (8, 7168, 2048), (32, 7168, 2048)] if want("moe") else []):
        w = torch.randn(shape, dtype=torch.bfloat16, device="cuda")
        for variant in ("32x1", "32x32"):
            d, sc = qq.quantize_moe(w, variant, scale_layout="blocked")
            moved = nbytes(w) + nbytes(d) + nbytes(sc)
            us = timer(lambda: qq.quantize_moe(w, variant, scale_layout="blocked"), moved)
            gbps = moved / (us * 1e-6) / 1e9
            bench.row("quantize_3d", "mxfp8", shape, "GBps", gbps, "copy", copy_gbps, us=round(us, 2),
                      variant=variant, **same_size(timer, gbps, moved))
            # the transposed view of [E, D2, D1] weights (QQGroupedLinear's forward operand)
            wt = w.transpose(1, 2).contiguous().transpose(1, 2)
            ust = timer(lambda: qq.quantize_moe(wt, variant, scale_layout="blocked"), moved)
            gbps = moved / (ust * 1e-6) / 1e9
            bench.row("quantize_3d", "mxfp8", shape, "GBps", gbps, "copy", copy_gbps, us=round(ust, 2),
                      variant=variant + "-tview", **same_size(timer, gbps, moved))
            if not args.quick and shape[0] == 8:
                fn = torch.compile(lambda t, t32=(variant == "32x32"): torch_moe(t, t32), dynamic=False)
                fn(w)
                bench.row("quantize_3d", "mxfp8", shape, "us", us, "torch_compile", timer(lambda: fn(w), moved),
                          variant=variant)
    # ---- amax of a whole tensor (its own table)
    amax_bench = Bench("amax")
    for shape in (SHAPES[:2] if want("amax") else []):
        for dt in (torch.bfloat16, torch.float32):
            x = torch.randn(shape, dtype=dt, device="cuda")
            us = timer(lambda: qq.amax(x), nbytes(x))
            us_t = timer(lambda: x.abs().amax(), nbytes(x))
            amax_bench.row("amax", str(dt).rpartition(".")[2], shape, "GBps", nbytes(x) / (us * 1e-6) / 1e9, "copy",
                           copy_gbps, us=round(us, 2))
            amax_bench.row("amax", str(dt).rpartition(".")[2], shape, "us", us, "torch_amax", us_t)
    for path in (bench.save() if bench.rows else ()) + (amax_bench.save() if amax_bench.rows else ()):
        print("wrote", path)


if __name__ == "__main__":
    main()
