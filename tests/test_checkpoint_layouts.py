"""Loaders of public checkpoint layouts (qq.checkpoint.from_* / load_layout,
docs/checkpoints.md): small files written here byte by byte in each layout (a writer of the
safetensors format independent of qq and of the safetensors package, so float8 dtype strings
appear as real exporters write them), loaded with qq, and qq.dequantize of the result checked
against each format's documented decode formula computed in NumPy. Includes the worked
examples of docs/checkpoints.md."""

from __future__ import annotations

import json

import numpy as np
import pytest

import qq
import qq.checkpoint as ck
import reference as R
from helpers import raises

E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float64)


def write_raw(path, tensors, metadata=None):
    """tensors: {name: (dtype string, np.ndarray of the bytes' type, shape or None)}."""
    header, blobs, off = {}, [], 0
    for name, (dt, arr, shape) in tensors.items():
        b = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape if shape is None else shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))


def e4m3_value(b):
    return R.decode(np.asarray(b, np.uint8), R.elem_format("mxfp8", "e4m3")).astype(np.float64)


def fp4_decode(packed):
    lo, hi = packed & 0xF, packed >> 4
    codes = np.stack([lo, hi], axis=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)
    return E2M1[codes]


def dq32(q):
    return np.asarray(qq.dequantize(q, dtype="float32"), np.float64)


