"""python -m qq: what this libqq build is, which path each operation takes on the devices
it sees (for the matmuls: the route a tiny call took, qq.last_route()), and a small
accuracy / timing demo on a synthetic layer.

    python -m qq                        # CPU demo, W 4096 x 4096, x 16 x 4096
    python -m qq --size 1024 --device cuda
    python -m qq bench [--quick] [--json PATH] [--plot PATH]   # the main benchmarks (qq/_bench.py)

The demo quantizes one random float32 "layer" W (seeded, normal * 0.02) in every mode and
reports, per mode: the SQNR of dequantize(quantize(W)) against W, and the relative error
||y - y_ref|| / ||y_ref|| of qqmm (fp modes: x quantized on the fly too) and
quantized_matmul (weight-only) against y_ref = x @ W.T in float64, with the time each
call took. --device cuda needs torch or CuPy to move the data to the GPU.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import qq
from qq import _qq

OPS = ("quantize", "dequantize", "swizzle_scales", "amax", "qqmm", "quantized_matmul")

# Which path each operation takes, per backend. The one place to update as GPU kernels land;
# on a CUDA device, an operation whose probe call succeeds is reported as on the GPU
# whatever this table says.
PATHS = {
    "cpu": {op: "CPU reference backend" for op in OPS},
    "cuda": {op: "not yet implemented on the GPU (CPU only)" for op in OPS},
}
GPU_OK = "CUDA backend (runs on the GPU)"

# The demo's modes: (label, quantize kwargs, has a qqmm).
MODES = (
    ("affine4", dict(mode="affine", bits=4), False),
    ("affine8", dict(mode="affine", bits=8), False),
    ("nvfp4", dict(mode="nvfp4"), True),
    ("nvfp4+gs", dict(mode="nvfp4", global_scale=True), True),
    ("mxfp4", dict(mode="mxfp4"), True),
    ("mxfp8", dict(mode="mxfp8"), True),
)


def _version(v: int) -> str:
    """cuBLAS's major * 10000 + minor * 100 + patch as "13.1.0" ("-" for 0)."""
    return f"{v // 10000}.{v // 100 % 100}.{v % 100}" if v else "-"


def _print_build() -> dict:
    info = qq.build_info()
    cuda = qq.cuda_info()
    print(f"qq {qq.__version__}")
    print(f"  CUDA:           {'on' if info['cuda'] else 'off'}"
          + (f" (CUDA {info['cuda_version']})" if info["cuda"] else ""))
    if info["cuda"]:
        print(f"  architectures:  {', '.join(info['archs']) or '-'}")
        print(f"  CUDA driver:    {cuda['driver_version'] or 'none'}")
        print(f"  cuBLASLt:       built against {_version(info['cublaslt'])}; "
              + (f"loaded {cuda['cublaslt_version']} ({cuda['cublaslt_path']})" if cuda["cublaslt_loaded"]
                 else f"not loaded: {cuda['cublaslt_note']}"))
    print(f"  cuBLASLt preload: {info['cublaslt_preload']}")
    info["cuda_info"] = cuda
    return info


def _probe_gpu(device: int) -> dict:
    """Run each operation once on tiny uninitialized libqq device buffers: success means
    the GPU path exists. The buffers' contents do not matter for that."""
    empty = lambda shape, dtype="float32": _qq._device_empty(shape, dtype, device)  # noqa: E731
    paths = {}

    def probe(op, fn):
        try:
            fn()
            paths[op] = GPU_OK
        except qq.NotSupportedError:
            paths[op] = PATHS["cuda"][op]
        except Exception as e:  # noqa: BLE001 - report, do not stop the overview
            paths[op] = f"error: {type(e).__name__}: {e}"

    x = empty((128, 64))
    probe("quantize", lambda: qq.quantize(x, mode="nvfp4"))
    data, scales = empty((128, 32), "uint8"), empty((128, 4), "uint8")
    probe("dequantize", lambda: qq.dequantize(data, scales, mode="nvfp4"))
    probe("swizzle_scales", lambda: qq.swizzle_scales(scales))
    probe("amax", lambda: qq.amax(x))
    probe("qqmm", lambda: qq.qqmm(empty((16, 64)), empty((32, 64)), mode="nvfp4"))
    probe("quantized_matmul", lambda: qq.quantized_matmul(
        empty((16, 64)), empty((32, 32), "uint8"), empty((32, 1)), empty((32, 1)),
        mode="affine"))
    return paths


