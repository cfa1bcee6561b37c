"""torch.compile of qq calls and of qq.torch.QQLinear / QQGroupedLinear (docs/api.md,
"torch.compile").

Every compiled function runs with fullgraph=True (a graph break is an error) and must
return exactly what the same function returns eagerly: libqq's CPU path is deterministic,
so quantized codes, scales and GEMM outputs are compared bit for bit. Most cases compile
with the "eager" / "aot_eager" backends (Dynamo + AOTAutograd with the fake
implementations, no code generation); two tests run inductor. CUDA variants are marked gpu.
"""

from __future__ import annotations

import re

import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import qq  # noqa: E402
import qq.torch as qqt  # noqa: E402
from qq import _torch_ops  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
BACKENDS = ["eager", "aot_eager"]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles from scratch (no cache limit reached across parametrizations)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def dev(device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    return torch.device(device)


def data(*shape, device="cpu", dtype=torch.float32, seed=0):
    """Normal data whose rows span 2^-8 .. 2^8, so that the scales differ per group."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    x = x * torch.exp2(torch.randint(-8, 9, shape[:-1] + (1,), generator=g).float())
    return x.to(device=device, dtype=dtype)


def compiled(fn, backend="aot_eager", **kw):
    return torch.compile(fn, fullgraph=True, backend=backend, **kw)


def assert_same(got, want, path="result"):
    """Bit-equal tensors (NaN payloads included), equal QuantizedArray / PreparedWeight
    fields, recursively through tuples and lists."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{path}: {type(got).__name__}, expected a tensor"
        assert got.shape == want.shape and got.dtype == want.dtype, \
            f"{path}: {got.dtype}{tuple(got.shape)} vs {want.dtype}{tuple(want.shape)}"
        assert got.device == want.device, f"{path}: device {got.device} vs {want.device}"
        bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[got.element_size()]
        a = got.detach().cpu().contiguous().view(bits)
        b = want.detach().cpu().contiguous().view(bits)
        assert torch.equal(a, b), f"{path}: values differ"
    elif isinstance(want, qq.QuantizedArray):
        assert type(got) is qq.QuantizedArray, f"{path}: {type(got).__name__}"
        for f in ("mode", "group_size", "bits", "rounding", "scale_layout", "fp8_format", "shape"):
            assert getattr(got, f) == getattr(want, f), f"{path}.{f}"
            assert type(getattr(got, f)) is type(getattr(want, f)), f"{path}.{f}: type"
        for f in ("data", "scales", "biases", "global_scale"):
            assert_same(getattr(got, f), getattr(want, f), f"{path}.{f}")
        assert len(got) == len(want)
    elif isinstance(want, qq.PreparedWeight):
        assert type(got) is qq.PreparedWeight, f"{path}: {type(got).__name__}"
        assert got.mode == want.mode and got.shape == want.shape
        assert_same(got.quantized, want.quantized, f"{path}.quantized")
        assert_same(got.values, want.values, f"{path}.values")
    elif isinstance(want, (tuple, list)):
        assert type(got) is type(want) and len(got) == len(want), f"{path}: {got!r}"
        for i, (a, b) in enumerate(zip(got, want)):
            assert_same(a, b, f"{path}[{i}]")
    else:
        assert got == want, f"{path}: {got!r} != {want!r}"


def check(fn, *args, backend="aot_eager"):
    """fn compiled with fullgraph=True returns what fn returns eagerly."""
    want = fn(*args)
    got = compiled(fn, backend)(*args)
    assert_same(got, want)
    return got


# =========================================================================================
# import, shape rules
# =========================================================================================

def _fresh_python(code, timeout=600):
    """Runs `code` in a new interpreter (import order and process-wide caches start clean);
    asserts that it exits 0."""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "PYTHONWARNINGS": "ignore"}, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]


def test_import_qq_does_not_import_torch():
    """qq works without torch: `import qq` must not import it (the ops register lazily)."""
    _fresh_python("import qq, sys; assert 'torch' not in sys.modules, 'torch imported'; "
                  "assert 'qq._torch_ops' not in sys.modules")


def test_import_after_torch_registers_ops():
    """torch first, then qq: the ops exist before any call (qq/_dispatch.py)."""
    _fresh_python("import torch, qq; assert hasattr(torch.ops.qq, 'quantize'); "
                  "assert 'qq._torch_ops' in __import__('sys').modules; "
                  "assert qq._dispatch._is_compiling is not None")


def test_compile_when_qq_was_imported_before_torch():
    """qq first, then torch, and the first qq call is one Dynamo traces: the ops register
    during the trace. That used to write qq._dispatch's cached compile check while Dynamo
    traced, and the guard Dynamo had put on it failed (AssertionError on the first call)."""
    code = ("import qq, torch\n"
            "f = torch.compile(lambda x: qq.dequantize(qq.quantize(x, mode='mxfp8')), fullgraph=True,\n"
            "                  backend='aot_eager')\n"
            "x = torch.randn(4, 64)\n"
            "want = lambda: qq.dequantize(qq.quantize(x, mode='mxfp8'))\n"
            "assert torch.equal(f(x), want())\n"
            "assert torch.equal(f(x), want())   # after eager calls too\n")
    _fresh_python(code)


def test_results_stay_real_after_a_call_under_a_dispatch_mode():
    """Results are new_empty of a cached template per (dtype, device); a template made under
    FakeTensorMode (a call that fails there: fake tensors have no data) must not be kept,
    or every later result would be fake."""
    code = ("import torch, qq\n"
            "from torch._subclasses.fake_tensor import FakeTensorMode\n"
            "with FakeTensorMode():\n"
            "    try:\n"
            "        qq.amax(torch.empty(2, 32))\n"
            "    except ValueError:\n"
            "        pass\n"
            "a = qq.amax(torch.ones(2, 32))\n"
            "assert type(a) is torch.Tensor and float(a) == 1.0, a\n")
    _fresh_python(code)


