"""qq inside jax.jit and jax.vmap: libqq's operations as XLA FFI custom calls
(qq/_jax_ffi.py, bindings/xla/handlers.cpp; docs/adapters.md, "JAX").

On JAX's CPU backend (CI), and - marked gpu, skipped without a CUDA JAX backend - on the GPU:
  - quantize (every mode, global scale or not, linear and blocked scales, f32 / bf16 / f16),
    quantize_colwise (with rowwise), quantize_moe, dequantize and amax under jit equal the
    eager results bit for bit, and the independent NumPy reference (tests/reference.py);
  - qqmm and quantized_matmul under jit equal the eager results bit for bit and the
    reference within fp32-accumulation error;
  - qq.jax.qq_linear's forward and gradients under jit equal the eager ones bit for bit,
    and the jitted program holds qq's custom calls, not host callbacks;
  - jax.vmap of quantize, qqmm and qq_linear equals a Python loop of eager calls, through
    both of the handler's vmap paths (folded into one call; looped per example);
  - a bad argument raises with libqq's message: at trace time where Python asks libqq for
    shapes, at run time from the handler (an XLA error carrying qqGetLastErrorMessage()).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import qq  # noqa: E402
import reference as R  # noqa: E402
from helpers import (BF16, FP_PARAMS, as_bytes, assert_bits_equal, assert_quantized_equal,  # noqa: E402
                     random_data, to_numpy)

qj = pytest.importorskip("qq._jax_ffi")
qqj = pytest.importorskip("qq.jax")

F32 = np.float32

pytestmark = pytest.mark.skipif(not qj.available(), reason=f"qq's XLA handlers: {qj.status()}")


def _jax_device(kind):
    try:
        devs = jax.devices("gpu" if kind == "cuda" else "cpu")
    except RuntimeError:
        devs = []
    if not devs:
        pytest.skip(f"no JAX {kind} backend")
    return devs[0]


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture(params=DEVICES)
def dev(request):
    """A JAX device: the CPU, or (gpu-marked) the first CUDA device."""
    return _jax_device(request.param)


def put(a, dev):
    return None if a is None else jax.device_put(np.asarray(a), dev)


def tree_put(t, dev):
    return jax.tree.map(lambda a: put(a, dev), t)


def assert_same(got, want, what):
    """Same shape, dtype and bits (two qq results; uint8 / float / bfloat16)."""
    assert_bits_equal(to_numpy(got), to_numpy(want), what)


def assert_gemm_close(got, want, what, dev):
    """Bit-equal on the CPU. On the GPU the same within fp32 accumulation order: there a
    product's summation order depends on M (cuBLASLt picks its algorithm per shape), so a
    vmapped call, whose examples are folded into one GEMM's rows, and a loop over the
    examples may differ in the last bits - as eager qqmm on [3T, K] and three calls on
    [T, K] do; and XLA's jitted reductions (the bias gradient, a jnp.sum) sum in another
    order than its op-by-op eager ones."""
    if dev.platform == "cpu":
        assert_same(got, want, what)
        return
    g, w = to_numpy(got).astype(np.float64), to_numpy(want).astype(np.float64)
    assert g.shape == w.shape, (what, g.shape, w.shape)
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6 * max(np.abs(w).max(), 1e-30), err_msg=what)


def assert_qa_same(got, want, what):
    assert isinstance(got, qq.QuantizedArray), type(got)
    for f in ("mode", "group_size", "bits", "scale_layout", "rounding", "fp8_format", "shape"):
        assert getattr(got, f) == getattr(want, f), (what, f, getattr(got, f), getattr(want, f))
    for f in ("data", "scales", "biases"):
        if getattr(want, f) is None:
            assert getattr(got, f) is None, (what, f)
        else:
            assert_same(getattr(got, f), getattr(want, f), f"{what}: {f}")


# ---------------------------------------------------------------------------
# Quantization: jit == eager (NumPy, libqq's CPU backend) == reference, bit for bit
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [F32, BF16, np.float16], ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize("layout", ["linear", "blocked"])
@pytest.mark.parametrize("cfg", FP_PARAMS)
def test_quantize_fp(cfg, layout, dtype, dev, rng):
    """Every fp mode / rounding / fp8 format, with and without nvfp4's global scale; the
    jitted codes and scales equal the eager NumPy call's and the reference's, and their
    dequantization under jit equals the eager one."""
    x = random_data(rng, (130, 256), dtype, cfg.group_size)
    gs = R.amax(x) if cfg.global_scale else None
    kw = dict(cfg.kwargs(), scale_layout=layout)
    eager = qq.quantize(x, **kw, global_scale=gs)

    @jax.jit
    def f(x, gs):
        qa = qq.quantize(x, **kw, global_scale=gs)
        return qa, qq.dequantize(qa, dtype="float32")

    got, deq = f(put(x, dev), put(gs, dev))
    assert_qa_same(got, eager, "quantize jit vs eager")
    assert_quantized_equal(got, R.quantize(x, **kw, global_scale=gs), x, what="quantize jit")
    assert_same(deq, qq.dequantize(eager, dtype="float32"), "dequantize jit vs eager")
    assert list(got.data.devices()) == [dev]


@pytest.mark.parametrize("bits,group_size", [(2, 32), (3, 128), (4, 64), (5, 32), (6, 64), (8, 128)])
def test_quantize_affine(bits, group_size, dev, rng):
    x = random_data(rng, (64, 256), BF16, group_size)
    kw = dict(mode="affine", bits=bits, group_size=group_size)
    f = jax.jit(lambda x: (lambda qa: (qa, qq.dequantize(qa)))(qq.quantize(x, **kw)))
    got, deq = f(put(x, dev))
    eager = qq.quantize(x, **kw)
    assert_qa_same(got, eager, "affine jit vs eager")
    assert_quantized_equal(got, R.quantize(x, **kw), x, what="affine jit")
    assert_same(deq, qq.dequantize(eager), "affine dequantize")
    assert to_numpy(deq).dtype == BF16


@pytest.mark.parametrize("mode,kw,layout", [
    ("nvfp4", {"gs": True}, "linear"), ("nvfp4", {"gs": True}, "blocked"),
    ("mxfp8", {"fp8_format": "e5m2"}, "blocked"), ("mxfp4", {"rounding": "floor"}, "linear"),
    ("affine", {"bits": 4}, "linear")],
    ids=["nvfp4-gs-linear", "nvfp4-gs-blocked", "mxfp8-e5m2-blocked", "mxfp4-floor-linear", "affine4"])
def test_quantize_colwise(mode, kw, layout, dev, rng):
    """quantize_colwise (with the row-wise result from the same read) under jit: the
    column-wise result equals the reference's quantize of x^T."""
    kw = dict(kw)
    x = random_data(rng, (2, 64, 128), F32, 64)
    gs = R.amax(x) if kw.pop("gs", False) else None
    kw.update(mode=mode, scale_layout=layout)
    row, col = jax.jit(lambda x, g: qq.quantize_colwise(x, global_scale=g, rowwise=True, **kw))(
        put(x, dev), put(gs, dev))
    erow, ecol = qq.quantize_colwise(x, global_scale=gs, rowwise=True, **kw)
    assert_qa_same(row, erow, "colwise rowwise part")
    assert_qa_same(col, ecol, "colwise")
    xt = np.ascontiguousarray(np.swapaxes(x, -1, -2))
    assert_quantized_equal(col, R.quantize(xt, global_scale=gs, **kw), xt, what="colwise jit")


