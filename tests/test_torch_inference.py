"""qq.torch inference: QuantizedLinear and quantize_ (docs/adapters.md, "Inference").

The module's weight must be the reference quantizer's bytes, and its output the reference
product on those bytes (tests/reference.py, float64) within fp32-accumulation error; the
state dict must round-trip through torch.save / torch.load(weights_only=True); the report
must name every skipped layer with its reason; torch.compile (CPU and GPU) and CUDA graphs
must give the eager bits.
"""

from __future__ import annotations

import io
import logging
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")
qqt = pytest.importorskip("qq.torch")
from torch import nn  # noqa: E402

import qq  # noqa: E402
import reference as R  # noqa: E402
from helpers import BF16, capture, raises, torch_device  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
# (mode, extra kwargs): every weight format quantize_ offers
MODES = [("nvfp4", {}), ("mxfp4", {}), ("mxfp8", {}), ("affine", {"bits": 4}), ("affine", {"bits": 8})]
IDS = ["nvfp4", "mxfp4", "mxfp8", "affine4", "affine8"]


dev = torch_device


def np_of(t):
    t = t.detach().cpu()
    return t.float().numpy().astype(BF16) if t.dtype == torch.bfloat16 else t.numpy()


def ref_weight(layer: "qqt.QuantizedLinear"):
    """The layer's buffers as a reference RefQuantized-like object."""
    return types.SimpleNamespace(
        data=np_of(layer.weight), scales=np_of(layer.weight_scales),
        biases=None if layer.weight_biases is None else np_of(layer.weight_biases),
        group_size=layer.group_size, bits=layer.bits, mode=layer.mode,
        global_scale=None if layer.weight_global_scale is None else np_of(layer.weight_global_scale).reshape(1),
        scale_layout="linear", fp8_format="e4m3")