def test_dispatch_wrapper_refuses_signatures_it_cannot_stand_for():
    """qq._dispatch's generated wrappers name the positional parameters: a signature with
    positional-only or *args parameters, none positional, or a name the wrapper uses
    itself would be misread, so it is refused when the wrapper is made."""
    from qq import _dispatch

    def pos_only(x, /, y=None):
        return x

    def star(x, *rest):
        return x

    def kw_only(*, x=None):
        return x

    def clash(x, _qq_kw=None):
        return x

    for f in (pos_only, star, kw_only, clash):
        with pytest.raises(TypeError, match="needs a wrapper of its own"):
            _dispatch._dispatching("f", f)

    def fine(x, c=None, *, kw=1):
        return (x, c, kw)

    w = _dispatch._dispatching("fine", fine)
    assert w(1, c=5, kw=2) == (1, 5, 2) and w(1) == (1, None, 1)


def test_defaults_table_matches_libqq():
    """The fake implementations' group_size / bits defaults are qqQuantParamsInit's."""
    for mode, (g, b) in _torch_ops.DEFAULTS.items():
        qa = qq.quantize(np.ones((1, 128), np.float32), mode=mode)
        assert (qa.group_size, qa.bits) == (g, b), mode


@pytest.mark.parametrize("shape", [(128,), (3, 64), (2, 1, 192), (2, 64, 128), (2, 3, 130, 128)])
@pytest.mark.parametrize("mode,layout", [("affine", "linear"), ("nvfp4", "blocked"),
                                         ("mxfp4", "linear"), ("mxfp8", "blocked")])
def test_fake_shapes_match_eager(mode, layout, shape):
    """Every op's fake implementation gives the eager result's shapes, dtypes and strides
    (torch.library.opcheck runs the op under FakeTensorMode and compares); 1-D x counts as
    M = 1 for blocked scales, M = 130 pads to 256."""
    x = data(*shape)
    gs = qq.amax(x) if mode == "nvfp4" else None
    g, b = _torch_ops.DEFAULTS[mode]
    ops = torch.ops.qq
    tests = ("test_schema", "test_faketensor")
    for td in ("true", "false", "float4"):      # torch_dtypes= (typed / uint8 / fp4 typed)
        # (opcheck's test_schema compares outputs with arithmetic that torch has no float8 /
        # float4 CPU kernels for: the typed results get the fake-tensor check only)
        t = tests if td == "false" or mode == "affine" else ("test_faketensor",)
        torch.library.opcheck(ops.quantize, (x, gs, mode, g, b, "ceil", layout, "e4m3", td), test_utils=t)
        if len(shape) >= 2 and shape[-2] % g == 0:
            torch.library.opcheck(ops.quantize_colwise,
                                  (x, gs, mode, g, b, "ceil", layout, "e4m3", True, td), test_utils=t)
    for td in (False, True):                    # uint8 inputs; float8 inputs (fake check only)
        qa = qq.quantize(x, mode=mode, global_scale=gs, scale_layout=layout, torch_dtypes=td)
        torch.library.opcheck(ops.dequantize, (qa.data, qa.scales, qa.biases, gs, mode, g, b, layout,
                                               "e4m3", torch.float16),
                              test_utils=tests if not td or mode == "affine" else ("test_faketensor",))
    torch.library.opcheck(ops.amax, (x,), test_utils=tests)
    if mode != "affine":
        for td in (True, False):                # float8 scales stay float8; uint8 stay uint8
            t = tests if not td else ("test_faketensor",)
            lin = qq.quantize(x, mode=mode, global_scale=gs, torch_dtypes=td).scales
            torch.library.opcheck(ops.swizzle_scales, (lin,), test_utils=t)
            blk = qq.swizzle_scales(lin)
            assert blk.dtype == lin.dtype
            torch.library.opcheck(ops.unswizzle_scales, (blk, list(lin.shape)), test_utils=t)


def test_opcheck_matmuls_and_linear():
    """opcheck of the GEMM ops, quantize_moe and qq.torch's linear ops, autograd
    registration included (test_autograd_registration, test_aot_dispatch_dynamic)."""
    x, w = data(5, 64), data(48, 64, seed=1)
    for td in (False, True):        # uint8 operands; float8 ones (fake check only, as above)
        qw = qq.quantize(w, mode="mxfp8", scale_layout="blocked", torch_dtypes=td)
        torch.library.opcheck(torch.ops.qq.qqmm, (x, None, None, qw.data, qw.scales, None, None, None,
                                                  None, 0.0, "mxfp8", 32, 8, "ceil", "linear",
                                                  "blocked", "e4m3", torch.bfloat16),
                              **({"test_utils": ("test_faketensor",)} if td else {}))
    aw = qq.quantize(w, mode="affine", group_size=32, bits=3)
    ew = qq.quantize(data(3, 48, 64, seed=5), mode="affine", group_size=32, bits=4)
    torch.library.opcheck(torch.ops.qq.gather_qmm,
                          (data(4, 2, 64), ew.data, ew.scales, ew.biases,
                           torch.tensor([2, 0, 1, 1], dtype=torch.int32), None, None, True, 48,
                           "affine", 32, 4, "linear", "e4m3", torch.float32))
    torch.library.opcheck(torch.ops.qq.quantized_matmul,
                          (x, aw.data, aw.scales, aw.biases, None, None, True, 48, "affine", 32, 3,
                           "linear", "e4m3", torch.float32))
    torch.library.opcheck(torch.ops.qq.quantize_moe, (data(2, 64, 96), "32x32", "ceil", "blocked", "e4m3", "false"))
    torch.library.opcheck(torch.ops.qq.quantize_moe, (data(2, 64, 96), "32x32", "ceil", "blocked", "e4m3", "true"),
                          test_utils=("test_faketensor",))   # float8 results: as above
    for mode in qqt.MODES:
        xr = data(40, 64).requires_grad_()
        wr = (data(96, 64, seed=2) / 16).requires_grad_()
        br = data(96, seed=3).requires_grad_()
        torch.library.opcheck(torch.ops.qq.linear, (xr, wr, br, mode, True))
        torch.library.opcheck(torch.ops.qq.linear, (xr, wr.detach(), br, mode, False))
        dy, x2 = data(40, 96, seed=4), data(40, 64)
        _, *saved = torch.ops.qq.linear(x2, wr.detach(), None, mode, True)
        torch.library.opcheck(torch.ops.qq.linear_backward,
                              (dy, saved, mode, True, True, torch.float32, torch.float32))