# Tiny matmuls whose route (qq.last_route()) `python -m qq` reports: (label, mode, M, packed w,
# quantized_matmul instead of qqmm). K = 512, N = 256.
ROUTE_PROBES = (
    ("qqmm nvfp4", "nvfp4", 256, False, False),
    ("qqmm mxfp8", "mxfp8", 256, False, False),
    ("qqmm mxfp4", "mxfp4", 256, False, False),
    ("qqmm nvfp4, packed w", "nvfp4", 1, True, False),
    ("qqmm nvfp4, packed w", "nvfp4", 16, True, False),
    ("qqmm mxfp8, packed w", "mxfp8", 256, True, False),
    ("quantized_matmul nvfp4", "nvfp4", 1, True, True),
    ("quantized_matmul nvfp4", "nvfp4", 256, True, True),
)


def _routes(device):
    """[(label, route or error)] for ROUTE_PROBES on `device` ("cpu" or a CUDA id). On a GPU
    with block-scaled tensor cores a qqmm that did not take that route is asked for it once
    more, so the line says why (the refusal's message)."""
    if device == "cpu":
        empty = lambda shape, dtype="float32": np.zeros(shape, dtype=getattr(np, dtype, np.float32))  # noqa: E731
    else:
        empty = lambda shape, dtype="float32": _qq._device_empty(shape, dtype, device)  # noqa: E731
    blackwell = device != "cpu" and _qq.device_capability(device)[0] in (10, 11, 12)
    lines = []
    for label, mode, m, packed, qmm in ROUTE_PROBES:
        k, n = 512, 256
        try:
            w = empty((n, k))
            if packed or qmm:
                w = qq.quantize(w, mode=mode, scale_layout="linear")
            if qmm:
                x = empty((m, k), "bfloat16" if device != "cpu" else "float32")
                qq.quantized_matmul(x, w)
            else:
                x = empty((m, k))
                qq.qqmm(x, w, mode=mode)
            route = qq.last_route()
            if blackwell and not qmm and route != "blockscaled":
                try:
                    qq.qqmm(x, w, mode=mode, route="blockscaled")
                except qq.NotSupportedError as e:
                    route += f" (blockscaled: {e})"
            lines.append((f"{label} (M={m})", route))
        except Exception as e:  # noqa: BLE001 - report, do not stop the overview
            lines.append((f"{label} (M={m})", f"error: {type(e).__name__}: {e}"))
    return lines


def _print_devices(info: dict) -> None:
    n = qq.device_count()
    note = info["cuda_info"]["device_note"] if "cuda_info" in info else ""
    print(f"\nCUDA devices: {n}" + (f" - {note}" if not n and note else ""))
    for d in range(n):
        try:
            major, minor = _qq.device_capability(d)
            print(f"  cuda:{d}  compute capability {major}.{minor}")
        except Exception as e:  # noqa: BLE001
            print(f"  cuda:{d}  ({e})")
    backends = [("cpu", PATHS["cpu"])]
    if n and info["cuda"]:
        backends.append(("cuda:0", _probe_gpu(0)))
    print("\nPaths:")
    width = max(len(op) for op in OPS)
    for name, paths in backends:
        print(f"  {name}")
        for op in OPS:
            print(f"    {op:<{width}}  {paths[op]}")
    print("\nRoutes (qq.last_route() after a tiny call; docs/api.md \"Dispatch\", docs/blackwell.md):")
    targets = [("cpu", "cpu")]
    if n and info["cuda"]:
        targets += [(f"cuda:{d}", d) for d in range(n)]
    for name, device in targets:
        lines = _routes(device)
        width = max(len(label) for label, _ in lines)
        print(f"  {name}")
        for label, route in lines:
            print(f"    {label:<{width}}  route {route}")


class _Device:
    """Moves NumPy arrays to the demo device and back, and synchronizes for timing."""

    def __init__(self, kind: str):
        self.kind = kind
        self.lib = None
        if kind == "cuda":
            try:
                import torch
                if not torch.cuda.is_available():
                    raise ImportError("torch sees no CUDA device")
                self.lib = torch
            except ImportError:
                try:
                    import cupy
                    self.lib = cupy
                except ImportError:
                    sys.exit("--device cuda needs torch (with CUDA) or CuPy to move the demo "
                             "data to the GPU")

    def put(self, a: np.ndarray):
        if self.lib is None:
            return a
        if self.lib.__name__ == "torch":
            return self.lib.from_numpy(a).cuda()
        return self.lib.asarray(a)

    def get(self, a) -> np.ndarray:
        if isinstance(a, np.ndarray):
            return a
        if self.lib.__name__ == "torch":
            return a.float().cpu().numpy()
        return self.lib.asnumpy(a)

    def sync(self):
        if self.lib is None:
            return
        if self.lib.__name__ == "torch":
            self.lib.cuda.synchronize()
        else:
            self.lib.cuda.get_current_stream().synchronize()