def make_model(dtype, device, k=64, bias=True):
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(k, 64, bias=bias), nn.GELU(), nn.Linear(64, 32, bias=bias)).to(device, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("mode,kw", MODES, ids=IDS)
def test_weight_only_matches_reference(mode, kw, bias, dtype, device):
    d = dev(device)
    model = make_model(dtype, d, bias=bias)
    w_float = [np_of(m.weight) for m in model if isinstance(m, nn.Linear)]
    report = qqt.quantize_(model, mode=mode, **kw)
    assert [c[0] for c in report.converted] == ["0", "2"] and report.skipped == []
    layers = [m for m in model if isinstance(m, qqt.QuantizedLinear)]
    assert len(layers) == 2
    for layer, wf in zip(layers, w_float):
        assert layer.weight.device.type == d.type
        gs = R.amax(wf) if mode == "nvfp4" else None
        ref_q = R.quantize(wf, layer.group_size, layer.bits, mode, global_scale=gs)
        np.testing.assert_array_equal(np_of(layer.weight), ref_q.data)
        np.testing.assert_array_equal(np_of(layer.weight_scales).view(np.uint8) if mode != "affine"
                                      else np_of(layer.weight_scales), ref_q.scales)
    x = torch.randn(2, 3, 64, dtype=dtype, device=d)
    h = layers[0](x)
    assert h.shape == (2, 3, 64) and h.dtype == dtype
    b = None if layers[0].bias is None else np_of(layers[0].bias)
    msg = R.matmul_mismatch(np_of(h), R.quantized_matmul(np_of(x), ref_weight(layers[0]), bias=b))
    assert msg is None, msg
    y = model(x)  # the whole model runs
    assert y.shape == (2, 3, 32) and torch.isfinite(y).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("weight_only", [True, False], ids=["weight_only", "both"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode,kw", MODES, ids=IDS)
def test_input_gradient(mode, kw, dtype, weight_only, device):
    """x's gradient through a frozen quantized layer (an adapter or a prefix trained under it):
    dy @ W with W the layer's dequantized weight (straight through q(x) for weight_only=False).
    Before, the result had no grad_fn and the gradient was silently lost."""
    if mode == "affine" and not weight_only:
        pytest.skip("affine has no qqmm form")
    d = dev(device)
    torch.manual_seed(2)
    lin = nn.Linear(64, 96, bias=True).to(d, dtype)
    layer = qqt.QuantizedLinear.from_linear(lin, mode, weight_only=weight_only, **kw)
    x = torch.randn(2, 3, 64, dtype=dtype, device=d, requires_grad=True)
    y = layer(x)
    assert y.grad_fn is not None
    with torch.no_grad():   # the forward is the same product with or without x's graph
        assert torch.equal(y.detach(), layer(x.detach()))
    dy = torch.randn_like(y)
    y.backward(dy)
    assert x.grad is not None and x.grad.shape == x.shape and x.grad.dtype == dtype
    ref = R.quantized_matmul(np_of(dy).reshape(-1, 96), ref_weight(layer), transpose=False)
    msg = R.matmul_mismatch(np_of(x.grad).reshape(-1, 64), ref)
    assert msg is None, msg
    # a second backward through that gradient would need W's GEMM's derivative in dy: refused
    x2 = x.detach().requires_grad_()
    (g,) = torch.autograd.grad(layer(x2).square().sum(), x2, create_graph=True)
    with pytest.raises(RuntimeError, match="QuantizedLinear: differentiating its gradients again"):
        g.sum().backward()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["nvfp4", "mxfp4", "mxfp8"])
def test_both_quantized_matches_reference(mode, device):
    d = dev(device)
    model = make_model(torch.bfloat16, d)
    wf = np_of(model[0].weight)
    qqt.quantize_(model, mode=mode, weight_only=False)
    layer = model[0]
    assert not layer.weight_only
    x = torch.randn(5, 64, dtype=torch.bfloat16, device=d)
    y = layer(x)
    xs = np_of(x)
    gx = R.amax(xs) if mode == "nvfp4" else None
    gw = R.amax(wf) if mode == "nvfp4" else None
    ref = R.qqmm(xs, wf, mode, global_scale_x=gx, global_scale_w=gw, bias=np_of(layer.bias))
    msg = R.matmul_mismatch(np_of(y), ref)
    assert msg is None, msg
    assert torch.equal(layer(x), y)  # the prepared-weight cache gives the same bits


def test_report_and_log(caplog):
    model = nn.ModuleDict({"a": nn.Linear(64, 16), "odd": nn.Linear(100, 16), "keep": nn.Linear(32, 16),
                           "ints": nn.Linear(32, 16)})
    model["ints"].weight = nn.Parameter(torch.zeros(16, 32, dtype=torch.int32), requires_grad=False)
    with caplog.at_level(logging.INFO, logger="qq.torch"):
        report = qqt.quantize_(model, mode="mxfp8", filter_fn=lambda m, fqn: fqn != "keep")
    assert [c[0] for c in report.converted] == ["a"]
    reasons = dict(report.skipped)
    assert set(reasons) == {"odd", "keep", "ints"}
    assert "in_features (100)" in reasons["odd"] and "32" in reasons["odd"]
    assert "filter_fn" in reasons["keep"]
    assert "int32" in reasons["ints"]
    assert isinstance(model["a"], qqt.QuantizedLinear) and type(model["odd"]) is nn.Linear
    text = caplog.text
    assert "1 linear layers converted, 3 skipped" in text and "odd left as nn.Linear" in text
    assert "skipped odd" in str(report)


def test_convert_linear_warns_on_skip(caplog):
    model = nn.Sequential(nn.Linear(64, 32), nn.Linear(32, 100))
    with caplog.at_level(logging.WARNING, logger="qq.torch"):
        qqt.convert_linear(model, mode="mxfp8")
    assert isinstance(model[0], qqt.QQLinear) and type(model[1]) is nn.Linear
    assert "1 (in_features=32, out_features=100) left as nn.Linear" in caplog.text


def test_shared_layers_and_training_layers_converted():
    """A layer registered under two names becomes one converted layer under both (convert_linear
    and quantize_; named_children lists it once and left the second name a float layer); a
    QQLinear (qq's training layer) is quantized by quantize_ like any nn.Linear (train, then
    quantize for inference), and to the same bytes as the float layer it came from."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32))
    model.add_module("again", model[0])
    plain = qqt.QuantizedLinear.from_linear(model[0], "nvfp4")
    qqt.convert_linear(model, "mxfp8")
    assert isinstance(model.again, qqt.QQLinear) and model.again is model[0]
    report = qqt.quantize_(model, "nvfp4")
    assert sorted(c[0] for c in report.converted) == ["0", "2", "again"] and not report.skipped
    assert isinstance(model.again, qqt.QuantizedLinear) and model.again is model[0]
    for name in ("weight", "weight_scales", "weight_global_scale"):
        assert torch.equal(getattr(model[0], name), getattr(plain, name)), name


def test_transposed_and_expanded_input():
    """x as a transposed or expanded 2-D view (nn.Linear takes them): the layer's result on the
    contiguous copy."""
    torch.manual_seed(0)
    layer = qqt.QuantizedLinear.from_linear(nn.Linear(64, 16), "mxfp8")
    for x in (torch.randn(64, 5).t(), torch.randn(1, 64).expand(6, 64)):
        assert torch.equal(layer(x), layer(x.contiguous()))


@pytest.mark.parametrize("mode,kw", MODES, ids=IDS)
def test_state_dict_round_trip(mode, kw, tmp_path):
    model = make_model(torch.bfloat16, "cpu")
    qqt.quantize_(model, mode=mode, **kw)
    sd = model.state_dict()
    assert all(isinstance(v, torch.Tensor) for v in sd.values())
    path = tmp_path / "m.pt"
    torch.save(sd, path)
    loaded = torch.load(path, weights_only=True)
    fresh = make_model(torch.bfloat16, "cpu")
    with torch.no_grad():  # different float weights: every byte must come from the file
        for p in fresh.parameters():
            p.mul_(-3.0)
    qqt.quantize_(fresh, mode=mode, **kw)
    fresh.load_state_dict(loaded)
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    assert torch.equal(fresh(x), model(x))
    for k, v in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k


def _spy_matmul(monkeypatch):
    """The weights qq.quantized_matmul receives (so a test sees which form a layer ran)."""
    seen = []
    real = qq.quantized_matmul

    def spy(x, w, *a, **k):
        seen.append(w)
        return real(x, w, *a, **k)
    monkeypatch.setattr(qq, "quantized_matmul", spy)
    return seen


@pytest.mark.parametrize("mode,kw", MODES, ids=IDS)
def test_decode_layout_cpu_runs_packed(mode, kw, monkeypatch):
    """On the CPU a decode_layout layer runs its packed weight (the CPU's faster path)."""
    torch.manual_seed(2)
    lin = nn.Linear(256, 128).to(torch.bfloat16)
    packed = qqt.QuantizedLinear.from_linear(lin, mode, **kw)
    fast = qqt.QuantizedLinear.from_linear(lin, mode, decode_layout=True, **kw)
    assert "decode_layout=True" in repr(fast) and torch.equal(fast.weight, packed.weight)
    seen = _spy_matmul(monkeypatch)
    x = torch.randn(3, 256, dtype=torch.bfloat16)
    assert torch.equal(fast(x), packed(x))
    assert seen[0] is fast.weight and fast._decode is None


@pytest.mark.gpu
@pytest.mark.parametrize("mode,kw", MODES, ids=IDS)
def test_decode_layout(mode, kw, monkeypatch):
    d = dev("cuda")
    torch.manual_seed(2)
    lin = nn.Linear(256, 128).to(d, torch.bfloat16)
    fast = qqt.QuantizedLinear.from_linear(lin, mode, decode_layout=True, **kw)
    seen = _spy_matmul(monkeypatch)
    for rows in (1, 5, 80):  # 80 rows: more than the decode kernel takes (its packed weight runs)
        x = torch.randn(rows, 256, dtype=torch.bfloat16, device=d)
        seen.clear()
        y = fast(x)
        assert len(seen) == 1 and isinstance(seen[0], qq.DecodeWeight)
        dw = seen[0]
        assert dw is fast._decode[1]  # built once, kept
        assert torch.equal(y, qq.quantized_matmul(x, dw, bias=fast.bias))
        msg = R.matmul_mismatch(np_of(y), R.quantized_matmul(np_of(x), ref_weight(fast), bias=np_of(fast.bias)))
        assert msg is None, msg
    # new buffers (load_state_dict copies in place: the versions change): the layout is rebuilt
    torch.manual_seed(3)
    other = qqt.QuantizedLinear.from_linear(nn.Linear(256, 128).to(d, torch.bfloat16), mode, **kw)
    fast.load_state_dict(other.state_dict())
    x = torch.randn(2, 256, dtype=torch.bfloat16, device=d)
    y = fast(x)
    assert seen[-1] is dw and fast._decode[1] is dw  # rebuilt into the same storage
    msg = R.matmul_mismatch(np_of(y), R.quantized_matmul(np_of(x), ref_weight(other), bias=np_of(other.bias)))
    assert msg is None, msg
    fast.to(torch.float16)  # a cast drops the cache
    assert fast._decode is None


@pytest.mark.parametrize("device", DEVICES)
def test_prepared_cache_follows_the_buffers(device):
    """weight_only=False's prepared weight (the qqmm cache, on the CPU too): rebuilt into its
    own storage after load_state_dict; writes through .data need invalidate_caches()."""
    d = dev(device)
    torch.manual_seed(9)
    layer, a, b = (qqt.QuantizedLinear.from_linear(nn.Linear(64, 32).to(d, torch.bfloat16), "mxfp8",
                                                   weight_only=False) for _ in range(3))
    x = torch.randn(80, 64, dtype=torch.bfloat16, device=d)  # rows past the packed weight's routes
    layer(x)
    pw = layer._prepared[1]
    values = pw.values
    layer.load_state_dict(a.state_dict())
    assert torch.equal(layer(x), a(x))
    assert layer._prepared[1] is pw and (values is None or pw.values is values)  # same storage
    with torch.no_grad():
        b.bias.copy_(layer.bias)
        for name in ("weight", "weight_scales"):
            getattr(layer, name).data.copy_(getattr(b, name))
    assert torch.equal(layer(x), a(x))  # unseen by the version counters: the old weight
    layer.invalidate_caches()
    assert torch.equal(layer(x), b(x))


@pytest.mark.gpu
def test_decode_layout_refused_weight_stays_packed(caplog, monkeypatch):
    d = dev("cuda")
    torch.manual_seed(4)
    lin = nn.Linear(64, 32).to(d, torch.bfloat16)  # K = 64: not a multiple of the layout's 256
    fast = qqt.QuantizedLinear.from_linear(lin, "nvfp4", decode_layout=True)
    packed = qqt.QuantizedLinear.from_linear(lin, "nvfp4")
    seen = _spy_matmul(monkeypatch)
    x = torch.randn(3, 64, dtype=torch.bfloat16, device=d)
    with caplog.at_level(logging.WARNING, logger="qq.torch"):
        y = fast(x)
        fast(x)
    warned = [r.getMessage() for r in caplog.records if "decode layout refuses" in r.getMessage()]
    assert len(warned) == 1 and "multiple of 256" in warned[0]  # once, with libqq's reason
    assert all(w is fast.weight for w in seen) and fast._decode[1] is None
    assert torch.equal(y, packed(x))


def test_decode_layout_choices(tmp_path):
    raises(ValueError, ["QuantizedLinear", "decode_layout", "weight_only"], qqt.QuantizedLinear, 256, 16,
           mode="mxfp8", weight_only=False, decode_layout=True)
    raises(ValueError, ["quantize_", "decode_layout"], qqt.quantize_, nn.Sequential(nn.Linear(256, 16)),
           mode="mxfp8", weight_only=False, decode_layout=True)
    model = nn.Sequential(nn.Linear(256, 64), nn.Linear(64, 16)).to(torch.bfloat16)
    twin = nn.Sequential(nn.Linear(256, 64), nn.Linear(64, 16)).to(torch.bfloat16)
    twin.load_state_dict(model.state_dict())
    qqt.quantize_(model, mode="mxfp8", decode_layout=True)
    qqt.quantize_(twin, mode="mxfp8")
    assert all(m.decode_layout for m in model) and not any(m.decode_layout for m in twin)
    assert model.state_dict().keys() == twin.state_dict().keys()  # the flag adds no state
    path = tmp_path / "m.safetensors"
    qqt.save_quantized(model, path)
    x = torch.randn(2, 256, dtype=torch.bfloat16)
    for flag in (False, True):
        fresh = nn.Sequential(nn.Linear(256, 64), nn.Linear(64, 16)).to(torch.bfloat16)
        qqt.load_quantized(fresh, path, decode_layout=flag)
        assert all(m.decode_layout == flag for m in fresh)
        assert torch.equal(fresh(x), twin(x))  # the CPU runs the packed weight either way
    # pickling / deepcopy carry the state, not the caches
    import copy
    import pickle
    model[0]._decode = ("key", "a cache")
    clone = copy.deepcopy(model)
    assert clone[0]._decode is None and model[0]._decode == ("key", "a cache")
    # a layer pickled before decode_layout existed (its __dict__ without the new fields)
    old = model[1].__getstate__()
    for k in ("decode_layout", "_decode", "_capture_warned"):
        del old[k]
    revived = qqt.QuantizedLinear.__new__(qqt.QuantizedLinear)
    revived.__setstate__(old)
    h = torch.randn(2, 64, dtype=torch.bfloat16)
    assert revived.decode_layout is False and torch.equal(revived(h), model[1](h))
    assert torch.equal(pickle.loads(pickle.dumps(model))(x), model(x))


def test_dtype_cast_keeps_global_scale_float32():
    layer = qqt.QuantizedLinear.from_linear(nn.Linear(32, 16), "nvfp4")
    gs = layer.weight_global_scale.clone()
    layer.to(torch.float16)
    assert layer.weight_global_scale.dtype == torch.float32 and torch.equal(layer.weight_global_scale, gs)
    assert layer.bias.dtype == torch.float16 and layer.weight.dtype == torch.uint8
    y = layer(torch.randn(2, 32, dtype=torch.float16))
    assert y.dtype == torch.float16


def test_bad_input():
    raises(ValueError, ["quantize_", "mode"], qqt.quantize_, nn.Linear(32, 16), mode="int4")
    raises(ValueError, ["quantize_", "weight_only"], qqt.quantize_, nn.Linear(32, 16), mode="affine",
           weight_only=False)
    raises(TypeError, ["quantize_", "model"], qqt.quantize_, "not a model")
    raises(ValueError, ["QuantizedLinear", "in_features"], qqt.QuantizedLinear, 100, 16, mode="nvfp4")
    raises(TypeError, ["from_linear"], qqt.QuantizedLinear.from_linear, nn.ReLU())
    layer = qqt.QuantizedLinear.from_linear(nn.Linear(32, 16), "mxfp8")
    raises(ValueError, ["QuantizedLinear", "in_features"], layer, torch.randn(2, 64))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("weight_only", [True, False])
def test_torch_compile(weight_only, device):
    d = dev(device)
    model = make_model(torch.bfloat16, d)
    qqt.quantize_(model, mode="nvfp4", weight_only=weight_only)
    x = torch.randn(3, 64, dtype=torch.bfloat16, device=d)
    eager = model(x)
    compiled = torch.compile(model, fullgraph=True)
    assert torch.equal(compiled(x), eager)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_decode_layout(device):
    """Under torch.compile a decode_layout layer traces its packed weight: no graph break,
    the packed layer's eager bits."""
    d = dev(device)
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(256, 64), nn.GELU(), nn.Linear(64, 16)).to(d, torch.bfloat16)
    twin = nn.Sequential(nn.Linear(256, 64), nn.GELU(), nn.Linear(64, 16)).to(d, torch.bfloat16)
    twin.load_state_dict(model.state_dict())
    qqt.quantize_(model, mode="nvfp4", decode_layout=True)
    qqt.quantize_(twin, mode="nvfp4")
    x = torch.randn(3, 256, dtype=torch.bfloat16, device=d)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    assert torch.equal(compiled(x), twin(x))


def _warm_up(model, x):
    """Calls before a capture on a side stream, as torch.cuda.graph asks (they also build a
    decode_layout layer's layout)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            model(x)
    torch.cuda.current_stream().wait_stream(s)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["nvfp4", "mxfp8"])
def test_cuda_graph(mode):
    d = dev("cuda")
    model = make_model(torch.bfloat16, d)
    qqt.quantize_(model, mode=mode)
    x = torch.randn(1, 64, dtype=torch.bfloat16, device=d)
    eager = model(x)
    _warm_up(model, x)
    g = torch.cuda.CUDAGraph()
    # thread_local: a CUDA call this thread makes during the capture that is not allowed
    # there still fails it; another thread's (another test's JAX or torch threads in the same
    # pytest worker) does not. In the default global mode this test failed once in a full
    # GPU run and passed in every rerun (bench/results/gpu-tests-2026-11-27s.md). The likelier
    # cause, found in session ax, was this thread's own: the garbage collector destroying an
    # earlier test's CUDA graph inside the capture, which capture() now prevents.
    with capture(g, capture_error_mode="thread_local"):
        y = model(x)
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, model(x))
    assert not torch.equal(y, eager)  # the replay read the new x


@pytest.mark.gpu
def test_cuda_graph_decode_layout_capture_first(caplog, monkeypatch):
    """A capture before any eager call: the packed weights run in the graph (the layout
    cannot be built there), with one warning per layer."""
    d = dev("cuda")
    torch.manual_seed(7)
    model = nn.Sequential(nn.Linear(256, 256), nn.Linear(256, 256)).to(d, torch.bfloat16)
    twin = nn.Sequential(nn.Linear(256, 256), nn.Linear(256, 256)).to(d, torch.bfloat16)
    twin.load_state_dict(model.state_dict())
    qqt.quantize_(model, mode="nvfp4", decode_layout=True)
    qqt.quantize_(twin, mode="nvfp4")
    x = torch.randn(1, 256, dtype=torch.bfloat16, device=d)
    _warm_up(twin, x)  # libqq's own first-call setup, outside the capture
    seen = _spy_matmul(monkeypatch)
    g = torch.cuda.CUDAGraph()
    with caplog.at_level(logging.WARNING, logger="qq.torch"):
        with capture(g, capture_error_mode="thread_local"):
            y = model(x)
        g2 = torch.cuda.CUDAGraph()
        with capture(g2, capture_error_mode="thread_local"):
            model(x)
    assert [type(w) for w in seen] == [torch.Tensor] * 4  # the packed buffers
    warned = [r for r in caplog.records if "before this CUDA graph capture" in r.getMessage()]
    assert len(warned) == 2  # once per layer, not per capture
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, twin(x))
    assert all(m._decode is None for m in model)


@pytest.mark.gpu
def test_cuda_graph_decode_layout_weights_update():
    """New weights after capture (load_state_dict: in place) reach the graph's replays once
    an eager call has rebuilt the layout, which goes into the captured layout's storage;
    writes through .data need invalidate_caches()."""
    d = dev("cuda")
    torch.manual_seed(8)
    lin = [nn.Linear(256, 128).to(d, torch.bfloat16) for _ in range(3)]
    layer = qqt.QuantizedLinear.from_linear(lin[0], "nvfp4", decode_layout=True)
    other = [qqt.QuantizedLinear.from_linear(m, "nvfp4", decode_layout=True) for m in lin[1:]]
    x = torch.randn(1, 256, dtype=torch.bfloat16, device=d)
    _warm_up(layer, x)
    dw = layer._decode[1]
    ptr = dw.data.data_ptr()
    g = torch.cuda.CUDAGraph()
    with capture(g, capture_error_mode="thread_local"):
        y = layer(x)
    layer.load_state_dict(other[0].state_dict())
    want = other[0](x)
    assert torch.equal(layer(x), want)  # the eager call rebuilds the layout ...
    assert layer._decode[1] is dw and dw.data.data_ptr() == ptr  # ... into the captured storage
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, want)
    # writes the version counters do not see
    with torch.no_grad():
        other[1].bias.copy_(layer.bias)  # the same bias (read per call, not cached)
        for name in ("weight", "weight_scales", "weight_global_scale"):
            getattr(layer, name).data.copy_(getattr(other[1], name))
    assert torch.equal(layer(x), want)  # stale: documented
    layer.invalidate_caches()
    assert torch.equal(layer(x), other[1](x))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, other[1](x))


@pytest.mark.gpu
@pytest.mark.parametrize("mode,kw", [("nvfp4", {}), ("affine", {"bits": 4})], ids=["nvfp4", "affine4"])
def test_cuda_graph_decode_layout(mode, kw, monkeypatch):
    """Warm-up builds the decode layout; the captured graph runs the decode kernel on it."""
    d = dev("cuda")
    torch.manual_seed(6)
    model = nn.Sequential(nn.Linear(256, 512), nn.Linear(512, 256)).to(d, torch.bfloat16)
    qqt.quantize_(model, mode=mode, decode_layout=True, **kw)
    x = torch.randn(1, 256, dtype=torch.bfloat16, device=d)
    _warm_up(model, x)
    assert all(isinstance(m._decode[1], qq.DecodeWeight) for m in model)
    seen = _spy_matmul(monkeypatch)
    g = torch.cuda.CUDAGraph()
    with capture(g, capture_error_mode="thread_local"):
        y = model(x)
    assert len(seen) == 2 and all(isinstance(w, qq.DecodeWeight) for w in seen)
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    h = qq.quantized_matmul(x, model[0]._decode[1], bias=model[0].bias)
    assert torch.equal(y, qq.quantized_matmul(h, model[1]._decode[1], bias=model[1].bias))