def test_opcheck_grouped_linear(monkeypatch):
    """opcheck of qq.torch's grouped linear ops (fake shapes, dtypes and strides, autograd
    registration) in every mode, and of the mxfp8 form whose dgrad operand is quantize_moe's
    codes (the block-scaled GPUs' path, forced on the CPU)."""
    off = torch.tensor([16, 16, 40], dtype=torch.int32)     # expert 1 empty

    def run(mode):
        x, w = data(40, 64).requires_grad_(), (data(3, 64, 64, seed=1) / 16).requires_grad_()
        torch.library.opcheck(torch.ops.qq.grouped_linear, (x, w, off, mode))
        torch.library.opcheck(torch.ops.qq.grouped_linear, (x, w.detach(), off, mode))
        _, *dgrad = torch.ops.qq.grouped_linear(x.detach(), w.detach(), off, mode)
        for need in ((True, True), (True, False), (False, True)):
            torch.library.opcheck(torch.ops.qq.grouped_linear_backward,
                                  (data(40, 64, seed=4), x.detach(), off, dgrad, mode, *need, torch.float32))

    for mode in qqt.MODES:
        run(mode)
    monkeypatch.setattr(qqt, "_values_path", lambda t: False)
    run("mxfp8")


# =========================================================================================
# plain qq calls on torch tensors
# =========================================================================================

CASES = [("affine", "linear"), ("nvfp4", "linear"), ("nvfp4", "blocked"), ("mxfp4", "blocked"),
         ("mxfp8", "linear")]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode,layout", CASES)
@pytest.mark.parametrize("device", DEVICES)
def test_quantize_dequantize_amax(device, mode, layout, backend):
    """A QuantizedArray made, unpacked and returned inside the compiled function equals the
    eager one field by field (nvfp4's global scale from qq.amax, a Python float too)."""
    x = data(2, 40, 128, device=dev(device), dtype=torch.bfloat16)

    def f(x):
        gs = qq.amax(x) if mode == "nvfp4" else None
        qa = qq.quantize(x, mode=mode, global_scale=gs, scale_layout=layout)
        codes, scales, *biases = qa
        y = qq.dequantize(qa, dtype=torch.float32)
        y2 = qq.dequantize(codes, scales, *biases, mode=mode, global_scale=gs,
                           scale_layout=layout, dtype="float16")
        return qa, y, y2, len(qa), qa[1]

    check(f, x, backend=backend)
    if mode == "nvfp4":
        check(lambda x: qq.quantize(x, mode="nvfp4", global_scale=448.0 * 6), x, backend=backend)