@pytest.mark.parametrize("layout", ["linear", "blocked"])
@pytest.mark.parametrize("scaling", ["32x1", "32x32"])
def test_quantize_moe(scaling, layout, dev, rng):
    w = random_data(rng, (3, 64, 96), BF16, 32)
    data, scales = jax.jit(lambda w: qq.quantize_moe(w, scaling, scale_layout=layout))(put(w, dev))
    edata, escales = qq.quantize_moe(w, scaling, scale_layout=layout)
    assert_same(data, np.ascontiguousarray(edata), "moe data")
    assert_same(scales, escales, "moe scales")
    if scaling == "32x1" and layout == "linear":
        # 32x1 along D1 is quantize of w^T per expert: the reference, independently
        ref = R.quantize(np.ascontiguousarray(np.swapaxes(w, -1, -2)), mode="mxfp8")
        assert_bits_equal(np.swapaxes(as_bytes(data), -1, -2), ref.codes, "moe codes")
        assert_bits_equal(np.swapaxes(as_bytes(scales), -1, -2), ref.scales, "moe scales vs ref")


def test_amax(dev, rng):
    x = random_data(rng, (33, 70), BF16, 70)
    x[5, 7] = -np.inf
    got = jax.jit(qq.amax)(put(x, dev))
    assert_same(got, qq.amax(x), "amax")
    assert float(got) == np.inf
    y = random_data(rng, (33, 70), F32, 70)
    assert float(jax.jit(qq.amax)(put(y, dev))) == float(np.abs(y).max())


