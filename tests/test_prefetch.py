"""qq.prefetch / qqPrefetch: bytes asked into the GPU's L2 cache, a hint.

* CPU (run in CI): NumPy arrays of every dtype libqq takes, strided and empty views, a
  QuantizedArray and a DecodeWeight: None comes back and no value changes; bad arguments
  raise naming prefetch and 't'.
* GPU (`gpu` marker, torch CUDA): spans at every alignment (the kernel asks only for the
  16-byte-aligned interior), empty and strided views; a decode-layout matmul after a
  prefetch gives the bits it gives without one (poisoned outputs); the stream's order holds
  through the prefetch kernel's programmatic dependent launch (a one-row qq.swiglu, then a
  prefetch, then the matmul that reads the SwiGLU's output, eagerly and in a CUDA graph).
"""

from __future__ import annotations

import numpy as np
import pytest

import qq
from helpers import BF16, raises

gpu = pytest.mark.gpu


def torch_mod():
    return pytest.importorskip("torch")


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16, np.uint8, np.int32], ids=str)
def test_prefetch_cpu_is_a_no_op(dtype):
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((33, 17)) * 4).astype(dtype)
    keep = a.copy()
    for t in (a, a[:, ::3], a[5:5], a[::-1]):
        assert qq.prefetch(t) is None
    assert a.tobytes() == keep.tobytes()


def test_prefetch_cpu_quantized_and_decode_weight():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((64, 256)).astype(np.float32)
    for kw in (dict(mode="nvfp4"), dict(mode="mxfp8"), dict(mode="affine", bits=4, group_size=64)):
        qa = qq.quantize(w.astype(BF16) if kw["mode"] == "affine" else w, **kw)
        dw = qq.prepare_decode(qa)
        before = [np.array(t).tobytes() for t in (qa.data, qa.scales, dw.data)]
        assert qq.prefetch(qa) is None
        assert qq.prefetch(dw) is None
        assert [np.array(t).tobytes() for t in (qa.data, qa.scales, dw.data)] == before


def test_prefetch_errors():
    raises((qq.QQError, TypeError, ValueError), ("prefetch", "t"), qq.prefetch, None)
    raises((qq.QQError, TypeError, ValueError), ("prefetch", "t"), qq.prefetch, "weights")
    # int64 is not a dtype libqq takes: the message names the function and the argument
    raises(qq.QQError, "t", qq.prefetch, np.zeros(4, np.int64))


@gpu
def test_gpu_prefetch_spans():
    """Every start and length around the 16-byte granule, strided and empty views, every
    float dtype: the call succeeds, nothing is written, and the device stays healthy."""
    torch = torch_mod()
    base = torch.arange(4096, dtype=torch.int32, device="cuda").view(torch.uint8)
    keep = base.clone()
    for start in (0, 1, 7, 15, 16, 17):
        for length in (0, 1, 14, 15, 16, 17, 31, 32, 33, 1000):
            qq.prefetch(base[start:start + length])
    qq.prefetch(base[::7])
    qq.prefetch(base.view(torch.int32).view(64, 64)[:, 3])
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        qq.prefetch(torch.ones((100, 300), dtype=dt, device="cuda")[:, 1:])
    big = torch.empty(40 << 20, dtype=torch.uint8, device="cuda")  # past the grid's one piece a lane
    qq.prefetch(big)
    torch.cuda.synchronize()
    assert torch.equal(base, keep)


def _decode_weight(torch, mode, n, k, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn((n, k), generator=g, device="cuda").to(torch.bfloat16)
    kw = dict(mode="affine", bits=4, group_size=64) if mode == "affine4" else dict(mode=mode)
    return qq.prepare_decode(qq.quantize(w, **kw))


@gpu
@pytest.mark.parametrize("mode", ["nvfp4", "mxfp8", "affine4"])
def test_gpu_prefetch_keeps_the_bits(mode):
    torch = torch_mod()
    if qq.device_capability(0)[0] < 9:
        pytest.skip("the decode layout's kernel needs compute capability 9.0+")
    dw = _decode_weight(torch, mode, 4096, 1024, 3)
    x = torch.randn((1, 1024), device="cuda").to(torch.bfloat16)
    want = qq.quantized_matmul(x, dw)
    for target in (dw, dw.quantized, dw.data.reshape(-1)[: 1 << 20]):
        out = torch.full_like(want, float("nan"))
        qq.prefetch(target)
        qq.quantized_matmul(x, dw, out=out)
        torch.cuda.synchronize()
        assert torch.equal(out.view(torch.int16), want.view(torch.int16))


@gpu
def test_gpu_prefetch_keeps_the_stream_order():
    """One-row qq.swiglu lets the next kernel start at once; the prefetch kernel after it
    does too, and ends only after the SwiGLU: the matmul after both reads the SwiGLU's
    finished output. Ten fresh inputs in a row, eagerly, then the same three calls captured
    in a CUDA graph and replayed on new inputs; each against the calls synchronized apart."""
    torch = torch_mod()
    if qq.device_capability(0)[0] < 9:
        pytest.skip("the decode layout's kernel needs compute capability 9.0+")
    F, N = 14336, 4096
    dw = _decode_weight(torch, "nvfp4", N, F, 5)
    gus = [torch.randn((1, 2 * F), device="cuda").to(torch.bfloat16) * 3 for _ in range(10)]
    want = []
    for gu in gus:
        a = qq.swiglu(gu)
        torch.cuda.synchronize()
        want.append(qq.quantized_matmul(a, dw))
        torch.cuda.synchronize()
    outs = []
    for gu in gus:
        a = qq.swiglu(gu)
        qq.prefetch(dw)
        outs.append(qq.quantized_matmul(a, dw))
    torch.cuda.synchronize()
    for i, (o, w) in enumerate(zip(outs, want)):
        assert torch.equal(o.view(torch.int16), w.view(torch.int16)), f"eager input {i}"

    src = torch.empty_like(gus[0])
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        src.copy_(gus[0])
        qq.prefetch(dw)
        qq.quantized_matmul(qq.swiglu(src), dw)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        a = qq.swiglu(src)
        qq.prefetch(dw)
        y = qq.quantized_matmul(a, dw)
    for i, gu in enumerate(gus):
        src.copy_(gu)
        y.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(y.view(torch.int16), want[i].view(torch.int16)), f"graph replay {i}"
