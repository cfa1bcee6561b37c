"""Which route a qqmm / quantized_matmul call takes (qq.last_route(), qqGetLastRoute), the
route= request ("take this route or fail saying why"), and the Blackwell block-scaled path
(cuBLASLt, VEC16_UE4M3 / VEC32_UE8M0) with every way it can refuse.

Three groups, by where they can run:
* CPU (no marker, run in CI): the route query says "cpu"; a GPU route on CPU tensors and
  a bad route string are clear errors.
* GPU, any architecture (`gpu` marker): on GPUs without block-scaled tensor cores (Hopper,
  Ampere) the routes documented per M regime; route="blockscaled" refused with the reason;
  the force_blockscaled test hook sends AUTO into the block-scaled path, where cuBLASLt
  refuses, and every refusal falls back (AUTO) or raises (explicit route) with the same
  numbers as without the hook.
* Blackwell (compute capability 10.x / 11.0 / 12.x; skipped elsewhere): the route is
  "blockscaled" and the results equal the CPU reference within the accumulation-order
  bound; the scale-layout, nibble-order and NaN tests that only the hardware path can fail;
  strided / misaligned inputs either work or fall back, never change the numbers.

What a Blackwell user runs to confirm the path: docs/blackwell.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading

import numpy as np
import pytest

import qq
import reference as R
from helpers import BF16, assert_matmul_close, cast, raises, to_device, to_numpy, try_import

F32 = np.float32
F16 = np.float16
GPU_ROUTES = ("exact", "blockscaled", "qmma", "qmv")


def randn(rng, shape, dtype=F32, scale=1.0):
    return cast(rng.standard_normal(shape) * scale, dtype)


def cuda(a):
    return to_device(None if a is None else np.asarray(a), "cuda")


@contextlib.contextmanager
def hook(name, value=1):
    """libqq's test hook `name` set to `value` for the block, restored after."""
    old = qq._qq._set_test_hook(name, value)
    try:
        yield
    finally:
        qq._qq._set_test_hook(name, old)


def queries():
    """Block-scaled heuristic queries made so far in this process (a counter hook)."""
    return qq._qq._set_test_hook("blockscaled_queries", 0)


def capability():
    return qq.device_capability(0)


def is_blackwell():
    return capability()[0] in (10, 11, 12)


def need_hopper_like():
    if is_blackwell():
        pytest.skip("this GPU has block-scaled tensor cores; the Blackwell tests cover it")


def need_blackwell():
    if not is_blackwell():
        pytest.skip(f"needs compute capability 10.x / 11.0 / 12.x (block-scaled tensor cores); "
                    f"this GPU is {capability()}")


def torch_or_skip():
    torch = try_import("torch")
    if torch is None or not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA")
    return torch


def mode_kw(mode):
    """qq / reference keyword arguments of a mode label ("mxfp8-e5m2" -> e5m2)."""
    if mode == "mxfp8-e5m2":
        return {"mode": "mxfp8", "fp8_format": "e5m2"}
    return {"mode": mode}


def ref(x, w, mode, **kw):
    k = mode_kw(mode)
    return R.qqmm(x, w, k["mode"], fp8_format=k.get("fp8_format", "e4m3"), **kw)


def bits_of(a):
    a = to_numpy(a)
    return a.view(np.uint16) if a.dtype.itemsize == 2 else a.view(np.uint32)


# ---------------------------------------------------------------------------
# CPU (CI)
# ---------------------------------------------------------------------------

X = np.linspace(-1, 1, 4 * 64, dtype=F32).reshape(4, 64)
W = np.linspace(-1, 1, 8 * 64, dtype=F32).reshape(8, 64)


@pytest.mark.parametrize("route", ["auto", "cpu"])
def test_cpu_route_is_cpu(route):
    """CPU tensors run on the CPU backend, and the route query says so."""
    y = qq.qqmm(X, W, mode="nvfp4", route=route)
    assert qq.last_route() == "cpu"
    assert_matmul_close(y, R.qqmm(X, W, "nvfp4"), "qqmm")
    wq = qq.quantize(W, mode="mxfp8")
    qq.quantized_matmul(X, wq)
    assert qq.last_route() == "cpu"