@pytest.mark.parametrize("strict", [False, True])
def test_torch_export(strict):
    """torch.export, strict (Dynamo) and non-strict (the module runs on fake tensors with
    torch.compiler's _is_compiling_flag set): qq's calls become its ops either way (the
    dispatch wrapper reads is_dynamo_compiling() and that flag, qq/_dispatch.py), and the
    exported program equals eager."""
    class M(torch.nn.Module):
        def forward(self, x):
            qa = qq.quantize(x, mode="mxfp8")
            return qq.dequantize(qa, dtype="float32"), qq.amax(x)

    x = data(4, 64)
    ep = torch.export.export(M(), (x,), strict=strict)
    assert any("qq." in str(n.target) for n in ep.graph.nodes), ep.graph
    for got, want in zip(ep.module()(x), M()(x)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("mode,layout", CASES)
@pytest.mark.parametrize("device", DEVICES)
def test_quantize_colwise(device, mode, layout):
    """quantize_colwise alone and rowwise=True (a pair of QuantizedArrays)."""
    x = data(3, 64, 128, device=dev(device))
    gs = qq.amax(x) if mode == "nvfp4" else None
    check(lambda x, gs: qq.quantize_colwise(x, mode=mode, global_scale=gs, scale_layout=layout), x, gs)
    check(lambda x, gs: qq.quantize_colwise(x, mode=mode, global_scale=gs, scale_layout=layout,
                                            rowwise=True), x, gs)


@pytest.mark.parametrize("mode", ["nvfp4", "mxfp4", "mxfp8"])
@pytest.mark.parametrize("device", DEVICES)
def test_qqmm_float_and_quantized_operands(device, mode):
    """qqmm with float operands (quantized inside), QuantizedArrays made inside and outside
    the compiled function, raw packed w with scales, bias, c / beta, dtype and out=."""
    d = dev(device)
    x, w = data(2, 5, 64, device=d), data(48, 64, device=d, seed=1)
    bias, c = data(48, device=d, seed=2), data(2, 5, 48, device=d, seed=3)
    nv = mode == "nvfp4"
    qw = qq.quantize(w, mode=mode, global_scale=qq.amax(w) if nv else None, scale_layout="blocked")

    def f(x, w, qw, bias, c):
        gx = qq.amax(x) if nv else None
        gw = qq.amax(w) if nv else None
        y1 = qq.qqmm(x, w, mode=mode, global_scale_x=gx, global_scale_w=gw, bias=bias)
        qx = qq.quantize(x, mode=mode, global_scale=gx)
        y2 = qq.qqmm(qx, qw, dtype=torch.float16)
        y3 = qq.qqmm(x, qw.data, qw.scales, mode=mode, global_scale_x=gx,
                     global_scale_w=qw.global_scale, scale_layout="blocked", c=c, beta=0.5)
        qb = qq.quantize(x, mode=mode, global_scale=gx, scale_layout="blocked")
        y4 = qq.qqmm(qb.data, qw, x_scales=qb.scales, global_scale_x=gx, scale_layout="blocked")
        return y1, y2, y3, y4

    check(f, x, w, qw, bias, c)

    out = torch.zeros(2, 5, 48, device=d)

    def g(x, qw, out):
        return qq.qqmm(x, qw, global_scale_x=qq.amax(x) if nv else None, out=out)

    want = g(x, qw, torch.zeros_like(out))
    got = compiled(g)(x, qw, out)
    assert got is out
    assert_same(out, want)


@pytest.mark.parametrize("mode", ["nvfp4", "mxfp8"])
@pytest.mark.parametrize("device", DEVICES)
def test_qqmm_prepared_weight(device, mode):
    """A PreparedWeight from outside the compiled function (rows <= 4: the packed form;
    more rows: the bf16 values; qqmm picks per call at run time, as eagerly) and
    prepare_weight inside it."""
    d = dev(device)
    w = data(64, 96, device=d, seed=1)
    gw = qq.amax(w) if mode == "nvfp4" else None
    pw = qq.prepare_weight(w, mode=mode, global_scale=gw)

    def f(x, pw):
        return qq.qqmm(x, pw, global_scale_x=qq.amax(x) if mode == "nvfp4" else None)

    for rows in (3, 40):
        check(f, data(rows, 96, device=d), pw)
    check(lambda w, gw: qq.prepare_weight(w, mode=mode, global_scale=gw), w, gw)


@pytest.mark.parametrize("device", DEVICES)
def test_quantized_matmul(device):
    """Weight-only matmul: affine (3 bits) both orientations, nvfp4 from a QuantizedArray,
    bias and dtype."""
    d = dev(device)
    x = data(2, 6, 64, device=d, dtype=torch.bfloat16)
    w = data(48, 64, device=d, seed=1, dtype=torch.bfloat16)
    wt = data(64, 96, device=d, seed=2, dtype=torch.bfloat16)
    bias = data(48, device=d, seed=3)
    qa = qq.quantize(w, mode="affine", group_size=32, bits=3)
    qt = qq.quantize(wt, mode="affine", group_size=32)
    qn = qq.quantize(w, mode="nvfp4", global_scale=qq.amax(w))

    def f(x, qa, qt, qn, bias):
        return (qq.quantized_matmul(x, qa, bias=bias),
                qq.quantized_matmul(x, qt, transpose=False, dtype=torch.float32),
                qq.quantized_matmul(x, qt.data, qt.scales, qt.biases, False, 32, mode="affine"),
                qq.quantized_matmul(x, qn))

    check(f, x, qa, qt, qn, bias)


@pytest.mark.parametrize("mode,kw", [("affine", {"bits": 4, "group_size": 64}), ("affine", {"bits": 8}),
                                     ("nvfp4", {})], ids=["affine4", "affine8", "nvfp4"])
def test_quantized_matmul_decode_weight(mode, kw):
    """A DecodeWeight from outside the compiled function: traced, quantized_matmul and
    gather_qmm take the packed weight it keeps; on the CPU that equals the eager call on the
    layout bit for bit (both dequantize, then one summation order)."""
    x = data(3, 256, dtype=torch.bfloat16)
    w = data(64, 256, seed=1, dtype=torch.bfloat16)
    dw = qq.prepare_decode(qq.quantize(w, mode=mode, **kw))
    de = qq.prepare_decode(qq.quantize(data(4, 64, 256, seed=2, dtype=torch.bfloat16), mode=mode, **kw))
    xe = data(3, 1, 1, 256, seed=3, dtype=torch.bfloat16)
    idx = torch.tensor([[2], [0], [3]], dtype=torch.int32)

    def f(x, xe, idx):
        return qq.quantized_matmul(x, dw, dtype=torch.float32), qq.gather_qmm(xe, de, rhs_indices=idx)

    check(f, x, xe, idx)


@pytest.mark.parametrize("mode", ["nvfp4", "mxfp8"])
def test_quantized_matmul_swiglu_gated(mode):
    """quantized_matmul_swiglu on a gated DecodeWeight under torch.compile(fullgraph=True):
    traced as the packed weight's quantized_matmul and qq.swiglu (the fused kernel is
    eager), equal to the eager call; the packed QuantizedArray likewise."""
    x = data(3, 256, dtype=torch.bfloat16)
    w = data(128, 256, seed=1, dtype=torch.bfloat16)
    qa = qq.quantize(w, mode=mode)
    dg = qq.prepare_decode(qa, gated=True)

    def f(x):
        return qq.quantized_matmul_swiglu(x, dg), qq.quantized_matmul_swiglu(x, qa)

    check(f, x)


@pytest.mark.parametrize("device", DEVICES)
def test_gather_qmm(device):
    """MoE decode: each token's top-2 experts from device-side indices; nvfp4 experts from a
    QuantizedArray, affine from arrays; x broadcast against the indices."""
    d = dev(device)
    x = data(5, 1, 1, 64, device=d, dtype=torch.bfloat16)
    w = data(4, 48, 64, device=d, seed=1, dtype=torch.bfloat16)
    idx = torch.tensor([[0, 3], [1, 1], [2, 0], [3, 2], [1, 0]], dtype=torch.int32, device=d)
    qn = qq.quantize(w, mode="nvfp4")
    qa = qq.quantize(w, mode="affine", group_size=32, bits=4)

    def f(x, qn, qa, idx):
        return (qq.gather_qmm(x, qn, rhs_indices=idx),
                qq.gather_qmm(x, qa.data, qa.scales, qa.biases, idx, group_size=32, bits=4,
                              mode="affine", dtype=torch.float32))

    check(f, x, qn, qa, idx)


@pytest.mark.parametrize("device", DEVICES)
def test_swizzle_unswizzle_and_quantize_moe(device):
    """Blocked <-> linear scales round trip for 1-D, odd and batched shapes (R = 130 pads
    to 256, C = 5 to 8), and quantize_moe (column-major codes: the fake strides matter)."""
    d = dev(device)
    for shape in [(7,), (130, 5), (2, 3, 9)]:
        s = torch.randint(0, 255, shape, dtype=torch.uint8, device=d)

        def f(s):
            b = qq.swizzle_scales(s)
            return b, qq.unswizzle_scales(b, s.shape)

        b, back = check(f, s)
        assert torch.equal(back, s)
    w = data(2, 64, 96, device=d)
    for scaling, layout in [("32x1", "linear"), ("32x32", "blocked")]:
        got = check(lambda w: qq.quantize_moe(w, scaling, scale_layout=layout), w)
        assert got[0].stride() == (64 * 96, 1, 64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["mxfp8", "nvfp4"])
def test_grouped_qqmm_and_wgrad(device, mode):
    """grouped_qqmm (float, QuantizedArray and quantize_moe weights; an empty and a ragged
    group) and grouped_qqmm_wgrad are single ops in the graph: no break, the eager result."""
    d = dev(device)
    x = data(40, 64, device=d, seed=1)
    w = data(3, 32, 64, device=d, seed=2)
    dy = data(40, 32, device=d, seed=3)
    offsets = torch.tensor([16, 16, 40], dtype=torch.int32, device=d)
    kw = {}
    if mode == "nvfp4":
        kw = dict(global_scale_x=qq.amax(x), global_scale_w=torch.stack([qq.amax(w[e]) for e in range(3)]))
    check(lambda x, w, o: qq.grouped_qqmm(x, w, o, mode=mode, **kw), x, w, offsets)
    qw = qq.quantize(w, mode=mode, scale_layout="blocked",
                     global_scale=None if mode == "mxfp8" else None)
    if mode == "mxfp8":
        check(lambda x, o: qq.grouped_qqmm(x, qw, o), x, offsets)
        moe = qq.quantize_moe(w.transpose(1, 2).contiguous(), "32x1", scale_layout="blocked")
        check(lambda x, o: qq.grouped_qqmm(x, moe, o, moe_scaling="32x1", scale_layout="blocked"),
              x, offsets)
        got = check(lambda x, dy, o: qq.grouped_qqmm_wgrad(x, dy, o), x, dy, offsets)
        assert got.shape == (3, 64, 32) and got.dtype == torch.float32
        assert torch.count_nonzero(got[1]) == 0        # the empty group


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["mxfp8", "nvfp4"])
def test_grouped_qqmm_prepared(device, mode):
    """grouped_qqmm with a PreparedWeight of [E, N, K] (its bf16 values go in as the op's
    prepared weight; nvfp4 with one global scale for every expert) and prepare_weight of 3-D
    weights trace without a break and give the eager result."""
    d = dev(device)
    x = data(40, 64, device=d, seed=1)
    w = data(3, 32, 64, device=d, seed=2)
    offsets = torch.tensor([16, 16, 40], dtype=torch.int32, device=d)
    gs = qq.amax(w) if mode == "nvfp4" else None
    pw = qq.prepare_weight(w, mode=mode, global_scale=gs)
    check(lambda x, o: qq.grouped_qqmm(x, pw, o), x, offsets)
    check(lambda w: qq.prepare_weight(w, mode=mode, global_scale=gs).quantized.data, w)


