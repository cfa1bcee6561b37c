"""The small CPU calls' path (python/qq/_fast.pxi): quantize, quantized_matmul and qqmm of
small NumPy arrays and torch CPU tensors in their common form skip the per-call objects.
It must give what the general path gives - the same bits, dtypes, shapes, fields, routes
and errors - and it must actually be taken where it applies (qq._qq._fast_path() counts
its calls; _fast_path(False) switches it off, so each case runs both ways here)."""

from __future__ import annotations

import numpy as np
import pytest

import qq
from qq import _qq
from helpers import try_import

torch = try_import("torch")

MODES = [("affine", {}), ("affine", {"bits": 8, "group_size": 32}), ("affine", {"bits": 4, "group_size": 128}),
         ("nvfp4", {}), ("mxfp4", {}), ("mxfp8", {}), ("mxfp8", {"fp8_format": "e5m2"}),
         ("mxfp4", {"rounding": "floor"}), ("nvfp4", {"scale_layout": "blocked"})]
MODE_IDS = [m + "".join(f"-{k}={v}" for k, v in kw.items()) for m, kw in MODES]


def frameworks():
    out = [("numpy", np.float32), ("numpy", np.float16)]
    if torch is not None:
        out += [("torch", torch.float32), ("torch", torch.float16), ("torch", torch.bfloat16)]
    return [pytest.param(f, d, id=f"{f}-{str(d).rpartition('.')[2]}") for f, d in out]


def make(fw, dtype, a):
    a = np.asarray(a, np.float32)
    if fw == "numpy":
        return a.astype(dtype)
    return torch.from_numpy(a).to(dtype)


def both(fn):
    """fn() through the small calls' path and through the general path: (fast, general,
    whether the first took the fast path)."""
    _, before = _qq._fast_path()
    fast = fn()
    _, after = _qq._fast_path()
    _qq._fast_path(False)
    try:
        general = fn()
    finally:
        _qq._fast_path(True)
    return fast, general, after > before


def bits(a):
    """a's bytes as a flat uint8 NumPy array (any dtype, NumPy or torch)."""
    if torch is not None and isinstance(a, torch.Tensor):
        return a.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def same_array(got, want, what):
    assert type(got) is type(want), what
    assert tuple(got.shape) == tuple(want.shape), what
    assert got.dtype == want.dtype, what
    assert np.array_equal(bits(got), bits(want)), what


def same_qa(got, want):
    for f in ("data", "scales", "biases", "global_scale"):
        g, w = getattr(got, f), getattr(want, f)
        assert (g is None) == (w is None), f
        if g is not None:
            same_array(g, w, f)
    for f in ("mode", "group_size", "bits", "rounding", "scale_layout", "fp8_format", "shape"):
        assert getattr(got, f) == getattr(want, f), f
        assert type(getattr(got, f)) is type(getattr(want, f)), f


@pytest.fixture(autouse=True)
def _on():
    _qq._fast_path(True)
    yield
    _qq._fast_path(True)