# ---------------------------------------------------------------------------
# Matmuls: jit == eager bit for bit (same device), and the reference within fp32 error
# ---------------------------------------------------------------------------

def _eager_on(dev, fn, *arrays):
    """fn eagerly on the arrays placed on dev (the eager path of the same backend)."""
    return fn(*[tree_put(a, dev) for a in arrays])


@pytest.mark.parametrize("mode", ["nvfp4", "mxfp4", "mxfp8"])
def test_qqmm_float_operands(mode, dev, rng):
    """x and w float, quantized inside the call; nvfp4 with amax global scales computed
    under jit too; bias added."""
    x = random_data(rng, (48, 256), BF16, 32, varied=False)
    w = random_data(rng, (80, 256), BF16, 32, varied=False)
    b = rng.standard_normal(80).astype(F32)
    nv = mode == "nvfp4"

    def f(x, w, b):
        return qq.qqmm(x, w, mode=mode, bias=b, global_scale_x=qq.amax(x) if nv else None,
                       global_scale_w=qq.amax(w) if nv else None)

    got = jax.jit(f)(put(x, dev), put(w, dev), put(b, dev))
    assert to_numpy(got).dtype == BF16 and got.shape == (48, 80)
    assert_same(got, _eager_on(dev, f, x, w, b), "qqmm jit vs eager")
    ref = R.qqmm(x, w, mode, bias=b, global_scale_x=R.amax(x) if nv else None,
                 global_scale_w=R.amax(w) if nv else None)
    assert R.matmul_mismatch(to_numpy(got), ref) is None


@pytest.mark.parametrize("layout", ["linear", "blocked"])
@pytest.mark.parametrize("mode", ["nvfp4", "mxfp8"])
def test_qqmm_quantized_weight_and_c(mode, layout, dev, rng):
    """A QuantizedArray weight (a pytree argument of the jitted function) and beta * C."""
    x = random_data(rng, (3, 20, 128), F32, 32, varied=False)
    w = random_data(rng, (64, 128), F32, 32, varied=False)
    c = rng.standard_normal((3, 20, 64)).astype(F32)
    gw = R.amax(w) if mode == "nvfp4" else None
    wq = qq.quantize(w, mode=mode, scale_layout=layout, global_scale=gw)

    def f(x, wq, c):
        return qq.qqmm(x, wq, c=c, beta=0.5)

    got = jax.jit(f)(put(x, dev), tree_put(wq, dev), put(c, dev))
    assert_same(got, _eager_on(dev, f, x, wq, c), "qqmm jit vs eager")
    ref = R.qqmm(x, R.quantize(w, mode=mode, global_scale=gw), mode, c=c, beta=0.5)
    assert R.matmul_mismatch(to_numpy(got), ref) is None


@pytest.mark.parametrize("transpose", [True, False])
@pytest.mark.parametrize("mode,kw", [("affine", {"bits": 4, "group_size": 64}), ("nvfp4", {}),
                                     ("mxfp8", {})], ids=["affine4", "nvfp4", "mxfp8"])
@pytest.mark.parametrize("m", [1, 37])
def test_quantized_matmul(mode, kw, transpose, m, dev, rng):
    """Weight-only matmul under jit, the weight closed over (a constant of the program) and
    passed in; M = 1 (the decode kernels on the GPU) and 37."""
    x = random_data(rng, (m, 128), BF16, 32, varied=False)
    w = random_data(rng, (64, 128) if transpose else (128, 64), BF16, 32, varied=False)
    gs = R.amax(w) if mode == "nvfp4" else None
    wq = qq.quantize(w, mode=mode, global_scale=gs, **kw)
    bias = rng.standard_normal(64).astype(F32)       # N = 64 either way

    def f(x, wq, bias):
        return qq.quantized_matmul(x, wq, transpose=transpose, bias=bias)

    got = jax.jit(f)(put(x, dev), tree_put(wq, dev), put(bias, dev))
    want = _eager_on(dev, f, x, wq, bias)
    assert_same(got, want, "quantized_matmul jit vs eager")
    wq_dev = tree_put(wq, dev)
    closed = jax.jit(lambda x: qq.quantized_matmul(x, wq_dev, transpose=transpose, bias=bias))
    assert_same(closed(put(x, dev)), want, "quantized_matmul, weight closed over")
    ref = R.quantized_matmul(x, R.quantize(w, mode=mode, global_scale=gs, **kw),
                             transpose=transpose, bias=bias)
    assert R.matmul_mismatch(to_numpy(got), ref) is None


