"""Shared helpers of the qq tests: parameter sets, random data, device movement, and
bit-exact comparisons against tests/reference.py."""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pytest

import reference as R

F32 = np.float32
BF16 = R.BF16

DTYPES = [np.dtype(np.float32), np.dtype(np.float16), BF16]
DTYPE_IDS = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16", BF16: "bf16"}


def libqq_path() -> str:
    """The libqq.so.0 that `import qq` loads: the package's lib/ (qq.cmake_prefix_path())."""
    import os

    import qq
    return os.path.join(qq.cmake_prefix_path(), "lib", "libqq.so.0")


def dtype_params(dtypes=None):
    return [pytest.param(d, id=DTYPE_IDS[np.dtype(d)]) for d in (dtypes or DTYPES)]


#: CPU always; CUDA in gpu-marked variants (skipped without a device, see conftest.py).
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@dataclass(frozen=True)
class FpCfg:
    """One fp quantization setting (mode, rounding, fp8 format, global scale or not)."""

    mode: str
    rounding: str = "ceil"
    fp8_format: str = "e4m3"
    global_scale: bool = False

    @property
    def group_size(self) -> int:
        return R.DEFAULTS[self.mode][0]

    @property
    def bits(self) -> int:
        return R.DEFAULTS[self.mode][1]

    def __str__(self) -> str:
        parts = [self.mode]
        if self.mode == "mxfp8":
            parts.append(self.fp8_format)
        if self.mode != "nvfp4":
            parts.append(self.rounding)
        if self.global_scale:
            parts.append("gs")
        return "-".join(parts)

    def kwargs(self, gs=None) -> dict:
        """Keyword arguments shared by qq.quantize and reference.quantize."""
        kw = {"mode": self.mode}
        if self.mode in ("mxfp4", "mxfp8"):
            kw["rounding"] = self.rounding
        if self.mode == "mxfp8":
            kw["fp8_format"] = self.fp8_format
        if gs is not None:
            kw["global_scale"] = gs
        return kw


FP_CFGS = [
    FpCfg("nvfp4"),
    FpCfg("nvfp4", global_scale=True),
    FpCfg("mxfp4", "ceil"),
    FpCfg("mxfp4", "floor"),
    FpCfg("mxfp8", "ceil", "e4m3"),
    FpCfg("mxfp8", "floor", "e4m3"),
    FpCfg("mxfp8", "ceil", "e5m2"),
    FpCfg("mxfp8", "floor", "e5m2"),
]
FP_PARAMS = [pytest.param(c, id=str(c)) for c in FP_CFGS]
AFFINE_PARAMS = [pytest.param(b, g, id=f"affine{b}-g{g}") for b in R.AFFINE_BITS for g in R.AFFINE_GROUPS]


# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------

#: Group multipliers: ordinary, tiny (subnormal scales, fp32/bf16 subnormal inputs) and
#: huge (E4M3 scale saturation without a global scale) magnitudes, within each dtype.
MAGNITUDES = {
    np.dtype(np.float32): [1e-30, 1e30, 1e-40, 1e-3, 1e3, 2.0 ** -120],
    BF16: [1e-30, 1e30, 1e-39, 1e-3, 1e3, 2.0 ** -120],
    np.dtype(np.float16): [1e-6, 1e-3, 1e3, 2.0 ** -14],
}


