"""CUDA graphs: every GPU op can be captured with torch.cuda.graph and replays to its eager
result (docs/api.md, CUDA graphs). A call must not synchronize the host or allocate outside
the stream's pool; grouped_qqmm and its wgrad are captured where they read their offsets on
the device (one grouped GEMM: Hopper, and Blackwell for nvfp4 / mxfp8) and raise a clear error
under capture where they read them on the host.

Each case runs the op eagerly twice (warm-up: cuBLASLt plans and pools), captures one call,
replays the graph on fresh input values copied into the captured buffers, and compares
bit for bit with an eager call on those values."""

from __future__ import annotations

import numpy as np
import pytest

import qq
from helpers import capture, try_import

torch = try_import("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch is None or not torch.cuda.is_available(),
                                 reason="needs torch with CUDA")]


def _flat(res):
    """The tensors of a result (a tensor, a QuantizedArray or a tuple of them)."""
    if isinstance(res, qq.QuantizedArray):
        return [t for t in (res.data, res.scales, res.biases) if t is not None]
    if isinstance(res, (tuple, list)):
        return [t for r in res for t in _flat(r)]
    return [res]


def _check_graph(fn, inputs):
    """fn(*inputs) captured in a graph, replayed on new values of `inputs`, equals eager."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn(*inputs)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with capture(g):
        captured = _flat(fn(*inputs))
    gen = torch.Generator(device="cuda").manual_seed(1)
    for t in inputs:
        if t.dtype.is_floating_point:
            t.copy_(torch.randn(t.shape, generator=gen, device="cuda", dtype=torch.float32).to(t.dtype))
    for c in captured:
        c.fill_(0) if c.dtype != torch.uint8 else c.fill_(0xAB)   # poison: replay must rewrite
    g.replay()
    torch.cuda.synchronize()
    want = _flat(fn(*inputs))
    assert len(want) == len(captured)
    for got, exp in zip(captured, want):
        assert got.shape == exp.shape and got.dtype == exp.dtype
        assert torch.equal(got.reshape(-1).view(torch.uint8), exp.reshape(-1).view(torch.uint8))


def _x(*shape, dtype=None):
    return torch.randn(*shape, device="cuda", dtype=dtype or torch.bfloat16)


@pytest.mark.parametrize("mode", ["nvfp4", "mxfp4", "mxfp8", "affine"])
@pytest.mark.parametrize("layout", ["linear", "blocked"])
def test_quantize_dequantize(mode, layout):
    if mode == "affine" and layout == "blocked":
        pytest.skip("affine scales are linear")
    x = _x(64, 256)
    gs = 1.5 if mode == "nvfp4" else None
    _check_graph(lambda x: qq.quantize(x, mode=mode, scale_layout=layout, global_scale=gs), [x])
    _check_graph(lambda x: qq.dequantize(qq.quantize(x, mode=mode, scale_layout=layout),
                                         mode=mode, dtype="bfloat16"), [x])


def test_quantize_device_global_scale():
    x = _x(64, 256)
    _check_graph(lambda x: qq.quantize(x, mode="nvfp4", global_scale=qq.amax(x)), [x])


def test_amax_swizzle_colwise_moe():
    x = _x(64, 256)
    _check_graph(lambda x: qq.amax(x), [x])
    _check_graph(lambda x: qq.swizzle_scales(qq.quantize(x, mode="mxfp8").scales), [x])
    _check_graph(lambda x: qq.unswizzle_scales(qq.quantize(x, mode="mxfp8", scale_layout="blocked").scales,
                                               (64, 8)), [x])
    _check_graph(lambda x: qq.quantize_colwise(x, mode="mxfp8", rowwise=True), [x])
    w = _x(4, 64, 128)
    _check_graph(lambda w: qq.quantize_moe(w, "32x32"), [w])


@pytest.mark.parametrize("mode", ["nvfp4", "mxfp8", "affine"])
@pytest.mark.parametrize("m", [1, 16])
def test_swiglu_then_decode_matmul(mode, m):
    """qq.swiglu, then a decode-layout matmul: in a graph the two kernels are joined by
    programmatic dependent launch (the matmul prefetches its weights while swiglu runs and
    must read x only after it). Graph replay equals eager, and eager equals the matmul run
    after a synchronize (no early start at all)."""
    w = _x(256, 512) * 0.05
    dw = qq.prepare_decode(qq.quantize(w, mode=mode))
    gu = _x(m, 1024)
    _check_graph(lambda gu: qq.quantized_matmul(qq.swiglu(gu), dw), [gu])
    act = qq.swiglu(gu)
    torch.cuda.synchronize()
    want = qq.quantized_matmul(act, dw)
    got = qq.quantized_matmul(qq.swiglu(gu), dw)
    assert torch.equal(got, want)


def _synced(x, *steps):
    """The steps applied to x one after another with a synchronize after each (no kernel
    starts before the previous one has ended): (the second-to-last result, the last)."""
    outs = [x]
    for f in steps:
        outs.append(f(outs[-1]))
        torch.cuda.synchronize()
    return outs[-2], outs[-1]


@pytest.mark.parametrize("mode", ["nvfp4", "mxfp8"])
def test_decode_gate_up_swiglu_down(mode):
    """A decode MLP: gate/up matmul (its kernel lets the next one launch before it has
    written its result), qq.swiglu (which must wait for that result), down matmul. Eager and
    graphed equal the same three calls with a synchronize after each."""
    wgu = qq.prepare_decode(qq.quantize(_x(1024, 512) * 0.05, mode=mode))
    wd = qq.prepare_decode(qq.quantize(_x(256, 512) * 0.05, mode=mode))
    x = _x(1, 512)

    def mlp(x):
        return qq.quantized_matmul(qq.swiglu(qq.quantized_matmul(x, wgu)), wd)

    act, want = _synced(x, lambda x: qq.quantized_matmul(x, wgu), qq.swiglu, lambda a: qq.quantized_matmul(a, wd))
    assert torch.equal(mlp(x), want)
    _check_graph(mlp, [x])


@pytest.mark.parametrize("mode", ["nvfp4", "mxfp8", "affine"])
@pytest.mark.parametrize("m", [1, 16, 40])
def test_decode_gated_swiglu_down(mode, m):
    """The fused MLP: quantized_matmul_swiglu on a gated gate/up weight (SwiGLU in the
    decode kernel's epilogue), then the down matmul, which starts early on it. Eager and
    graphed equal the two ops (matmul, qq.swiglu) run with a synchronize after each."""
    wgu = qq.quantize(_x(1024, 512) * 0.05, mode=mode)
    dg, dp = qq.prepare_decode(wgu, gated=True), qq.prepare_decode(wgu)
    wd = qq.prepare_decode(qq.quantize(_x(256, 512) * 0.05, mode=mode))
    x = _x(m, 512)

    def mlp(x):
        return qq.quantized_matmul(qq.quantized_matmul_swiglu(x, dg), wd)

    act, want = _synced(x, lambda x: qq.quantized_matmul(x, dp), qq.swiglu, lambda a: qq.quantized_matmul(a, wd))
    assert torch.equal(qq.quantized_matmul_swiglu(x, dg), act)
    assert qq.last_route() == "decode"
    assert torch.equal(mlp(x), want)
    _check_graph(mlp, [x])


@pytest.mark.parametrize("mode", ["nvfp4", "mxfp8"])
@pytest.mark.parametrize("m", [1, 4, 16, 64, 300])
def test_quantized_matmul(mode, m):
    w = qq.quantize(_x(512, 1024), mode=mode)
    x = _x(m, 1024)
    _check_graph(lambda x: qq.quantized_matmul(x, w, mode=mode), [x])


def test_quantized_matmul_affine():
    w = qq.quantize(_x(512, 1024), mode="affine", group_size=64, bits=4)
    x = _x(1, 1024)
    _check_graph(lambda x: qq.quantized_matmul(x, w), [x])


@pytest.mark.parametrize("mode", ["nvfp4", "mxfp8", "affine"])
@pytest.mark.parametrize("m", [1, 8])
def test_gather_qmm(mode, m):
    """MoE decode: the indices are read on the device, so a captured call follows new
    indices copied into its buffer as well as new x."""
    w = qq.quantize(_x(8, 256, 512), mode=mode)
    x = _x(4, 1, m, 512)
    idx = torch.randint(0, 8, (4, 2), dtype=torch.int32, device="cuda")
    _check_graph(lambda x: qq.gather_qmm(x, w, rhs_indices=idx), [x])
    g = torch.cuda.CUDAGraph()
    with capture(g):
        y = qq.gather_qmm(x, w, rhs_indices=idx)
    idx.copy_(torch.tensor([[7, 0], [3, 3], [1, 6], [5, 2]], dtype=torch.int32))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y.view(torch.int16), qq.gather_qmm(x, w, rhs_indices=idx).view(torch.int16))


@pytest.mark.parametrize("mode", ["nvfp4", "mxfp4", "mxfp8"])
@pytest.mark.parametrize("m", [1, 16, 300])
def test_qqmm_prepared_and_stored(mode, m):
    wf = _x(512, 1024)
    pw = qq.prepare_weight(wf, mode=mode)
    stored = qq.quantize(wf, mode=mode, scale_layout="blocked")
    x = _x(m, 1024)
    gs = 2.0 if mode == "nvfp4" else None
    _check_graph(lambda x: qq.qqmm(x, pw, global_scale_x=gs), [x])
    _check_graph(lambda x: qq.qqmm(x, stored, mode=mode, global_scale_x=gs), [x])


def _grouped_one_launch(mode):
    """Hopper's grouped GEMM (built with CUTLASS's headers) or Blackwell's grouped
    block-scaled one (cuBLASLt new enough for `mode`): the group ends are read on the device."""
    from test_grouped import blackwell_grouped, hopper_one_launch
    return hopper_one_launch("cuda") or blackwell_grouped(mode)


def _check_grouped_graph(fn, inputs, ends):
    """fn(*inputs) (reading int32 group ends `ends` on the device) captured, and replayed on
    new values and then on new ends (an empty group first) equal to eager."""
    _check_graph(fn, inputs)
    g = torch.cuda.CUDAGraph()
    with capture(g):
        y = fn(*inputs)
    ends.copy_(torch.tensor([0, 120, 121, 200], dtype=torch.int32))
    y.fill_(7)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, fn(*inputs))
    return y


@pytest.mark.parametrize("mode", ["mxfp8", "nvfp4"])
def test_grouped_qqmm(mode):
    """Hopper or Blackwell: one grouped GEMM, the group ends read on the device - captured, and
    replayed on new ends (an empty group included) as well as new values."""
    if not _grouped_one_launch(mode):
        pytest.skip("grouped_qqmm reads its offsets on the host here (not Hopper built with "
                    "CUTLASS's headers, nor Blackwell with a new enough cuBLASLt)")
    ends = torch.tensor([30, 64, 64, 200], dtype=torch.int32, device="cuda")
    kw = {"global_scale_w": torch.rand(4, device="cuda") + 1} if mode == "nvfp4" else {}
    _check_grouped_graph(lambda x, w: qq.grouped_qqmm(x, w, ends, mode=mode, **kw),
                         [_x(200, 256), _x(4, 136, 256)], ends)


@pytest.mark.parametrize("mode", ["mxfp8", "nvfp4"])
def test_grouped_qqmm_wgrad(mode):
    """Hopper or Blackwell: the weight gradient in a fixed number of launches, the group ends
    read on the device - captured, and replayed on new ends (an empty expert included)."""
    if not _grouped_one_launch(mode):
        pytest.skip("grouped_qqmm_wgrad reads its offsets on the host here")
    x, dy = _x(200, 256), _x(200, 136)
    ends = torch.tensor([30, 64, 64, 200], dtype=torch.int32, device="cuda")
    kw = {"global_scale_x": x.abs().max().float(), "global_scale_dy": dy.abs().max().float()} \
        if mode == "nvfp4" else {}
    dw = _check_grouped_graph(lambda x, dy: qq.grouped_qqmm_wgrad(x, dy, ends, mode=mode, **kw), [x, dy], ends)
    assert not dw[0].any()


def test_grouped_qqmm_under_capture_raises():
    """Where the offsets are read on the host (here: mxfp4 with a float32 result, which
    neither Hopper's grouped GEMM nor Blackwell's grouped block-scaled one takes), capture is
    refused with a clear error."""
    x = _x(64, 256)
    w = _x(2, 128, 256)
    ends = torch.tensor([30, 64], dtype=torch.int32, device="cuda")
    qq.grouped_qqmm(x, w, ends, mode="mxfp4", dtype="float32")          # eager works
    g = torch.cuda.CUDAGraph()
    with capture(g):
        with pytest.raises(qq.NotSupportedError, match="graph"):
            qq.grouped_qqmm(x, w, ends, mode="mxfp4", dtype="float32")


def test_host_waits_under_capture_raise():
    """The calls that wait on the host refuse a captured stream with a clear error before they
    queue anything, so the capture stays valid and replays what else it holds: prepare_decode
    (its one-time conversion checks its scales on the host) and the stream synchronization
    behind a libqq buffer's DLPack export. Before session ay both failed inside CUDA, which
    invalidated the capture."""
    wq = qq.quantize(_x(256, 512), mode="nvfp4")
    qq.prepare_decode(wq)                                                 # eager works
    x = _x(64, 256)
    g = torch.cuda.CUDAGraph()
    with capture(g):
        with pytest.raises(qq.NotSupportedError, match="prepare_decode: .*captured into a CUDA graph"):
            qq.prepare_decode(wq)
        stream = torch.cuda.current_stream().cuda_stream
        with pytest.raises(qq.NotSupportedError, match="(qqStreamSynchronize|_stream_synchronize): .*captured into a CUDA graph"):
            qq._qq._stream_synchronize(torch.cuda.current_device(), stream)
        y = x * 2
    x.fill_(1.5)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, torch.full_like(y, 3.0))


def test_host_wait_on_another_stream_during_a_capture():
    """A host wait on a stream that is not captured, while this thread captures another in
    torch's global mode, works and leaves the capture valid: CUDA prohibits the wait there
    (it invalidated the capture, bench/tune/capture_sync_probe.py, session az), so libqq
    waits in relaxed capture mode. Here the stream synchronization behind a libqq buffer's
    DLPack export. (prepare_decode on a side stream inside a capture is not tried: torch's
    own allocation on that stream fails there, capture_side_stream_probe.py.)"""
    x = _x(64, 256)
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = x * 2
        qq._qq._stream_synchronize(torch.cuda.current_device(), side.cuda_stream)
    x.fill_(1.5)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, torch.full_like(y, 3.0))


def test_device_buffer_freed_inside_a_capture():
    """A libqq device buffer (what qq returns where no CUDA framework made the inputs, and
    the memory behind its DLPack exports) freed while torch captures a graph on another
    stream leaves that capture valid: the free is made outside the capture (relaxed capture
    mode, qqDeviceFree). Before the fix the free invalidated the capture
    (bench/tune/capture_gc_probe.py, session ax).

    The last reference is dropped inside the capture, so the buffer's dealloc runs there,
    as it does when the garbage collector frees it. (Until session ba the test freed it by
    gc.collect() inside the capture. In both full GPU runs, sessions az and ba, the capture
    was then invalidated though the test collected first: the collector freed some other
    test's garbage, which one was not found. In a run of test_graphs.py alone it passed.
    docs/api.md, CUDA graphs, says what such garbage can do.)"""
    x = _x(64, 256)
    buf = qq._qq._device_empty((1 << 20,), "float32", 0)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with capture(g):
        del buf  # the only reference: __dealloc__ -> qqDeviceFree inside the capture
        y = x * 2
    x.fill_(1.5)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, torch.full_like(y, 3.0))


_FIRST_CALL = r"""
import sys, torch, qq
mode, op = sys.argv[1], sys.argv[2]
x = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
w = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
if op == "qqmm":
    fn = lambda: qq.qqmm(x, w, mode="mxfp8")