@pytest.mark.parametrize("mode,kw", [("affine", {"bits": 4, "group_size": 64}), ("affine", {"bits": 8}),
                                     ("nvfp4", {})], ids=["affine4", "affine8", "nvfp4"])
def test_quantized_matmul_decode_weight(mode, kw, rng):
    """A DecodeWeight closed over under jit: the packed weight it keeps goes in (the layout's
    kernel is eager); on the CPU that equals the eager call on the layout bit for bit."""
    cpu = jax.devices("cpu")[0]
    x = random_data(rng, (3, 256), BF16, 32, varied=False)
    w = random_data(rng, (64, 256), BF16, 32, varied=False)
    dw = qq.prepare_decode(qq.quantize(put(w, cpu), mode=mode, **kw))
    got = jax.jit(lambda x: qq.quantized_matmul(x, dw))(put(x, cpu))
    assert_same(got, qq.quantized_matmul(put(x, cpu), dw), "quantized_matmul(DecodeWeight) jit vs eager")


def test_quantized_matmul_swiglu_gated(rng):
    """quantized_matmul_swiglu on a gated DecodeWeight under jit: the packed weight's custom
    call and swiglu's; on the CPU equal to the eager call (the gated layout's kernel) bit for
    bit."""
    cpu = jax.devices("cpu")[0]
    x = random_data(rng, (3, 256), BF16, 32, varied=False)
    w = random_data(rng, (128, 256), BF16, 32, varied=False)
    dg = qq.prepare_decode(qq.quantize(put(w, cpu), mode="nvfp4"), gated=True)
    got = jax.jit(lambda x: qq.quantized_matmul_swiglu(x, dg))(put(x, cpu))
    assert_same(got, qq.quantized_matmul_swiglu(put(x, cpu), dg), "quantized_matmul_swiglu jit vs eager")


@pytest.mark.parametrize("mode,kw", [("affine", {"bits": 4, "group_size": 64}), ("nvfp4", {}),
                                     ("mxfp8", {})], ids=["affine4", "nvfp4", "mxfp8"])
def test_gather_qmm(mode, kw, dev, rng):
    """MoE decode under jit: each token's top-2 experts from indices traced with the
    program (new indices, no retrace); jit == eager bit for bit; vmap over tokens."""
    x = random_data(rng, (5, 1, 1, 128), BF16, 32, varied=False)
    w = random_data(rng, (4, 64, 128), BF16, 32, varied=False)
    wq = qq.quantize(w, mode=mode, **kw)
    idx = rng.integers(0, 4, size=(5, 2)).astype(np.int32)

    def f(x, wq, idx):
        return qq.gather_qmm(x, wq, rhs_indices=idx)

    jf = jax.jit(f)
    got = jf(put(x, dev), tree_put(wq, dev), put(idx, dev))
    want = _eager_on(dev, f, x, wq, idx)
    assert_same(got, want, "gather_qmm jit vs eager")
    idx2 = idx[::-1].copy()
    assert_same(jf(put(x, dev), tree_put(wq, dev), put(idx2, dev)), _eager_on(dev, f, x, wq, idx2),
                "gather_qmm jit, new indices")
    ref = R.gather_qmm(x, R.quantize(w, mode=mode, **kw), idx)
    assert R.matmul_mismatch(to_numpy(got), ref) is None
    # vmap over the tokens: one call per token (the handler loops); on the GPU a token's
    # 2 entries run ungrouped, the 10 of the batch call grouped by expert (other k-splits)
    wq_dev = tree_put(wq, dev)
    per_token = jax.jit(jax.vmap(lambda xt, it: qq.gather_qmm(xt, wq_dev, rhs_indices=it)))
    got_v = per_token(put(x[:, 0], dev), put(idx, dev))          # xt [1, 128], it [2]
    if dev.platform == "cpu":
        assert_same(got_v, got, "gather_qmm under vmap")
    assert R.matmul_mismatch(to_numpy(got_v), ref) is None


# ---------------------------------------------------------------------------
# qq.jax.qq_linear: forward and gradients under jit equal eager; no host callbacks
# ---------------------------------------------------------------------------

