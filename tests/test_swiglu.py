"""qq.swiglu(x): silu(g) * u of x [..., 2F] = [g | u] as [..., F] in x's dtype, computed in
float32 (g / (1 + exp(-g)) * u) and rounded once (libqq/src/act.h, docs/api.md)."""

from __future__ import annotations

import numpy as np
import pytest

import qq
import reference as R
from helpers import BF16, DEVICES, cast, dtype_params, poison, raises, to_device, to_numpy

F32 = np.float32


def ulps(got, want_f64, dtype):
    """|got - want| in units of the last place of `dtype` at want (NaN where both are NaN is 0,
    NaN on one side only is infinite)."""
    dtype = np.dtype(dtype)
    got = np.asarray(got).astype(np.float64)
    mant = {np.dtype(F32): 23, np.dtype(np.float16): 10, BF16: 7}[dtype]
    tiny = {np.dtype(F32): 2.0 ** -149, np.dtype(np.float16): 2.0 ** -24, BF16: 2.0 ** -133}[dtype]
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        e = np.floor(np.log2(np.maximum(np.abs(want_f64), tiny)))
        ulp = np.maximum(2.0 ** (e - mant), tiny)
        d = np.abs(got - want_f64) / ulp
    both_nan = np.isnan(got) & np.isnan(want_f64)
    same_inf = np.isinf(got) & (got == want_f64)
    d = np.where(both_nan | same_inf, 0.0, d)
    return np.where(np.isnan(d), np.inf, d)


def swiglu_np(x, device="cpu", **kw):
    return to_numpy(qq.swiglu(to_device(x, device), **kw))


def check(x, got, dtype, what="swiglu"):
    want = R.swiglu(x)
    assert got.dtype == np.dtype(dtype) and got.shape == want.shape, (got.dtype, got.shape, want.shape)
    d = ulps(got, want, dtype)
    # float32 math (exp within a few float32 ulp) then one rounding to nearest: within half
    # an ulp of a 16-bit dtype (plus the float32 error, far below 0.01 of it), so a
    # truncation or a double rounding shows; a few ulp of float32
    limit = 8.0 if np.dtype(dtype) == F32 else 0.51
    worst = np.unravel_index(np.argmax(d), d.shape) if d.size else None
    assert d.size == 0 or d.max() <= limit, (
        f"{what}: {d.max()} ulp at {worst}: got {got[worst]!r}, want {want[worst]!r}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", dtype_params())
# F % 8 == 0 (the GPU's 16-byte path) and not (per element: F = 5, 1, 1003); batch axes; one
# row; 14336 (Llama's MLP)
@pytest.mark.parametrize("shape", [(1, 16), (3, 10), (2, 5, 64), (1, 2 * 14336), (7, 2 * 1000), (4, 2),
                                   (130, 48), (2,), (3, 2 * 1003)],
                         ids=lambda s: "x".join(map(str, s)))
