"""Seeded fuzz test over every public op of `qq` on NumPy (CPU) arrays.

Each test draws a fixed number of random calls from a fixed seed (reproducible in CI; set
QQ_FUZZ_SEED=<int> to explore other seeds and QQ_FUZZ_SCALE=<float> to run more or fewer
calls). A call is a valid request (random shapes including 0-size, 1, ragged and
non-multiples of 128; float32 / float16 / bfloat16; every mode, group_size, bits, rounding,
scale_layout, fp8_format; strided, transposed, negative-stride, offset and read-only views)
with at most one mutation (a wrong dtype, shape, enum string, int, out= buffer, aliasing,
None where an array is required, ...). The property, per call:

* the call returns a result equal to tests/reference.py's (bit for bit for quantize,
  quantize_colwise, quantize_moe, dequantize, swizzle/unswizzle_scales, amax; within
  reference.matmul_mismatch's fp32-accumulation bound for qqmm, grouped_qqmm,
  quantized_matmul and prepare_weight + qqmm), computed on a contiguous copy of the inputs
  taken before the call; or
* it raises ValueError / TypeError / qq.QQError (or a subclass) whose message names the
  function (``quantize:``, ``qqmm:``, ...) and the offending argument.

Mutations that must be refused ("raise") fail when accepted; unusual layouts that libqq
may take or refuse ("either") must give the reference's answer when taken. Anything else -
another exception type, a crash, a message naming neither the function nor the argument,
a wrong result, a valid request refused - is a failure. Each test collects every distinct
failure (deduplicated by op, mutation, kind of failure and message shape) and reports them
all with a reproducer.

Defects that are known (being fixed) or were found by this test are recognised by narrow
signatures in KNOWN and printed as known instead of failing the fuzz tests; each also has a
minimal reproducer in test_fuzz_known_defect, marked xfail(strict=False), which XPASSes
once it is fixed. QQ_FUZZ_KNOWN=fail makes the fuzz tests fail on them too.

The property can fail: test_fuzz_catches_planted_bugs runs the same generators and
checker against planted bugs - reference.quantize / dequantize / swizzle / amax with one
flipped bit, reference.qqmm / quantized_matmul 1 % off in one element - and asserts that
each is reported as "wrong-result"; and it feeds the checker an op raising RuntimeError, a
message without the argument, a message without the function, an invalid call that
returns and a valid call that raises, asserting each is reported. (With QQ_FUZZ_KNOWN=fail
the fuzz tests themselves fail on the defects listed in KNOWN.)
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
import traceback

import ml_dtypes
import numpy as np
import pytest

import qq
import reference as R
from helpers import FpCfg, as_bytes, assert_bits_equal, assert_quantized_equal, cast, to_numpy
from test_colwise import ref_moe
from test_grouped import ref_wgrad_expert

F32 = np.float32
BF16 = R.BF16
FLOATS = (np.dtype(np.float32), np.dtype(np.float16), BF16)
FP_MODES = ("nvfp4", "mxfp4", "mxfp8")
BAD_DTYPES = (np.int8, np.int32, np.int64, np.float64, np.complex64, np.bool_, np.uint8, np.int16)
BAD_ENUMS = ("", "NVFP4", "bogus", "linear ", 4, None, b"ceil")
BAD_INTS = (2 ** 31, 2 ** 63, -1, 0, 7, 1.5, "32", -(2 ** 31))
ACCEPTED = (ValueError, TypeError, qq.QQError)

SEED = int(os.environ.get("QQ_FUZZ_SEED", "20240611"))
SCALE = float(os.environ.get("QQ_FUZZ_SCALE", "6"))
# Every defect in KNOWN is fixed; a signature seen again is a regression and fails the run
# (QQ_FUZZ_KNOWN=report only prints it).
STRICT_KNOWN = os.environ.get("QQ_FUZZ_KNOWN", "fail") == "fail"


# ---------------------------------------------------------------------------
# Known defects: (reason, predicate on a Failure). Narrow on purpose.
# ---------------------------------------------------------------------------

@dataclasses.dataclass
class Failure:
    op: str
    kind: str       # the mutation ("valid" for none)
    category: str   # accepted-invalid, raised-on-valid, wrong-exception, message-no-func, ...
    exc: str
    msg: str
    desc: str
    detail: str = ""

    def signature(self):
        shape = re.sub(r"\d+", "#", self.msg)[:90]
        return (self.op, self.kind, self.category, self.exc, shape)

    def __str__(self):
        s = f"[{self.category}] {self.desc}  (mutation: {self.kind})"
        if self.exc:
            s += f"\n      -> {self.exc}: {self.msg[:300]}"
        if self.detail:
            s += f"\n      {self.detail[:600]}"
        return s


KNOWN = [
    ("grouped_qqmm never checks that x_scales has T rows",
     lambda f: f.op == "grouped_qqmm" and f.kind.startswith("x_scales_rows")
     and f.category in ("accepted-invalid", "wrong-result")),
    ("qqmm with a batched w of batch 0 returns without validating",
     lambda f: f.op == "qqmm" and f.kind == "w_batch0" and f.category == "accepted-invalid"),
    ("swizzle_scales(s, out=s) / in-place unswizzle / dequantize out overlapping data",
     lambda f: f.kind.startswith("out_alias") and f.op in ("swizzle_scales", "unswizzle_scales", "dequantize")
     and f.category in ("wrong-result", "accepted-invalid")),
    ("misaligned (byte_offset=1) float inputs are accepted",
     lambda f: f.kind.endswith("offset_misaligned") and f.category in ("accepted-invalid", "wrong-result")),
    ("nvfp4 global_scale of 0, negative or tiny is accepted",
     lambda f: f.kind in ("gs_zero", "gs_negative", "gs_tiny") and f.category == "accepted-invalid"),
    ("swizzle_scales of an (R, 0) array talks about x, K and mxfp8",
     lambda f: f.op == "swizzle_scales" and f.kind == "zero_cols"
     and f.category in ("message-no-func", "message-no-arg", "forbidden-text")),
    ("quantize_colwise reports K=<M> for the M axis",
     lambda f: f.op == "quantize_colwise" and f.kind == "M_ragged"
     and f.category in ("forbidden-text", "message-no-func")),
    ("K/group errors from qq.quantize are prefixed quantized_shapes:",
     lambda f: f.category == "message-no-func" and f.msg.startswith("quantized_shapes:")),
    ("group_size=2**31 gives a bare OverflowError",
     lambda f: f.category == "wrong-exception" and f.exc == "OverflowError"
     and f.kind in ("group_size_bad", "bits_bad")),
    ("beta='x' gives a bare float() error",
     lambda f: f.op == "qqmm" and f.kind == "beta_bad" and f.category in ("message-no-func", "message-no-arg")),
    ("outputs are allocated before validation (unswizzle_scales: NumPy's bare error)",
     lambda f: f.op == "unswizzle_scales" and f.kind == "shape_neg" and f.category == "message-no-func"
     and "negative dimensions" in f.msg),
    # ---- found by this fuzzer (NEW at the time of writing; reported, not yet fixed) ----
    ("NEW: group_size=0 / bits=0 are accepted (taken as the mode's default; QuantizedArray records 0)",
     lambda f: f.kind in ("group_size_bad", "bits_bad") and (
         f.category == "accepted-invalid" or f.category == "message-no-arg" and "argument 'scales'" in f.msg)),
    ("NEW: nvfp4 global_scale of +-Inf or NaN is accepted",
     lambda f: f.kind == "gs_nonfinite" and f.category == "accepted-invalid"),
    ("NEW: an nvfp4 global_scale of shape (1, 1) is accepted (documented: () or (1,))",
     lambda f: f.kind == "gs_shape" and f.category == "accepted-invalid"),
    ("NEW: an unsupported bits (7) is blamed on w ('not a whole number of 7-bit values'), bits not named",
     lambda f: f.kind == "bits_bad" and f.category == "message-no-arg" and "whole number of" in f.msg),
    ("NEW: quantize_colwise errors are prefixed 'quantize:'",
     lambda f: f.op == "quantize_colwise" and f.category == "message-no-func" and f.msg.startswith("quantize:")),
    ("NEW: quantize_moe dtype errors name argument 'x' instead of 'w'",
     lambda f: f.op == "quantize_moe" and f.category == "message-no-arg" and "argument 'x'" in f.msg),
    ("NEW: qqmm(x, None) raises AttributeError",
     lambda f: f.op == "qqmm" and f.kind == "w_none" and f.exc == "AttributeError"),
    ("NEW: prepare_weight errors are prefixed 'quantize:'",
     lambda f: f.op == "prepare_weight" and f.category == "message-no-func" and f.msg.startswith("quantize:")),
    ("NEW: grouped_qqmm with T = 0 tokens does not check w's K against x's",
     lambda f: f.op == "grouped_qqmm" and f.category == "accepted-invalid"
     and re.match(r"qq\.grouped_qqmm\(<\w+ \(0, ", f.desc) is not None),
    ("NEW: quantized_matmul with an empty batch of x (batch 0) is refused: out (0, M, N) 'expected (1, M, N)'",
     lambda f: f.op == "quantized_matmul" and f.category == "raised-on-valid"
     and re.search(r"argument 'out' has shape \(0, .*expected \(1, ", f.msg) is not None),
    ("int64 / float64 x get no hint of the accepted dtypes",
     lambda f: f.kind.endswith("dtype_bad") and f.category == "missing-text"),
]


def known_reason(f: Failure):
    for reason, pred in KNOWN:
        if pred(f):
            return reason
    return None


# ---------------------------------------------------------------------------
# The checker
# ---------------------------------------------------------------------------

def _short(v):
    if isinstance(v, np.ndarray):
        tag = ""
        if v.size and not v.flags.c_contiguous:
            tag = f" strides={v.strides}"
        if not v.flags.aligned:
            tag += " misaligned"
        if not v.flags.writeable:
            tag += " readonly"
        return f"<{v.dtype} {v.shape}{tag}>"
    if isinstance(v, qq.QuantizedArray):
        return f"QA({v.mode!r}, {v.shape}, {v.scale_layout})"
    if isinstance(v, qq.PreparedWeight):
        return f"PW({v.mode!r}, {v.shape})"
    if isinstance(v, tuple) and any(isinstance(e, np.ndarray) for e in v):
        return "(" + ", ".join(_short(e) for e in v) + ")"
    r = repr(v)
    return r if len(r) < 50 else r[:47] + "..."


def _names_re(name):
    return re.compile(r"(?<![A-Za-z0-9_])" + re.escape(name) + r"(?![A-Za-z0-9_])")


class Fuzzer:
    def __init__(self, seed, budget_s=None):
        self.rng = np.random.default_rng(seed)
        self.failures = {}
        self.known = {}
        self.calls = 0
        self.outcomes = {}
        self.strict = False

    # random helpers
    def choice(self, seq):
        return seq[int(self.rng.integers(len(seq)))]

    def coin(self, p=0.5):
        return bool(self.rng.random() < p)

    def call(self, op, fn, args=(), kwargs=None, *, kind="valid", expect="ok", names=(),
             check=None, forbid=(), require=(), func=None):
        """Run fn(*args, **kwargs) and judge it.

        expect: "ok" (must succeed and pass check), "raise" (must raise an accepted
        exception naming the function and one of `names`), "either".
        forbid / require: regexes the error message must not / must contain."""
        kwargs = kwargs or {}
        func = func or op
        self.calls += 1
        desc = f"qq.{op}(" + ", ".join([_short(a) for a in args] +
                                       [f"{k}={_short(v)}" for k, v in kwargs.items()]) + ")"
        try:
            res = fn(*args, **kwargs)
        except ACCEPTED as e:
            msg = str(e)
            self.outcomes[(op, "raised")] = self.outcomes.get((op, "raised"), 0) + 1
            ex = type(e).__name__
            if expect == "ok":
                return self._fail(Failure(op, kind, "raised-on-valid", ex, msg, desc))
            if not _names_re(func).search(msg):
                return self._fail(Failure(op, kind, "message-no-func", ex, msg, desc,
                                          f"message should name the function {func!r}"))
            if names and not any(_names_re(n).search(msg) for n in names):
                return self._fail(Failure(op, kind, "message-no-arg", ex, msg, desc,
                                          f"message should name {' or '.join(names)}"))
            for pat in forbid:
                if re.search(pat, msg):
                    return self._fail(Failure(op, kind, "forbidden-text", ex, msg, desc,
                                              f"message must not match {pat!r}"))
            for pat in require:
                if not re.search(pat, msg):
                    return self._fail(Failure(op, kind, "missing-text", ex, msg, desc,
                                              f"message should match {pat!r}"))
            return None
        except Exception as e:  # noqa: BLE001 - the point of the test
            return self._fail(Failure(op, kind, "wrong-exception", type(e).__name__, str(e), desc,
                                      traceback.format_exc(limit=-2).strip().splitlines()[-1]))
        self.outcomes[(op, "ok")] = self.outcomes.get((op, "ok"), 0) + 1
        if expect == "raise":
            return self._fail(Failure(op, kind, "accepted-invalid", "", "", desc,
                                      f"should raise naming {' or '.join(names) or 'the argument'}"))
        if check is not None:
            try:
                check(res)
            except AssertionError as e:
                return self._fail(Failure(op, kind, "wrong-result", "", "", desc, str(e)))
            except Exception as e:  # noqa: BLE001 - a result the checker cannot even read
                return self._fail(Failure(op, kind, "wrong-result", "", "", desc,
                                          f"{type(e).__name__}: {e}"))
        return res

    def _fail(self, f: Failure):
        reason = known_reason(f)
        bucket = self.known if (reason and not (STRICT_KNOWN or self.strict)) else self.failures
        key = f.signature()
        if key not in bucket:
            bucket[key] = (reason, f)
        return None

    def report(self, name):
        lines = []
        if self.known:
            lines.append(f"{name}: {len(self.known)} known defect signature(s) seen:")
            for reason, f in self.known.values():
                lines.append(f"  KNOWN ({reason}): {f}")
        print("\n".join(lines + [f"{name}: {self.calls} calls, outcomes {self.outcomes}"]))
        if self.failures:
            body = "\n".join(f"  {i + 1}. {f}" for i, (_, f) in enumerate(self.failures.values()))
            raise AssertionError(f"{name}: {len(self.failures)} distinct failure(s) in "
                                 f"{self.calls} calls (seed {SEED}):\n{body}")


# ---------------------------------------------------------------------------
# Data and layouts
# ---------------------------------------------------------------------------

def rand_float(fz, shape, dtype, specials=False, scale=None):
    rng = fz.rng
    x = rng.standard_normal(shape).astype(F32)
    if x.size and scale is None and fz.coin(0.3):
        mags = {np.dtype(np.float16): [1e-6, 1e-3, 1e3, 2.0 ** -14]}.get(
            np.dtype(dtype), [1e-30, 1e30, 1e-40, 1e-3, 1e3, 2.0 ** -120])
        x = (x * F32(fz.choice(mags))).astype(F32)
    elif scale is not None:
        x = (x * F32(scale)).astype(F32)
    if specials and x.size and fz.coin(0.3):
        flat = x.reshape(-1)
        for _ in range(int(rng.integers(1, 4))):
            i = int(rng.integers(flat.size))
            flat[i] = fz.choice([np.nan, np.inf, -np.inf, 0.0, -0.0, 3e38, 1e-45])
        if fz.coin(0.3) and x.ndim and x.shape[-1] >= 16:  # an all-zero run
            x[..., :16] = 0
    return cast(x, dtype)


def at_offset(a, off):
    """A writable copy of `a` starting `off` bytes into a fresh buffer (misaligned if off
    is not a multiple of the item size)."""
    buf = np.zeros(a.nbytes + off + 64, np.uint8)
    v = buf[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
    v[...] = a
    return v


def relayout(fz, a, kinds=None):
    """(view of a's values in another memory layout, kind, expectation)."""
    kinds = kinds or ["row_strided", "batch_strided", "transposed", "negstride", "last_strided",
                      "offset_aligned", "offset_misaligned", "readonly"]
    kind = fz.choice(kinds)
    if a.ndim == 0 or a.size == 0:
        kind = "readonly"
    if kind == "row_strided" and a.ndim >= 2:
        big = np.zeros(a.shape[:-1] + (a.shape[-1] + int(fz.rng.integers(1, 9)),), a.dtype)
        big[..., :a.shape[-1]] = a
        return big[..., :a.shape[-1]], kind, "either"
    if kind == "batch_strided" and a.ndim >= 2:
        big = np.zeros((a.shape[0] * 2,) + a.shape[1:], a.dtype)
        big[::2] = a
        return big[::2], kind, "either"
    if kind == "transposed" and a.ndim >= 2:
        return np.asfortranarray(a), kind, "either"
    if kind == "negstride" and a.ndim >= 1:
        return np.ascontiguousarray(a[::-1])[::-1], kind, "either"
    if kind == "last_strided" and a.ndim >= 1:
        big = np.zeros(a.shape[:-1] + (a.shape[-1] * 2,), a.dtype)
        big[..., ::2] = a
        return big[..., ::2], kind, "either"
    if kind == "offset_aligned":
        return at_offset(a, a.dtype.itemsize * 3), kind, "ok"
    if kind == "offset_misaligned" and a.dtype.itemsize > 1:
        return at_offset(a, 1), kind, "raise"
    b = a.copy()
    b.setflags(write=False)
    return b, "readonly", "ok"


def readonly(a):
    b = np.array(a)
    b.setflags(write=False)
    return b


def poison(shape, dtype):
    buf = np.empty(shape, dtype)
    buf.reshape(-1).view(np.uint8)[...] = 0xAB
    return buf


def pick_dtype(fz):
    return fz.choice(FLOATS)


def dtype_arg(fz, dt):
    """dt spelled as a string, a NumPy dtype or the scalar type."""
    name = {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16", BF16: "bfloat16"}[np.dtype(dt)]
    return fz.choice([name, np.dtype(dt), np.dtype(dt).type])


def group_bits(fz, mode):
    if mode == "affine":
        return fz.choice(R.AFFINE_GROUPS), fz.choice(R.AFFINE_BITS)
    return R.DEFAULTS[mode]


def mode_kwargs(fz, mode, g, b, rounding=True, fp8=True):
    """Keyword arguments for mode, with group_size / bits given explicitly or left out."""
    kw = {"mode": mode}
    if mode == "affine" or fz.coin(0.3):
        kw["group_size"] = g
    if mode == "affine" or fz.coin(0.3):
        kw["bits"] = b
    if rounding and mode in ("mxfp4", "mxfp8"):
        kw["rounding"] = fz.choice(["ceil", "floor"])
    if fp8 and mode == "mxfp8":
        kw["fp8_format"] = fz.choice(["e4m3", "e5m2"])
    return kw


def batch_shape(fz, max_dims=2):
    nd = int(fz.rng.integers(0, max_dims + 1))
    return tuple(int(fz.choice([1, 2, 3, 0 if fz.coin(0.1) else 2])) for _ in range(nd))


def rows(fz):
    return int(fz.choice([1, 1, 2, 3, 5, 17, 33, 130, 0]))


def gs_value(fz, x):
    """A valid nvfp4 global scale for x: amax as () / (1,) array or a Python float."""
    a = R.amax(x)
    if not np.isfinite(a) or a < 2.0 ** -100:  # tiny global scales: the gs_tiny mutation
        a = np.array(1.0, F32)
    form = fz.choice(["()", "(1,)", "float"])
    if form == "()":
        return a.astype(F32)
    if form == "(1,)":
        return a.reshape(1).astype(F32)
    return float(a)


def swizzle_ref(linear):
    """reference.swizzle, also for 0-size scales (which it cannot reshape)."""
    linear = np.asarray(linear)
    if linear.size == 0:
        return np.zeros(R.blocked_shape(linear.shape), linear.dtype)
    return R.swizzle(linear)


def quantize_ref(x, g, b, mode, gs=None, rounding="ceil", layout="linear", fp8_format="e4m3"):
    """reference.quantize with the blocked layout made by swizzle_ref."""
    ref = R.quantize(x, g, b, mode, global_scale=gs_ref(gs), rounding=rounding,
                     scale_layout="linear", fp8_format=fp8_format)
    if layout == "blocked":
        ref = dataclasses.replace(ref, scales=swizzle_ref(ref.scales), scale_layout="blocked")
    return ref


def gs_ref(gs):
    return None if gs is None else np.asarray(gs, F32).reshape(())


# ---------------------------------------------------------------------------
# Budget
# ---------------------------------------------------------------------------

def budget(n):
    return max(1, int(n * SCALE))


def run_budget(fz, n, one):
    """Call one(fz) n times; one test case's own exceptions are failures of the test."""
    for _ in range(budget(n)):
        one(fz)


# ---------------------------------------------------------------------------
# quantize
# ---------------------------------------------------------------------------

QUANTIZE_MUTATIONS = ["valid"] * 8 + [
    "layout", "x_dtype_bad", "K_ragged", "mode_bad", "rounding_bad", "scale_layout_bad",
    "fp8_format_bad", "group_size_bad", "bits_bad", "gs_other_mode", "gs_dtype", "gs_shape",
    "gs_zero", "gs_negative", "gs_tiny", "gs_nonfinite", "x_none", "x_list", "x_0d",
    "blocked_affine", "fp8_not_mxfp8", "group_other_valid", "x_1d", "K_zero"]


def fuzz_quantize_one(fz, op="quantize"):
    mode = fz.choice(R.MODES)
    g, b = group_bits(fz, mode)
    dt = pick_dtype(fz)
    mut = fz.choice(QUANTIZE_MUTATIONS)
    shape = batch_shape(fz, 2) + (rows(fz), g * int(fz.choice([1, 1, 2, 3, 5])))
    if mut == "x_1d":
        shape = (g * int(fz.choice([1, 2, 4])),)
    x = rand_float(fz, shape, dt, specials=True)
    kw = mode_kwargs(fz, mode, g, b)
    layout = "linear"
    if mode != "affine" and fz.coin(0.4):
        layout = kw["scale_layout"] = "blocked"
    gs = None
    if mode == "nvfp4" and fz.coin(0.5):
        gs = kw["global_scale"] = gs_value(fz, x)
    xa, expect, names, forbid, require = x, "ok", (), (), ()
    if mut == "layout":
        xa, kind, expect = relayout(fz, x)
        mut = "layout:" + kind
        names = ("x", "stride", "strides")
    elif mut == "x_dtype_bad":
        xa = np.zeros(shape, fz.choice(BAD_DTYPES))
        expect, names = "raise", ("x",)
        require = (r"float32|float16|bfloat16",)
    elif mut == "K_ragged":
        k = shape[-1] + int(fz.choice([1, 2, 8, 16, g // 2])) * (1 if fz.coin() else -1)
        if k <= 0 or k % g == 0:
            k = g + 1
        xa = rand_float(fz, shape[:-1] + (k,), dt)
        expect, names = "raise", ("x", "K", "group_size")
    elif mut in ("mode_bad", "rounding_bad", "scale_layout_bad", "fp8_format_bad"):
        arg = mut[:-4]
        kw[arg] = fz.choice(BAD_ENUMS)
        if arg == "mode":
            kw.pop("group_size", None), kw.pop("bits", None)
        expect, names = "raise", (arg,)
    elif mut in ("group_size_bad", "bits_bad"):
        arg = mut[:-4]
        kw[arg] = fz.choice(BAD_INTS)
        expect, names = "raise", (arg,)
    elif mut == "group_other_valid":
        # another group size / bits that the mode does not take
        if mode == "affine":
            kw["group_size"] = fz.choice([16, 256, 8])
            names = ("group_size",)
        else:
            kw["group_size"] = 32 if mode == "nvfp4" else 16
            names = ("group_size",)
        expect = "raise"
    elif mut == "gs_other_mode":
        if mode != "nvfp4":
            kw["global_scale"] = np.array(1.0, F32)
            expect, names = "raise", ("global_scale",)
    elif mut in ("gs_dtype", "gs_shape", "gs_zero", "gs_negative", "gs_tiny", "gs_nonfinite"):
        if mode == "nvfp4":
            bad = {"gs_dtype": lambda: np.array(1.0, fz.choice([np.float64, np.float16, np.int32, BF16])),
                   "gs_shape": lambda: np.ones(fz.choice([(2,), (1, 1), (0,)]), F32),
                   "gs_zero": lambda: fz.choice([0.0, np.array(0.0, F32), -0.0]),
                   "gs_negative": lambda: fz.choice([-1.0, np.array(-3.5, F32)]),
                   "gs_tiny": lambda: fz.choice([1e-45, np.array(1e-40, F32), 1e-38]),
                   "gs_nonfinite": lambda: fz.choice([np.inf, np.nan, np.array(np.inf, F32),
                                                      np.array(np.nan, F32), -np.inf])}[mut]()
            kw["global_scale"] = bad
            expect, names = "raise", ("global_scale",)
            if mut == "gs_zero":  # 0 (an all-zero tensor's amax) means no global scale (docs/errors.md)
                gs, expect = bad, "ok"
    elif mut == "x_none":
        xa, expect, names = None, "raise", ("x",)
    elif mut == "x_list":
        xa, expect, names = x.astype(F32).tolist(), "raise", ("x",)
    elif mut == "x_0d":
        xa, expect, names = np.array(1.0, dt), "raise", ("x",)
    elif mut == "blocked_affine":
        if mode == "affine":
            kw["scale_layout"] = "blocked"
            expect, names = "raise", ("scale_layout",)
    elif mut == "fp8_not_mxfp8":
        if mode != "mxfp8":
            kw["fp8_format"] = "e5m2"
            expect, names = "raise", ("fp8_format",)
    elif mut == "K_zero":
        xa = np.zeros(shape[:-1] + (0,), dt)
        expect, names = "either", ("x", "K")

    if expect == "raise":
        # with several bad arguments any may be named; keep one cause by resetting others
        fz.call(op, qq.quantize, (xa,), kw, kind=mut, expect="raise", names=names,
                forbid=forbid, require=require)
        return

    def check(got):
        xr = np.ascontiguousarray(np.asarray(xa)) if expect != "ok" or mut.startswith("layout") else x
        if np.asarray(xr).size == 0 and np.asarray(xr).shape[-1] == 0:
            return
        ref = quantize_ref(x, g, b, mode, gs, kw.get("rounding", "ceil"), layout,
                           kw.get("fp8_format", "e4m3"))
        assert tuple(got.shape) == x.shape, f"shape {got.shape} != {x.shape}"
        assert (got.group_size, got.bits, got.mode) == (g, b, mode), (got.group_size, got.bits, got.mode)
        assert_quantized_equal(got, ref, x, what=op)

    fz.call(op, qq.quantize, (xa,), kw, kind=mut, expect=expect, names=names, check=check)


def test_fuzz_quantize():
    fz = Fuzzer(SEED)
    run_budget(fz, 500, fuzz_quantize_one)
    fz.report("quantize")


# ---------------------------------------------------------------------------
# out= buffers
# ---------------------------------------------------------------------------

def out_mutation(fz, shape, dtype, bad_dtypes=(np.float64, np.int32, np.uint8, np.int16)):
    """(out, kind, expect) for an out= buffer that should hold shape/dtype."""
    kind = fz.choice(["out_ok", "out_ok", "out_shape", "out_dtype", "out_readonly", "out_noncontig"])
    if kind == "out_shape":
        bad = tuple(shape[:-1]) + (shape[-1] + 1,) if len(shape) else (2,)
        if fz.coin(0.3) and len(shape):
            bad = (1,) + tuple(shape)
        return poison(bad, dtype), kind, "raise"
    if kind == "out_dtype":
        bd = fz.choice([d for d in bad_dtypes if np.dtype(d) != np.dtype(dtype)])
        return poison(shape, bd), kind, "raise"
    if kind == "out_readonly":
        return readonly(poison(shape, dtype)), kind, "raise"
    # (an empty out has no layout to get wrong: any strides are fine there)
    if kind == "out_noncontig" and len(shape) >= 2 and shape[-1] > 1 and shape[-2] > 1 and all(shape):
        return np.asfortranarray(poison(shape, dtype)), kind, "raise"
    return poison(shape, dtype), "out_ok", "ok"


def check_is_out(out, inner):
    def check(got):
        assert got is out, "out= must be returned"
        inner(got)
    return check


# ---------------------------------------------------------------------------
# dequantize
# ---------------------------------------------------------------------------

DEQ_MUTATIONS = ["valid"] * 8 + [
    "data_layout", "scales_layout", "scales_shape", "scales_dtype", "biases_missing", "biases_extra",
    "biases_dtype", "data_width", "data_dtype_bad", "out", "out", "out_alias", "dtype_bad", "mode_bad",
    "fp8_format_bad", "scale_layout_bad", "blocked_affine", "gs_other_mode", "qa_contradict", "w_none",
    "group_size_bad", "bits_bad", "data_1byte_views"]


def fuzz_dequantize_one(fz):
    rng = fz.rng
    mode = fz.choice(R.MODES)
    g, b = group_bits(fz, mode)
    shape = batch_shape(fz, 2) + (rows(fz), g * int(fz.choice([1, 2, 3])))
    k = shape[-1]
    dshape = shape[:-1] + (k * b // 8,)
    lshape = shape[:-1] + (k // g,)
    data = rng.integers(0, 256, dshape, dtype=np.uint8)
    biases = None
    fp8 = fz.choice(["e4m3", "e5m2"]) if mode == "mxfp8" else "e4m3"
    if mode == "affine":
        sdt = pick_dtype(fz)
        scales = rand_float(fz, lshape, sdt, scale=0.1)
        biases = rand_float(fz, lshape, sdt, scale=1.0)
    else:
        scales = rng.integers(0, 256, lshape, dtype=np.uint8)
        if fz.coin(0.7):  # mostly finite, moderate scales
            lo, hi = (0x20, 0x60) if mode == "nvfp4" else (100, 150)
            scales = rng.integers(lo, hi, lshape, dtype=np.uint8)
    layout = "blocked" if mode != "affine" and fz.coin(0.4) else "linear"
    scales_arg = swizzle_ref(scales) if layout == "blocked" else scales
    gs = None
    if mode == "nvfp4" and fz.coin(0.5):
        gs = fz.choice([float(np.abs(rng.standard_normal()) * 100 + 0.1), np.array(3.0, F32),
                        np.array([2688.0], F32)])
    out_dt = fz.choice([None, *FLOATS])
    kw = {"mode": mode}
    if mode == "affine" or fz.coin(0.3):
        kw["group_size"] = g
    if mode == "affine" or fz.coin(0.3):
        kw["bits"] = b
    if mode == "mxfp8" and (fp8 != "e4m3" or fz.coin(0.3)):
        kw["fp8_format"] = fp8
    if layout == "blocked":
        kw["scale_layout"] = "blocked"
    if gs is not None:
        kw["global_scale"] = gs
    if out_dt is not None:
        kw["dtype"] = dtype_arg(fz, out_dt)
    res_dt = out_dt if out_dt is not None else BF16
    ref = R.dequantize(data, scales, biases, g, b, mode, global_scale=gs_ref(gs), scale_layout="linear",
                       fp8_format=fp8, dtype=res_dt)
    mut = fz.choice(DEQ_MUTATIONS)
    args = [data, scales_arg, biases]
    expect, names = "ok", ()
    if mut == "data_layout":
        args[0], k2, expect = relayout(fz, data)
        mut += ":" + k2
        names = ("w", "data", "stride", "strides")
    elif mut == "scales_layout":
        args[1], k2, expect = relayout(fz, scales_arg)
        mut += ":" + k2
        names = ("scales", "stride", "strides")
    elif mut == "scales_shape":
        s = scales_arg
        opts = [s[..., :-1], np.concatenate([s, s[..., :1]], -1), s[None], s[..., :1, :]]
        if s.ndim >= 2 and s.shape[-2] > 1:
            opts.append(s[..., 1:, :])
        cand = fz.choice(opts)
        if cand.shape == s.shape or cand.size == s.size == 0 and cand.ndim == s.ndim:
            cand = s[None, None]
        args[1] = np.ascontiguousarray(cand)
        expect, names = "raise", ("scales",)
    elif mut == "scales_dtype":
        if mode == "affine":
            args[1] = scales.astype(fz.choice([np.int32, np.float64, np.uint8]))
        else:
            args[1] = scales_arg.astype(fz.choice([F32, np.int32, np.uint16, np.float16]))
        expect, names = "raise", ("scales",)
    elif mut == "biases_missing" and mode == "affine":
        args[2], expect, names = None, "raise", ("biases",)
    elif mut == "biases_extra" and mode != "affine":
        args[2], expect, names = np.zeros(lshape, F32), "raise", ("biases",)
    elif mut == "biases_dtype" and mode == "affine":
        other = fz.choice([d for d in (*FLOATS, np.dtype(np.int32)) if d != biases.dtype])
        args[2], expect, names = biases.astype(other), "raise", ("biases", "scales")
    elif mut == "data_width":
        if dshape[-1] > 1:
            args[0] = np.ascontiguousarray(data[..., :-1])
        else:
            args[0] = np.zeros(dshape[:-1] + (3,), np.uint8)
        expect, names = "raise", ("w", "data", "scales")
    elif mut == "data_dtype_bad":
        args[0] = data.astype(fz.choice([F32, np.int32, np.float16, np.uint16]))
        expect, names = "raise", ("w", "data")
    elif mut == "data_1byte_views":
        # int8 carries no claim; a float8 dtype must be the one the mode stores there
        # (docs/api.md, "Inputs and outputs"), else TypeError naming the argument
        dv = fz.choice([np.int8, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2])
        args[0] = data.view(dv)
        fits = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}[fp8] if mode == "mxfp8" else None
        bad = [] if dv is np.int8 or dv is fits else ["w"]
        if mode != "affine":
            sv = fz.choice([np.int8, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e8m0fnu])
            args[1] = scales_arg.view(sv)
            fits = ml_dtypes.float8_e4m3fn if mode == "nvfp4" else ml_dtypes.float8_e8m0fnu
            if sv is not np.int8 and sv is not fits:
                bad.append("scales")
        if bad:
            expect, names = "raise", tuple(bad)
    elif mut == "out":
        out, k2, expect = out_mutation(fz, shape, res_dt, (np.float64, np.int32, np.uint8))
        if k2 == "out_dtype" and out_dt is None:
            expect = "raise"  # float64 / ints are never a dequantize output
        mut = k2
        kw["out"] = out
        names = ("out", "dtype")
    elif mut == "out_alias" and mode != "affine":
        ob = int(np.prod(shape)) * res_dt.itemsize
        db = data.nbytes
        if ob and db:
            buf = np.zeros(ob + db, np.uint8)
            shift = int(rng.integers(0, ob + 1))
            out = buf[:ob].view(res_dt).reshape(shape)
            alias = buf[shift:shift + db].reshape(dshape)
            alias[...] = data
            args[0] = alias
            kw["out"] = out
            kw["dtype"] = dtype_arg(fz, res_dt)
            expect, names = "either", ("out", "w", "overlap", "overlaps")
            mut = f"out_alias_shift{'0' if shift == 0 else '' if shift < ob else '_end'}"
    elif mut == "dtype_bad":
        kw["dtype"] = fz.choice(["float64", "int8", np.int32, "bf16", np.complex64, 3, "torch.float64"])
        expect, names = "raise", ("dtype",)
    elif mut in ("mode_bad", "fp8_format_bad", "scale_layout_bad"):
        arg = mut[:-4]
        kw[arg] = fz.choice(BAD_ENUMS)
        if arg == "mode":
            kw.pop("group_size", None), kw.pop("bits", None), kw.pop("global_scale", None)
        expect, names = "raise", (arg,)
    elif mut == "blocked_affine" and mode == "affine":
        kw["scale_layout"], expect, names = "blocked", "raise", ("scale_layout",)
    elif mut == "gs_other_mode" and mode != "nvfp4":
        kw["global_scale"], expect, names = np.array(1.0, F32), "raise", ("global_scale",)
    elif mut in ("group_size_bad", "bits_bad"):
        arg = mut[:-4]
        kw[arg] = fz.choice(BAD_INTS)
        expect, names = "raise", (arg,)
    elif mut == "w_none":
        args[0], expect, names = None, "raise", ("w",)
    elif mut == "qa_contradict":
        pass
    else:
        mut = "valid"

    use_qa = mut in ("valid", "qa_contradict", "out_ok") and fz.coin(0.4)
    if use_qa:
        qkw = {k: v for k, v in kw.items() if k in ("mode", "group_size", "bits", "global_scale",
                                                      "scale_layout", "fp8_format")}
        qa = qq.QuantizedArray(args[0], args[1], args[2], **qkw)
        args = [qa]
        kw = {k: v for k, v in kw.items() if k in ("dtype", "out")}
        if mut == "qa_contradict":
            other = fz.choice([m for m in R.MODES if m != mode and m != "affine"])
            kw["mode"], expect, names = other, "raise", ("mode",)
    elif mut == "qa_contradict":
        mut = "valid"
    if args and not use_qa and args[2] is None:
        args = args[:2]

    def check(got):
        if "out" in kw:
            assert got is kw["out"], "out= must be returned"
        assert_bits_equal(np.asarray(got), ref, "dequantize")

    fz.call("dequantize", qq.dequantize, tuple(args), kw, kind=mut, expect=expect, names=names,
            check=check)


def test_fuzz_dequantize():
    fz = Fuzzer(SEED + 1)
    run_budget(fz, 500, fuzz_dequantize_one)
    fz.report("dequantize")


# ---------------------------------------------------------------------------
# swizzle_scales / unswizzle_scales / amax
# ---------------------------------------------------------------------------

def lin_scales_shape(fz):
    r = int(fz.choice([1, 2, 5, 31, 127, 128, 129, 256, 300]))
    c = int(fz.choice([1, 2, 3, 4, 5, 8, 9]))
    form = fz.choice(["1d", "2d", "2d", "3d", "4d"])
    if form == "1d":
        return (c,)
    if form == "2d":
        return (r, c)
    if form == "3d":
        return (int(fz.choice([1, 2, 3, 0])), r, c)
    return (2, 1, r, c)


def fuzz_swizzle_one(fz):
    rng = fz.rng
    lshape = lin_scales_shape(fz)
    s = rng.integers(0, 256, lshape, dtype=np.uint8)
    mut = fz.choice(["valid"] * 5 + ["one_byte_view", "layout", "dtype_bad", "out", "out", "out_alias_same",
                                     "out_alias_partial", "zero_cols", "zero_rows", "0d", "none"])
    arg, kw, expect, names, forbid = s, {}, "ok", (), ()
    ref = swizzle_ref(s)
    if mut == "one_byte_view":
        arg = s.view(fz.choice([np.int8, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e8m0fnu]))
    elif mut == "layout":
        arg, k2, expect = relayout(fz, s)
        mut, names = "layout:" + k2, ("scales", "stride", "strides")
    elif mut == "dtype_bad":
        arg, expect, names = s.astype(fz.choice([F32, np.int32, np.uint16, np.float16, BF16])), "raise", ("scales",)
    elif mut == "out":
        out, mut, expect = out_mutation(fz, ref.shape, np.uint8, (F32, np.int32, np.uint16))
        kw["out"], names = out, ("out",)
    elif mut == "out_alias_same":
        if s.shape == ref.shape:
            kw["out"], expect, names = s, "either", ("out", "scales", "overlap", "overlaps", "in place")
        else:
            mut = "valid"
    elif mut == "out_alias_partial":
        n = ref.size
        buf = np.zeros(n + s.size, np.uint8)
        shift = int(rng.integers(1, n + 1)) if n else 0
        out = buf[:n].reshape(ref.shape)
        arg = buf[shift:shift + s.size].reshape(s.shape)
        arg[...] = s
        kw["out"], expect, names = out, "either", ("out", "scales", "overlap", "overlaps")
    elif mut == "zero_cols":
        arg = np.zeros(lshape[:-1] + (0,), np.uint8)
        # a 1-D (0,) array is one row of no columns: blocked (128, 0)
        ref = np.zeros(R.blocked_shape(arg.shape) if len(lshape) > 1 else (128, 0), np.uint8)
        expect, names = "either", ("scales", "C", "columns")
        forbid = (r"\bx\b", r"\bK\b", r"mxfp8")
    elif mut == "zero_rows" and len(lshape) >= 2:
        arg = np.zeros(lshape[:-2] + (0, lshape[-1]), np.uint8)
        ref = swizzle_ref(arg)
        expect, names = "either", ("scales",)
    elif mut == "0d":
        arg, expect, names = np.array(3, np.uint8), "raise", ("scales",)
    elif mut == "none":
        arg, expect, names = None, "raise", ("scales",)
    else:
        mut = "valid"

    def check(got):
        if "out" in kw:
            assert got is kw["out"], "out= must be returned"
        assert ref is not None, f"accepted, shape {np.asarray(got).shape}"
        assert_bits_equal(np.asarray(got).view(np.uint8), ref, "swizzle_scales")

    fz.call("swizzle_scales", qq.swizzle_scales, (arg,), kw, kind=mut, expect=expect, names=names,
            check=check, forbid=forbid)


def fuzz_unswizzle_one(fz):
    rng = fz.rng
    lshape = lin_scales_shape(fz)
    lin = rng.integers(0, 256, lshape, dtype=np.uint8)
    blk = swizzle_ref(lin)
    shape_arg = fz.choice([lshape, list(lshape), np.array(lshape, np.int64)])
    mut = fz.choice(["valid"] * 5 + ["layout", "dtype_bad", "shape_rows", "shape_cols", "shape_neg",
                                     "shape_type", "shape_ndim", "out", "out", "out_alias", "none"])
    arg, kw, expect, names = blk, {}, "ok", ()
    if mut == "layout":
        arg, k2, expect = relayout(fz, blk)
        mut, names = "layout:" + k2, ("scales", "stride", "strides")
    elif mut == "dtype_bad":
        arg, expect, names = blk.astype(fz.choice([F32, np.int32, np.float16])), "raise", ("scales",)
    elif mut == "shape_rows":
        bad = list(lshape)
        if len(bad) >= 2:
            bad[-2] = blk.shape[-2] + 1
        else:
            bad = [129, bad[0]]
        shape_arg, expect, names = tuple(bad), "raise", ("shape", "scales")
    elif mut == "shape_cols":
        bad = list(lshape)
        bad[-1] = blk.shape[-1] + int(fz.choice([1, 4]))
        shape_arg, expect, names = tuple(bad), "raise", ("shape", "scales")
    elif mut == "shape_neg":
        bad = list(lshape)
        bad[int(rng.integers(len(bad)))] = -1
        shape_arg, expect, names = tuple(bad), "raise", ("shape",)
    elif mut == "shape_type":
        shape_arg = fz.choice([(1.5, 2), "12", None, (lshape[0], "a"), 7])
        expect, names = "raise", ("shape",)
    elif mut == "shape_ndim":
        shape_arg, expect, names = (1,) + tuple(lshape), "either", ("shape", "scales")
    elif mut == "out":
        out, mut, expect = out_mutation(fz, lshape, np.uint8, (F32, np.int32, np.uint16))
        kw["out"], names = out, ("out",)
    elif mut == "out_alias":
        arg = blk.copy()
        kw["out"] = arg.reshape(-1)[:lin.size].reshape(lshape)
        expect, names = "either", ("out", "scales", "overlap", "overlaps")
    elif mut == "none":
        arg, expect, names = None, "raise", ("scales",)
    else:
        mut = "valid"

    want = lin.reshape(tuple(shape_arg)) if mut == "shape_ndim" else lin

    def check(got):
        if "out" in kw:
            assert got is kw["out"], "out= must be returned"
        assert_bits_equal(np.asarray(got).view(np.uint8), want, "unswizzle_scales")

    fz.call("unswizzle_scales", qq.unswizzle_scales, (arg, shape_arg), kw, kind=mut, expect=expect,
            names=names, check=check)


def test_fuzz_swizzle_unswizzle():
    fz = Fuzzer(SEED + 2)
    run_budget(fz, 300, fuzz_swizzle_one)
    run_budget(fz, 300, fuzz_unswizzle_one)
    fz.report("swizzle/unswizzle")


def fuzz_amax_one(fz):
    dt = pick_dtype(fz)
    nd = int(fz.rng.integers(0, 4))
    shape = tuple(int(fz.choice([0, 1, 2, 3, 7, 64, 100])) for _ in range(nd))
    x = rand_float(fz, shape, dt, specials=True)
    mut = fz.choice(["valid"] * 5 + ["layout", "layout", "dtype_bad", "out", "out", "out_1", "none", "list"])
    arg, kw, expect, names, require = x, {}, "ok", (), ()
    if mut == "layout":
        arg, k2, expect = relayout(fz, x)
        mut, names = "layout:" + k2, ("x", "stride", "strides")
    elif mut == "dtype_bad":
        arg, expect, names = np.zeros(shape, fz.choice(BAD_DTYPES)), "raise", ("x",)
        require = (r"float32|float16|bfloat16",)
    elif mut == "out":
        out, mut, expect = out_mutation(fz, (), F32, (np.float64, np.float16, np.int32))
        if mut == "out_noncontig":
            mut = "out_ok"
        kw["out"], names = out, ("out",)
    elif mut == "out_1":
        kw["out"], expect, names = poison((1,), F32), "either", ("out",)
    elif mut == "none":
        arg, expect, names = None, "raise", ("x",)
    elif mut == "list":
        arg, expect, names = [1.0, -2.0], "raise", ("x",)
    else:
        mut = "valid"
    want = R.amax(x)

    def check(got):
        if "out" in kw:
            assert got is kw["out"], "out= must be returned"
        got = np.asarray(got)
        assert got.dtype == F32, got.dtype
        if mut != "out_1":
            assert got.shape == (), got.shape
        assert_bits_equal(got.reshape(()), want, "amax")

    fz.call("amax", qq.amax, (arg,), kw, kind=mut, expect=expect, names=names, check=check,
            require=require)


def test_fuzz_amax():
    fz = Fuzzer(SEED + 3)
    run_budget(fz, 300, fuzz_amax_one)
    fz.report("amax")


# ---------------------------------------------------------------------------
# quantize_colwise / quantize_moe
# ---------------------------------------------------------------------------

def fuzz_colwise_one(fz):
    mode = fz.choice(R.MODES)
    g, b = group_bits(fz, mode)
    rowwise = fz.coin(0.3)
    m = g * int(fz.choice([1, 2, 3]))
    k = int(fz.choice([1, 3, 16, 40, 64, 96, 130])) if not rowwise else g * int(fz.choice([1, 2]))
    dt = pick_dtype(fz)
    shape = batch_shape(fz, 1) + (m, k)
    x = rand_float(fz, shape, dt, specials=True)
    kw = mode_kwargs(fz, mode, g, b)
    layout = "blocked" if mode != "affine" and fz.coin(0.4) else "linear"
    if layout == "blocked":
        kw["scale_layout"] = layout
    gs = None
    if mode == "nvfp4" and fz.coin(0.5):
        gs = kw["global_scale"] = gs_value(fz, x)
    if rowwise:
        kw["rowwise"] = True
    mut = fz.choice(["valid"] * 5 + ["layout", "x_dtype_bad", "M_ragged", "x_1d", "mode_bad", "K_ragged_rowwise",
                                     "gs_other_mode", "group_size_bad"])
    arg, expect, names, forbid = x, "ok", (), ()
    if mut == "layout":
        arg, k2, expect = relayout(fz, x)
        mut, names = "layout:" + k2, ("x", "stride", "strides")
    elif mut == "x_dtype_bad":
        arg, expect, names = np.zeros(shape, fz.choice(BAD_DTYPES)), "raise", ("x",)
    elif mut == "M_ragged":
        m2 = m + int(fz.choice([1, 8])) if fz.coin() else m - 1
        arg = rand_float(fz, shape[:-2] + (m2, shape[-1]), dt)
        expect, names = "raise", ("x", "M", "group_size")
        forbid = (rf"\bK={m2}\b",)
    elif mut == "x_1d":
        arg, expect, names = rand_float(fz, (m,), dt), "raise", ("x",)
    elif mut == "mode_bad":
        kw = {"mode": fz.choice(BAD_ENUMS)}
        expect, names = "raise", ("mode",)
    elif mut == "K_ragged_rowwise":
        kw["rowwise"] = True
        if shape[-1] % g:
            expect, names = "raise", ("x", "K", "group_size")
        else:
            arg = rand_float(fz, shape[:-1] + (shape[-1] + 1,), dt)
            expect, names = "raise", ("x", "K", "group_size")
    elif mut == "gs_other_mode" and mode != "nvfp4":
        kw["global_scale"], expect, names = np.array(2.0, F32), "raise", ("global_scale",)
    elif mut == "group_size_bad":
        kw["group_size"], expect, names = fz.choice(BAD_INTS), "raise", ("group_size",)
    else:
        mut = "valid"
    if expect == "raise":
        fz.call("quantize_colwise", qq.quantize_colwise, (arg,), kw, kind=mut, expect="raise",
                names=names, forbid=forbid)
        return
    rounding, fp8 = kw.get("rounding", "ceil"), kw.get("fp8_format", "e4m3")
    xt = np.ascontiguousarray(np.swapaxes(x, -1, -2))

    def check(got):
        col = got
        if rowwise:
            assert isinstance(got, tuple) and len(got) == 2, type(got)
            row, col = got
            assert_quantized_equal(row, quantize_ref(x, g, b, mode, gs, rounding, layout, fp8), x,
                                   what="quantize_colwise rowwise half")
        assert tuple(col.shape) == xt.shape, (col.shape, xt.shape)
        assert_quantized_equal(col, quantize_ref(xt, g, b, mode, gs, rounding, layout, fp8), xt,
                               what="quantize_colwise")

    fz.call("quantize_colwise", qq.quantize_colwise, (arg,), kw, kind=mut, expect=expect,
            names=names, check=check)


def test_fuzz_quantize_colwise():
    fz = Fuzzer(SEED + 4)
    run_budget(fz, 250, fuzz_colwise_one)
    fz.report("quantize_colwise")


def fuzz_moe_one(fz):
    e = int(fz.choice([1, 2, 3, 0]))
    d1 = int(fz.choice([32, 64, 96]))
    d2 = int(fz.choice([32, 64, 160]))
    dt = pick_dtype(fz)
    w = rand_float(fz, (e, d1, d2), dt, scale=fz.choice([1.0, 1e-3, 100.0]))
    scaling = fz.choice(["32x1", "32x32"])
    kw = {}
    rounding = fz.choice(["ceil", "floor"])
    fp8 = fz.choice(["e4m3", "e5m2"])
    layout = fz.choice(["linear", "blocked"])
    if rounding != "ceil" or fz.coin(0.3):
        kw["rounding"] = rounding
    if fp8 != "e4m3" or fz.coin(0.3):
        kw["fp8_format"] = fp8
    if layout != "linear" or fz.coin(0.3):
        kw["scale_layout"] = layout
    arg = w if fz.coin() else np.ascontiguousarray(w.transpose(0, 2, 1)).transpose(0, 2, 1)
    mut = fz.choice(["valid"] * 5 + ["layout", "w_dtype_bad", "D1_ragged", "D2_ragged", "w_2d",
                                     "scaling_bad", "rounding_bad", "fp8_format_bad", "scale_layout_bad"])
    expect, names = "ok", ()
    if mut == "layout":
        arg, k2, expect = relayout(fz, w)
        mut, names = "layout:" + k2, ("w", "stride", "strides")
    elif mut == "w_dtype_bad":
        arg, expect, names = np.zeros(w.shape, fz.choice(BAD_DTYPES)), "raise", ("w",)
    elif mut in ("D1_ragged", "D2_ragged"):
        sh = [max(e, 1), d1, d2]
        sh[1 if mut == "D1_ragged" else 2] += int(fz.choice([1, 16, -8]))
        arg, expect, names = np.ones(sh, F32), "raise", ("w", "D1", "D2")
    elif mut == "w_2d":
        arg, expect, names = np.ones((d1, d2), F32), "raise", ("w",)
    elif mut == "scaling_bad":
        scaling, expect, names = fz.choice(["16x16", "32X1", "", None, 32]), "raise", ("scaling",)
    elif mut.endswith("_bad"):
        a = mut[:-4]
        kw[a], expect, names = fz.choice(BAD_ENUMS), "raise", (a,)
    else:
        mut = "valid"

    def check(got):
        data, sc = got
        d = as_bytes(data)
        assert d.shape == (e, d1, d2), d.shape
        if e == 0:
            return
        assert d.strides == (d1 * d2, 1, d1), d.strides
        codes, scales = ref_moe(w, scaling, rounding, fp8, layout)
        assert_bits_equal(d, codes, "quantize_moe data")
        assert_bits_equal(as_bytes(sc), scales, "quantize_moe scales")

    fz.call("quantize_moe", qq.quantize_moe, (arg, scaling), kw, kind=mut, expect=expect, names=names,
            check=check)


def test_fuzz_quantize_moe():
    fz = Fuzzer(SEED + 5)
    run_budget(fz, 120, fuzz_moe_one)
    fz.report("quantize_moe")


# ---------------------------------------------------------------------------
# qqmm / prepare_weight
# ---------------------------------------------------------------------------

def fp_cfg(fz):
    mode = fz.choice(FP_MODES)
    rounding = fz.choice(["ceil", "floor"]) if mode != "nvfp4" else "ceil"
    fp8 = fz.choice(["e4m3", "e5m2"]) if mode == "mxfp8" else "e4m3"
    return mode, rounding, fp8


def mm_data(fz, shape, dt):
    return rand_float(fz, shape, dt, scale=fz.choice([1.0, 0.01, 30.0]))


def operand(fz, a, form, mode, gs, rounding, fp8, layout):
    """(what qqmm gets, RefQuantized) for a float operand a in `form`."""
    ref = quantize_ref(a, None, None, mode, gs, rounding, layout, fp8)
    if form == "float":
        return a, ref
    if form == "qa":
        kw = {"mode": mode, "rounding": rounding, "scale_layout": layout}
        if mode == "mxfp8":
            kw["fp8_format"] = fp8
        if gs is not None:
            kw["global_scale"] = gs
        return qq.quantize(a, **kw), ref
    return ref.data, ref  # packed: the caller passes ref.scales


def stack_refs(refs):
    return R.MatmulRef(np.stack([r.value for r in refs]), np.stack([r.abs_sum for r in refs]))


QQMM_MUTATIONS = ["valid"] * 10 + [
    "x_layout", "w_layout", "x_dtype_bad", "w_dtype_bad", "affine", "mode_bad", "K_mismatch", "w_4d",
    "w_batch_mismatch", "w_batch0", "bias_shape", "bias_dtype", "c_shape", "c_dtype", "beta_bad",
    "gs_other_mode", "scales_missing", "x_scales_missing", "scales_shape", "scales_dtype", "rounding_bad",
    "scale_layout_bad", "out", "out", "dtype_bad", "qa_mismatch", "qa_contradict", "out_alias_x",
    "x_none", "w_none", "gs_zero"]


def fuzz_qqmm_one(fz):
    rng = fz.rng
    mode, rounding, fp8 = fp_cfg(fz)
    g = R.DEFAULTS[mode][0]
    k = g * int(fz.choice([1, 2, 4, 5]))
    n = int(fz.choice([1, 3, 8, 24, 130]))
    m = int(fz.choice([1, 2, 4, 7, 17, 0]))
    batched_w = fz.coin(0.2)
    nb = int(fz.choice([1, 2, 3]))
    if batched_w:
        xshape = (m, k) if fz.coin(0.4) else (nb, m, k)
        wshape = (nb, n, k)
    else:
        xshape = batch_shape(fz, 2) + (m, k) if fz.coin(0.85) else (k,)
        wshape = (n, k)
    xdt, wdt = pick_dtype(fz), pick_dtype(fz)
    x, w = mm_data(fz, xshape, xdt), mm_data(fz, wshape, wdt)
    gx = gw = None
    if mode == "nvfp4" and fz.coin(0.5):
        gx = gs_value(fz, x) if fz.coin(0.8) else None
        gw = gs_value(fz, w) if fz.coin(0.8) else None
    layout = fz.choice(["linear", "blocked"])
    xform = fz.choice(["float", "float", "qa", "packed"])
    wform = fz.choice(["float", "qa", "packed", "packed"])
    if len(xshape) == 1 and xform == "packed":
        xform = "float"
    xa, rx = operand(fz, x, xform, mode, gx, rounding, fp8, layout)
    wa, rw = operand(fz, w, wform, mode, gw, rounding, fp8, layout)
    kw = {"mode": mode} if (xform != "qa" and wform != "qa") or fz.coin(0.5) else {}
    if mode != "nvfp4" and (rounding != "ceil" or fz.coin(0.3)):
        kw["rounding"] = rounding
    if mode == "mxfp8" and (fp8 != "e4m3" or fz.coin(0.3)) and (xform != "qa" and wform != "qa"):
        kw["fp8_format"] = fp8
    if (xform == "packed" or wform == "packed") and (layout == "blocked" or fz.coin(0.3)):
        kw["scale_layout"] = layout
    if xform == "packed":
        kw["x_scales"] = rx.scales
    args = [xa, wa]
    if wform == "packed":
        args.append(rw.scales)
    if xform != "qa" and gx is not None:
        kw["global_scale_x"] = gx
    if wform != "qa" and gw is not None:
        kw["global_scale_w"] = gw
    if wform == "qa" and xform == "packed" and layout == "linear" and "scale_layout" not in kw:
        pass
    bias = None
    if fz.coin(0.3):
        bias = kw["bias"] = mm_data(fz, (n,), pick_dtype(fz))
    out_shape = R.qqmm(x, w, mode, rounding=rounding, fp8_format=fp8).value.shape
    c, beta = None, 1.0
    if fz.coin(0.25):
        c = kw["c"] = mm_data(fz, out_shape, pick_dtype(fz))
        if fz.coin(0.7):
            beta = kw["beta"] = fz.choice([0.0, -0.75, 2.0, 1])
    out_dt = xdt if xform == "float" else BF16
    if fz.coin(0.3):
        out_dt = pick_dtype(fz)
        kw["dtype"] = dtype_arg(fz, out_dt)
    mut = fz.choice(QQMM_MUTATIONS)
    expect, names = "ok", ()
    if mut == "x_layout" and xform == "float":
        args[0], k2, expect = relayout(fz, x)
        mut, names = "x_layout:" + k2, ("x", "stride", "strides")
    elif mut == "w_layout" and wform != "qa":
        args[1], k2, expect = relayout(fz, np.asarray(wa))
        mut, names = "w_layout:" + k2, ("w", "stride", "strides")
    elif mut == "x_dtype_bad" and xform == "float":
        args[0], expect, names = np.zeros(xshape, fz.choice(BAD_DTYPES)), "raise", ("x",)
        if args[0].dtype in (np.uint8, np.int8):  # 1-byte: read as packed data
            names = ("x", "x_scales")
    elif mut == "w_dtype_bad" and wform == "float":
        args[1], expect, names = np.zeros(wshape, fz.choice(BAD_DTYPES)), "raise", ("w",)
        if args[1].dtype in (np.uint8, np.int8):
            names = ("w", "scales")
    elif mut == "affine":
        kw["mode"], expect, names = "affine", "raise", ("mode",)
    elif mut == "mode_bad":
        kw["mode"], expect, names = fz.choice([e for e in BAD_ENUMS if e is not None]), "raise", ("mode",)
    elif mut == "K_mismatch" and xform == "float" and wform == "float":
        args[1], expect, names = mm_data(fz, wshape[:-1] + (k + g,), wdt), "raise", ("w", "x", "K")
    elif mut == "w_4d" and wform == "float":
        args[1], expect, names = np.ones((2, 2) + wshape[-2:], F32), "raise", ("w",)
    elif mut == "w_batch_mismatch" and xform == "float" and wform == "float":
        args[0] = mm_data(fz, (nb + 1, max(m, 1), k), xdt)
        args[1] = mm_data(fz, (nb, n, k), wdt)
        kw.pop("c", None), kw.pop("out", None)
        expect, names = "raise", ("w", "x", "batch")
    elif mut == "w_batch0" and xform == "float":
        args[0] = mm_data(fz, (max(m, 1), k), xdt)
        args[1] = np.zeros((0, n, k // 2), np.int32) if fz.coin() else np.zeros((0, n, k), F32)
        args[2:] = []
        for a in ("c", "bias", "global_scale_w", "x_scales"):
            kw.pop(a, None)
        kw["mode"] = mode  # the operands no longer carry it
        expect, names = "raise", ("w",)
        if args[1].dtype == F32:
            expect = "either"  # an empty batch of a float w is a legal empty product
    elif mut == "bias_shape":
        kw["bias"], expect, names = np.ones(n + 1, F32), "raise", ("bias",)
    elif mut == "bias_dtype":
        kw["bias"], expect, names = np.ones(n, fz.choice([np.int32, np.float64, np.uint8])), "raise", ("bias",)
    elif mut == "c_shape":
        kw["c"], expect, names = np.ones(out_shape[:-1] + (n + 1,), F32), "raise", ("c",)
        kw["beta"] = fz.choice([1.0, -2.0])
    elif mut == "c_dtype":
        kw["c"], expect, names = np.ones(out_shape, fz.choice([np.int32, np.float64])), "raise", ("c",)
        kw["beta"] = 1.0
    elif mut == "beta_bad":
        kw["c"] = np.ones(out_shape, F32)
        kw["beta"], expect, names = fz.choice(["x", None, [1.0], 1j]), "raise", ("beta",)
    elif mut == "gs_other_mode" and mode != "nvfp4":
        a = fz.choice(["global_scale_x", "global_scale_w"])
        kw[a], expect, names = np.array(1.0, F32), "raise", (a, "global_scale")
    elif mut == "gs_zero" and mode == "nvfp4" and xform == "float":
        kw["global_scale_x"], expect, names = -1.0, "raise", ("global_scale_x",)
        mut = "gs_negative"
    elif mut == "scales_missing" and wform == "packed":
        args = args[:2]
        expect, names = "raise", ("scales",)
    elif mut == "x_scales_missing" and xform == "packed":
        kw.pop("x_scales")
        expect, names = "raise", ("x_scales",)
    elif mut == "scales_shape" and wform == "packed":
        args[2], expect, names = np.ascontiguousarray(args[2][..., :-1]), "raise", ("scales",)
    elif mut == "scales_dtype" and wform == "packed":
        args[2], expect, names = args[2].astype(fz.choice([F32, np.int32])), "raise", ("scales",)
    elif mut == "rounding_bad":
        kw["rounding"], expect, names = fz.choice(BAD_ENUMS), "raise", ("rounding",)
    elif mut == "scale_layout_bad":
        kw["scale_layout"], expect, names = fz.choice(BAD_ENUMS), "raise", ("scale_layout",)
    elif mut == "out":
        out, mut, expect = out_mutation(fz, out_shape, out_dt, (np.float64, np.int32, np.uint8))
        if mut == "out_dtype" and "dtype" not in kw and out.dtype not in FLOATS:
            expect = "raise"
        kw["out"], names = out, ("out", "dtype")
        if expect == "ok" and "dtype" not in kw:
            out_dt = out.dtype
        if expect == "ok" and c is not None and fz.coin(0.5):
            kw["out"] = kw["c"] = cast(np.asarray(c).astype(F32), out.dtype)
            c = kw["c"].copy()
            mut = "out_is_c"
    elif mut == "dtype_bad":
        kw["dtype"], expect, names = fz.choice(["int8", "float64", np.int32, "half"]), "raise", ("dtype",)
    elif mut == "qa_mismatch" and xform == "qa" and wform == "qa" and k % 32 == 0:
        other = fz.choice([md for md in FP_MODES if md != mode])
        args[1] = qq.quantize(w, mode=other)
        kw.pop("global_scale_w", None)
        expect, names = "raise", ("mode", "x", "w")
    elif mut == "qa_contradict" and (xform == "qa" or wform == "qa"):
        # (an explicit "nvfp4", qqmm's default, cannot be told from an omitted mode)
        kw["mode"] = fz.choice([md for md in FP_MODES if md not in (mode, "nvfp4")] or ["mxfp4"])
        expect, names = ("raise", ("mode",)) if kw["mode"] != mode else ("ok", ())
    elif mut == "out_alias_x" and xform == "float" and x.ndim >= 2:
        if out_shape == x.shape and out_dt == x.dtype and "dtype" not in kw:
            kw["out"] = args[0] = x.copy()
            expect, names = "either", ("out", "x", "overlap", "overlaps")
        else:
            mut = "valid"
    elif mut == "x_none":
        args[0], expect, names = None, "raise", ("x",)
        kw["mode"] = mode
    elif mut == "w_none":
        args[1], expect, names = None, "raise", ("w",)
        kw["mode"] = mode
    else:
        mut = "valid"
    if expect == "raise":
        fz.call("qqmm", qq.qqmm, tuple(args), kw, kind=mut, expect="raise", names=names)
        return
    rx, rw = to_linear(rx), to_linear(rw)
    beta_ref = float(kw.get("beta", 1.0)) if kw.get("c") is not None else 0.0
    c_ref = None if beta_ref == 0.0 or c is None else np.asarray(c).astype(F32)
    if batched_w and x.ndim == 3:
        ref = stack_refs([R.qqmm(_rq_index(rx, i), _rq_index(rw, i), mode, bias=bias,
                                 c=None if c_ref is None else c_ref[i], beta=beta_ref)
                          for i in range(nb)])
    elif batched_w:
        ref = stack_refs([R.qqmm(rx, _rq_index(rw, i), mode, bias=bias,
                                 c=None if c_ref is None else c_ref[i], beta=beta_ref) for i in range(nb)])
    else:
        ref = R.qqmm(rx, rw, mode, bias=bias, c=c_ref, beta=beta_ref)
    want_dt = out_dt
    if mut == "w_batch0":
        ref = R.MatmulRef(np.zeros((0, max(m, 1), n)), np.zeros((0, max(m, 1), n)))

    def check(got):
        if "out" in kw:
            assert got is kw["out"], "out= must be returned"
        got = np.asarray(got)
        assert got.shape == ref.value.shape, (got.shape, ref.value.shape)
        if got.size:
            msg = R.matmul_mismatch(got, ref)
            assert msg is None, f"qqmm: {msg}"
        assert got.dtype == np.dtype(want_dt), f"dtype {got.dtype}, expected {np.dtype(want_dt)}"

    fz.call("qqmm", qq.qqmm, tuple(args), kw, kind=mut, expect=expect, names=names, check=check)


def to_linear(rq):
    """The same RefQuantized with linear scales (the matmul references then never unswizzle,
    which reference.py cannot do for 0-size scales)."""
    return dataclasses.replace(rq, scales=rq.linear_scales, scale_layout="linear")


def _rq_index(rq, i):
    """Batch entry i of a RefQuantized (linear or blocked scales)."""
    return dataclasses.replace(rq, data=rq.data[i], scales=rq.scales[i], codes=rq.codes[i],
                               linear_scales=rq.linear_scales[i], loose_sign=rq.loose_sign[i],
                               shape=rq.shape[1:])


def test_fuzz_qqmm():
    fz = Fuzzer(SEED + 6)
    run_budget(fz, 350, fuzz_qqmm_one)
    fz.report("qqmm")


def fuzz_prepare_one(fz):
    mode, rounding, fp8 = fp_cfg(fz)
    g = R.DEFAULTS[mode][0]
    n, k = int(fz.choice([1, 5, 24, 130])), g * int(fz.choice([1, 2, 4]))
    w = mm_data(fz, (n, k), pick_dtype(fz))
    gw = gs_value(fz, w) if mode == "nvfp4" and fz.coin(0.5) else None
    kw = {"mode": mode}
    if mode != "nvfp4":
        kw["rounding"] = rounding
    if mode == "mxfp8":
        kw["fp8_format"] = fp8
    if gw is not None:
        kw["global_scale"] = gw
    mut = fz.choice(["valid"] * 4 + ["affine", "w_4d", "w_dtype_bad", "mode_bad", "K_ragged", "from_qa"])
    arg, expect, names = w, "ok", ()
    if mut == "affine":
        kw = {"mode": "affine"}
        expect, names = "raise", ("mode",)
    elif mut == "w_4d":     # [N, K], or grouped_qqmm's [E, N, K]; nothing else
        arg, expect, names = np.ones((2, 2, n, k), F32), "raise", ("w",)
    elif mut == "w_dtype_bad":
        arg, expect, names = np.ones((n, k), fz.choice(BAD_DTYPES)), "raise", ("w",)
    elif mut == "mode_bad":
        kw["mode"], expect, names = fz.choice(BAD_ENUMS), "raise", ("mode",)
    elif mut == "K_ragged":
        arg, expect, names = np.ones((n, k + 1), F32), "raise", ("w", "K", "group_size")
    elif mut == "from_qa":
        arg = qq.quantize(w, scale_layout=fz.choice(["linear", "blocked"]), **kw)
        kw = {}
    else:
        mut = "valid"
    if expect == "raise":
        fz.call("prepare_weight", qq.prepare_weight, (arg,), kw, kind=mut, expect="raise", names=names)
        return
    rq = quantize_ref(w, None, None, mode, gw, rounding, "blocked", fp8)
    m = int(fz.choice([1, 3, 4, 5, 16, 17, 40]))
    x = mm_data(fz, (m, k), pick_dtype(fz))
    gx = gs_value(fz, x) if mode == "nvfp4" and fz.coin(0.5) else None

    def check(pw):
        assert isinstance(pw, qq.PreparedWeight), type(pw)
        assert tuple(pw.shape) == (n, k), pw.shape
        if mut != "from_qa":
            assert_quantized_equal(pw.quantized, rq, w, what="prepare_weight.quantized")
        if pw.values is not None:
            want = R.dequantize(rq.data, rq.scales, None, rq.group_size, rq.bits, mode,
                                scale_layout="blocked", fp8_format=fp8, dtype=BF16)
            assert_bits_equal(np.asarray(pw.values), want, "prepare_weight.values")
        qkw = {"mode": mode}
        if mode != "nvfp4":
            qkw["rounding"] = rounding
        if gx is not None:
            qkw["global_scale_x"] = gx
        ref = R.qqmm(x, to_linear(rq), mode, global_scale_x=gs_ref(gx), rounding=rounding, fp8_format=fp8)
        fz.call("qqmm", qq.qqmm, (x, pw), qkw, kind="prepared", check=lambda y: _mm_check(y, ref, x.dtype))

    fz.call("prepare_weight", qq.prepare_weight, (arg,), kw, kind=mut, expect=expect, names=names,
            check=check)


def _mm_check(got, ref, dt):
    got = np.asarray(got)
    assert got.shape == ref.value.shape, (got.shape, ref.value.shape)
    assert got.dtype == np.dtype(dt), (got.dtype, dt)
    msg = R.matmul_mismatch(got, ref) if got.size else None
    assert msg is None, msg


def test_fuzz_prepare_weight():
    fz = Fuzzer(SEED + 7)
    run_budget(fz, 100, fuzz_prepare_one)
    fz.report("prepare_weight")


# ---------------------------------------------------------------------------
# grouped_qqmm
# ---------------------------------------------------------------------------

def fuzz_grouped_one(fz):
    rng = fz.rng
    mode, rounding, fp8 = fp_cfg(fz)
    g = R.DEFAULTS[mode][0]
    e = int(fz.choice([1, 2, 3, 6]))
    sizes = [int(fz.choice([0, 0, 1, 2, 5, 17, 33])) for _ in range(e)]
    t = sum(sizes)
    offsets = np.cumsum(sizes).astype(np.int32)
    n = int(fz.choice([1, 8, 24, 40]))
    moe = mode == "mxfp8" and fz.coin(0.25)
    k = g * int(fz.choice([1, 2, 4])) if not moe else 32 * int(fz.choice([1, 2]))
    if moe:
        n = 32 * int(fz.choice([1, 2]))
    xdt = pick_dtype(fz)
    x = mm_data(fz, (t, k), xdt)
    w = mm_data(fz, (e, n, k), pick_dtype(fz))
    kw = {"mode": mode} if mode != "mxfp8" or fz.coin(0.5) else {}
    if mode != "nvfp4" and (rounding != "ceil" or fz.coin(0.3)):
        kw["rounding"] = rounding
    if mode == "mxfp8" and (fp8 != "e4m3" or fz.coin(0.3)):
        kw["fp8_format"] = fp8
    gx = gw = None
    wform = fz.choice(["float", "qa", "packed"]) if not moe else "moe"
    xform = fz.choice(["float", "float", "qa", "packed"])
    layout = fz.choice(["linear", "blocked"])
    if mode == "nvfp4" and wform != "qa" and fz.coin(0.5):
        gx = gs_value(fz, x) if fz.coin(0.8) else None
        gw = np.array([R.amax(w[i]) if R.amax(w[i]) > 0 else 1.0 for i in range(e)], F32)
        if gx is not None:
            kw["global_scale_x"] = gx
        kw["global_scale_w"] = gw
    rx = quantize_ref(x, None, None, mode, gx, rounding, "linear", fp8)
    args = [x, None, offsets]
    if xform == "qa":
        qkw = {"mode": mode, "rounding": rounding, "fp8_format": fp8}
        if gx is not None:
            qkw["global_scale"] = gx
            kw.pop("global_scale_x", None)
        args[0] = qq.quantize(x, **qkw)
    elif xform == "packed":
        args[0], kw["x_scales"] = rx.data, rx.scales
    codes = blocked = None
    if wform == "float":
        args[1] = w
    elif wform == "qa":
        args[1] = qq.quantize(w, mode=mode, rounding=rounding, fp8_format=fp8, scale_layout=layout)
        kw.pop("fp8_format", None)
    elif wform == "packed":
        per = [quantize_ref(w[i], None, None, mode, None if gw is None else gw[i], rounding, layout, fp8)
               for i in range(e)]
        args[1] = np.stack([r.data for r in per])
        args.append(np.stack([r.scales for r in per]))
        if layout == "blocked" or fz.coin(0.3):
            kw["scale_layout"] = layout
    else:  # quantize_moe weights [E, K, N]
        scaling = fz.choice(["32x1", "32x32"])
        wt = np.ascontiguousarray(w.transpose(0, 2, 1))
        data, sc = qq.quantize_moe(wt, scaling, scale_layout="blocked", rounding=rounding, fp8_format=fp8)
        codes, blocked = ref_moe(wt, scaling, rounding, fp8, layout="blocked")
        args[1] = (data, sc)
        kw.update(moe_scaling=scaling, scale_layout="blocked")
    out_dt = xdt if xform == "float" else BF16
    if fz.coin(0.3):
        out_dt = pick_dtype(fz)
        kw["dtype"] = dtype_arg(fz, out_dt)
    mut = fz.choice(["valid"] * 8 + [
        "offsets_int64", "offsets_f32", "offsets_decreasing", "offsets_last", "offsets_negative",
        "offsets_len", "offsets_2d", "x_scales_rows_more", "x_scales_rows_fewer", "w_2d", "K_mismatch",
        "x_dtype_bad", "out", "affine", "moe_scaling_bad", "x_layout", "offsets_none"])
    expect, names = "ok", ()
    if mut == "offsets_int64":
        args[2], expect, names = offsets.astype(np.int64), "either", ("offsets",)
    elif mut == "offsets_f32":
        args[2], expect, names = offsets.astype(F32), "raise", ("offsets",)
    elif mut == "offsets_decreasing" and e >= 2 and t > 0:
        o = offsets.copy()
        o[0] = t + 1 if e == 2 else t
        o[1] = 0 if e > 2 else o[1]
        args[2], expect, names = o, "raise", ("offsets",)
    elif mut == "offsets_last":
        o = offsets.copy()
        o[-1] = t + int(fz.choice([1, -1 if t else 2, 100]))
        args[2], expect, names = o, "raise", ("offsets",)
    elif mut == "offsets_negative":
        o = offsets.copy()
        o[0] = -1
        args[2], expect, names = o, "raise", ("offsets",)
    elif mut == "offsets_len":
        o = np.concatenate([offsets, [t]]).astype(np.int32) if fz.coin() else offsets[1:]
        if len(o) == 0:
            o = np.array([t, t], np.int32)
        args[2], expect, names = o, "raise", ("offsets", "w", "E")
    elif mut == "offsets_2d":
        args[2], expect, names = offsets[None], "raise", ("offsets",)
    elif mut == "offsets_none":
        args[2], expect, names = None, "raise", ("offsets",)
    elif mut.startswith("x_scales_rows") and xform == "packed" and t > 0:
        s = kw["x_scales"]
        big = np.concatenate([s, s[:1]])          # T + 1 rows in memory
        kw["x_scales"] = big if mut.endswith("more") else big[:t - 1] if t > 1 else big[:0]
        expect, names = "raise", ("x_scales",)
    elif mut == "w_2d" and wform == "float":
        args[1], expect, names = w[0], "raise", ("w",)
    elif mut == "K_mismatch" and wform == "float" and xform == "float":
        args[1], expect, names = mm_data(fz, (e, n, k + g), F32), "raise", ("w", "x", "K")
    elif mut == "x_dtype_bad" and xform == "float":
        args[0], expect, names = np.zeros((t, k), fz.choice(BAD_DTYPES)), "raise", ("x",)
        if args[0].dtype in (np.uint8, np.int8):
            names = ("x", "x_scales")
    elif mut == "out":
        out, mut, expect = out_mutation(fz, (t, n), out_dt, (np.float64, np.int32, np.uint8))
        kw["out"], names = out, ("out", "dtype")
        if expect == "ok" and "dtype" not in kw:
            out_dt = out.dtype
    elif mut == "affine" and not moe:
        kw["mode"], expect, names = "affine", "raise", ("mode",)
    elif mut == "moe_scaling_bad":
        kw["moe_scaling"], expect, names = fz.choice(["16x16", "32X32", 1]), "raise", ("moe_scaling",)
    elif mut == "x_layout" and xform == "float":
        args[0], k2, expect = relayout(fz, x)
        mut, names = "x_layout:" + k2, ("x", "stride", "strides")
    else:
        mut = "valid"
    if expect == "raise":
        fz.call("grouped_qqmm", qq.grouped_qqmm, tuple(args), kw, kind=mut, expect="raise", names=names)
        return
    vals, sums = np.zeros((t, n)), np.zeros((t, n))
    r0 = 0
    for i, sz in enumerate(sizes):
        if sz:
            xe = quantize_ref(x[r0:r0 + sz], None, None, mode, gx, rounding, "linear", fp8)
            if moe:
                s = R.unswizzle(blocked[i], (n, k // 32))
                we = dataclasses.replace(quantize_ref(np.zeros((n, k), F32), None, None, "mxfp8", None,
                                                      "ceil", "linear", fp8),
                                         data=np.ascontiguousarray(codes[i].T), scales=s)
            else:
                we = quantize_ref(w[i], None, None, mode, None if gw is None else gw[i], rounding,
                                  "linear", fp8)
            r = R.qqmm(xe, we, mode)
            vals[r0:r0 + sz], sums[r0:r0 + sz] = r.value, r.abs_sum
        r0 += sz
    ref = R.MatmulRef(vals, sums)

    def check(got):
        if "out" in kw:
            assert got is kw["out"], "out= must be returned"
        _mm_check(got, ref, out_dt)

    fz.call("grouped_qqmm", qq.grouped_qqmm, tuple(args), kw, kind=mut, expect=expect, names=names,
            check=check)


def test_fuzz_grouped_qqmm():
    fz = Fuzzer(SEED + 8)
    run_budget(fz, 200, fuzz_grouped_one)
    fz.report("grouped_qqmm")


def fuzz_wgrad_one(fz):
    """grouped_qqmm_wgrad (C entry point qqGroupedQqmmWgrad): ragged and empty experts, any
    K and N, every fp mode and input dtype, nvfp4 global scales, each result dtype; and the
    mutations a caller gets wrong (offsets, shapes, dtypes, scales, layouts)."""
    mode, rounding, fp8 = fp_cfg(fz)
    e = int(fz.choice([1, 2, 3, 5]))
    sizes = [int(fz.choice([0, 0, 1, 3, 16, 31, 33])) for _ in range(e)]
    t = sum(sizes)
    offsets = np.cumsum(sizes).astype(np.int32)
    k, n = int(fz.choice([1, 8, 24, 40])), int(fz.choice([1, 8, 16, 36]))
    x = mm_data(fz, (t, k), pick_dtype(fz))
    dy = mm_data(fz, (t, n), pick_dtype(fz))
    kw = {"mode": mode} if mode != "mxfp8" or fz.coin(0.5) else {}
    if mode != "nvfp4" and (rounding != "ceil" or fz.coin(0.3)):
        kw["rounding"] = rounding
    if mode == "mxfp8" and (fp8 != "e4m3" or fz.coin(0.3)):
        kw["fp8_format"] = fp8
    gx = gd = None
    if mode == "nvfp4" and fz.coin(0.5):
        gx, gd = gs_value(fz, x), gs_value(fz, dy)
        kw.update(global_scale_x=gx, global_scale_dy=gd)
    out_dt = np.dtype(F32)
    if fz.coin(0.4):
        out_dt = np.dtype(pick_dtype(fz))
        kw["dtype"] = {np.dtype(F32): "float32", np.dtype(np.float16): "float16", BF16: "bfloat16"}[out_dt]
    args = [x, dy, offsets]
    mut = fz.choice(["valid"] * 6 + [
        "offsets_int64", "offsets_decreasing", "offsets_last", "offsets_negative", "offsets_2d",
        "offsets_empty", "x_1d", "dy_rows", "x_dtype_bad", "affine", "one_gs", "gs_not_nvfp4",
        "dtype_bad", "x_layout"])
    expect, names = "ok", ()
    if mut == "offsets_int64":
        args[2], expect, names = offsets.astype(np.int64), "raise", ("offsets",)
    elif mut == "offsets_decreasing" and e >= 2 and t > 0:
        o = offsets.copy()
        o[0] = t
        o[1] = 0
        args[2], expect, names = o, "raise", ("offsets",)
    elif mut == "offsets_last":
        o = offsets.copy()
        o[-1] = t + int(fz.choice([1, 100]))
        args[2], expect, names = o, "raise", ("offsets",)
    elif mut == "offsets_negative":
        o = offsets.copy()
        o[0] = -1
        args[2], expect, names = o, "raise", ("offsets",)
    elif mut == "offsets_2d":
        args[2], expect, names = offsets[None], "raise", ("offsets",)
    elif mut == "offsets_empty":
        args[2], expect, names = offsets[:0], "raise", ("offsets",)
    elif mut == "x_1d":
        args[0], expect, names = x.reshape(-1), "raise", ("x",)
    elif mut == "dy_rows":
        args[1], expect, names = mm_data(fz, (t + 1, n), F32), "raise", ("x", "dy", "T")
    elif mut == "x_dtype_bad":
        args[0], expect, names = np.zeros((t, k), fz.choice(BAD_DTYPES)), "raise", ("x",)
    elif mut == "affine":
        kw["mode"], expect, names = "affine", "raise", ("mode",)
    elif mut == "one_gs" and mode == "nvfp4":
        kw.pop("global_scale_dy", None)
        kw["global_scale_x"] = gs_value(fz, x)
        expect, names = "raise", ("global_scale_x", "global_scale_dy")
    elif mut == "gs_not_nvfp4" and mode != "nvfp4":
        kw.update(global_scale_x=1.0, global_scale_dy=1.0)
        expect, names = "raise", ("global_scale_x", "global", "nvfp4")
    elif mut == "dtype_bad":
        kw["dtype"], expect, names = fz.choice(["int8", "float64", "bf16"]), "raise", ("dtype",)
    elif mut == "x_layout":
        args[0], k2, expect = relayout(fz, x)
        mut, names = "x_layout:" + k2, ("x", "stride", "strides")
    else:
        mut = "valid"
    if expect == "raise":
        fz.call("grouped_qqmm_wgrad", qq.grouped_qqmm_wgrad, tuple(args), kw, kind=mut, expect="raise",
                names=names)
        return

    def check(got):
        got = np.asarray(got)
        assert got.shape == (e, k, n) and got.dtype == out_dt, (got.shape, got.dtype)
        r0 = 0
        for i, sz in enumerate(sizes):
            if sz == 0:
                assert not got[i].astype(F32).any(), f"expert {i} (empty) must be zero"
            else:
                ref = ref_wgrad_expert(x[r0:r0 + sz], dy[r0:r0 + sz], FpCfg(mode, rounding, fp8), gs_ref(gx),
                                       gs_ref(gd))
                msg = R.matmul_mismatch(got[i], ref)
                assert msg is None, f"expert {i}: {msg}"
            r0 += sz

    fz.call("grouped_qqmm_wgrad", qq.grouped_qqmm_wgrad, tuple(args), kw, kind=mut, expect=expect, names=names,
            check=check)


def test_fuzz_grouped_qqmm_wgrad():
    fz = Fuzzer(SEED + 11)
    run_budget(fz, 150, fuzz_wgrad_one)
    fz.report("grouped_qqmm_wgrad")


# ---------------------------------------------------------------------------
# quantized_matmul
# ---------------------------------------------------------------------------

QMM_BATCH = [((), ()), ((2,), ()), ((), (2,)), ((2, 1), (3,)), ((2, 3), (1, 3)), ((3,), (3,)),
             ((0,), ()), ((1,), (2,))]


def fuzz_qmm_one(fz):
    rng = fz.rng
    mode = fz.choice(R.MODES)
    g, b = group_bits(fz, mode)
    fp8 = fz.choice(["e4m3", "e5m2"]) if mode == "mxfp8" else "e4m3"
    transpose = fz.coin(0.6)
    xb, wb = fz.choice(QMM_BATCH)
    m = int(fz.choice([1, 2, 3, 5, 17, 70, 0]))
    if transpose:
        k = g * int(fz.choice([1, 2, 3]))
        n = int(fz.choice([1, 7, 24, 130]))
        wshape = wb + (n, k)
    else:
        k = int(fz.choice([1, 5, 24, 64]))
        n = g * int(fz.choice([1, 2]))
        wshape = wb + (k, n)
    xdt = pick_dtype(fz)
    x = mm_data(fz, xb + (m, k), xdt) if fz.coin(0.9) else mm_data(fz, (k,), xdt)
    wf = mm_data(fz, wshape, pick_dtype(fz) if mode == "affine" else F32)
    gs = gs_value(fz, wf) if mode == "nvfp4" and fz.coin(0.5) else None
    layout = "blocked" if mode != "affine" and transpose and fz.coin(0.4) else "linear"
    rq = quantize_ref(wf, g, b, mode, gs, "ceil", layout, fp8)
    form = fz.choice(["raw", "raw", "qa"])
    kw = {"transpose": transpose} if (not transpose or fz.coin(0.5)) else {}
    if form == "qa":
        qkw = {"mode": mode, "group_size": g, "bits": b, "scale_layout": layout}
        if mode == "mxfp8":
            qkw["fp8_format"] = fp8
        if gs is not None:
            qkw["global_scale"] = gs
        args = [x, qq.quantize(wf, **qkw)]
    else:
        args = [x, rq.data, rq.scales, rq.biases]
        kw.update(group_size=g, bits=b, mode=mode)
        if mode == "mxfp8":
            kw["fp8_format"] = fp8
        if layout == "blocked":
            kw["scale_layout"] = layout
        if gs is not None:
            kw["global_scale"] = gs
    bias = None
    if fz.coin(0.3):
        bias = kw["bias"] = mm_data(fz, (n,), pick_dtype(fz))
    out_dt = xdt
    if fz.coin(0.3):
        out_dt = pick_dtype(fz)
        kw["dtype"] = dtype_arg(fz, out_dt)
    ref = R.quantized_matmul(x, to_linear(rq), transpose=transpose, bias=bias)
    mut = fz.choice(["valid"] * 8 + ["x_layout", "w_layout", "x_dtype_bad", "K_mismatch", "batch_mismatch",
                                     "scales_shape", "biases_missing", "gs_other_mode", "blocked_no_transpose",
                                     "bias_shape", "bits_bad", "out", "out", "dtype_bad", "mode_bad", "x_none",
                                     "transpose_qa_contradict"])
    expect, names = "ok", ()
    if mut == "x_layout":
        args[0], k2, expect = relayout(fz, x)
        mut, names = "x_layout:" + k2, ("x", "stride", "strides")
    elif mut == "w_layout" and form == "raw":
        args[1], k2, expect = relayout(fz, rq.data)
        mut, names = "w_layout:" + k2, ("w", "stride", "strides")
    elif mut == "x_dtype_bad":
        args[0], expect, names = np.zeros(x.shape, fz.choice(BAD_DTYPES)), "raise", ("x",)
        require = ()
    elif mut == "K_mismatch":
        args[0], expect, names = mm_data(fz, x.shape[:-1] + (k + g,), xdt), "raise", ("x", "w", "K")
    elif mut == "batch_mismatch" and form == "raw":
        args[0] = mm_data(fz, (4, max(m, 1), k), xdt)
        args[1:4] = [np.stack([a] * 3) if a is not None else None for a in (rq.data, rq.scales, rq.biases)]
        if len(wb):
            args[1:4] = [np.stack([a] * 3)[:, None] if a is not None else None for a in (rq.data, rq.scales, rq.biases)]
        expect, names = "raise", ("x", "w", "batch", "broadcast")
    elif mut == "scales_shape" and form == "raw":
        args[2], expect, names = np.ascontiguousarray(rq.scales[..., :1, :]) if rq.scales.shape[-2] > 1 else \
            np.concatenate([rq.scales, rq.scales], -2), "raise", ("scales",)
    elif mut == "biases_missing" and form == "raw" and mode == "affine":
        args[3], expect, names = None, "raise", ("biases",)
    elif mut == "gs_other_mode" and mode != "nvfp4" and form == "raw":
        kw["global_scale"], expect, names = np.array(1.0, F32), "raise", ("global_scale",)
    elif mut == "blocked_no_transpose" and form == "raw" and mode != "affine" and not transpose:
        args[2] = swizzle_ref(rq.scales)
        kw["scale_layout"], expect, names = "blocked", "raise", ("scale_layout", "transpose")
    elif mut == "bias_shape":
        kw["bias"], expect, names = np.ones(n + 1, F32), "raise", ("bias",)
    elif mut == "bits_bad" and form == "raw":
        kw["bits"], expect, names = fz.choice(BAD_INTS), "raise", ("bits",)
    elif mut == "out":
        out, mut, expect = out_mutation(fz, ref.value.shape, out_dt, (np.float64, np.int32, np.uint8))
        kw["out"], names = out, ("out", "dtype")
        if expect == "ok" and "dtype" not in kw:
            out_dt = out.dtype
    elif mut == "dtype_bad":
        kw["dtype"], expect, names = fz.choice(["int8", "float64", np.int32]), "raise", ("dtype",)
    elif mut == "mode_bad" and form == "raw":
        kw["mode"], expect, names = fz.choice(BAD_ENUMS), "raise", ("mode",)
        kw.pop("group_size"), kw.pop("bits")
    elif mut == "x_none":
        args[0], expect, names = None, "raise", ("x",)
    elif mut == "transpose_qa_contradict" and form == "qa" and mode != "affine":
        kw["mode"] = fz.choice([md for md in FP_MODES if md != mode])
        expect, names = "raise", ("mode",)
    else:
        mut = "valid"
    if len(args) == 4 and args[3] is None:
        args = args[:3]
    if expect == "raise":
        fz.call("quantized_matmul", qq.quantized_matmul, tuple(args), kw, kind=mut, expect="raise",
                names=names)
        return

    def check(got):
        if "out" in kw:
            assert got is kw["out"], "out= must be returned"
        _mm_check(got, ref, out_dt)

    fz.call("quantized_matmul", qq.quantized_matmul, tuple(args), kw, kind=mut, expect=expect, names=names,
            check=check)


def test_fuzz_quantized_matmul():
    fz = Fuzzer(SEED + 9)
    run_budget(fz, 350, fuzz_qmm_one)
    fz.report("quantized_matmul")


# ---------------------------------------------------------------------------
# The property can fail: planted bugs must be reported
# ---------------------------------------------------------------------------

def _flip_first_bit(a):
    a = np.array(a, copy=True)
    if a.size:
        a.reshape(-1).view(np.uint8)[0] ^= 1
    return a


def _categories(fz):
    return {f.category for _, f in fz.failures.values()}


def test_fuzz_catches_planted_bugs(monkeypatch):
    """Every kind of failure the fuzz tests look for is reported when planted:

    * a reference with one flipped bit (reference.quantize's packed data and codes,
      reference.dequantize's result, reference.swizzle's result, reference.amax's result)
      and a matmul reference 1 % off in one element (reference.qqmm, and
      reference.quantized_matmul) -> "wrong-result" from the corresponding fuzz loop;
    * an op that raises RuntimeError -> "wrong-exception"; a message without the
      argument's name -> "message-no-arg"; without the function's name ->
      "message-no-func"; an invalid call that returns -> "accepted-invalid"; a valid call
      that raises -> "raised-on-valid".
    """
    orig_q, orig_dq, orig_sw, orig_amax = R.quantize, R.dequantize, R.swizzle, R.amax
    orig_qqmm, orig_qmm = R.qqmm, R.quantized_matmul

    def bad_quantize(*a, **k):
        r = orig_q(*a, **k)
        if r.data.size:
            codes = r.codes.copy()
            codes.reshape(-1)[0] ^= 1
            r = dataclasses.replace(r, codes=codes, data=R.pack(codes, r.bits))
        return r

    def off_by_1pct(ref):
        v = np.array(ref.value, copy=True)
        if v.size:
            v.reshape(-1)[0] = v.reshape(-1)[0] * 1.01 + 1e-3
        return dataclasses.replace(ref, value=v, alt_value=None if ref.alt_value is None else v)

    plants = [
        ("quantize", fuzz_quantize_one, "quantize", bad_quantize),
        ("dequantize", fuzz_dequantize_one, "dequantize", lambda *a, **k: _flip_first_bit(orig_dq(*a, **k))),
        ("swizzle", fuzz_swizzle_one, "swizzle", lambda *a, **k: _flip_first_bit(orig_sw(*a, **k))),
        ("amax", fuzz_amax_one, "amax", lambda *a, **k: np.nextafter(orig_amax(*a, **k), F32(np.inf))),
        ("qqmm", fuzz_qqmm_one, "qqmm", lambda *a, **k: off_by_1pct(orig_qqmm(*a, **k))),
        ("quantized_matmul", fuzz_qmm_one, "quantized_matmul", lambda *a, **k: off_by_1pct(orig_qmm(*a, **k))),
    ]
    for name, one, attr, bad in plants:
        with monkeypatch.context() as mp:
            mp.setattr(R, attr, bad)
            fz = Fuzzer(SEED + 100)
            for _ in range(60):
                one(fz)
            assert "wrong-result" in _categories(fz), f"a planted wrong {name} reference went unnoticed"

    fz = Fuzzer(0)
    fz.strict = True

    def raises(exc, msg):
        def f(*a, **k):
            raise exc(msg)
        return f

    fz.call("quantize", raises(RuntimeError, "quantize: x: boom"), (1,), expect="raise", names=("x",))
    fz.call("quantize", raises(ValueError, "quantize: something is wrong"), (1,), expect="raise", names=("x",))
    fz.call("quantize", raises(ValueError, "x is wrong"), (1,), expect="raise", names=("x",))
    fz.call("quantize", lambda *a: None, (1,), kind="k1", expect="raise", names=("x",))
    fz.call("quantize", raises(TypeError, "quantize: x: no"), (1,), kind="k2", expect="ok")
    fz.call("quantize", lambda *a: 1, (1,), kind="k3", expect="ok", check=lambda r: None)
    assert _categories(fz) == {"wrong-exception", "message-no-arg", "message-no-func", "accepted-invalid",
                               "raised-on-valid"}, _categories(fz)
    assert len(fz.failures) == 5


# ---------------------------------------------------------------------------
# Explicit reproducers of the defects the fuzz tests recognise (KNOWN); XPASS once fixed
# ---------------------------------------------------------------------------

def _overlap_dequantize():
    x = np.linspace(-1, 1, 4 * 64, dtype=F32).reshape(4, 64)
    q = R.quantize(x, mode="mxfp8")
    buf = np.zeros(4 * 64 * 4 + q.data.nbytes, np.uint8)
    out = buf[:4 * 64 * 4].view(F32).reshape(4, 64)
    data = buf[100:100 + q.data.nbytes].reshape(q.data.shape)
    data[...] = q.data
    want = R.dequantize(q.data, q.scales, mode="mxfp8", dtype=F32)
    return (data, q.scales), {"mode": "mxfp8", "dtype": "float32", "out": out}, want


def _unswizzle_in_place():
    lin = np.arange(300, dtype=np.uint8).reshape(100, 3)
    blk = R.swizzle(lin)
    return (blk, (100, 3)), {"out": blk.reshape(-1)[:300].reshape(100, 3)}, lin


def _grouped_short_x_scales():
    x = np.linspace(-1, 1, 5 * 32, dtype=F32).reshape(5, 32)
    q = R.quantize(x, mode="mxfp8")
    return (q.data, np.ones((1, 8, 32), F32), np.array([5], np.int32)), {"x_scales": q.scales[:4]}


X64 = np.linspace(-1, 1, 4 * 64, dtype=F32).reshape(4, 64)
S128 = (np.arange(512) % 251).astype(np.uint8).reshape(128, 4)

# (id, reason, op, fn, args, kwargs, expect, names, want or None, forbid, require)
REPRODUCERS = [
    ("grouped-x-scales-rows", KNOWN[0][0], "grouped_qqmm", qq.grouped_qqmm, *_grouped_short_x_scales(),
     "raise", ("x_scales",), None, (), ()),
    ("qqmm-w-batch0", KNOWN[1][0], "qqmm", qq.qqmm, (np.zeros((4, 64), F32), np.zeros((0, 8, 32), np.int32)), {},
     "raise", ("w",), None, (), ()),
    ("swizzle-out-is-input", KNOWN[2][0], "swizzle_scales", qq.swizzle_scales, (S128,), {"out": S128.copy()},
     "either", ("out",), R.swizzle(S128), (), ()),
    ("unswizzle-in-place", KNOWN[2][0], "unswizzle_scales", qq.unswizzle_scales, *_unswizzle_in_place()[:2],
     "either", ("out",), _unswizzle_in_place()[2], (), ()),
    ("dequantize-out-overlaps-w", KNOWN[2][0], "dequantize", qq.dequantize, *_overlap_dequantize()[:2], "either",
     ("out",), _overlap_dequantize()[2], (), ()),
    ("misaligned-x", KNOWN[3][0], "amax", qq.amax, (at_offset(X64, 1),), {}, "raise", ("x",), None, (), ()),
    ("nvfp4-gs-negative", KNOWN[4][0], "quantize", qq.quantize, (X64,), {"mode": "nvfp4", "global_scale": -1.0},
     "raise", ("global_scale",), None, (), ()),
    ("nvfp4-gs-tiny", KNOWN[4][0], "quantize", qq.quantize, (X64,), {"mode": "nvfp4", "global_scale": 1e-40},
     "raise", ("global_scale",), None, (), ()),
    ("swizzle-zero-cols", KNOWN[5][0], "swizzle_scales", qq.swizzle_scales, (np.zeros((4, 0), np.uint8),), {},
     "either", ("scales",), np.zeros((128, 0), np.uint8), (r"\bx\b", r"\bK\b", "mxfp8"), ()),
    ("colwise-M-ragged", KNOWN[6][0], "quantize_colwise", qq.quantize_colwise, (np.ones((40, 32), F32),),
     {"mode": "mxfp8"}, "raise", ("M", "x"), None, (r"\bK=40\b",), ()),
    ("quantize-K-ragged-prefix", KNOWN[7][0], "quantize", qq.quantize, (np.ones((4, 96), F32),), {},
     "raise", ("K", "group_size"), None, (), ()),
    ("group-size-2-31", KNOWN[8][0], "quantize", qq.quantize, (X64,), {"group_size": 2 ** 31},
     "raise", ("group_size",), None, (), ()),
    ("beta-str", KNOWN[9][0], "qqmm", qq.qqmm, (X64, X64), {"c": np.zeros((4, 4), F32), "beta": "x"},
     "raise", ("beta",), None, (), ()),
    ("unswizzle-negative-shape", KNOWN[10][0], "unswizzle_scales", qq.unswizzle_scales, (S128, (-1, 4)), {},
     "raise", ("shape",), None, (), ()),
    ("group-size-0", KNOWN[11][0], "quantize", qq.quantize, (X64,), {"mode": "mxfp4", "group_size": 0},
     "raise", ("group_size",), None, (), ()),
    ("bits-0", KNOWN[11][0], "quantize", qq.quantize, (X64,), {"bits": 0}, "raise", ("bits",), None, (), ()),
    ("nvfp4-gs-inf", KNOWN[12][0], "quantize", qq.quantize, (X64,), {"mode": "nvfp4", "global_scale": np.inf},
     "raise", ("global_scale",), None, (), ()),
    ("nvfp4-gs-nan", KNOWN[12][0], "quantize", qq.quantize, (X64,), {"mode": "nvfp4", "global_scale": np.nan},
     "raise", ("global_scale",), None, (), ()),
    ("nvfp4-gs-shape-1x1", KNOWN[13][0], "quantize", qq.quantize, (X64,),
     {"mode": "nvfp4", "global_scale": np.ones((1, 1), F32)}, "raise", ("global_scale",), None, (), ()),
    ("dequantize-bits-7", KNOWN[14][0], "dequantize", qq.dequantize,
     (np.zeros((4, 32), np.uint8), np.ones((4, 1), F32), np.zeros((4, 1), F32)), {"group_size": 32, "bits": 7},
     "raise", ("bits",), None, (), ()),
    ("colwise-prefix", KNOWN[15][0], "quantize_colwise", qq.quantize_colwise, (np.ones((32, 32), np.float64),), {},
     "raise", ("x",), None, (), ()),
    ("moe-dtype-names-x", KNOWN[16][0], "quantize_moe", qq.quantize_moe, (np.ones((1, 32, 32), np.float64),), {},
     "raise", ("w",), None, (), ()),
    ("qqmm-w-none", KNOWN[17][0], "qqmm", qq.qqmm, (X64, None), {}, "raise", ("w",), None, (), ()),
    ("prepare-weight-prefix", KNOWN[18][0], "prepare_weight", qq.prepare_weight, (np.ones((8, 32), np.float64),),
     {}, "raise", ("w",), None, (), ()),
    ("grouped-T0-K-mismatch", KNOWN[19][0], "grouped_qqmm", qq.grouped_qqmm,
     (np.zeros((0, 64), F32), np.zeros((2, 8, 96), F32), np.array([0, 0], np.int32)), {},
     "raise", ("K", "w", "x"), None, (), ()),
    ("qmm-x-batch0", KNOWN[20][0], "quantized_matmul", qq.quantized_matmul,
     (np.zeros((0, 2, 64), F32), *R.quantize(np.ones((8, 64), F32))), {"group_size": 64, "bits": 4},
     "ok", (), np.zeros((0, 2, 8), F32), (), ()),
    ("int64-x-no-dtype-hint", KNOWN[21][0], "quantize", qq.quantize, (np.zeros((4, 64), np.int64),), {},
     "raise", ("x",), None, (), (r"float32|float16|bfloat16",)),
]


@pytest.mark.parametrize(
    "op,fn,args,kwargs,expect,names,want,forbid,require",
    [pytest.param(*r[2:], id=r[0]) for r in REPRODUCERS])
def test_fuzz_known_defect(op, fn, args, kwargs, expect, names, want, forbid, require):
    """One minimal reproducer per defect the fuzz tests recognise (see KNOWN); each is
    expected to fail today (xfail, not strict: it passes once the defect is fixed)."""
    fz = Fuzzer(0)
    fz.strict = True
    kwargs = dict(kwargs)
    if "out" in kwargs and fn is qq.swizzle_scales:
        args = (args[0].copy(),)
        kwargs["out"] = args[0]  # out is the input itself
    check = None
    if want is not None:
        def check(got):
            assert_bits_equal(np.asarray(got), want, op)
    fz.call(op, fn, args, kwargs, kind="reproducer", expect=expect, names=names, check=check,
            forbid=forbid, require=require)
    assert not fz.failures, "\n".join(str(f) for _, f in fz.failures.values())