def _linear_data(rng):
    x = rng.standard_normal((3, 40, 256)).astype(F32)
    w = (rng.standard_normal((128, 256)) / 16).astype(F32)
    b = rng.standard_normal(128).astype(F32)
    dy = rng.standard_normal((3, 40, 128)).astype(F32)
    return x, w, b, dy


@pytest.mark.parametrize("mode", ["mxfp8", "nvfp4", "mxfp4"])
def test_qq_linear_jit_equals_eager(mode, dev, rng):
    x, w, b, dy = _linear_data(rng)

    def lin(x, w, b):
        return qqj.qq_linear(x, w, b, mode=mode)

    def step(x, w, b, dy):
        y, vjp = jax.vjp(lin, x, w, b)
        return (y, *vjp(dy))

    args = [put(a, dev) for a in (x, w, b, dy)]
    got = jax.jit(step)(*args)
    want = step(*args)                       # eager: every qq call on concrete arrays
    for name, g, e in zip(("y", "dx", "dw"), got, want):
        assert_same(g, e, f"qq_linear {mode} {name}: jit vs eager")
    # db = sum of dy over the tokens: XLA's reduction, not qq's (assert_gemm_close says why)
    assert_gemm_close(got[3], want[3], f"qq_linear {mode} db: jit vs eager", dev)
    # and not merely equal to a wrong eager: y is x @ w.T + b within the mode's error
    y_ref = x.astype(np.float64) @ w.T.astype(np.float64) + b
    err = np.abs(to_numpy(got[0]) - y_ref).max() / np.abs(y_ref).max()
    assert err < {"mxfp8": 0.05, "nvfp4": 0.2, "mxfp4": 0.25}[mode], err


def test_qq_linear_jit_runs_custom_calls():
    """The jitted forward + backward holds qq's XLA custom calls and no host callback."""
    x, w, b = jnp.ones((32, 64)), jnp.ones((32, 64)), jnp.ones(32)
    f = jax.grad(lambda x, w, b: qqj.qq_linear(x, w, b, mode="nvfp4").sum(), argnums=(0, 1, 2))
    text = jax.jit(f).lower(x, w, b).as_text()
    for op in ("qq_qqmm", "qq_quantize_colwise", "qq_amax"):
        assert op in text, op
    assert "callback" not in text


def test_qq_linear_falls_back_to_callbacks(monkeypatch, rng):
    """Where the handlers cannot be registered, qq_linear under jit runs host callbacks
    (pure_callback) - and computes the same numbers. On the CPU device: the callbacks run
    libqq's CPU backend, so the custom call compared with them must too (on a GPU machine
    JAX's default device is the GPU, whose kernels sum in another order)."""
    cpu = jax.devices("cpu")[0]
    x, w, b = (put(a, cpu) for a in _linear_data(rng)[:3])
    want = jax.jit(lambda x, w, b: qqj.qq_linear(x, w, b, mode="mxfp8"))(x, w, b)
    monkeypatch.setattr(qj, "_status", "simulated: no handlers")
    f = jax.jit(lambda x, w, b: qqj.qq_linear(x, w, b, mode="mxfp8"))
    assert "callback" in f.lower(x, w, b).as_text()
    assert_same(f(x, w, b), want, "callback vs FFI")
    with pytest.raises(qq.NotSupportedError, match="simulated: no handlers"):
        jax.jit(lambda x: qq.amax(x))(x)


# ---------------------------------------------------------------------------
# vmap
# ---------------------------------------------------------------------------

def _stack(trees):
    return jax.tree.map(lambda *a: np.stack([to_numpy(v) for v in a]), *trees)


def _assert_tree_same(got, want, what):
    gl, wl = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(gl) == len(wl), what
    for i, (g, w) in enumerate(zip(gl, wl)):
        assert_same(g, w, f"{what} leaf {i}")


@pytest.mark.parametrize("case", ["mxfp8-linear", "nvfp4-blocked", "nvfp4-amax-gs", "affine-1d",
                                  "mxfp4-blocked-1d"])
