"""qq.checkpoint (safetensors files of QuantizedArrays) and qq.torch.save_quantized /
load_quantized (docs/checkpoints.md): bit-exact round trips for every mode and scale layout,
the metadata a file needs, and clear errors for damaged or foreign files."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("safetensors")
import qq  # noqa: E402
import qq.checkpoint as ck  # noqa: E402
from helpers import BF16, raises  # noqa: E402

CASES = [("nvfp4", {}), ("nvfp4-gs", {}), ("mxfp4", {}), ("mxfp8", {}), ("mxfp8", {"fp8_format": "e5m2"}),
         ("affine", {"bits": 4}), ("affine", {"bits": 8, "group_size": 32})]
IDS = ["nvfp4", "nvfp4-gs", "mxfp4", "mxfp8", "mxfp8-e5m2", "affine4", "affine8"]


def quantized(name, kw, dtype, layout, rng):
    w = (rng.standard_normal((48, 128)) * 3).astype(dtype)
    mode = name.split("-")[0]
    if mode == "affine" and layout == "blocked":
        pytest.skip("affine has linear scales only")
    gs = qq.amax(w) if name == "nvfp4-gs" else None
    return qq.quantize(w, mode=mode, global_scale=gs, scale_layout=layout, **kw)


def same(a, b):
    if a is None or b is None:
        return a is None and b is None
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8))


@pytest.mark.parametrize("layout", ["linear", "blocked"])
@pytest.mark.parametrize("dtype", [np.float32, BF16])
@pytest.mark.parametrize("name,kw", CASES, ids=IDS)
def test_round_trip_bit_exact(name, kw, dtype, layout, tmp_path, rng):
    q = quantized(name, kw, dtype, layout, rng)
    extra = np.arange(6, dtype=np.float32).reshape(2, 3)
    path = tmp_path / "q.safetensors"
    ck.save(path, {"layers.0.weight": q, "layers.0.bias": extra}, metadata={"source": "test"})
    got = ck.load(path)
    assert set(got) == {"layers.0.weight", "layers.0.bias"}
    r = got["layers.0.weight"]
    assert isinstance(r, qq.QuantizedArray)
    for f in ("mode", "group_size", "bits", "rounding", "scale_layout", "fp8_format", "shape"):
        assert getattr(r, f) == getattr(q, f), f
    for part in ("data", "scales", "biases", "global_scale"):
        assert same(getattr(r, part), getattr(q, part)), part
    assert same(qq.dequantize(r, dtype="float32"), qq.dequantize(q, dtype="float32"))
    assert same(got["layers.0.bias"], extra)


def test_file_layout(tmp_path, rng):
    """The stored names and metadata are the documented ones (docs/checkpoints.md)."""
    from safetensors import safe_open
    w = rng.standard_normal((32, 64)).astype(np.float32)
    path = tmp_path / "q.safetensors"
    ck.save(path, {"w": qq.quantize(w, mode="nvfp4", global_scale=qq.amax(w)), "a": qq.quantize(w)})
    with safe_open(str(path), framework="numpy") as f:
        keys, meta = set(f.keys()), f.metadata()
    assert keys == {"w", "w_scales", "w_global_scale", "a", "a_scales", "a_biases"}
    assert meta["qq.format"] == "qq-1"
    info = json.loads(meta["qq.quantized.w"])
    assert info == {"mode": "nvfp4", "group_size": 16, "bits": 4, "rounding": "ceil", "scale_layout": "linear",
                    "fp8_format": "e4m3", "shape": [32, 64]}


def test_torch_inputs(tmp_path):
    torch = pytest.importorskip("torch")
    w = torch.randn(16, 64, dtype=torch.bfloat16)
    q = qq.quantize(w)  # affine: bf16 scales and biases
    path = tmp_path / "t.safetensors"
    ck.save(path, {"w": q, "b": torch.ones(3, dtype=torch.bfloat16)})
    got = ck.load(path)
    assert got["b"].dtype == BF16 and np.array_equal(got["b"].astype(np.float32), np.ones(3, np.float32))
    assert np.array_equal(got["w"].scales.view(np.uint16), q.scales.view(torch.int16).numpy().view(np.uint16))


def test_errors(tmp_path, rng):
    import safetensors.numpy as sn
    w = rng.standard_normal((16, 64)).astype(np.float32)
    q = qq.quantize(w, mode="mxfp8")
    path = tmp_path / "q.safetensors"
    raises(ValueError, ["qq.checkpoint.save", "metadata"], ck.save, path, {"w": q}, {"qq.mine": "x"})
    raises(TypeError, ["qq.checkpoint.save", "metadata"], ck.save, path, {"w": q}, {"k": 3})
    raises(ValueError, ["qq.checkpoint.save", "w_scales"], ck.save, path, {"w": q, "w_scales": w})
    # a part the QuantizedArray does not have is reserved too (load would read the array as it)
    gs = np.float32(1000.0)
    raises(ValueError, ["qq.checkpoint.save", "w_global_scale", "reserved"], ck.save, path,
           {"w": qq.quantize(w, mode="nvfp4"), "w_global_scale": gs})
    raises(ValueError, ["qq.checkpoint.save", "w_biases", "reserved"], ck.save, path,
           {"w_biases": w, "w": q})
    raises(TypeError, ["qq.checkpoint.save", "tensors"], ck.save, path, [q])
    # a foreign file
    sn.save_file({"x": w}, str(path))
    raises(ValueError, ["qq.checkpoint.load", "qq-1"], ck.load, path)
    # a missing scales tensor, damaged metadata
    ck.save(path, {"w": q})
    arrays = sn.load_file(str(path))
    from safetensors import safe_open
    with safe_open(str(path), framework="numpy") as f:
        meta = f.metadata()
    sn.save_file({"w": arrays["w"]}, str(path), metadata=meta)
    raises(ValueError, ["qq.checkpoint.load", "w_scales"], ck.load, path)
    meta["qq.quantized.w"] = "{not json"
    sn.save_file(arrays, str(path), metadata=meta)
    raises(ValueError, ["qq.checkpoint.load", "qq.quantized.w"], ck.load, path)


def test_torch_model_save_load(tmp_path):
    torch = pytest.importorskip("torch")
    qqt = pytest.importorskip("qq.torch")
    from torch import nn

    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 32), nn.Linear(32, 10)).to(torch.bfloat16)

    model = make()
    qqt.quantize_(model, mode="nvfp4", filter_fn=lambda m, fqn: fqn != "3")
    qqt.quantize_(model, mode="affine", bits=8, group_size=32)  # layer 3: mixed modes in one file
    path = tmp_path / "m.safetensors"
    qqt.save_quantized(model, path, metadata={"name": "tiny"})
    fresh = make()
    report = qqt.load_quantized(fresh, path)
    assert [c[0] for c in report.converted] == ["0", "2", "3"]
    assert fresh[3].mode == "affine" and fresh[3].bits == 8 and fresh[0].mode == "nvfp4"
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    assert torch.equal(fresh(x), model(x))
    # the same file read as QuantizedArrays
    arrays = ck.load(path)
    w0 = arrays["0.weight"]
    assert isinstance(w0, qq.QuantizedArray) and w0.mode == "nvfp4" and w0.shape == (64, 64)
    y = qq.quantized_matmul(x, qq.QuantizedArray(torch.from_numpy(w0.data), torch.from_numpy(w0.scales), None,
                                                 mode="nvfp4", global_scale=torch.from_numpy(w0.global_scale)),
                            bias=model[0].bias)
    assert torch.equal(y, model[0](x))
    # a model of another architecture
    raises(ValueError, ["load_quantized", "3"], qqt.load_quantized, nn.Sequential(nn.Linear(64, 64)), path)


def test_torch_model_save_load_tied_and_single_layer(tmp_path):
    """save_quantized of a model whose float lm_head shares the embedding's weight (safetensors
    refuses shared memory: the tie is written as a copy and loaded into both), and of a model
    that is one QuantizedLinear (loaded into a QuantizedLinear; another module is refused
    with a message naming what to pass)."""
    torch = pytest.importorskip("torch")
    qqt = pytest.importorskip("qq.torch")
    from torch import nn

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.emb, self.mid = nn.Embedding(100, 64), nn.Linear(64, 64)
            self.head = nn.Linear(64, 100, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, i):
            return self.head(self.mid(self.emb(i)))

    model = Tied()
    qqt.quantize_(model, "mxfp8", filter_fn=lambda m, fqn: fqn != "head")
    path = tmp_path / "tied.safetensors"
    qqt.save_quantized(model, path)
    fresh = Tied()
    with torch.no_grad():
        fresh.emb.weight.zero_()
    qqt.load_quantized(fresh, path)
    i = torch.tensor([[1, 2, 3]])
    assert torch.equal(fresh(i), model(i)) and fresh.head.weight is fresh.emb.weight
    layer = qqt.QuantizedLinear.from_linear(nn.Linear(64, 32), "nvfp4")
    qqt.save_quantized(layer, path)
    back = qqt.QuantizedLinear(64, 32, True, mode="nvfp4", dtype=torch.float32)
    assert [c[0] for c in qqt.load_quantized(back, path).converted] == [""]
    x = torch.randn(3, 64)
    assert torch.equal(back(x), layer(x))
    raises(ValueError, ["load_quantized", "QuantizedLinear"], qqt.load_quantized, nn.Linear(64, 32), path)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_example_runs(device):
    """examples/python/quantized_model.py (the README's end-to-end example) runs; on CUDA
    also its decode-layout CUDA graph section."""
    pytest.importorskip("torch")
    import pathlib
    import subprocess
    import sys
    ex = pathlib.Path(__file__).resolve().parents[1] / "examples" / "python" / "quantized_model.py"
    r = subprocess.run([sys.executable, str(ex), device], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "same outputs" in r.stdout
    assert ("CUDA graph replay: same outputs" in r.stdout) == (device == "cuda")