def rand_nvfp4(rng, n, k):
    packed = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    scales = rng.integers(0x08, 0x7f, (n, k // 16), dtype=np.uint8)  # positive finite E4M3
    return packed, scales


def test_modelopt(tmp_path, rng):
    n, k = 24, 64
    packed, scales = rand_nvfp4(rng, n, k)
    s2 = np.float32(0.25)  # amax / 2688 (a power of two: 2688 * s2 / 2688 is exact)
    path = tmp_path / "model.safetensors"
    write_raw(path, {"layers.0.proj.weight": ("U8", packed, None),
                     "layers.0.proj.weight_scale": ("F8_E4M3", scales, None),
                     "layers.0.proj.weight_scale_2": ("F32", np.array(s2), None),
                     "layers.0.proj.input_scale": ("F32", np.array(np.float32(0.5)), None),
                     "norm.weight": ("F32", np.ones(8, np.float32), None)})
    got = ck.load_layout(path, "modelopt")
    q = got["layers.0.proj.weight"]
    assert q.mode == "nvfp4" and q.shape == (n, k)
    assert float(np.asarray(q.global_scale).reshape(-1)[0]) == 2688 * 0.25
    expect = fp4_decode(packed) * np.repeat(e4m3_value(scales), 16, axis=1) * float(s2)
    np.testing.assert_array_equal(dq32(q), expect)
    assert set(got) == {"layers.0.proj.weight", "layers.0.proj.input_scale", "norm.weight"}


def test_modelopt_worked_example(tmp_path):
    """docs/checkpoints.md: W = [1, -2, 3, 6, 0.5, 0 x 11]."""
    packed = np.array([[0xC2, 0x75, 0x01, 0, 0, 0, 0, 0]], np.uint8)
    q = ck.from_modelopt({"p.weight": packed, "p.weight_scale": np.array([[0x40]], np.uint8),
                          "p.weight_scale_2": np.array(0.5, np.float32)}, "p")
    np.testing.assert_array_equal(dq32(q)[0], [1, -2, 3, 6, 0.5] + [0] * 11)


def test_compressed_tensors(tmp_path, rng):
    n, k = 16, 32
    packed, scales = rand_nvfp4(rng, n, k)
    path = tmp_path / "ct.safetensors"
    write_raw(path, {"m.q_proj.weight_packed": ("U8", packed, None),
                     "m.q_proj.weight_scale": ("F8_E4M3", scales, None),
                     "m.q_proj.weight_global_scale": ("F32", np.array([2.0], np.float32), None),
                     "m.q_proj.input_global_scale": ("F32", np.array([4.0], np.float32), None)})
    q = ck.load_layout(path, "compressed-tensors")["m.q_proj.weight"]
    assert q.mode == "nvfp4"
    expect = fp4_decode(packed) * np.repeat(e4m3_value(scales), 16, axis=1) / 2.0  # scale / global_scale
    np.testing.assert_array_equal(dq32(q), expect)
    # mxfp4-pack-quantized: E8M0 scales, no global scale
    e8 = rng.integers(120, 135, (n, k // 32), dtype=np.uint8)
    q = ck.from_compressed_tensors({"p.weight_packed": packed, "p.weight_scale": e8}, "p")
    assert q.mode == "mxfp4"
    np.testing.assert_array_equal(dq32(q), fp4_decode(packed) * np.repeat(2.0 ** (e8.astype(float) - 127), 32, 1))


def test_gpt_oss(tmp_path, rng):
    e, n, k = 3, 8, 64
    blocks = rng.integers(0, 256, (e, n, k // 32, 16), dtype=np.uint8)
    scales = rng.integers(118, 136, (e, n, k // 32), dtype=np.uint8)
    pre = "model.layers.0.mlp.experts.gate_up_proj"
    path = tmp_path / "oss.safetensors"
    write_raw(path, {f"{pre}_blocks": ("U8", blocks, None), f"{pre}_scales": ("U8", scales, None),
                     f"{pre}_bias": ("F32", np.zeros((e, n), np.float32), None)})
    got = ck.load_layout(path, "gpt-oss")
    q = got[pre]
    assert q.mode == "mxfp4" and q.shape == (e, n, k)
    # the reference decoding: lut[low nibble] at even, lut[high] at odd, ldexp(., scale - 127)
    vals = fp4_decode(blocks.reshape(e, n, k // 2))
    expect = vals * np.repeat(2.0 ** (scales.astype(np.float64) - 127), 32, axis=-1)
    np.testing.assert_array_equal(dq32(q), expect)
    assert f"{pre}_bias" in got and f"{pre}_blocks" not in got
    # docs/checkpoints.md worked example, the original checkpoint's names
    b = np.zeros((1, 1, 1, 16), np.uint8)
    b[0, 0, 0, :4] = [0x21, 0x43, 0x65, 0x97]
    q = ck.from_gpt_oss({"mlp1_weight.blocks": b, "mlp1_weight.scales": np.array([[[128]]], np.uint8)}, "mlp1_weight")
    np.testing.assert_array_equal(dq32(q)[0, 0, :8], [1, 2, 3, 4, 6, 8, 12, -1])


@pytest.mark.parametrize("mode,g,bits", [("affine", 64, 4), ("affine", 32, 8), ("mxfp4", 32, 4), ("nvfp4", 16, 4),
                                         ("mxfp8", 32, 8)])
def test_mlx(mode, g, bits, tmp_path, rng):
    n, k = 8, 128
    nbytes = k * bits // 8
    raw = rng.integers(0, 256, (n, nbytes), dtype=np.uint8)
    words = raw.view("<u4")  # MLX's uint32 words: little-endian bytes of the packed row
    t = {"model.o_proj.weight": ("U32", words, None)}
    if mode == "affine":
        sc = rng.uniform(0.01, 0.1, (n, k // g)).astype(np.float32)
        bi = rng.uniform(-1, 1, (n, k // g)).astype(np.float32)
        t["model.o_proj.scales"] = ("F32", sc, None)
        t["model.o_proj.biases"] = ("F32", bi, None)
        codes = R.unpack(raw, bits, k).astype(np.float64)
        expect = codes * np.repeat(sc, g, 1).astype(np.float64) + np.repeat(bi, g, 1)
    else:
        if mode == "nvfp4":
            sc = rng.integers(0x08, 0x7f, (n, k // g), dtype=np.uint8)
            t["model.o_proj.global_scale"] = ("F32", np.array([1344.0], np.float32), None)
            sv = e4m3_value(sc) * 0.5
        else:
            sc = rng.integers(118, 136, (n, k // g), dtype=np.uint8)
            sv = 2.0 ** (sc.astype(np.float64) - 127)
        t["model.o_proj.scales"] = ("U8", sc, None)
        if mode == "mxfp8":
            raw[(raw & 0x7f) == 0x7f] = 0x11  # no NaN codes in this test
            t["model.o_proj.weight"] = ("U32", raw.view("<u4"), None)
            vals = e4m3_value(raw)
        else:
            vals = fp4_decode(raw)
        expect = vals * np.repeat(sv, g, 1)
    path = tmp_path / "mlx.safetensors"
    write_raw(path, t)
    q = ck.load_layout(path, "mlx", mode=mode, group_size=g, bits=bits)["model.o_proj.weight"]
    assert q.mode == mode and q.shape == (n, k)
    got = dq32(q)
    if mode == "affine":  # scale * q + bias in fp32 (one fma) against float64
        np.testing.assert_allclose(got, expect, rtol=2e-7, atol=2e-7)
    else:
        np.testing.assert_array_equal(got, expect)


def test_errors(tmp_path, rng):
    packed, scales = rand_nvfp4(rng, 4, 32)
    raises(ValueError, ["qq.checkpoint.from_modelopt", "p.weight_scale_2"], ck.from_modelopt,
           {"p.weight": packed, "p.weight_scale": scales}, "p")
    raises(ValueError, ["qq.checkpoint.from_modelopt", "p.weight_scale"], ck.from_modelopt,
           {"p.weight": packed, "p.weight_scale": scales.astype(np.float32), "p.weight_scale_2": np.float32(1)}, "p")
    raises(ValueError, ["qq.checkpoint.from_mlx", "uint32"], ck.from_mlx,
           {"p.weight": packed, "p.scales": scales}, "p", mode="nvfp4")
    raises(ValueError, ["qq.checkpoint.from_mlx", "p.biases"], ck.from_mlx,
           {"p.weight": packed.view("<u4"), "p.scales": scales.astype(np.float32)}, "p")
    raises(ValueError, ["qq.checkpoint.load_layout", "layout"], ck.load_layout, tmp_path / "x", "gguf")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x04\x00\x00\x00\x00\x00\x00\x00{no}")
    raises(ValueError, ["qq.checkpoint.read_raw", "JSON"], ck.read_raw, bad)


@pytest.mark.parametrize("layout,names,bad", [
    ("modelopt", {"a.weight": "U8", "a.weight_scale": "F8_E4M3", "a.weight_scale_2": "F32"}, ("a.weight_scale", "F8_E5M2")),
    ("modelopt", {"a.weight": "U8", "a.weight_scale": "F8_E4M3", "a.weight_scale_2": "F32"}, ("a.weight_scale", "F8_E8M0")),
    ("modelopt", {"a.weight": "U8", "a.weight_scale": "F8_E4M3", "a.weight_scale_2": "F32"}, ("a.weight", "F8_E4M3")),
    ("compressed-tensors", {"a.weight_packed": "U8", "a.weight_scale": "F8_E4M3", "a.weight_global_scale": "F32"},
     ("a.weight_scale", "F8_E8M0")),
    ("compressed-tensors", {"a.weight_packed": "U8", "a.weight_scale": "U8"}, ("a.weight_scale", "F8_E4M3")),
    ("gpt-oss", {"a_blocks": "U8", "a_scales": "U8"}, ("a_scales", "F8_E4M3")),
])
def test_byte_tensors_of_another_float8_type_are_refused(tmp_path, rng, layout, names, bad):
    """Before: any one-byte dtype passed, so E5M2 / E8M0 bytes were read as E4M3 scales (or the
    other way round): silently wrong weights. The same files with the right dtypes load."""
    n, k = 4, 64
    mx = layout == "gpt-oss" or "a.weight_global_scale" not in names and layout == "compressed-tensors"
    arrays = {"a.weight": rng.integers(0, 256, (n, k // 2), dtype=np.uint8),
              "a.weight_packed": rng.integers(0, 256, (n, k // 2), dtype=np.uint8),
              "a.weight_scale": rng.integers(0x30, 0x40, (n, k // (32 if mx else 16)), dtype=np.uint8),
              "a.weight_scale_2": np.array(0.5, np.float32), "a.weight_global_scale": np.array([2.0], np.float32),
              "a_blocks": rng.integers(0, 256, (1, n, k // 32, 16), dtype=np.uint8),
              "a_scales": rng.integers(120, 130, (1, n, k // 32), dtype=np.uint8)}
    good = {name: (dt, arrays[name], None) for name, dt in names.items()}
    write_raw(tmp_path / "good.safetensors", good)
    assert len(ck.load_layout(tmp_path / "good.safetensors", layout)) == 1
    key, dt = bad
    write_raw(tmp_path / "bad.safetensors", dict(good, **{key: (dt, arrays[key], None)}))
    raises(ValueError, [key, dt], ck.load_layout, tmp_path / "bad.safetensors", layout)


def test_torch_float8_scales_are_checked():
    torch = pytest.importorskip("torch")
    packed = np.zeros((2, 16), np.uint8)
    ok = torch.full((2, 2), 0.5).to(torch.float8_e4m3fn)
    q = ck.from_modelopt({"p.weight": torch.from_numpy(packed), "p.weight_scale": ok,
                          "p.weight_scale_2": torch.tensor(1.0)}, "p")
    assert np.asarray(q.scales).tolist() == [[0x30, 0x30]] * 2     # E4M3 0.5, as its bytes
    raises(ValueError, ["p.weight_scale", "F8_E5M2"], ck.from_modelopt,
           {"p.weight": torch.from_numpy(packed), "p.weight_scale": ok.to(torch.float8_e5m2),
            "p.weight_scale_2": torch.tensor(1.0)}, "p")


def _model_dir(tmp_path, config, shards, hf_quant=None):
    """A model directory: config.json, shards {file: tensors} and their index."""
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    if hf_quant is not None:
        (d / "hf_quant_config.json").write_text(json.dumps(hf_quant))
    weight_map = {}
    for fname, tensors in shards.items():
        write_raw(d / fname, tensors)
        weight_map.update({k: fname for k in tensors})
    if len(shards) > 1:
        (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return d


def test_load_pretrained_modelopt_sharded(tmp_path, rng):
    p1, s1 = rand_nvfp4(rng, 16, 32)
    p2, s2 = rand_nvfp4(rng, 32, 64)
    d = _model_dir(tmp_path, {"architectures": ["X"]}, {
        "model-00001-of-00002.safetensors": {"a.weight": ("U8", p1, None), "a.weight_scale": ("F8_E4M3", s1, None),
                                             "a.weight_scale_2": ("F32", np.array(np.float32(0.5)), None)},
        "model-00002-of-00002.safetensors": {"b.weight": ("U8", p2, None), "b.weight_scale": ("F8_E4M3", s2, None),
                                             "b.weight_scale_2": ("F32", np.array(np.float32(2.0)), None),
                                             "lm_head.weight": ("F32", np.ones((4, 4), np.float32), None)}},
        hf_quant={"quantization": {"quant_algo": "NVFP4", "group_size": 16}})
    got = ck.load_pretrained(d)
    assert set(got) == {"a.weight", "b.weight", "lm_head.weight"}
    np.testing.assert_array_equal(dq32(got["b.weight"]),
                                  fp4_decode(p2) * np.repeat(e4m3_value(s2), 16, axis=1) * 2.0)
    assert got["a.weight"].shape == (16, 32)


def test_load_pretrained_compressed_tensors_and_gpt_oss(tmp_path, rng):
    p, s = rand_nvfp4(rng, 16, 32)
    d = _model_dir(tmp_path, {"quantization_config": {"quant_method": "compressed-tensors",
                                                      "format": "nvfp4-pack-quantized"}},
                   {"model.safetensors": {"q.weight_packed": ("U8", p, None), "q.weight_scale": ("F8_E4M3", s, None),
                                          "q.weight_global_scale": ("F32", np.array([4.0], np.float32), None)}})
    q = ck.load_pretrained(d)["q.weight"]
    np.testing.assert_array_equal(dq32(q), fp4_decode(p) * np.repeat(e4m3_value(s), 16, axis=1) / 4.0)
    blocks = rng.integers(0, 256, (2, 4, 1, 16), dtype=np.uint8)
    sc = rng.integers(120, 130, (2, 4, 1), dtype=np.uint8)
    d2 = tmp_path / "oss"
    d2.mkdir()
    (d2 / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "mxfp4"}}))
    write_raw(d2 / "model.safetensors", {"e.down_proj_blocks": ("U8", blocks, None),
                                         "e.down_proj_scales": ("U8", sc, None)})
    q = ck.load_pretrained(d2)["e.down_proj"]
    assert q.mode == "mxfp4" and q.shape == (2, 4, 32)


def test_load_pretrained_mlx_per_module_override(tmp_path, rng):
    """mlx-lm's config: defaults plus a per-module entry (here one layer in 8 bits)."""
    n, k = 4, 64
    raw4 = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    raw8 = rng.integers(0, 256, (n, k), dtype=np.uint8)
    sc = np.full((n, k // 64), 0.5, np.float32)
    bi = np.zeros((n, k // 64), np.float32)
    cfg = {"quantization": {"group_size": 64, "bits": 4, "model.down": {"group_size": 64, "bits": 8}}}
    d = _model_dir(tmp_path, cfg, {"model.safetensors": {
        "model.up.weight": ("U32", raw4.view("<u4"), None), "model.up.scales": ("F32", sc, None),
        "model.up.biases": ("F32", bi, None),
        "model.down.weight": ("U32", raw8.view("<u4"), None), "model.down.scales": ("F32", sc, None),
        "model.down.biases": ("F32", bi, None), "model.norm": ("F32", np.ones(4, np.float32), None)}})
    got = ck.load_pretrained(d)
    assert set(got) == {"model.up.weight", "model.down.weight", "model.norm"}
    assert got["model.up.weight"].bits == 4 and got["model.down.weight"].bits == 8
    np.testing.assert_array_equal(dq32(got["model.down.weight"]), raw8.astype(np.float64) * 0.5)
    np.testing.assert_array_equal(dq32(got["model.up.weight"]), R.unpack(raw4, 4, k).astype(np.float64) * 0.5)


def test_load_pretrained_errors(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    raises(ValueError, ["qq.checkpoint.load_pretrained", "config.json"], ck.load_pretrained, d)
    (d / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "gptq"}}))
    raises(ValueError, ["qq.checkpoint.load_pretrained", "gptq"], ck.load_pretrained, d)
    (d / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "compressed-tensors",
                                                                       "format": "int-quantized"}}))
    raises(ValueError, ["qq.checkpoint.load_pretrained", "int-quantized"], ck.load_pretrained, d)


def test_deinterleave_gate_up(rng):
    """gpt-oss's fused gate_up rows (even: gate, odd: up) split into two QuantizedArrays whose
    dequantized values are the even / odd rows of the fused one; affine biases and the nvfp4
    global scale follow; blocked scales and a row count that does not divide are refused."""
    e, n, k = 2, 8, 64
    blocks = rng.integers(0, 256, (e, n, k // 32, 16), dtype=np.uint8)
    scales = rng.integers(118, 136, (e, n, k // 32), dtype=np.uint8)
    q = ck.from_gpt_oss({"p_blocks": blocks, "p_scales": scales}, "p")
    gate, up = ck.deinterleave(q)
    assert gate.shape == up.shape == (e, n // 2, k) and gate.mode == "mxfp4"
    full = dq32(q)
    np.testing.assert_array_equal(dq32(gate), full[:, ::2])
    np.testing.assert_array_equal(dq32(up), full[:, 1::2])
    w = rng.standard_normal((12, 64)).astype(np.float32)
    for kw in ({}, {"mode": "nvfp4", "global_scale": qq.amax(w)}):
        qa = qq.quantize(w, **kw)
        parts = ck.deinterleave(qa, 3)
        for i, p in enumerate(parts):
            np.testing.assert_array_equal(dq32(p), dq32(qa)[i::3])
    with pytest.raises(ValueError, match="multiple of parts=5"):
        ck.deinterleave(qq.quantize(w), 5)
    with pytest.raises(ValueError, match="blocked"):
        ck.deinterleave(qq.quantize(w, mode="mxfp4", scale_layout="blocked"))


def test_layer_parts_found_or_refused(tmp_path, rng):
    """What a probe of the readers found: a compressed-tensors NVFP4 layer without its global
    scale is refused (it was read as mxfp4, its E4M3 scales as E8M0), as is a layer whose
    scales' shape contradicts its format; a part whose layer marker is missing (or tensors of
    another layout) is refused, not passed through as a plain array; a per-tensor scale
    that makes the factor 0 over non-zero block scales, or an infinite one, is refused; a
    weight whose parts lie in different shards loads; a damaged config is a ValueError."""
    packed, scales = rand_nvfp4(rng, 8, 64)
    raises(ValueError, ["p.weight_global_scale", "missing"], ck.from_compressed_tensors,
           {"p.weight_packed": packed, "p.weight_scale": scales}, "p")
    e8 = rng.integers(120, 135, (8, 2), dtype=np.uint8)
    raises(ValueError, ["p.weight_scale", "nvfp4"], ck.from_compressed_tensors,
           {"p.weight_packed": packed, "p.weight_scale": e8, "p.weight_global_scale": np.float32(2)}, "p")
    raises(ValueError, ["mxfp4"], ck.from_compressed_tensors,
           {"p.weight_packed": packed, "p.weight_scale": scales}, "p", format="mxfp4-pack-quantized")
    path = tmp_path / "m.safetensors"
    write_raw(path, {"a.weight": ("U8", packed, None), "a.weight_scale": ("F8_E4M3", scales, None)})
    raises(ValueError, ["a.weight_scale", "a.weight_scale_2", "missing"], ck.load_layout, path, "modelopt")
    write_raw(path, {"a.weight": ("U8", packed, None), "a.weight_scale": ("F8_E4M3", scales, None),
                     "a.weight_scale_2": ("F32", np.array(np.float32(0.5)), None)})
    raises(ValueError, ["a.weight_scale", "a.weight_packed"], ck.load_layout, path, "compressed-tensors")
    for s2 in (0.0, 1e36):
        raises(ValueError, ["p.weight_scale_2"], ck.from_modelopt,
               {"p.weight": packed, "p.weight_scale": scales, "p.weight_scale_2": np.float32(s2)}, "p")
    zeros = ck.from_modelopt({"p.weight": packed, "p.weight_scale": np.zeros_like(scales),
                              "p.weight_scale_2": np.float32(0)}, "p")
    assert not dq32(zeros).any()
    # parts split over two shards
    d = _model_dir(tmp_path, {"architectures": ["X"]}, {
        "model-00001-of-00002.safetensors": {"a.weight": ("U8", packed, None),
                                             "a.weight_scale": ("F8_E4M3", scales, None)},
        "model-00002-of-00002.safetensors": {"a.weight_scale_2": ("F32", np.array(np.float32(0.5)), None)}},
        hf_quant={"quantization": {"quant_algo": "NVFP4", "group_size": 16}})
    got = ck.load_pretrained(d)
    np.testing.assert_array_equal(dq32(got["a.weight"]),
                                  fp4_decode(packed) * np.repeat(e4m3_value(scales), 16, axis=1) * 0.5)
    (d / "config.json").write_text("{not json")
    raises(ValueError, ["config.json", "JSON"], ck.load_pretrained, d)