else:  # the packed weight is quantized before the capture: no handle is made for that
    wq = qq.quantize(w, mode="nvfp4" if op == "qmma" else "mxfp8")
    fn = lambda: qq.quantized_matmul(x[:4] if op == "qmma" else x[:1], wq)
torch.cuda.synchronize()
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g, capture_error_mode=mode):
    y = fn()
route = qq.last_route()
y.fill_(float("nan"))
g.replay()
torch.cuda.synchronize()
assert torch.equal(y.view(torch.uint8), fn().view(torch.uint8)), "replay differs from eager"
print("ok", route)
"""


@pytest.mark.parametrize("mode", ["global", "thread_local"])
@pytest.mark.parametrize("op", ["qqmm", "qmma", "qmv"])
def test_first_call_of_the_process_inside_a_capture(op, mode):
    """A process's first qq call that needs the default handle (its cuBLASLt handle and memory
    pool) may come inside a capture: the handle is made outside it (relaxed capture mode).
    Before session ay cudaMemPoolCreate was refused there and invalidated the capture
    (bench/tune/capture_first_call_where.py). A fresh process, so that no handle exists yet;
    the qqmm case also plans its first cuBLASLt GEMM inside the capture, the qmv case (a
    packed mxfp8 weight at one row) asks for its kernel's occupancy there."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", _FIRST_CALL, mode, op], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0 and r.stdout.startswith("ok"), (r.stdout + r.stderr)[-2000:]
    assert r.stdout.split()[1] == ("exact" if op == "qqmm" else op), r.stdout