def _timed(dev: _Device, fn):
    """fn() and its wall time; on the GPU after one untimed warm-up call (first-call costs:
    handle creation, memory pool growth, module loading)."""
    if dev.kind == "cuda":
        fn()
    dev.sync()
    t = time.perf_counter()
    r = fn()
    dev.sync()
    return r, time.perf_counter() - t


def _rel(y: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(y.astype(np.float64) - ref) / np.linalg.norm(ref))


def _demo(size: int, batch: int, device: str, seed: int) -> None:
    dev = _Device(device)
    rng = np.random.default_rng(seed)
    w_np = (rng.standard_normal((size, size)) * 0.02).astype(np.float32)
    x_np = rng.standard_normal((batch, size)).astype(np.float32)
    y_ref = x_np.astype(np.float64) @ w_np.astype(np.float64).T
    w, x = dev.put(w_np), dev.put(x_np)

    print(f"\nDemo on {device}: W {size}x{size} float32 (normal * 0.02, seed {seed}), "
          f"x {batch}x{size} (normal); y_ref = x @ W.T in float64")
    head = (f"  {'mode':<9} {'quantize':>9} {'SQNR dB':>8} {'dequant':>9} "
            f"{'qqmm err':>9} {'time':>9} {'qmm err':>9} {'time':>9}")
    print(head)
    print("  " + "-" * (len(head) - 2))
    ms = lambda t: f"{t * 1e3:7.1f}ms"  # noqa: E731
    missing = False
    for label, kwargs, has_qqmm in MODES:
        kwargs = dict(kwargs)
        gs_w = gs_x = None
        if kwargs.pop("global_scale", False):
            gs_w, gs_x = qq.amax(w), qq.amax(x)
            kwargs["global_scale"] = gs_w
        try:
            wq, t_q = _timed(dev, lambda: qq.quantize(w, **kwargs))
        except qq.NotSupportedError as e:
            print(f"  {label:<9} quantize is not supported here: {e}")
            continue
        # Each later column on its own: one missing GPU path must not hide the others.
        cols = [ms(t_q)]
        try:
            wd, t_d = _timed(dev, lambda: qq.dequantize(wq, dtype="float32"))
            err = dev.get(wd).astype(np.float64) - w_np
            sqnr = 10 * np.log10(np.sum(w_np.astype(np.float64) ** 2) / np.sum(err ** 2))
            cols += [f"{sqnr:8.2f}", ms(t_d)]
        except qq.NotSupportedError:
            cols += ["n/a", "n/a"]
        if has_qqmm:
            try:
                y, t_mm = _timed(dev, lambda: qq.qqmm(x, wq, global_scale_x=gs_x, dtype="float32"))
                cols += [f"{_rel(dev.get(y), y_ref):9.4f}", ms(t_mm)]
            except qq.NotSupportedError:
                cols += ["n/a", "n/a"]
        else:
            cols += ["-", "-"]
        try:
            y, t_qmm = _timed(dev, lambda: qq.quantized_matmul(x, wq, dtype="float32"))
            cols += [f"{_rel(dev.get(y), y_ref):9.4f}", ms(t_qmm)]
        except qq.NotSupportedError:
            cols += ["n/a", "n/a"]
        print(f"  {label:<9} {cols[0]:>9} {cols[1]:>8} {cols[2]:>9} {cols[3]:>9} {cols[4]:>9} "
              f"{cols[5]:>9} {cols[6]:>9}")
        missing = missing or "n/a" in cols
    if missing:
        print("  (n/a: not supported on this device yet; see Paths above)")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:
        from . import _bench
        return _bench.main(argv[1:])
    ap = argparse.ArgumentParser(prog="python -m qq", description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=4096, help="W is size x size (default 4096)")
    ap.add_argument("--batch", type=int, default=16, help="rows of x (default 16)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="where the demo runs (default cpu)")
    ap.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    ap.add_argument("--no-demo", action="store_true", help="only print build and devices")
    args = ap.parse_args(argv)

    info = _print_build()
    _print_devices(info)
    if not args.no_demo:
        _demo(args.size, args.batch, args.device, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