def random_data(rng, shape, dtype, group_size=32, varied=True) -> np.ndarray:
    """Normal random numbers in `dtype`; if varied, about 40 % of the groups of
    `group_size` along the last axis are scaled by an extreme magnitude. Where every group
    drew one so small that the tensor's amax fell below 1e-29 (a few groups, all tiny:
    ~3e-4 for 4 groups), the first group keeps magnitude 1, so that the amax is always
    usable as an nvfp4 global scale (a host scale below 1e-30 is refused: docs/errors.md;
    1e-29 leaves room for bfloat16's rounding)."""
    dtype = np.dtype(dtype)
    x = rng.standard_normal(shape).astype(F32)
    if varied and x.size:
        k = shape[-1]
        g = group_size if k % group_size == 0 else k
        xg = x.reshape(-1, k // g, g)
        mags = np.array([1.0] + MAGNITUDES[dtype], np.float64)
        p = np.array([0.6] + [0.4 / len(MAGNITUDES[dtype])] * len(MAGNITUDES[dtype]))
        m = rng.choice(mags, size=xg.shape[:2], p=p)
        scaled = (xg * m[..., None]).astype(F32)
        if np.abs(scaled).max() < 1e-29:
            m.flat[0] = 1.0
            scaled = (xg * m[..., None]).astype(F32)
        x = scaled.reshape(shape)
    return cast(x, dtype)


def cast(x, dtype) -> np.ndarray:
    """float32 -> dtype by RNE (bfloat16 through the reference's bit rounding)."""
    dtype = np.dtype(dtype)
    x = np.asarray(x, F32)
    if dtype == BF16:
        return R.f32_to_bf16(x)
    with np.errstate(over="ignore"):
        return x.astype(dtype)


def poison(shape, dtype) -> np.ndarray:
    """An out= buffer full of 0xAB bytes, so unwritten bytes show."""
    buf = np.empty(shape, dtype)
    buf.reshape(-1).view(np.uint8)[...] = 0xAB
    return buf


# ---------------------------------------------------------------------------
# Devices and frameworks
# ---------------------------------------------------------------------------

def torch_device(device):
    """torch.device(device) for a test parametrized over "cpu" / "cuda"; skips "cuda" when
    torch has no CUDA (a CPU-only torch beside a CUDA libqq)."""
    import torch
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    return torch.device(device)


def capture(graph, **kw):
    """torch.cuda.graph(graph, **kw) after a garbage collection. An earlier test can leave a
    CUDA graph in a reference cycle (an exception's traceback holds its frame); destroyed by
    the collector in the middle of this capture, it invalidates the capture (destroying a
    graph is a prohibited call there: bench/tune/capture_gc_probe.py). Collected first, the
    capture sees only what the test does (session ax: one gather test failed so, once)."""
    import gc
    import torch
    gc.collect()
    return torch.cuda.graph(graph, **kw)


def try_import(name):
    try:
        return importlib.import_module(name)
    except Exception:
        return None


def to_device(a, device):
    """A NumPy array on `device`: itself for "cpu"; a torch CUDA tensor (or a CuPy array
    when torch is missing) for "cuda". None passes through."""
    if a is None or device == "cpu":
        return a
    a = np.array(a, order="C", copy=True)  # (np.ascontiguousarray would make a 0-d array 1-d)
    torch = try_import("torch")
    if torch is not None and torch.cuda.is_available():
        return numpy_to_torch(a, torch).cuda()
    cupy = try_import("cupy")
    if cupy is not None:
        if a.dtype == BF16:
            pytest.skip("CuPy has no bfloat16 and torch with CUDA is not installed")
        return cupy.asarray(a)
    pytest.skip("neither torch with CUDA nor CuPy is installed to put data on the GPU")


def numpy_to_torch(a, torch=None):
    torch = torch or importlib.import_module("torch")
    a = np.array(a, copy=True)  # writable, contiguous
    if a.dtype == BF16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def to_numpy(a) -> Optional[np.ndarray]:
    """A qq result (NumPy, torch, CuPy or JAX array) as a NumPy array on the host; torch
    bfloat16 becomes ml_dtypes.bfloat16 and 1-byte float8 becomes uint8 (bit patterns)."""
    if a is None or isinstance(a, np.ndarray):
        return a
    mod = type(a).__module__
    if mod.startswith("torch"):
        import torch

        t = a.detach().cpu()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(BF16)
        if t.is_floating_point() and t.element_size() == 1:
            return t.view(torch.uint8).numpy()
        return t.numpy()
    if mod.startswith("cupy"):
        return a.get()
    return np.asarray(a)


def as_bytes(a) -> np.ndarray:
    """A 1-byte array (uint8, int8, float8) as uint8 bit patterns."""
    a = to_numpy(a)
    assert a.dtype.itemsize == 1, f"expected a 1-byte dtype, got {a.dtype}"
    return a.view(np.uint8)


def framework_of(a) -> str:
    if isinstance(a, np.ndarray):
        return "numpy"
    return type(a).__module__.split(".")[0]


# ---------------------------------------------------------------------------
# Comparisons
# ---------------------------------------------------------------------------

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _is_nan(a):
    if a.dtype.kind in "ui":
        return np.zeros(a.shape, bool)
    return np.isnan(a.astype(np.float32))


def _fmt(v):
    v = np.asarray(v)
    bits = v.view(_UINT[v.dtype.itemsize])
    if v.dtype.kind in "ui":
        return f"0x{int(bits):02X}"
    return f"{float(v.astype(np.float64))!r} (0x{int(bits):0{2 * v.dtype.itemsize}X})"


def assert_bits_equal(got, want, what="array", context=None):
    """Same shape, same dtype, same bit patterns (any NaN matches any NaN; -0 != +0).

    On failure, lists the first mismatches; `context(index)` may add a line each (e.g. the
    input group that produced it)."""
    got = to_numpy(got)
    want = np.asarray(want)
    assert got is not None, f"{what}: got None"
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    ub = _UINT[got.dtype.itemsize]
    eq = got.view(ub) == want.view(ub)  # same itemsize: a view of any layout
    eq |= _is_nan(got) & _is_nan(want)
    if eq.all():
        return
    bad = np.argwhere(~eq) if got.ndim else [()]
    lines = [f"{what}: {len(bad)} of {eq.size} differ"]
    for idx in bad[:6]:
        idx = tuple(int(i) for i in idx)
        line = f"  at {idx}: got {_fmt(got[idx])}, expected {_fmt(want[idx])}"
        if context is not None:
            line += "\n    " + context(idx)
        lines.append(line)
    raise AssertionError("\n".join(lines))


def assert_quantized_equal(got, ref: R.RefQuantized, x=None, what="quantize"):
    """qq.quantize's result equals the reference bit for bit: packed data, scales (and
    affine biases). In groups whose zero codes may carry either sign (amax == 0, or an
    nvfp4 scale of 0) the codes must be +-0, i.e. only the sign bit may differ."""
    assert got.mode == ref.mode, (got.mode, ref.mode)
    scales = to_numpy(got.scales)
    if ref.mode == "affine":
        assert_bits_equal(scales, ref.scales, f"{what}: scales")
        assert_bits_equal(got.biases, ref.biases, f"{what}: biases")
    else:
        assert got.biases is None, f"{what}: biases must be None for {ref.mode}"
        assert_bits_equal(as_bytes(scales), ref.scales, f"{what}: scales")
    data = as_bytes(got.data)
    assert data.shape == ref.data.shape, f"{what}: data shape {data.shape}, expected {ref.data.shape}"
    if ref.loose_sign.any():
        sign = 0x8 if ref.bits == 4 else 0x80
        codes = R.unpack(data, ref.bits, ref.shape[-1])
        loose = np.repeat(ref.loose_sign, ref.group_size, axis=-1).reshape(codes.shape)
        codes = np.where(loose, codes & ~np.uint8(sign), codes).astype(np.uint8)
        assert_bits_equal(codes, ref.codes, f"{what}: element codes",
                          context=_code_context(x, ref))
    else:
        assert_bits_equal(data, ref.data, f"{what}: packed data",
                          context=_code_context(x, ref, packed=True))


def _code_context(x, ref, packed=False):
    """Describes the input group behind a mismatching byte or code."""
    if x is None:
        return None
    xf = np.asarray(x).astype(np.float32)

    def ctx(idx):
        col = idx[-1] * 8 // ref.bits if packed else idx[-1]
        g0 = (col // ref.group_size) * ref.group_size
        row = tuple(idx[:-1])
        sl = slice(g0, g0 + ref.group_size)
        return (f"input group {row}[{g0}:{g0 + ref.group_size}]: {xf[row][sl]!r}\n"
                f"    expected codes {ref.codes[row][sl]!r}")

    return ctx


def assert_matmul_close(got, ref: R.MatmulRef, what="matmul", dtype=None):
    got = to_numpy(got)
    if dtype is not None:
        assert got.dtype == np.dtype(dtype), f"{what}: dtype {got.dtype}, expected {np.dtype(dtype)}"
    msg = R.matmul_mismatch(got, ref)
    assert msg is None, f"{what}: {msg}"


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------

def raises(exc_type, names, fn, *args, **kwargs):
    """fn(*args, **kwargs) raises exc_type and the message names one of `names`."""
    if isinstance(names, str):
        names = (names,)
    with pytest.raises(exc_type) as info:
        fn(*args, **kwargs)
    msg = str(info.value)
    assert any(re.search(r"(?<![A-Za-z0-9_])" + re.escape(n) + r"(?![A-Za-z0-9_])", msg) for n in names), (
        f"{exc_type.__name__} message should name {' or '.join(names)}: {msg!r}")
    return info.value


# ---------------------------------------------------------------------------
# Running qq against the reference
# ---------------------------------------------------------------------------

def qq_quantize(x, device="cpu", **kw):
    """qq.quantize on `device` (the global scale moves along)."""
    import qq

    kw = dict(kw)
    if kw.get("global_scale") is not None:
        kw["global_scale"] = to_device(np.asarray(kw["global_scale"], F32), device)
    return qq.quantize(to_device(x, device), **kw)


def check_quantize(x, device="cpu", what="quantize", **kw) -> R.RefQuantized:
    """qq.quantize(x, **kw) on `device` equals reference.quantize(x, **kw) bit for bit; on
    the GPU it also equals qq's own CPU result bit for bit. Returns the reference."""
    ref = R.quantize(x, **kw)
    got = qq_quantize(x, device, **kw)
    assert_quantized_equal(got, ref, x, what=f"{what} [{device}]")
    if device != "cpu":
        cpu = qq_quantize(x, "cpu", **kw)
        assert_bits_equal(as_bytes(got.data), as_bytes(cpu.data), "GPU vs CPU data")
        if ref.mode == "affine":
            assert_bits_equal(got.scales, cpu.scales, "GPU vs CPU scales")
            assert_bits_equal(got.biases, cpu.biases, "GPU vs CPU biases")
        else:
            assert_bits_equal(as_bytes(got.scales), as_bytes(cpu.scales), "GPU vs CPU scales")
    return ref


def ref_dequantize_qa(qa, dtype=None) -> np.ndarray:
    """The reference's dequantization of a qq.QuantizedArray's own bytes and parameters
    (so that the sign of zero codes in scale-0 groups, which quantize may choose, is
    carried through instead of judged twice)."""
    gs = None if qa.global_scale is None else to_numpy(qa.global_scale)
    scales = to_numpy(qa.scales)
    if qa.mode != "affine":
        scales = scales.view(np.uint8)
    return R.dequantize(as_bytes(qa.data), scales, to_numpy(qa.biases), qa.group_size, qa.bits,
                        qa.mode, global_scale=gs, scale_layout=qa.scale_layout,
                        fp8_format=qa.fp8_format, dtype=dtype)