def test_no_graph_break_explain():
    """torch._dynamo.explain: one graph, no break, for a function using every op."""
    x, w = data(4, 64), data(32, 64, seed=1)

    def f(x, w):
        gs = qq.amax(x)
        qa = qq.quantize(x, mode="nvfp4", global_scale=gs)
        qc = qq.quantize_colwise(w, mode="mxfp8", scale_layout="blocked")
        y = qq.qqmm(qa, qq.quantize(w, mode="nvfp4", global_scale=qq.amax(w)))
        z = qq.quantized_matmul(x, qq.quantize(w, mode="mxfp4"))
        s = qq.unswizzle_scales(qq.swizzle_scales(qa.scales), qa.scales.shape)
        return y + z + qq.dequantize(qc, dtype=torch.float32).sum() + s.float().sum()

    e = torch._dynamo.explain(f)(x, w)
    assert e.graph_break_count == 0 and e.graph_count == 1, e.break_reasons
    ops = {n.target for g in e.graphs for n in g.graph.nodes if n.op == "call_function"}
    for name in ("amax", "quantize", "quantize_colwise", "qqmm", "quantized_matmul",
                 "swizzle_scales", "unswizzle_scales", "dequantize"):
        assert getattr(torch.ops.qq, name).default in ops, name


def test_dynamic_batch_one_compile():
    """mark_dynamic on the batch axis: one compile serves M = 3, 5 and 130 (the fake
    implementations compute roundup(M, 128) on the symbol)."""
    from torch._dynamo.testing import CompileCounterWithBackend
    cnt = CompileCounterWithBackend("aot_eager")
    w = data(48, 64, seed=1)

    def f(x, w):
        qa = qq.quantize(x, mode="mxfp8", scale_layout="blocked")
        return qa, qq.qqmm(qa, qq.quantize(w, mode="mxfp8", scale_layout="blocked")), \
            qq.quantize_colwise(x.t().contiguous(), mode="nvfp4", global_scale=qq.amax(x))

    cf = torch.compile(f, fullgraph=True, backend=cnt)
    for m in (3, 5, 130):
        x = data(m, 64, seed=m)
        torch._dynamo.mark_dynamic(x, 0)
        assert_same(cf(x, w), f(x, w), f"M={m}")
    assert cnt.frame_count == 1