def test_random(shape, dtype, device, rng):
    x = cast(rng.standard_normal(shape).astype(F32) * 4, dtype)
    check(x, swiglu_np(x, device), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", dtype_params())
def test_special_values(dtype, device):
    """Zeros (signed), large gates both ways, Inf and NaN in either half, subnormals."""
    big = 60000.0 if np.dtype(dtype) == np.float16 else 1e30
    sub = {np.dtype(F32): 1e-40, np.dtype(np.float16): 1e-6, BF16: 1e-39}[np.dtype(dtype)]
    g = np.array([0.0, -0.0, 1.0, -1.0, 100.0, -100.0, big, -big, np.inf, -np.inf, np.nan, 2.0,
                  0.0, 3.0, sub, -sub], F32)
    u = np.array([1.0, 1.0, -2.0, 3.0, 1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 1.0, np.nan,
                  np.inf, -np.inf, 1.0, 1.0], F32)
    x = cast(np.concatenate([g, u])[None, :], dtype)
    got = swiglu_np(x, device)
    check(x, got, dtype)
    got = got.astype(np.float64)[0]
    assert np.isnan(got[9]), "a gate of -Inf gives NaN (torch's silu)"
    assert got[8] == np.inf and np.isnan(got[10]) and np.isnan(got[11]) and np.isnan(got[12])
    assert got[13] == -np.inf and got[5] == 0 and np.signbit(got[5])


@pytest.mark.parametrize("device", DEVICES)
def test_strided_rows_and_out(device, rng):
    """x as a slice of wider rows (the row stride is not 2F); out= written in full (poisoned
    first) and returned."""
    wide = cast(rng.standard_normal((6, 40)).astype(F32), BF16)
    x_np = np.ascontiguousarray(wide[:, :32])
    want = swiglu_np(x_np)
    if device == "cpu":
        x = wide[:, :32]
        out = poison((6, 16), BF16)
        r = qq.swiglu(x, out=out)
        assert r is out
        np.testing.assert_array_equal(out.view(np.uint16), want.view(np.uint16))
    else:
        torch = pytest.importorskip("torch")
        from helpers import numpy_to_torch, torch_device
        dev = torch_device(device)
        w = numpy_to_torch(wide, torch).to(dev)
        out = torch.full((6, 16), float("nan"), dtype=torch.bfloat16, device=dev)
        r = qq.swiglu(w[:, :32], out=out)
        assert r is out
        check(x_np, to_numpy(out), BF16)  # (the GPU's exp: not bit for bit with the CPU)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("shape", [(16, 2 * 14336), (5, 2 * 1000), (3, 4, 72)], ids=lambda s: "x".join(map(str, s)))
def test_gpu_equals_cpu(shape, dtype, rng):
    """The GPU's float32 exp (CUDA's expf: within 2 ulp) may differ from the CPU's: at most one
    ulp of a 16-bit dtype apart and equal almost everywhere; a few ulp of float32 (5 seen on an
    H100)."""
    x = cast(rng.standard_normal(shape).astype(F32) * 4, dtype)
    cpu, gpu = swiglu_np(x), swiglu_np(x, "cuda")
    want = cpu.astype(np.float64)
    d = ulps(gpu, want, dtype)
    assert d.max() <= (8.0 if np.dtype(dtype) == F32 else 1.0)
    if np.dtype(dtype) != F32:
        assert np.count_nonzero(d) <= max(2, d.size // 1000)


def test_errors():
    raises(ValueError, ["swiglu", "x", "even last axis"], qq.swiglu, np.zeros((2, 3), F32))
    raises(ValueError, ["swiglu", "x"], qq.swiglu, np.zeros((), F32))
    raises(TypeError, ["swiglu", "x", "int32"], qq.swiglu, np.zeros((2, 4), np.int32))
    x = np.zeros((2, 8), F32)
    raises(ValueError, ["swiglu", "out", "shape"], qq.swiglu, x, out=np.zeros((2, 8), F32))
    raises(ValueError, ["swiglu", "out", "float16"], qq.swiglu, x, out=np.zeros((2, 4), np.float16))
    raises(ValueError, ["swiglu", "out", "compact"], qq.swiglu, x, out=x[:, :4])
    buf = np.zeros(16, F32)   # a compact out inside x
    raises(ValueError, ["overlaps"], qq.swiglu, buf.reshape(2, 8), out=buf[:8].reshape(2, 4))
    raises(ValueError, ["swiglu", "x", "stride"], qq.swiglu, np.zeros((8, 4), F32).T)
    assert qq.swiglu(np.zeros((0, 8), F32)).shape == (0, 4)


@pytest.mark.gpu
def test_gpu_kernel_paths(rng):
    """The GPU kernel's less common paths against the reference: more than 65535 rows (the
    grid's y loop), rows that start off 16-byte alignment (per element with F % 8 == 0), a
    broadcast batch axis (stride 0) and a non-compact batch stride."""
    torch = pytest.importorskip("torch")
    from helpers import numpy_to_torch, torch_device
    dev = torch_device("cuda")

    def on_gpu(a):
        return numpy_to_torch(a, torch).to(dev)

    x = cast(rng.standard_normal((70000, 16)).astype(F32), BF16)
    check(x, to_numpy(qq.swiglu(on_gpu(x))), BF16, "70000 rows")
    w = cast(rng.standard_normal((5, 2 * 64 + 1)).astype(F32), BF16)
    check(np.ascontiguousarray(w[:, 1:]), to_numpy(qq.swiglu(on_gpu(w)[:, 1:])), BF16, "misaligned rows")
    row = rng.standard_normal((1, 3, 32)).astype(F32)
    xb = on_gpu(row).expand(4, 3, 32)  # batch stride 0
    check(np.broadcast_to(row, (4, 3, 32)), to_numpy(qq.swiglu(xb)), F32, "broadcast batch")
    big = rng.standard_normal((6, 3, 32)).astype(F32)
    check(big[::2], to_numpy(qq.swiglu(on_gpu(big)[::2])), F32, "strided batch")


def test_torch_compile():
    """torch.compile(fullgraph=True) traces qq.swiglu (a torch custom op) and returns the eager
    result; the fake implementation gives the shape and dtype."""
    torch = pytest.importorskip("torch")
    x = torch.randn(3, 4, 32).to(torch.bfloat16)
    eager = qq.swiglu(x)
    f = torch.compile(lambda t: qq.swiglu(t) + 1, fullgraph=True)
    got = f(x)
    assert got.shape == (3, 4, 16) and got.dtype == torch.bfloat16
    assert torch.equal(got, eager + 1)


def test_jax_jit_and_vmap():
    """Inside jax.jit and vmap (the XLA custom call) equal to the eager call on the same JAX
    device (JAX's default: the GPU where it has one), bit for bit; and to the reference."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    x = np.random.default_rng(0).standard_normal((4, 24)).astype(F32)
    xj = jnp.asarray(x)
    eager = np.asarray(qq.swiglu(xj))
    check(x, eager, F32)
    np.testing.assert_array_equal(np.asarray(jax.jit(qq.swiglu)(xj)), eager)
    got = np.asarray(jax.vmap(qq.swiglu)(jnp.stack([xj, xj * 2])))
    np.testing.assert_array_equal(got[0], eager)
    np.testing.assert_array_equal(got[1], np.asarray(qq.swiglu(xj * 2)))


def test_torch_opcheck():
    torch = pytest.importorskip("torch")
    from qq import _torch_ops  # noqa: F401  (registers the ops)
    for x in (torch.randn(3, 32), torch.randn(2, 3, 10).to(torch.bfloat16)):
        torch.library.opcheck(torch.ops.qq.swiglu, (x,), test_utils=("test_schema", "test_faketensor"))