def test_vmap_quantize(case, dev, rng):
    """jax.vmap(quantize) equals a loop of eager calls. x alone batched folds into one libqq
    call; a per-example global scale (nvfp4 with amax(x)) and blocked scales of 1-D examples
    loop over the examples."""
    mode, layout = case.split("-")[:2]
    layout = "linear" if layout in ("amax", "1d") else layout
    x = random_data(rng, (4, 32, 128) if "1d" not in case else (4, 128), F32, 64)
    with_gs = "amax-gs" in case

    def f(x):
        return qq.quantize(x, mode=mode, scale_layout=layout,
                           global_scale=qq.amax(x) if with_gs else None)

    before = qj.vmap_counts()
    got = jax.jit(jax.vmap(f))(put(x, dev))
    after = qj.vmap_counts()
    want = _stack([f(x[i]) for i in range(4)])
    _assert_tree_same(got, want, f"vmap quantize {case}")
    assert got.shape == x.shape and got.mode == mode
    folds = (after[0] - before[0], after[1] - before[1])
    loops_expected = with_gs or (layout == "blocked" and "1d" in case)
    assert (folds[1] > 0) == loops_expected and (folds[0] > 0) == (not loops_expected), folds


def test_vmap_quantize_then_dequantize(dev, rng):
    x = random_data(rng, (3, 2, 16, 64), F32, 32)
    f = jax.vmap(jax.vmap(lambda x: qq.dequantize(qq.quantize(x, mode="mxfp4"), dtype="float32")))
    got = jax.jit(f)(put(x, dev))
    want = np.stack([np.stack([qq.dequantize(qq.quantize(x[i, j], mode="mxfp4"), dtype="float32")
                               for j in range(2)]) for i in range(3)])
    assert_same(got, want, "nested vmap dequantize(quantize)")


@pytest.mark.parametrize("batched", ["x", "w", "both"])
def test_vmap_qqmm(batched, dev, rng):
    xs = random_data(rng, (3, 16, 128), F32, 32, varied=False)
    ws = random_data(rng, (3, 48, 128), F32, 32, varied=False)
    x0, w0 = xs[0], ws[0]

    def f(x, w):
        return qq.qqmm(x, w, mode="nvfp4", global_scale_w=qq.amax(w))

    if batched == "x":
        got = jax.vmap(f, in_axes=(0, None))(put(xs, dev), put(w0, dev))
        want = [f(xs[i], w0) for i in range(3)]
    elif batched == "w":
        got = jax.vmap(f, in_axes=(None, 0))(put(x0, dev), put(ws, dev))
        want = [f(x0, ws[i]) for i in range(3)]
    else:
        got = jax.vmap(f)(put(xs, dev), put(ws, dev))
        want = [f(xs[i], ws[i]) for i in range(3)]
    assert_same(got, np.stack(want), f"vmap qqmm ({batched} batched)")


@pytest.mark.parametrize("mode", ["mxfp8", "nvfp4"])
def test_vmap_qq_linear(mode, dev, rng):
    """vmap of qq_linear's forward and of its gradient: each example is its own layer call
    (nvfp4's global scales are per example), as a Python loop computes it."""
    x, w, _, _ = _linear_data(rng)
    xd, wd = put(x, dev), put(w, dev)
    y = jax.jit(jax.vmap(lambda x: qqj.qq_linear(x, wd, None, mode=mode)))(xd)
    want = np.stack([to_numpy(qqj.qq_linear(xd[i], wd, None, mode=mode)) for i in range(3)])
    assert_gemm_close(y, want, "vmap qq_linear", dev)
    loss = jax.grad(lambda x, w: jnp.sum(qqj.qq_linear(x, w, None, mode=mode) ** 2), argnums=(0, 1))
    gx, gw = jax.jit(jax.vmap(loss, in_axes=(0, None)))(xd, wd)
    per = [loss(xd[i], wd) for i in range(3)]
    assert_gemm_close(gx, np.stack([to_numpy(p[0]) for p in per]), "vmap grad x", dev)
    assert_gemm_close(gw, np.stack([to_numpy(p[1]) for p in per]), "vmap grad w", dev)


# ---------------------------------------------------------------------------
# Errors carry libqq's message
# ---------------------------------------------------------------------------

def test_error_at_trace_time_names_the_argument():
    """Shapes are asked of libqq while tracing: a K that is not a multiple of the group
    fails there, with the eager call's message."""
    with pytest.raises(ValueError) as eager:
        qq.quantize(np.ones((4, 48), F32), mode="mxfp8")
    with pytest.raises(ValueError) as traced:
        jax.jit(lambda x: qq.quantize(x, mode="mxfp8"))(jnp.ones((4, 48)))
    assert str(traced.value) == str(eager.value)
    assert "K=48" in str(traced.value) and "group_size 32" in str(traced.value)