def test_errors_under_compile():
    """Wrong arguments raise with qq's message under compile too: an unknown mode or a
    stream at trace time (a ValueError; fullgraph=True reports it as Dynamo's Unsupported
    caused by it), K not a multiple of the group from the fake implementation, rounding
    'up' from libqq when the op runs (the ValueError itself)."""
    x = data(4, 64)
    with pytest.raises(ValueError, match="quantize: mode: expected one of"):
        torch.compile(lambda x: qq.quantize(x, mode="fp6"), backend="eager")(x)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="mode: expected one of") as e:
        compiled(lambda x: qq.quantize(x, mode="fp6"))(x)
    assert "ValueError" in repr(e.value.__cause__)
    with pytest.raises(Exception, match="amax: stream"):
        compiled(lambda x: qq.amax(x, stream=0))(x)
    with pytest.raises(Exception, match="quantize: K=48 is not a positive multiple of group_size 32"):
        compiled(lambda x: qq.quantize(x, mode="mxfp8"))(data(4, 48))
    with pytest.raises(ValueError, match="quantize: rounding: expected one of 'ceil', 'floor'"):
        compiled(lambda x: qq.quantize(x, mode="mxfp8", rounding="up"))(x)


def test_out_checked_under_compile():
    """out= under compile is held to eager's rule (docs/api.md: the exact shape and dtype,
    contiguous) before the result is copied in, where copy_ would broadcast a row, convert a
    dtype or write through strides; a right out gets eager's bits."""
    x = data(1, 128)
    q = qq.quantize(x, mode="nvfp4")
    f = compiled(lambda q, out: qq.dequantize(q, dtype=torch.float32, out=out))
    for out, words in ((torch.empty(4, 128), "argument 'out' has shape (4, 128)"),
                       (torch.empty(1, 128, dtype=torch.float16), "out has dtype torch.float16"),
                       (torch.empty(128, 2).T[:1], "not contiguous")):
        torch._dynamo.reset()
        with pytest.raises(Exception, match=re.escape(words)):
            f(q, out)
    torch._dynamo.reset()
    with pytest.raises(Exception, match=re.escape("argument 'out' has shape (8,)")):
        compiled(lambda x, out: qq.amax(x, out=out))(x, torch.zeros(8))
    torch._dynamo.reset()
    out = torch.full((1, 128), float("nan"))
    assert_same(f(q, out), qq.dequantize(q, dtype=torch.float32), "out")
    assert_same(out, qq.dequantize(q, dtype=torch.float32), "out written")


# =========================================================================================
# qq.torch.QQLinear
# =========================================================================================

def mlp(mode, device, dtype=torch.float32, act=torch.nn.GELU):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 96), act(), torch.nn.Linear(96, 32))
    return qqt.convert_linear(m.to(device=device, dtype=dtype), mode=mode)


def train_step(model, x, dynamic=False):
    for p in model.parameters():
        p.grad = None
    x = x.detach().requires_grad_()
    if dynamic:
        torch._dynamo.mark_dynamic(x, 0)
    y = model(x)
    y.float().square().sum().backward()
    return [y, x.grad] + [p.grad for p in model.parameters()]


@pytest.mark.parametrize("mode", qqt.MODES)
@pytest.mark.parametrize("device", DEVICES)
def test_qqlinear_forward_backward(device, mode):
    """A compiled two-layer QQLinear model: y, dx, dW and db bit-equal to eager (T = 80
    is not a multiple of the wgrad block 32: the padded path)."""
    d = dev(device)
    model = mlp(mode, d)
    x = data(2, 40, 64, device=d)
    want = train_step(model, x)
    got = train_step(compiled(model), x)
    assert_same(got, want)