@pytest.mark.parametrize("fw, dtype", frameworks())
@pytest.mark.parametrize("mode, kw", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("shape", [(1, 128), (3, 256), (2, 3, 128), (128,)], ids=str)
def test_quantize(fw, dtype, mode, kw, shape, rng):
    x = make(fw, dtype, rng.standard_normal(shape) * 4)
    x.reshape(-1)[:3] = 0       # zeros, and a NaN where the format keeps one
    if mode != "affine":
        x.reshape(-1)[5] = float("nan")
    fast, general, taken = both(lambda: qq.quantize(x, mode=mode, **kw))
    same_qa(fast, general)
    # torch affine (three results, two element sizes) is the general path's
    assert taken == (fw == "numpy" or mode != "affine")


@pytest.mark.parametrize("fw, dtype", frameworks())
@pytest.mark.parametrize("mode, kw", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("xshape", [(1, 128), (5, 128), (2, 3, 128), (128,)], ids=str)
def test_quantized_matmul(fw, dtype, mode, kw, xshape, rng):
    w = make(fw, dtype, rng.standard_normal((48, 128)))
    gs = {"global_scale": qq.amax(w)} if mode == "nvfp4" and "scale_layout" not in kw else {}
    qkw = {k: v for k, v in kw.items() if k != "rounding"}
    qw = qq.quantize(w, mode=mode, **qkw, **gs)
    x = make(fw, dtype, rng.standard_normal(xshape))
    fast, general, taken = both(lambda: qq.quantized_matmul(x, qw))
    same_array(fast, general, "quantized_matmul")
    assert taken
    assert qq.last_route() == "cpu"


@pytest.mark.parametrize("fw, dtype", frameworks())
@pytest.mark.parametrize("mode", ["nvfp4", "mxfp4", "mxfp8"])
@pytest.mark.parametrize("xshape", [(1, 128), (5, 128), (2, 3, 128)], ids=str)
def test_qqmm_prepared(fw, dtype, mode, xshape, rng):
    w = make(fw, dtype, rng.standard_normal((48, 128)))
    pw = qq.prepare_weight(w, mode=mode, **({"global_scale": qq.amax(w)} if mode == "nvfp4" else {}))
    x = make(fw, dtype, rng.standard_normal(xshape) * 3)
    fast, general, taken = both(lambda: qq.qqmm(x, pw))
    same_array(fast, general, "qqmm")
    assert taken == (pw.values is not None)
    assert qq.last_route() == "cpu"


def test_not_taken(rng):
    """Arguments given, big calls, other array types and frameworks: the general path."""
    x = rng.standard_normal((1, 128)).astype(np.float32)
    w = rng.standard_normal((48, 128)).astype(np.float32)
    qw = qq.quantize(w, mode="mxfp8")
    out = np.empty((1, 48), np.float32)
    big = rng.standard_normal((64, 128)).astype(np.float32)
    for fn in (lambda: qq.quantize(x, mode="nvfp4", global_scale=1.0),
               lambda: qq.quantize(x, mode="nvfp4", torch_dtypes=False),
               lambda: qq.quantize(rng.standard_normal((64, 128)).astype(np.float32), mode="nvfp4"),
               lambda: qq.quantized_matmul(x, qw, out=out),
               lambda: qq.quantized_matmul(x, qw, dtype="float16"),
               lambda: qq.quantized_matmul(x, qw, bias=np.ones(48, np.float32)),
               lambda: qq.quantized_matmul(big, qq.quantize(np.ones((1024, 128), np.float32), mode="mxfp8")),
               lambda: qq.quantized_matmul(x, qw.data, qw.scales, mode="mxfp8"),
               lambda: qq.qqmm(x, qw),                          # a QuantizedArray, not a PreparedWeight
               lambda: qq.qqmm(x, qq.prepare_weight(w, mode="mxfp8"), bias=np.ones(48, np.float32))):
        _, before = _qq._fast_path()
        fn()
        assert _qq._fast_path()[1] == before


ERRORS = [
    ("int32 x", lambda x, qw, pw: qq.quantize(x.astype(np.int32), mode="nvfp4")),
    ("float64 x", lambda x, qw, pw: qq.quantize(x.astype(np.float64), mode="mxfp8")),
    ("K not a multiple of the group", lambda x, qw, pw: qq.quantize(x[:, :40], mode="mxfp8")),
    ("0-d x", lambda x, qw, pw: qq.quantize(np.float32(1.0), mode="mxfp8")),
    ("bad mode", lambda x, qw, pw: qq.quantize(x, mode="fp3")),
    ("bad group_size", lambda x, qw, pw: qq.quantize(x, group_size=48)),
    ("strided last axis", lambda x, qw, pw: qq.quantize(np.ones((1, 256), np.float32)[:, ::2], mode="mxfp8")),
    ("qmm K mismatch", lambda x, qw, pw: qq.quantized_matmul(x[:, :96], qw)),
    ("qmm int32 x", lambda x, qw, pw: qq.quantized_matmul(x.astype(np.int32), qw)),
    ("qmm 0-d x", lambda x, qw, pw: qq.quantized_matmul(np.float32(1.0), qw)),
    ("qmm stale QuantizedArray", lambda x, qw, pw: qq.quantized_matmul(
        x, qq.QuantizedArray(qw.data[:, :32], qw.scales, mode="mxfp8"))),
    ("qqmm K mismatch", lambda x, qw, pw: qq.qqmm(x[:, :96], pw)),
    ("qqmm float64 x", lambda x, qw, pw: qq.qqmm(x.astype(np.float64), pw)),
]


@pytest.mark.parametrize("name, fn", ERRORS, ids=[e[0] for e in ERRORS])
def test_errors_as_the_general_path(name, fn, rng):
    """A call the small path does not take or libqq refuses raises the general path's error."""
    x = rng.standard_normal((2, 128)).astype(np.float32)
    w = rng.standard_normal((48, 128)).astype(np.float32)
    qw, pw = qq.quantize(w, mode="mxfp8"), qq.prepare_weight(w, mode="mxfp8")
    errs = []
    for on in (True, False):
        _qq._fast_path(on)
        with pytest.raises(Exception) as e:
            fn(x, qw, pw)
        errs.append((type(e.value), str(e.value)))
    assert errs[0] == errs[1]


@pytest.mark.skipif(torch is None, reason="torch")
def test_torch_views_and_parameters(rng):
    """torch: a Parameter, a tensor that requires grad, a view of every other row, a
    negative view (resolved by the general path) - all as the general path gives them."""
    w = torch.from_numpy(rng.standard_normal((48, 128)).astype(np.float32))
    qw = qq.quantize(w, mode="nvfp4")
    cases = [torch.nn.Parameter(torch.randn(2, 128)), torch.randn(2, 128, requires_grad=True),
             torch.randn(4, 128)[::2], torch._neg_view(torch.randn(2, 128))]
    for x in cases:
        fast, general, _ = both(lambda: qq.quantize(x, mode="mxfp8"))
        same_qa(fast, general)
        fast, general, _ = both(lambda: qq.quantized_matmul(x.detach(), qw))
        same_array(fast, general, "quantized_matmul")
    x = torch._neg_view(torch.randn(2, 128))
    _, _, taken = both(lambda: qq.quantize(x, mode="mxfp8"))
    assert not taken


def test_no_route_after_a_refusal_in_python(rng):
    """A call that fails before libqq runs leaves qq.last_route() None, as the general path
    does (the small path once kept the previous call's route)."""
    x = rng.standard_normal((2, 64)).astype(np.float32)
    qa = qq.quantize(rng.standard_normal((16, 64)).astype(np.float32), mode="nvfp4")
    qq.quantized_matmul(x, qa)
    assert qq.last_route() == "cpu"
    qa.group_size = 32
    for on in (True, False):
        _qq._fast_path(on)
        with pytest.raises(ValueError):
            qq.quantized_matmul(x, qa)
        assert qq.last_route() is None


def test_deleted_fields_as_the_general_path(rng):
    """A deleted QuantizedArray / PreparedWeight field: the general path's result or error
    (it reads the fields it needs, in its order; the small path declines)."""
    x = rng.standard_normal((2, 64)).astype(np.float32)
    w = rng.standard_normal((16, 64)).astype(np.float32)
    cases = []
    qa = qq.quantize(w, mode="nvfp4")
    del qa.shape                                        # quantized_matmul reads it: AttributeError
    cases.append(lambda: qq.quantized_matmul(x, qa))
    pw = qq.prepare_weight(w, mode="mxfp8")
    del pw.quantized.biases                             # qqmm never reads it: a result
    cases.append(lambda: qq.qqmm(x, pw))
    pw2 = qq.prepare_weight(w, mode="mxfp8")
    del pw2.quantized.scales, pw2.quantized.mode        # the general path names 'scales' first
    cases.append(lambda: qq.qqmm(x, pw2))
    for fn in cases:
        got = []
        for on in (True, False):
            _qq._fast_path(on)
            try:
                got.append(("ok", bits(fn())))
            except Exception as e:  # noqa: BLE001 - the comparison is the point
                got.append((type(e), str(e)))
        if got[0][0] == "ok":
            assert got[1][0] == "ok" and np.array_equal(got[0][1], got[1][1])
        else:
            assert got[0] == got[1]


@pytest.mark.skipif(torch is None, reason="torch")
def test_weight_moved_while_the_result_is_made(rng):
    """Code that runs while the result is allocated (here a torch dispatch mode's hook, as
    another thread could) moves the weight's storage: the small path notices and declines,
    the general path computes; the result is the unmoved weight's."""
    from torch.utils._python_dispatch import TorchDispatchMode

    x = torch.from_numpy(rng.standard_normal((1, 64)).astype(np.float32))
    qa = qq.quantize(torch.from_numpy(rng.standard_normal((16, 64)).astype(np.float32)), mode="nvfp4")
    want = qq.quantized_matmul(x, qa)

    class Move(TorchDispatchMode):
        moved = False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            r = func(*args, **(kwargs or {}))
            if not Move.moved and func is torch.ops.aten.new_empty.default:
                Move.moved = True
                shape, ptr = qa.data.shape, qa.data.data_ptr()
                qa.data.resize_(1 << 20)            # a new storage, the bytes copied
                qa.data.resize_(shape)
                assert qa.data.data_ptr() != ptr
            return r

    _, before = _qq._fast_path()
    with Move():
        got = qq.quantized_matmul(x, qa)
    assert Move.moved
    assert _qq._fast_path()[1] == before
    assert torch.equal(got, want)