@pytest.mark.parametrize("route", GPU_ROUTES)
def test_gpu_route_on_cpu_tensors_raises(route):
    """A GPU route asked for with CPU tensors is refused, naming the route and the fix."""
    e = raises(qq.NotSupportedError, "route", qq.qqmm, X, W, mode="nvfp4", route=route)
    assert route in str(e) and "CPU" in str(e)
    assert qq.last_route() is None


@pytest.mark.parametrize("bad", ["Exact", "fast", "", "block-scaled"])
def test_bad_route_string(bad):
    raises(ValueError, "route", qq.qqmm, X, W, mode="nvfp4", route=bad)


def test_route_not_a_string():
    raises(TypeError, "route", qq.qqmm, X, W, mode="nvfp4", route=3)


def test_failed_call_clears_the_route():
    """A call that fails reports no route: last_route() is None, not the previous one."""
    qq.qqmm(X, W, mode="nvfp4")
    assert qq.last_route() == "cpu"
    with pytest.raises(ValueError):
        qq.qqmm(X, W[:, :32], mode="nvfp4")  # K differs
    assert qq.last_route() is None


def test_empty_product_has_no_route():
    qq.qqmm(X, W, mode="nvfp4")
    y = qq.qqmm(X[:0], W, mode="nvfp4")
    assert y.shape == (0, 8)
    assert qq.last_route() is None


def test_route_is_per_thread():
    """Like the last error, the route is thread-local."""
    qq.qqmm(X, W, mode="nvfp4")
    seen = []
    t = threading.Thread(target=lambda: seen.append(qq.last_route()))
    t.start()
    t.join()
    assert seen == [None]
    assert qq.last_route() == "cpu"


def test_unknown_test_hook():
    raises(ValueError, "hook", qq._qq._set_test_hook, "no_such_hook", 1)


# ---------------------------------------------------------------------------
# GPU without block-scaled tensor cores (Hopper, Ampere): the documented routes
# ---------------------------------------------------------------------------