@pytest.mark.parametrize("mode", qqt.MODES)
def test_qqlinear_codes_path(monkeypatch, mode):
    """The path block-scaled GPUs take (GEMMs on quantize / quantize_moe codes, x saved for
    the backward), forced on the CPU: eager and compiled equal each other and, within fp32
    rounding, the exact path's values route (the same quantized values multiplied). The
    compiled form must not return its input x from the qq::linear op."""
    x = data(2, 40, 64)
    want = train_step(mlp(mode, "cpu"), x)
    monkeypatch.setattr(qqt, "_values_path", lambda t: False)
    model = mlp(mode, "cpu")
    eager = train_step(model, x)
    assert_same(train_step(compiled(model), x), eager)
    for a, b in zip(eager, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_qqlinear_bf16_dynamic_batch():
    """bf16 model, dynamic batch: one compile for T = 40 and 72, equal to eager."""
    from torch._dynamo.testing import CompileCounterWithBackend
    cnt = CompileCounterWithBackend("aot_eager")
    model = mlp("nvfp4", "cpu", torch.bfloat16)
    cm = torch.compile(model, fullgraph=True, backend=cnt)
    for t in (40, 72):
        x = data(t, 64, dtype=torch.bfloat16, seed=t)
        assert_same(train_step(cm, x, dynamic=True), train_step(model, x), f"T={t}")
    assert cnt.frame_count == 1


def test_qqlinear_partial_grads_and_no_grad():
    """Frozen first weight (the backward op skips its dW), an input without grad (skips
    the first layer's dx), and a no_grad forward: all equal to eager."""
    model = mlp("mxfp8", "cpu")
    model[0].weight.requires_grad_(False)
    x = data(40, 64)
    assert_same(train_step(compiled(model), x), train_step(model, x))
    torch._dynamo.reset()
    cm = compiled(model)
    grads = []
    for m in (cm, model):
        for p in model.parameters():
            p.grad = None
        m(x).sum().backward()
        grads.append([p.grad for p in model.parameters() if p.requires_grad])
    assert_same(grads[0], grads[1])
    with torch.no_grad():
        assert_same(cm(x), model(x))


# =========================================================================================
# qq.torch.QQGroupedLinear
# =========================================================================================

GROUP_ENDS = [16, 16, 40]     # three experts, ragged, the second one empty


def grouped_step(layer, x, ends=GROUP_ENDS, x_grad=True, dynamic=False):
    """y, dx and dW of one step of a QQGroupedLinear layer (or its compiled form) on x."""
    layer.weight.grad = None
    x = x.detach().requires_grad_(x_grad)
    if dynamic:
        torch._dynamo.mark_dynamic(x, 0)
    y = layer(x, torch.tensor(ends, dtype=torch.int32, device=x.device))
    y.float().square().sum().backward()
    return [y, x.grad, layer.weight.grad]


def grouped_layer(mode, device="cpu", dtype=torch.float32):
    torch.manual_seed(0)
    return qqt.QQGroupedLinear(3, 64, 64, mode=mode, device=device, dtype=dtype)


def grouped_ops(rec):
    """The qq ops in the forward and backward graphs a recording aot_eager backend kept:
    compiled, the layer must be the two qq::grouped_linear ops (whose backward is registered),
    not the insides of the eager autograd.Function traced by luck."""
    def ops(graphs):
        return {str(n.target) for g in graphs for n in g.graph.nodes
                if n.op == "call_function" and str(n.target).startswith("qq.")}
    return ops(rec.fw_graphs), ops(rec.bw_graphs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", qqt.MODES)
@pytest.mark.parametrize("device", DEVICES)
def test_grouped_linear_forward_backward(device, mode, dtype):
    """A compiled QQGroupedLinear layer (ragged groups, an empty expert, T = 40 not a multiple
    of the wgrad block): y, dx and dW bit-equal to eager with the eager and aot_eager backends
    and with inductor; forward and backward are the qq::grouped_linear ops."""
    from torch._dynamo.testing import AotEagerAndRecordGraphs
    d = dev(device)
    layer = grouped_layer(mode, d, dtype)
    x = data(40, 64, device=d, dtype=dtype)
    want = grouped_step(layer, x)
    rec = AotEagerAndRecordGraphs()
    for backend in ("eager", rec, "inductor"):
        torch._dynamo.reset()
        assert_same(grouped_step(compiled(layer, backend), x), want, f"{backend}")
    assert grouped_ops(rec) == ({"qq.grouped_linear.default"}, {"qq.grouped_linear_backward.default"})


def test_grouped_linear_codes_path(monkeypatch):
    """mxfp8 on the path block-scaled GPUs take (dgrad's operand is quantize_moe's codes and
    scales, two tensors from the forward op), forced on the CPU: compiled equals eager, and
    both equal the exact path's values route within fp32 rounding."""
    from torch._dynamo.testing import AotEagerAndRecordGraphs
    x = data(40, 64)
    values = grouped_step(grouped_layer("mxfp8"), x)
    monkeypatch.setattr(qqt, "_values_path", lambda t: False)
    layer = grouped_layer("mxfp8")
    eager = grouped_step(layer, x)
    rec = AotEagerAndRecordGraphs()
    assert_same(grouped_step(compiled(layer, rec), x), eager)
    assert grouped_ops(rec) == ({"qq.grouped_linear.default"}, {"qq.grouped_linear_backward.default"})
    for a, b in zip(eager, values):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_grouped_linear_partial_grads_dynamic_tokens_no_grad():
    """A frozen weight (the backward op is asked for dx alone), an input without grad (dW
    alone), a dynamic token axis (one compile serves T = 40 and 72: the fakes on a symbolic
    T) and a no_grad forward: all equal to eager."""
    from torch._dynamo.testing import AotEagerAndRecordGraphs
    off = torch.tensor(GROUP_ENDS, dtype=torch.int32)
    for mode in qqt.MODES:
        layer = grouped_layer(mode)
        x = data(40, 64, seed=1)
        for x_grad, w_grad in ((True, False), (False, True)):
            torch._dynamo.reset()
            layer.weight.requires_grad_(w_grad)
            rec = AotEagerAndRecordGraphs()
            assert_same(grouped_step(compiled(layer, rec), x, x_grad=x_grad),
                        grouped_step(layer, x, x_grad=x_grad), f"{mode} x {x_grad} weight {w_grad}")
            (bw,) = [n for g in rec.bw_graphs for n in g.graph.nodes
                     if n.target is torch.ops.qq.grouped_linear_backward.default]
            assert bw.args[5:7] == (x_grad, w_grad)      # need_dx, need_dw
        layer.weight.requires_grad_(True)
        torch._dynamo.reset()
        rec = AotEagerAndRecordGraphs()
        cm = compiled(layer, rec)
        for t, ends in ((40, GROUP_ENDS), (72, [30, 30, 72])):
            xt = data(t, 64, seed=t)
            assert_same(grouped_step(cm, xt, ends, dynamic=True), grouped_step(layer, xt, ends), f"{mode} T={t}")
        assert len(rec.graphs) == 1, mode
        with torch.no_grad():
            assert_same(cm(x, off), layer(x, off), f"{mode} no_grad")


@pytest.mark.parametrize("strict", [False, True])
def test_grouped_linear_export(strict):
    """torch.export of a module holding QQGroupedLinear: the program holds the
    qq::grouped_linear op, and its module's forward and backward equal eager's (the
    backward was 'no autograd formula' for the grouped_qqmm traced out of the eager
    autograd.Function)."""
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.moe = grouped_layer("nvfp4")

        def forward(self, x, offsets):
            return self.moe(x, offsets)

    m, x = M(), data(40, 64)
    off = torch.tensor(GROUP_ENDS, dtype=torch.int32)
    ep = torch.export.export(m, (x, off), strict=strict)
    assert {str(n.target) for n in ep.graph.nodes if "qq." in str(n.target)} == {"qq.grouped_linear.default"}
    em = ep.module()
    want = grouped_step(m.moe, x)
    xg = x.clone().requires_grad_()
    y = em(xg, off)
    y.float().square().sum().backward()
    assert_same([y, xg.grad, em.get_parameter("moe.weight").grad], want)


def test_grouped_linear_double_backward_compiled():
    """A second backward through the compiled layer's gradients (create_graph=True) raises
    instead of silently dropping the GEMMs' terms: with backend="eager" qq's own message, as
    eagerly (the gradient used to come back without a graph: a penalty on it added nothing);
    through AOTAutograd (aot_eager, inductor) torch's refusal of any double backward. A
    frozen weight's dx stays a plain tensor, as eagerly."""
    off = torch.tensor([4, 8], dtype=torch.int32)
    for backend in ("eager", "aot_eager"):
        torch._dynamo.reset()
        torch.manual_seed(0)
        x = torch.randn(8, 64, requires_grad=True)
        w = torch.randn(2, 32, 64, requires_grad=True)
        f = compiled(lambda x, w: qqt.qq_grouped_linear(x, w, off), backend)
        (g,) = torch.autograd.grad(f(x, w).sum(), x, create_graph=True)
        words = ("qq_grouped_linear: differentiating its gradients again" if backend == "eager" else
                 "torch.compile with aot_autograd does not currently support double backward")
        with pytest.raises(RuntimeError, match=words):
            (g.square().sum() + w.square().sum()).backward()
    torch._dynamo.reset()
    x = torch.randn(8, 64, requires_grad=True)
    f = compiled(lambda x: qqt.qq_grouped_linear(x, torch.ones(2, 32, 64), off), "eager")
    (g,) = torch.autograd.grad(f(x).sum(), x, create_graph=True)
    assert not g.requires_grad
    (g.square().sum() + x.square().sum()).backward()
    assert x.grad is not None



def test_linear_double_backward_compiled():
    """qq_linear as qq_grouped_linear above: with backend="eager" a second backward through
    the compiled layer's gradients raises qq's eager message (it was torch's "no autograd
    formula" for qq::linear_backward); through AOTAutograd torch's own refusal; a frozen
    weight's dx stays plain."""
    for backend in ("eager", "aot_eager"):
        torch._dynamo.reset()
        torch.manual_seed(0)
        x = torch.randn(8, 64, requires_grad=True)
        w = torch.randn(32, 64, requires_grad=True)
        f = compiled(lambda x, w: qqt.qq_linear(x, w), backend)
        (g,) = torch.autograd.grad(f(x, w).sum(), x, create_graph=True)
        words = ("qq_linear: differentiating its gradients again" if backend == "eager" else
                 "torch.compile with aot_autograd does not currently support double backward")
        with pytest.raises(RuntimeError, match=words):
            (g.square().sum() + w.square().sum()).backward()
    torch._dynamo.reset()
    x = torch.randn(8, 64, requires_grad=True)
    f = compiled(lambda x: qqt.qq_linear(x, torch.ones(32, 64)), "eager")
    (g,) = torch.autograd.grad(f(x).sum(), x, create_graph=True)
    assert not g.requires_grad
    (g.square().sum() + x.square().sum()).backward()
    assert x.grad is not None


def test_inductor():
    """inductor (C++ code generation on the CPU) around the ops: plain qq calls bit-equal;
    the QQLinear model's y, dx and dW bit-equal, db within fp32 rounding (inductor sums the
    tokens in another order)."""
    x, w = data(8, 64), data(32, 64, seed=1)

    def f(x, w):
        qa = qq.quantize(x * 2, mode="nvfp4", global_scale=qq.amax(x * 2))
        return qa, qq.qqmm(x, w, mode="mxfp8").relu()

    check(f, x, w, backend="inductor")
    # ReLU, not GELU: inductor's vectorized erf may differ from eager's in the last bit on
    # some CPUs (seen with AVX-512), and the second layer quantizes that difference into a
    # visible one; ReLU is exact in both, so the qq ops are what this compares.
    model = mlp("mxfp8", "cpu", act=torch.nn.ReLU)
    x = data(2, 40, 64)
    want = train_step(model, x)
    got = train_step(compiled(model, "inductor"), x)
    assert_same(got[:3] + got[4:5], want[:3] + want[4:5])
    for a, b in zip(got[3::2], want[3::2]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["nvfp4", "mxfp8"])
def test_reduce_overhead_cuda_graphs(mode):
    """torch.compile(mode="reduce-overhead"): inductor captures the qq ops in a CUDA graph
    and replays it; a decode-style step (quantized_matmul at M = 1, qqmm on a prepared
    weight, a QQLinear forward) equals eager across replays with new inputs. A step that
    holds grouped_qqmm (tagged cudagraph_unsafe) still runs and equals eager."""
    d = dev("cuda")
    torch._dynamo.reset()       # a fresh CUDA graph tree: nothing recorded by earlier tests
    w = data(256, 512, device=d, dtype=torch.bfloat16, seed=4)
    qw = qq.quantize(w, mode=mode)
    pw = qq.prepare_weight(w, mode=mode)
    lin = qqt.convert_linear(torch.nn.Sequential(torch.nn.Linear(512, 128)).to(d, torch.bfloat16),
                             mode=mode)

    def step(x):
        return qq.quantized_matmul(x, qw), qq.qqmm(x, pw), lin(x)

    cstep = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        for seed in range(4):                       # the first calls record, later ones replay
            x = data(1, 512, device=d, dtype=torch.bfloat16, seed=10 + seed)
            got = [t.clone() for t in cstep(x)]
            assert_same(got, list(step(x)), f"seed {seed}")
    x = data(40, 64, device=d, seed=1)
    we = data(3, 32, 64, device=d, seed=2)
    offsets = torch.tensor([16, 16, 40], dtype=torch.int32, device=d)
    g = torch.compile(lambda x: qq.grouped_qqmm(x * 2, we, offsets) + 1, mode="reduce-overhead")
    for _ in range(3):
        assert_same(g(x).clone(), qq.grouped_qqmm(x * 2, we, offsets) + 1)
    del cstep, g
    torch._dynamo.reset()