def test_error_at_run_time_from_the_handler(dev):
    """What only libqq's checks see (an int32 x; a global scale outside nvfp4) fails when
    XLA runs the handler: the XLA error carries libqq's message and status."""
    with pytest.raises(TypeError) as eager:
        qq.quantize(np.ones((4, 64), np.int32), mode="mxfp8")
    # (GPU execution is asynchronous: the error surfaces when the result is waited for)
    with pytest.raises(Exception) as run:
        jax.block_until_ready(
            jax.jit(lambda x: qq.quantize(x, mode="mxfp8"))(put(np.ones((4, 64), np.int32), dev)))
    assert "INVALID_ARGUMENT" in str(run.value)
    assert str(eager.value) in str(run.value) and "QQ_STATUS_INVALID_DTYPE" in str(run.value)
    with pytest.raises(Exception, match="argument 'global_scale' is given but mode is mxfp8"):
        jax.block_until_ready(jax.jit(lambda x: qq.quantize(x, mode="mxfp8", global_scale=1.0))(
            put(np.ones((4, 64), F32), dev)))


def test_empty_results_still_checked(dev):
    """A call whose results all have zero elements still runs libqq's checks under jit (XLA
    drops such a call as dead code unless it is marked as having a side effect): the same
    errors as eager, and valid empty calls give the eager shapes."""
    x0, xi = np.ones((0, 64), F32), np.ones((0, 64), np.int32)
    w = qq.quantize(np.ones((32, 64), F32), mode="mxfp8")
    wj = jax.tree_util.tree_map(lambda a: put(a, dev), w)
    cases = [  # f(x, w, bias), x, the message eager and jit share
        (lambda x, w, b: qq.quantize(x, mode="mxfp8"), xi, "argument 'x' has dtype int32"),
        (lambda x, w, b: qq.quantize(x, mode="mxfp8", global_scale=1.0), x0, "is given but mode is mxfp8"),
        (lambda x, w, b: qq.quantized_matmul(x, w, bias=b), x0, "argument 'bias' has shape (5,)"),
        (lambda x, w, b: qq.quantized_matmul(x, w, bias=b), xi, "argument 'x' has dtype int32"),
    ]
    b5 = np.ones((5,), F32)
    for f, x, msg in cases:
        with pytest.raises(Exception, match=re.escape(msg)):
            f(x, w, b5)
        with pytest.raises(Exception, match=re.escape(msg)):
            jax.block_until_ready(jax.jit(f)(put(x, dev), wj, put(b5, dev)))
    q = jax.block_until_ready(jax.jit(lambda x: qq.quantize(x, mode="mxfp8"))(put(x0, dev)))
    assert q.data.shape == (0, 64) and q.scales.shape == (0, 2)
    y = jax.block_until_ready(jax.jit(qq.quantized_matmul)(put(x0, dev), wj))
    assert y.shape == (0, 32) and y.dtype == jnp.float32
    qv = jax.jit(jax.vmap(lambda x: qq.quantize(x, mode="mxfp8")))(put(np.ones((3, 0, 64), F32), dev))
    assert qv.data.shape == (3, 0, 64)


def test_functions_without_a_handler_say_so():
    with pytest.raises(TypeError, match="swizzle_scales: called on a JAX tracer"):
        jax.jit(qq.swizzle_scales)(jnp.ones((4, 4), jnp.uint8))


def test_eager_errors_unchanged():
    """A concrete bad argument still raises the eager error (no tracer, no JAX path)."""
    with pytest.raises(TypeError, match="expected a NumPy array or an array with __dlpack__"):
        qq.quantize([1.0, 2.0], mode="mxfp8")


def test_torch_dtypes_accepted_and_checked_under_jit():
    """qq.quantize's torch_dtypes= (torch callers only) is taken under jax.jit too, JAX's
    results staying uint8, and a bad value is refused as in eager mode."""
    x = jnp.ones((4, 64), jnp.float32)
    for td in (True, False, "float4"):
        q = jax.jit(lambda x, td=td: qq.quantize(x, mode="mxfp8", torch_dtypes=td).scales)(x)
        assert q.dtype == jnp.uint8
    with pytest.raises(ValueError, match="torch_dtypes"):
        jax.jit(lambda x: qq.quantize(x, mode="mxfp8", torch_dtypes="no").data)(x)