# (M, mode, K, route AUTO takes with a packed w and a float x). qmma: M <= 64 with whole
# 16-byte weight rows (mxfp8 at M = 1 goes to qmv); qmv: M <= 4; exact otherwise.
AUTO_ROUTES = [
    (1, "nvfp4", 128, "qmma"), (4, "nvfp4", 128, "qmma"), (64, "nvfp4", 128, "qmma"),
    (65, "nvfp4", 128, "exact"), (1, "mxfp8", 128, "qmv"), (2, "mxfp8", 128, "qmma"),
    (3, "mxfp4", 128, "qmma"), (2, "nvfp4", 48, "qmv"), (5, "nvfp4", 48, "exact"),
    (130, "mxfp8", 128, "exact"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("m,mode,k,want", AUTO_ROUTES)
def test_hopper_auto_routes(m, mode, k, want, rng):
    """A stored (packed) weight and a float x: the route AUTO takes per M regime, and its
    numbers equal the reference. nvfp4 K = 48 has 24-byte weight rows, which qmma does not
    take."""
    need_hopper_like()
    x, w = randn(rng, (m, k)), randn(rng, (72, k))
    wq = qq.quantize(cuda(w), **mode_kw(mode))
    y = qq.qqmm(cuda(x), wq, dtype="float32", **mode_kw(mode))
    assert qq.last_route() == want
    assert_matmul_close(y, ref(x, w, mode), f"qqmm {mode} M={m}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 130])
def test_hopper_float_w_is_exact(m, rng):
    """A float w (quantized on the fly) has no packed form for the weight-only kernels."""
    need_hopper_like()
    x, w = randn(rng, (m, 64)), randn(rng, (40, 64))
    y = qq.qqmm(cuda(x), cuda(w), mode="nvfp4")
    assert qq.last_route() == "exact"
    assert_matmul_close(y, R.qqmm(x, w, "nvfp4"), "qqmm")


@pytest.mark.gpu
@pytest.mark.parametrize("m,want", [(1, "qmma"), (3, "qmma"), (65, "exact")])
def test_quantized_matmul_route(m, want, rng):
    """quantized_matmul reports its route too (exact = dequantize + GEMM)."""
    need_hopper_like()
    x, w = cast(randn(rng, (m, 128)), BF16), randn(rng, (48, 128))
    wq = qq.quantize(cuda(w), mode="nvfp4")
    qq.quantized_matmul(cuda(x), wq)
    assert qq.last_route() == want


@pytest.mark.gpu
@pytest.mark.parametrize("route,m", [("exact", 1), ("exact", 130), ("qmma", 8), ("qmv", 2)])
def test_hopper_explicit_route_runs(route, m, rng):
    """A requested route that covers the call runs and is reported; same numbers."""
    need_hopper_like()
    x, w = randn(rng, (m, 128)), randn(rng, (72, 128))
    wq = qq.quantize(cuda(w), mode="nvfp4")
    y = qq.qqmm(cuda(x), wq, route=route, dtype="float32")
    assert qq.last_route() == route
    assert_matmul_close(y, R.qqmm(x, w, "nvfp4"), f"route={route}")


@pytest.mark.gpu
@pytest.mark.parametrize("route,m,packed_w,names", [
    ("qmma", 65, True, "M <= 64"), ("qmv", 5, True, "M <= 4"), ("qmma", 8, False, "packed w"),
    ("qmv", 2, False, "packed w"), ("cpu", 2, True, "CPU tensors"),
])
def test_hopper_explicit_route_refused(route, m, packed_w, names, rng):
    """A requested route that does not cover the call raises, saying why; never falls back."""
    need_hopper_like()
    x, w = randn(rng, (m, 128)), randn(rng, (72, 128))
    wa = qq.quantize(cuda(w), mode="nvfp4") if packed_w else cuda(w)
    with pytest.raises(qq.NotSupportedError) as e:
        qq.qqmm(cuda(x), wa, mode="nvfp4", route=route)
    assert route in str(e.value) and names in str(e.value), str(e.value)
    assert qq.last_route() is None


@pytest.mark.gpu
def test_hopper_blockscaled_route_is_arch_mismatch(rng):
    """route="blockscaled" on a GPU without block-scaled tensor cores: a clear refusal
    naming the compute capability needed (QQ_STATUS_ARCH_MISMATCH -> NotSupportedError)."""
    need_hopper_like()
    x, w = randn(rng, (16, 64)), randn(rng, (32, 64))
    with pytest.raises(qq.NotSupportedError) as e:
        qq.qqmm(cuda(x), cuda(w), mode="nvfp4", route="blockscaled")
    msg = str(e.value)
    assert "blockscaled" in msg and "compute capability" in msg, msg


# ---------------------------------------------------------------------------
# The force_blockscaled hook on a GPU that refuses: every refusal falls back or raises
# ---------------------------------------------------------------------------

def run_both(fn):
    """fn() without and with the force_blockscaled hook: (result, route) of each."""
    a = fn()
    ra = qq.last_route()
    with hook("force_blockscaled"):
        b = fn()
        rb = qq.last_route()
    return (a, ra), (b, rb)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["nvfp4", "mxfp4", "mxfp8", "mxfp8-e5m2"])
@pytest.mark.parametrize("m", [1, 40, 130])
@pytest.mark.parametrize("bias", [None, "float32", "bfloat16"])
@pytest.mark.parametrize("out", ["float32", "bfloat16"])
def test_forced_blockscaled_falls_back(mode, m, bias, out, rng):
    """AUTO with the hook tries the block-scaled path; where it is refused (always on
    Hopper; mxfp4 and e5m2 everywhere) the route AUTO takes without the hook answers, bit
    for bit the same."""
    need_hopper_like()
    torch_or_skip()
    n, k = 72, 128
    x, w = randn(rng, (m, k)), randn(rng, (n, k))
    b = None if bias is None else cast(randn(rng, (n,)), np.dtype(bias) if bias == "float32" else BF16)
    wq = qq.quantize(cuda(w), scale_layout="blocked", **mode_kw(mode))
    (ya, ra), (yb, rb) = run_both(lambda: qq.qqmm(cuda(x), wq, bias=cuda(b), dtype=out, **mode_kw(mode)))
    assert ra == rb and ra != "blockscaled", (ra, rb)
    np.testing.assert_array_equal(bits_of(yb), bits_of(ya))
    assert_matmul_close(yb, ref(x, w, mode, bias=b), f"{mode} M={m}")


@pytest.mark.gpu
@pytest.mark.parametrize("mode,names", [
    ("nvfp4", "no block-scaled algorithm"), ("mxfp8", "no block-scaled algorithm"),
    ("mxfp4", "mxfp4"), ("mxfp8-e5m2", "e5m2"),
])
def test_forced_explicit_blockscaled_raises(mode, names, rng):
    """route="blockscaled" with the hook: no ARCH_MISMATCH, but each refusal raises with its
    reason (cuBLASLt's heuristic on Hopper; the undocumented combinations anywhere)."""
    need_hopper_like()
    x, w = randn(rng, (40, 128)), randn(rng, (72, 128))
    with hook("force_blockscaled"):
        with pytest.raises(qq.NotSupportedError) as e:
            qq.qqmm(cuda(x), cuda(w), route="blockscaled", **mode_kw(mode))
    assert names in str(e.value), str(e.value)


@pytest.mark.gpu
def test_forced_refusal_is_remembered(rng):
    """A refused shape asks cuBLASLt once: the second call makes no heuristic query, and a
    combination refused by rule (mxfp4) makes none at all."""
    need_hopper_like()
    x, w = randn(rng, (48, 224)), randn(rng, (88, 224))  # a shape no other test uses
    with hook("force_blockscaled"):
        q0 = queries()
        qq.qqmm(cuda(x), cuda(w), mode="nvfp4")
        q1 = queries()
        qq.qqmm(cuda(x), cuda(w), mode="nvfp4")
        q2 = queries()
        qq.qqmm(cuda(x), cuda(w), mode="mxfp4")
        q3 = queries()
    assert q1 - q0 == 1 and q2 == q1 and q3 == q2, (q0, q1, q2, q3)


def strided_cases(torch, rng, mode):
    """(label, call) pairs of inputs the block-scaled path must pass with their real strides
    or refuse: each call returns (result, reference)."""
    n, k, m = 72, 128, 40
    kw = mode_kw(mode)
    x, w = randn(rng, (m, k)), randn(rng, (n, k))
    rx, rw = R.quantize(x, **kw), R.quantize(w, **kw)
    want = ref(rx, rw, mode)
    pk, ng = rw.data.shape[-1], rw.linear_scales.shape[-1]

    def padded(a, extra):  # a [R, C] as a view of an [R, C + extra] buffer: row stride > row
        t = torch.zeros((a.shape[0], a.shape[1] + extra), dtype=torch.uint8, device="cuda")
        t[:, :a.shape[1]] = torch.from_numpy(np.ascontiguousarray(a)).cuda()
        return t[:, :a.shape[1]]

    def misaligned(a):  # a compact copy starting 1 byte past an allocation
        flat = torch.zeros(a.size + 1, dtype=torch.uint8, device="cuda")
        v = flat[1:].view(a.shape)
        v.copy_(torch.from_numpy(np.ascontiguousarray(a)).cuda())
        return v

    lin = dict(mode=kw["mode"], fp8_format=kw.get("fp8_format", "e4m3"))
    bx, bw = R.swizzle(rx.linear_scales), R.swizzle(rw.linear_scales)
    cases = [
        ("w row stride > row", lambda: qq.qqmm(padded(rx.data, 16), padded(rw.data, 32), padded(rw.linear_scales, 3),
                                               x_scales=cuda(rx.linear_scales), dtype="float32", **lin)),
        ("non-compact linear scales", lambda: qq.qqmm(
            cuda(rx.data), cuda(rw.data), padded(rw.linear_scales, 5), x_scales=padded(rx.linear_scales, 1),
            dtype="float32", **lin)),
        ("misaligned blocked scales", lambda: qq.qqmm(
            cuda(rx.data), cuda(rw.data), misaligned(bw), x_scales=misaligned(bx), scale_layout="blocked",
            dtype="float32", **lin)),
        ("misaligned float x", lambda: qq.qqmm(  # starts 4 bytes past an allocation
            torch.from_numpy(np.concatenate([[0], x.ravel()]).astype(F32)).cuda()[1:].view(m, k),
            cuda(w), dtype="float32", **lin)),
    ]
    # a batched packed x whose entries are not evenly spaced: every other entry of a buffer
    xb = randn(rng, (2, m, k))
    rxb = R.quantize(xb, **kw)
    big = torch.zeros((4, m, pk), dtype=torch.uint8, device="cuda")
    big[::2] = torch.from_numpy(rxb.data).cuda()
    bigs = torch.zeros((4, m, ng), dtype=torch.uint8, device="cuda")
    bigs[::2] = torch.from_numpy(rxb.linear_scales).cuda()
    cases.append(("batched x, uneven entries", lambda: qq.qqmm(
        big[::2], cuda(rw.data), cuda(rw.linear_scales), x_scales=bigs[::2], dtype="float32", **lin)))
    wants = {label: want for label, _ in cases}
    wants["misaligned float x"] = ref(x, w, mode)
    wants["batched x, uneven entries"] = ref(rxb, rw, mode)
    return [(label, fn, wants[label]) for label, fn in cases]


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["nvfp4", "mxfp8"])
def test_forced_strided_and_misaligned(mode, rng):
    """Strided, non-compact and misaligned inputs under the hook: the block-scaled path passes
    their real layout or refuses; either way the numbers are those without the hook."""
    need_hopper_like()
    torch = torch_or_skip()
    for label, fn, want in strided_cases(torch, rng, mode):
        (ya, ra), (yb, rb) = run_both(fn)
        assert ra == rb, (label, ra, rb)
        np.testing.assert_array_equal(bits_of(yb), bits_of(ya), err_msg=label)
        assert_matmul_close(yb, want, label)


@pytest.mark.gpu
def test_forced_other_refusals(rng):
    """The refusals decided before cuBLASLt is asked, under the hook: a prepared w and a
    batched x with blocked scales fall back in AUTO and raise, naming why, when asked for."""
    need_hopper_like()
    x, w = randn(rng, (2, 40, 128)), randn(rng, (72, 128))
    pw = qq.prepare_weight(cuda(w), mode="nvfp4")
    xq = qq.quantize(cuda(x), mode="nvfp4", scale_layout="blocked")
    cases = [("prepared", lambda route: qq.qqmm(cuda(x[0]), pw, route=route, dtype="float32"),
              ref(x[0], w, "nvfp4")),
             ("batched", lambda route: qq.qqmm(xq, cuda(w), mode="nvfp4", route=route, dtype="float32"),
              ref(x, w, "nvfp4"))]
    for label, fn, want in cases:
        (ya, ra), (yb, rb) = run_both(lambda: fn("auto"))
        assert ra == rb, (label, ra, rb)
        np.testing.assert_array_equal(bits_of(yb), bits_of(ya), err_msg=label)
        assert_matmul_close(yb, want, label)
    # the prepared weight goes packed for route="blockscaled" (qq.qqmm picks the packed
    # form), so only the batched case has a reason of its own
    with hook("force_blockscaled"):
        with pytest.raises(qq.NotSupportedError) as e:
            cases[1][1]("blockscaled")
    assert "blocked scales" in str(e.value), str(e.value)


# ---------------------------------------------------------------------------
# Blackwell: the hardware path itself
# ---------------------------------------------------------------------------

BW_MODES = ["nvfp4", "mxfp8"]


@pytest.mark.gpu
@pytest.mark.parametrize("mode", BW_MODES)
@pytest.mark.parametrize("m", [1, 40, 130, 300])
@pytest.mark.parametrize("operands", ["float", "linear", "blocked"])
@pytest.mark.parametrize("out", ["float32", "bfloat16", "float16"])
def test_blackwell_route_and_values(mode, m, operands, out, rng):
    """The block-scaled route is taken (float operands quantized on the fly, or packed with
    linear or blocked scales) and equals the CPU reference within the fp32 accumulation
    bound, for every output dtype."""
    need_blackwell()
    n, k = 136, 256
    x, w = randn(rng, (m, k)), randn(rng, (n, k))
    gs = {}
    if mode == "nvfp4":
        gs = dict(global_scale_x=R.amax(x), global_scale_w=R.amax(w))
    if operands == "float":
        y = qq.qqmm(cuda(x), cuda(w), mode=mode, dtype=out, route="blockscaled",
                    **{key: cuda(v) for key, v in gs.items()})
        want = ref(x, w, mode, **gs)
    else:
        rx = R.quantize(x, mode=mode, scale_layout=operands, global_scale=gs.get("global_scale_x"))
        rw = R.quantize(w, mode=mode, scale_layout=operands, global_scale=gs.get("global_scale_w"))
        y = qq.qqmm(cuda(rx.data), cuda(rw.data), cuda(rw.scales), x_scales=cuda(rx.scales), mode=mode,
                    scale_layout=operands, dtype=out, route="blockscaled",
                    **{key: cuda(v) for key, v in gs.items()})
        want = ref(rx, rw, mode)
    assert qq.last_route() == "blockscaled"
    assert_matmul_close(y, want, f"{mode} {operands} M={m} -> {out}")
    # AUTO takes the same route
    qq.qqmm(cuda(x), cuda(w), mode=mode, dtype=out)
    assert qq.last_route() == "blockscaled"


@pytest.mark.gpu
@pytest.mark.parametrize("mode,want", [("mxfp4", "exact"), ("mxfp8-e5m2", "exact")])
def test_blackwell_undocumented_combinations_take_exact(mode, want, rng):
    """mxfp4 and mxfp8 e5m2 x e5m2 are not in cuBLASLt's block-scaled tables: exact path."""
    need_blackwell()
    x, w = randn(rng, (130, 128)), randn(rng, (72, 128))
    q0 = queries()
    y = qq.qqmm(cuda(x), cuda(w), dtype="float32", **mode_kw(mode))
    assert qq.last_route() == want and queries() == q0
    assert_matmul_close(y, ref(x, w, mode), mode)


@pytest.mark.gpu
@pytest.mark.parametrize("out,bias", [("bfloat16", "bfloat16"), ("bfloat16", "float32"), ("float16", "float16"),
                                      ("float16", "bfloat16"), ("float32", "bfloat16"), ("float32", "float32")])
def test_blackwell_bias(out, bias, rng):
    """A bias never makes the call leave the block-scaled route: in cuBLASLt's epilogue where
    its type is the one the table allows (bf16 / fp16 for bf16 / fp16 out, bf16 for fp32
    out), else added in fp32 after the GEMM - exact either way."""
    need_blackwell()
    x, w = randn(rng, (130, 128)), randn(rng, (72, 128))
    b = cast(randn(rng, (72,)), {"bfloat16": BF16, "float16": np.dtype(F16), "float32": np.dtype(F32)}[bias])
    y = qq.qqmm(cuda(x), cuda(w), mode="nvfp4", bias=cuda(b), dtype=out)
    assert qq.last_route() == "blockscaled"
    assert_matmul_close(y, R.qqmm(x, w, "nvfp4", bias=b), f"bias {bias} -> {out}")


@pytest.mark.gpu
@pytest.mark.parametrize("mode,k", [("nvfp4", 80), ("nvfp4", 96), ("mxfp8", 160)])
@pytest.mark.parametrize("layout", ["linear", "blocked"])
@pytest.mark.parametrize("which", ["x", "w"])
def test_blackwell_scale_layout(mode, k, layout, which):
    """All-ones operands, M = 130, N = 136 (two 128-row scale tiles each, the second
    partial). One scale byte is doubled at row r in {0, 31, 32, 127, 128, 129} and scale
    column c in {0, 3, 4, 5} (those < K/group): only output row r (for x) or column r (for
    w) changes, to the reference's value. A misplaced blocked offset (the 32-row
    interleave, the 4-column tile, the second 128-row tile) moves or loses the change."""
    need_blackwell()
    m, n = 130, 136
    g = 16 if mode == "nvfp4" else 32
    rx, rw = R.quantize(np.ones((m, k), F32), mode=mode), R.quantize(np.ones((n, k), F32), mode=mode)
    up = 8 if mode == "nvfp4" else 1  # E4M3: +8 is +1 in the exponent field, x2; UE8M0: +1, x2
    lay = (lambda s: s) if layout == "linear" else R.swizzle

    def run(sx, sw):
        return to_numpy(qq.qqmm(cuda(rx.data), cuda(rw.data), cuda(lay(sw)), x_scales=cuda(lay(sx)), mode=mode,
                                scale_layout=layout, dtype="float32", route="blockscaled"))

    y0 = run(rx.linear_scales, rw.linear_scales)
    for r in (0, 31, 32, 127, 128, 129):
        for c in (0, 3, 4, 5):
            if c >= k // g:
                continue
            tgt = rx if which == "x" else rw
            lin = tgt.linear_scales.copy()
            lin[r, c] += up
            sx, sw = (lin, rw.linear_scales) if which == "x" else (rx.linear_scales, lin)
            y = run(sx, sw)
            where = f"{which} scale ({r}, {c}), {layout}"
            changed = np.argwhere(y != y0)
            if which == "x":
                assert set(changed[:, 0]) == {r} and len(changed) == n, f"{where}: changed {changed[:5]}..."
            else:
                assert set(changed[:, 1]) == {r} and len(changed) == m, f"{where}: changed {changed[:5]}..."
            mod = dataclasses.replace(tgt, scales=lin)
            want = R.qqmm(mod, rw, mode) if which == "x" else R.qqmm(rx, mod, mode)
            assert_matmul_close(y, want, where)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", BW_MODES)
def test_blackwell_element_order(mode, rng):
    """Different values at k = 0 and k = 1 (one byte's two nibbles in nvfp4; two bytes in
    mxfp8) against a w whose first two columns differ in sign: swapped nibbles flip the
    sign of the difference."""
    need_blackwell()
    m, n, k = 130, 136, 128
    x, w = np.ones((m, k), F32), np.ones((n, k), F32)
    x[:, 1] = 0.5
    w[:, 1] = -1.0
    x[7, 0], x[7, 1] = 0.5, 1.0
    y = qq.qqmm(cuda(x), cuda(w), mode=mode, dtype="float32", route="blockscaled")
    assert_matmul_close(y, R.qqmm(x, w, mode), "element order")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", BW_MODES)
def test_blackwell_nan_group(mode, rng):
    """A NaN in one group of x row 5: the rows and columns that are NaN are those of the
    exact path."""
    need_blackwell()
    x, w = randn(rng, (130, 128)), randn(rng, (72, 128))
    x[5, 40] = np.nan
    y = to_numpy(qq.qqmm(cuda(x), cuda(w), mode=mode, dtype="float32", route="blockscaled"))
    e = to_numpy(qq.qqmm(cuda(x), cuda(w), mode=mode, dtype="float32", route="exact"))
    np.testing.assert_array_equal(np.isnan(y), np.isnan(e))
    assert np.isnan(y[5]).all() and not np.isnan(np.delete(y, 5, axis=0)).any()


@pytest.mark.gpu
@pytest.mark.parametrize("mode", BW_MODES)
def test_blackwell_strided_and_misaligned(mode, rng):
    """Strided, non-compact and misaligned inputs work (their real leading dimensions, a
    copy of misaligned scales) or fall back; never different numbers."""
    need_blackwell()
    torch = torch_or_skip()
    for label, fn, want in strided_cases(torch, rng, mode):
        y = fn()
        assert qq.last_route() in ("blockscaled", "exact", "qmma", "qmv"), label
        assert_matmul_close(y, want, f"{label} ({qq.last_route()})")


@pytest.mark.gpu
def test_blackwell_failed_matmul_marks_the_plan_bad(rng):
    """A cublasLtMatmul failure (simulated by a hook): AUTO falls back to the exact path with
    the right numbers, the shape stays refused afterwards (no retry of a broken plan), and
    route="blockscaled" raises naming the failure."""
    need_blackwell()
    x, w = randn(rng, (96, 352)), randn(rng, (104, 352))  # a shape no other test uses
    with hook("fail_blockscaled_matmul"):
        y = qq.qqmm(cuda(x), cuda(w), mode="nvfp4", dtype="float32")
        assert qq.last_route() == "exact"
        assert_matmul_close(y, R.qqmm(x, w, "nvfp4"), "after a failed matmul")
    qq.qqmm(cuda(x), cuda(w), mode="nvfp4", dtype="float32")
    assert qq.last_route() == "exact"  # remembered as bad
    with pytest.raises(qq.NotSupportedError) as e:
        qq.qqmm(cuda(x), cuda(w), mode="nvfp4", route="blockscaled")
    assert "no block-scaled algorithm" in str(e.value) or "failed" in str(e.value), str(e.value)
    x2 = randn(rng, (96, 384))
    with hook("fail_blockscaled_matmul"):
        with pytest.raises(qq.NotSupportedError) as e:
            qq.qqmm(cuda(x2), cuda(randn(rng, (104, 384))), mode="nvfp4", route="blockscaled")
    assert "failed" in str(e.value), str(e.value)


# ---------------------------------------------------------------------------
# A prepared weight: libqq picks its form per call (qqQqmmParams_t.w_values)
# ---------------------------------------------------------------------------

def _marked_prepared(w, mode, scale, device):
    """A PreparedWeight of w on `device` whose bf16 values are `scale` times q(w)'s: the
    result says which form of w the call read (the packed one gives q(w)'s product, the
    values `scale` times it)."""
    pw = qq.prepare_weight(to_device(w, device), mode=mode)
    if pw.values is None:
        pytest.skip("no bf16 values on this device (block-scaled tensor cores)")
    vals = cast(to_numpy(pw.values).astype(np.float32) * scale, BF16)
    return qq.PreparedWeight(pw.quantized, to_device(vals, device))


def _scaled(r, s):
    """A MatmulRef of s times the product (exact for s = 2: every bound scales with it)."""
    return dataclasses.replace(r, value=r.value * s, abs_sum=r.abs_sum * abs(s),
                               alt_value=None if r.alt_value is None else r.alt_value * s,
                               alt_abs_sum=None if r.alt_abs_sum is None else r.alt_abs_sum * abs(s))


PREPARED_FORMS = [  # (M, mode, K, the form AUTO reads, the route)
    (1, "nvfp4", 128, "packed", "qmma"), (4, "mxfp8", 128, "packed", "qmma"),
    (16, "nvfp4", 128, "packed", "qmma"), (17, "nvfp4", 128, "values", "exact"),
    (5, "nvfp4", 48, "values", "exact"), (4, "nvfp4", 48, "packed", "qmv"),
    (64, "mxfp8", 128, "values", "exact"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("m,mode,k,form,route", PREPARED_FORMS)
def test_prepared_weight_form_is_libqqs_choice(m, mode, k, form, route, rng):
    """qqmm(x, PreparedWeight): libqq, not Python, picks the packed w (weight-only kernels,
    M <= 4, or M <= 16 with 16-byte weight rows) or the bf16 values (the GEMM) per call
    (kPackedOverValuesMaxM, cuda/ops.cuh); route='exact' always reads the values. Values
    marked x2 show which form was read."""
    need_hopper_like()
    x, w = randn(rng, (m, k)), randn(rng, (40, k))
    pw = _marked_prepared(w, mode, 2.0, "cuda")
    want = ref(x, w, mode)
    y = to_numpy(qq.qqmm(cuda(x), pw, dtype="float32"))
    assert qq.last_route() == route
    assert_matmul_close(y, _scaled(want, 2.0 if form == "values" else 1.0), f"qqmm {mode} M={m} ({form})")
    y = to_numpy(qq.qqmm(cuda(x), pw, dtype="float32", route="exact"))
    assert_matmul_close(y, _scaled(want, 2.0), f"qqmm {mode} M={m} route=exact (values)")


@pytest.mark.parametrize("m", [1, 40])
def test_prepared_weight_cpu_reads_values(m, rng):
    """The CPU backend reads a prepared weight's values at every M (no dequantization)."""
    x, w = randn(rng, (m, 64)), randn(rng, (24, 64))
    pw = _marked_prepared(w, "nvfp4", 2.0, "cpu")
    y = qq.qqmm(x, pw, dtype="float32")
    assert_matmul_close(y, _scaled(ref(x, w, "nvfp4"), 2.0), f"cpu M={m}")
