"""Frameworks in, the same framework out: NumPy (buffer protocol, ml_dtypes bfloat16),
torch, JAX and CuPy (DLPack). Results are bit-exact with the reference whatever the
container; QuantizedArray unpacks like MLX's result; out= returns the very object given."""

from __future__ import annotations

import sys

import ml_dtypes
import numpy as np
import pytest

import qq
import reference as R
from helpers import (BF16, DEVICES, as_bytes, assert_bits_equal, assert_matmul_close, assert_quantized_equal,
                     numpy_to_torch, poison, random_data, ref_dequantize_qa, to_numpy, torch_device)

F32 = np.float32


# ---------------------------------------------------------------------------
# NumPy
# ---------------------------------------------------------------------------

def test_numpy_in_numpy_out(rng):
    x = random_data(rng, (8, 64), F32, 16, varied=False)
    q = qq.quantize(x, mode="nvfp4")
    assert type(q.data) is np.ndarray and type(q.scales) is np.ndarray
    assert q.data.dtype == np.uint8 and q.scales.dtype == np.uint8
    d = qq.dequantize(q)
    assert type(d) is np.ndarray and d.dtype == BF16
    assert type(qq.amax(x)) is np.ndarray
    assert type(qq.qqmm(x, x[:4])) is np.ndarray
    assert type(qq.swizzle_scales(q.scales)) is np.ndarray


def test_numpy_bfloat16(rng):
    """ml_dtypes bfloat16 arrays go in through the buffer protocol; bfloat16 comes out as
    ml_dtypes.bfloat16; affine scales and biases keep x's dtype."""
    x = random_data(rng, (8, 128), BF16, 64, varied=False)
    q = qq.quantize(x)
    assert q.scales.dtype == BF16 and q.biases.dtype == BF16
    assert_quantized_equal(q, R.quantize(x), x)
    d = qq.dequantize(q)
    assert d.dtype == BF16
    assert_bits_equal(d, R.dequantize_q(R.quantize(x)))
    y = qq.quantized_matmul(x, q)
    assert y.dtype == BF16
    assert_matmul_close(y, R.quantized_matmul(x, R.quantize(x)))


def test_numpy_float16_and_float8_views(rng):
    """float16 in -> float16 scales; mxfp8 bytes viewed as ml_dtypes float8 are accepted."""
    x = random_data(rng, (4, 64), np.float16, 32)
    q = qq.quantize(x, group_size=32, bits=8)
    assert q.scales.dtype == np.float16
    r = R.quantize(x, mode="mxfp8", fp8_format="e5m2")
    d = qq.dequantize(r.data.view(ml_dtypes.float8_e5m2), r.scales.view(ml_dtypes.float8_e8m0fnu),
                      mode="mxfp8", fp8_format="e5m2", dtype=np.float16)
    assert_bits_equal(d, R.dequantize_q(r, np.float16))


def test_quantized_array_unpacks_like_mlx(rng):
    """data, scales = quantize(w, mode="nvfp4"); data, scales, biases = quantize(w) (affine);
    len() is 2 or 3; and the unpacked pieces work as plain arguments."""
    w = random_data(rng, (16, 64), F32, 16)
    data, scales = qq.quantize(w, mode="nvfp4")
    q = qq.quantize(w, mode="nvfp4")
    assert len(q) == 2
    assert_quantized_equal(q, R.quantize(w, mode="nvfp4"), w)
    assert_bits_equal(as_bytes(data), as_bytes(q.data), "unpacked data")
    assert_bits_equal(as_bytes(scales), as_bytes(q.scales), "unpacked scales")
    assert_bits_equal(qq.dequantize(data, scales, mode="nvfp4"), ref_dequantize_qa(q))
    data, scales, biases = qq.quantize(w)
    assert len(qq.quantize(w)) == 3
    ra = R.quantize(w)
    assert_bits_equal(scales, ra.scales)
    assert_bits_equal(biases, ra.biases)
    assert_bits_equal(qq.dequantize(data, scales, biases), R.dequantize_q(ra))
    with pytest.raises(ValueError):
        data, scales = qq.quantize(w)  # three values to unpack


def test_out_returns_same_object(rng):
    x = random_data(rng, (4, 64), F32, 32, varied=False)
    q = R.quantize(x, mode="mxfp8")
    out = poison((4, 64), F32)
    assert qq.dequantize(q.data, q.scales, mode="mxfp8", out=out) is out
    out = poison((), F32)
    assert qq.amax(x, out=out) is out
    out = poison((128, 4), np.uint8)
    assert qq.swizzle_scales(q.scales, out=out) is out
    out = poison((4, 4), F32)
    assert qq.qqmm(x, x, mode="mxfp8", out=out) is out


def test_info_functions():
    """build_info() has the documented keys; device_count() is an int; __version__ a str."""
    info = qq.build_info()
    for key in ("version", "cuda", "cuda_version", "archs", "cublaslt"):
        assert key in info, key
    assert isinstance(info["cuda"], bool) and isinstance(info["archs"], list)
    assert isinstance(qq.device_count(), int) and qq.device_count() >= 0
    assert isinstance(qq.__version__, str) and qq.__version__.count(".") >= 2
    if not info["cuda"]:
        assert qq.device_count() == 0


# ---------------------------------------------------------------------------
# torch (CPU here; CUDA in the gpu-marked tests)
# ---------------------------------------------------------------------------

def _torch_roundtrip_checks(torch, device, rng):
    x = random_data(rng, (8, 128), BF16, 32, varied=False)
    xt = numpy_to_torch(x, torch).to(device)
    q = qq.quantize(xt, mode="mxfp8")
    assert isinstance(q.data, torch.Tensor) and q.data.device.type == device
    assert q.data.dtype in (torch.uint8, torch.float8_e4m3fn)
    assert q.scales.dtype in (torch.uint8, getattr(torch, "float8_e8m0fnu", torch.uint8))
    ref = R.quantize(x, mode="mxfp8")
    assert_quantized_equal(q, ref, x)
    d = qq.dequantize(q)
    assert isinstance(d, torch.Tensor) and d.dtype == torch.bfloat16 and d.device.type == device
    assert_bits_equal(d, ref_dequantize_qa(q))
    d32 = qq.dequantize(q, dtype=torch.float32)
    assert d32.dtype == torch.float32
    qa = qq.quantize(xt)  # affine: bf16 scales and biases as torch tensors
    assert qa.scales.dtype == torch.bfloat16 and qa.biases.dtype == torch.bfloat16
    assert_quantized_equal(qa, R.quantize(x), x)
    a = qq.amax(xt)
    assert isinstance(a, torch.Tensor) and a.dtype == torch.float32 and tuple(a.shape) == ()
    y = qq.qqmm(xt, xt[:16], mode="nvfp4")
    assert isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16
    assert_matmul_close(y, R.qqmm(x, x[:16], "nvfp4"))
    out = torch.full((8, 128), float("nan"), dtype=torch.float16, device=device)  # poisoned: every element written
    assert qq.dequantize(q, out=out) is out
    assert_bits_equal(out, ref_dequantize_qa(q, np.float16))


def test_torch_cpu(rng):
    torch = pytest.importorskip("torch")
    _torch_roundtrip_checks(torch, "cpu", rng)


def test_torch_results_on_the_inputs_device_under_a_default_device(rng):
    """Results are made on the inputs' device, not torch's default device: inside
    `with torch.device("meta")` a CPU call got meta results (NULL data, refused by libqq)."""
    torch = pytest.importorskip("torch")
    x = rng.standard_normal((4, 64)).astype(np.float32)
    xt = torch.from_numpy(x)
    with torch.device("meta"):
        q = qq.quantize(xt, mode="nvfp4")
        y = qq.dequantize(q, dtype="float32")
        a = qq.amax(xt)
    for t in (q.data, q.scales, y, a):
        assert t.device.type == "cpu"
    assert_bits_equal(y, ref_dequantize_qa(q, np.float32))
    assert float(a) == float(np.abs(x).max())


def _torch_results_checks(torch, device, rng, monkeypatch):
    """qq's torch results come from torch's C shim (qq/_call.pxi, _torch_empty): plain,
    contiguous tensors on the inputs' device that alone hold their memory (the shim's
    handle is deleted: a leaked one would hold a second reference to the tensor), with torch's Python
    allocation (new_empty) not called at all."""
    x = rng.standard_normal((4, 64)).astype(np.float32)
    xt = torch.from_numpy(x).to(device)

    def refuse(self, *a, **k):
        raise AssertionError("torch.Tensor.new_empty was called")
    monkeypatch.setattr(torch.Tensor, "new_empty", refuse)
    q = qq.quantize(xt, mode="nvfp4")
    y = qq.dequantize(q, dtype="float32")
    a = qq.amax(xt)
    monkeypatch.undo()
    assert (q.data.dtype, q.scales.dtype, y.dtype, a.dtype) == (
        torch.uint8, torch.float8_e4m3fn, torch.float32, torch.float32)
    assert (tuple(q.data.shape), tuple(q.scales.shape), tuple(y.shape), tuple(a.shape)) == (
        (4, 32), (4, 4), (4, 64), ())
    for t in (q.data, q.scales, y, a):
        assert type(t) is torch.Tensor and t.is_contiguous() and t.device == xt.device
        assert t._use_count() == 1
    assert_quantized_equal(q, R.quantize(x, mode="nvfp4"), x)
    assert_bits_equal(y, ref_dequantize_qa(q, np.float32))
    assert float(a) == float(np.abs(x).max())


@pytest.mark.skipif(sys.platform != "linux", reason="the C allocation path is looked up in libtorch_cpu.so")
def test_torch_cpu_results_through_the_c_shim(rng, monkeypatch):
    torch = pytest.importorskip("torch")
    _torch_results_checks(torch, "cpu", rng, monkeypatch)


def _refuse_attributes(monkeypatch, torch):
    """Make the Python attributes that _import_torch's attribute path reads raise."""
    def refuse(self, *a, **k):
        raise AssertionError("a torch.Tensor attribute was read from Python")
    for name in ("stride", "data_ptr", "get_device"):
        monkeypatch.setattr(torch.Tensor, name, refuse)


@pytest.mark.skipif(sys.platform != "linux", reason="THPVariable_Wrap is looked up in libtorch_python.so")
def test_torch_tensors_through_the_dlpack_exchange_table(rng, monkeypatch):
    """torch tensors (and nn.Parameters) are read through torch's DLPack C exchange table
    (qq/_dlpack.pxi, _import_torch_c) - none of their Python attributes is read - with
    every kind of strided view described exactly: a storage offset, a row stride, a
    broadcast batch (stride 0), 1-D, 3-D, zero rows. Results come from the shim, wrapped by
    THPVariable_Wrap (a C call)."""
    torch = pytest.importorskip("torch")
    if not hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
        pytest.skip("this torch has no DLPack exchange table")
    x = random_data(rng, (6, 128), F32, 16)
    base = torch.from_numpy(x)
    qq.quantize(base, mode="mxfp8", torch_dtypes=False)       # makes the uint8 result kind
    paths = qq._qq._torch_fast_paths()
    if not (paths["exchange"] and paths["thp_wrap"] and paths["kinds"][("uint8", -1)] == (True, True)):
        pytest.skip(f"this torch lacks a C path qq uses: {paths}")
    cases = {
        "contiguous": (base, x),
        "storage offset": (base[1:], x[1:]),
        "row stride": (base[::2], x[::2]),
        "1-D": (base[3], x[3]),
        "3-D": (base.reshape(2, 3, 128), x.reshape(2, 3, 128)),
        "broadcast batch": (base[:2].expand(3, 2, 128), np.broadcast_to(x[:2], (3, 2, 128))),
        "zero rows": (base[:0], x[:0]),
        "parameter": (torch.nn.Parameter(base.clone(), requires_grad=False), x),
        "bfloat16": (base.bfloat16(), base.bfloat16().float().numpy()),
    }
    got = {}
    with monkeypatch.context() as m:
        _refuse_attributes(m, torch)
        for name, (t, _) in cases.items():
            got[name] = qq.quantize(t, mode="mxfp8", torch_dtypes=False)
    for name, (_, ref_x) in cases.items():
        ref_x = np.ascontiguousarray(ref_x, dtype=np.float32)
        assert_quantized_equal(got[name], R.quantize(ref_x, mode="mxfp8"), ref_x)


def test_torch_c_paths_in_use_on_linux():
    """On Linux with this torch (2.13), the C paths are found: the exchange table,
    THPVariable_Wrap and _alloc_from_pool for quantize's one block (a silent fallback would
    only show as lost speed)."""
    torch = pytest.importorskip("torch")
    if sys.platform != "linux" or not hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
        pytest.skip("not Linux, or a torch without the exchange table")
    qq.quantize(torch.zeros(1, 32), mode="nvfp4", torch_dtypes=False)
    paths = qq._qq._torch_fast_paths()
    assert paths["exchange"] and paths["thp_wrap"], paths
    assert paths["kinds"][("uint8", -1)] == (True, True), paths
    assert paths["pool"].get(-1) is True, paths     # quantize's results in one block


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kw", [dict(mode="nvfp4"), dict(mode="mxfp8", torch_dtypes=False),
                                dict(mode="mxfp4", scale_layout="blocked")],
                         ids=["nvfp4", "mxfp8-uint8", "mxfp4-blocked"])
def test_torch_quantize_results_share_one_block(kw, device, rng):
    """A torch caller's qq.quantize results come out of one allocation (docs/api.md, "quantize's
    results share one storage"): each a plain contiguous tensor of its own dtype, at a
    multiple of 256 bytes of one storage, none overlapping another; the bytes are the
    reference's; one result alone keeps the block alive."""
    torch = pytest.importorskip("torch")
    import gc
    tdev = torch_device(device)
    x = random_data(rng, (130, 96), F32, 16)
    t = torch.from_numpy(x).to(tdev)
    q = qq.quantize(t, **kw)
    paths = qq._qq._torch_fast_paths()
    pool = paths["pool"].get(-1 if device == "cpu" else tdev.index or 0)
    if not pool:
        if sys.platform == "linux" and hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
            raise AssertionError(f"the one-block path is off with this torch on Linux: {paths}")
        pytest.skip(f"this torch has no C path to one block: {paths}")
    assert_quantized_equal(q, R.quantize(x, **{k: v for k, v in kw.items() if k != "torch_dtypes"}), x)
    parts = [q.data, q.scales] + ([q.biases] if q.biases is not None else [])
    base = parts[0].untyped_storage().data_ptr()
    end = base
    for p in parts:
        assert type(p) is torch.Tensor and p.is_contiguous() and p._base is None and p.device.type == tdev.type
        assert p.untyped_storage().data_ptr() == base
        assert (p.data_ptr() - base) % 256 == 0 and p.data_ptr() >= end, [
            (r.data_ptr() - base, r.nbytes) for r in parts]
        end = p.data_ptr() + p.nbytes
    assert parts[0].untyped_storage().nbytes() >= end - base
    scales = q.scales.cpu().clone()
    kept = q.scales
    block = kept.untyped_storage().nbytes()
    del q, parts, p
    gc.collect()
    # blocks of the same size, poisoned: one of them would take the block's memory had it
    # been freed with the other results (both allocators hand a freed block of a size back to
    # the next request of that size)
    fill = [torch.full((block,), 0xAB, dtype=torch.uint8, device=tdev) for _ in range(8)]
    assert torch.equal(kept.cpu().view(torch.uint8), scales.view(torch.uint8))
    del fill


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kw", [dict(bits=4, group_size=32), dict(bits=8, group_size=64), dict(mode="nvfp4"),
                                dict(mode="mxfp8")], ids=["affine4", "affine8", "nvfp4", "mxfp8"])
def test_torch_quantize_results_save_together(kw, device, rng):
    """torch.save of a quantize result's tensors together (a state dict) works and loads the
    same bytes: affine's float scales and biases are allocated apart from its uint8 data
    (torch refuses to save views of one storage as dtypes of different sizes; docs/api.md,
    "quantize's results share one storage"); the fp modes' byte results share their block."""
    torch = pytest.importorskip("torch")
    import io
    x = random_data(rng, (64, 128), F32, 32)
    q = qq.quantize(torch.from_numpy(x).to(torch_device(device)), **kw)
    parts = [q.data, q.scales] + ([q.biases] if q.biases is not None else [])
    if q.biases is not None:
        ptrs = {p.untyped_storage().data_ptr() for p in parts}
        assert len(ptrs) == len(parts), "affine results share a storage"
    buf = io.BytesIO()
    torch.save({"data": q.data, "scales": q.scales, "biases": q.biases}, buf)
    buf.seek(0)
    back = torch.load(buf)
    for name in ("data", "scales", "biases"):
        a, b = getattr(q, name), back[name]
        assert (a is None) == (b is None)
        if a is not None:
            assert a.dtype == b.dtype and torch.equal(a.cpu().view(torch.uint8), b.cpu().view(torch.uint8))


def test_torch_quantize_results_apart_inside_a_dispatch_mode(rng):
    """Inside a torch dispatch mode the results are allocated through torch's Python path, one
    each (the mode sees every allocation), with the same bytes."""
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    x = random_data(rng, (4, 64), F32, 16)
    with Log():
        q = qq.quantize(torch.from_numpy(x), mode="nvfp4")
    assert q.data.untyped_storage().data_ptr() != q.scales.untyped_storage().data_ptr()
    assert sum("empty" in f for f in seen) >= 2, seen
    assert_quantized_equal(q, R.quantize(x, mode="nvfp4"), x)


def test_cxx_exceptions_do_not_cross_the_extension():
    """The call into torch's C++ (THPVariable_Wrap) goes through qq_call_wrap
    (python/qq/_cxx_call.cpp): a C++ exception becomes a RuntimeError (crossing the C frames
    of the Cython module would end the process)."""
    with pytest.raises(RuntimeError, match="qq_throwing_for_test"):
        qq._qq._cxx_call_selftest()


def test_nothing_python_while_the_gil_is_released():
    """Between `_gil = call.unlock()` and `_relock(_gil)` (python/qq/_ops_*.pxi) the GIL may be
    released: Cython cannot check what runs there (its `with nogil:` takes no run-time
    condition), so this does - only the C call (`st = qq...(...)`) and branches on C flags
    declared `cdef bint` in the same file."""
    import pathlib
    import re
    root = pathlib.Path(__file__).resolve().parents[1] / "python" / "qq"
    regions = 0
    for path in sorted(root.glob("_ops_*.pxi")):
        text = path.read_text()
        bints = set(re.findall(r"cdef bint (\w+)", text))
        lines = text.splitlines()
        for i, line in enumerate(lines):
            if line.strip() != "_gil = call.unlock()":
                continue
            regions += 1
            j = i + 1
            while lines[j].strip() != "_relock(_gil)":
                body = lines[j].strip()
                m = re.fullmatch(r"if (\w+):", body)
                ok = (re.fullmatch(r"st = qq[A-Za-z]+\([\w&, ]*\)", body) is not None or body == "else:"
                      or (m is not None and m.group(1) in bints))
                assert ok, f"{path.name}:{j + 1}: {body!r} between unlock() and _relock()"
                j += 1
    assert regions >= 18, regions


def test_torch_subclasses_are_read_through_their_attributes(rng, monkeypatch):
    """A torch.Tensor subclass other than nn.Parameter (it may override what its attributes
    say) is read through its Python attributes, not the exchange table. (Its module is
    torch's, so that qq takes it for a torch tensor, as it does torch's own subclasses.)"""
    torch = pytest.importorskip("torch")

    class Sub(torch.Tensor):
        __module__ = "torch.qq_test_subclass"

    x = random_data(rng, (4, 64), F32, 16)
    t = torch.from_numpy(x).as_subclass(Sub)
    seen = []
    orig = torch.Tensor.stride

    def spy(self, *a):
        seen.append(type(self))
        return orig(self, *a)
    monkeypatch.setattr(torch.Tensor, "stride", spy)
    got = qq.quantize(t, mode="nvfp4", torch_dtypes=False)
    monkeypatch.undo()
    assert type(t) in seen
    assert isinstance(got.data, torch.Tensor)
    assert_quantized_equal(got, R.quantize(x, mode="nvfp4"), x)


def test_torch_subclass_from_elsewhere_gets_torch_results(rng):
    """A torch.Tensor subclass defined outside torch (a user's, a library's) is a torch
    tensor to qq: results are torch tensors (they were NumPy arrays: such a tensor was an
    unknown CPU producer)."""
    torch = pytest.importorskip("torch")

    class Mine(torch.Tensor):
        pass

    x = random_data(rng, (4, 64), F32, 16)
    t = torch.from_numpy(x).as_subclass(Mine)
    q = qq.quantize(t, mode="nvfp4")
    y = qq.dequantize(q, dtype="float32")
    for r in (q.data, q.scales, y):
        assert isinstance(r, torch.Tensor), type(r)
    assert_quantized_equal(q, R.quantize(x, mode="nvfp4"), x)
    assert_bits_equal(y, ref_dequantize_qa(q, np.float32))


def test_torch_results_under_a_dispatch_mode_go_through_it(rng):
    """Inside a TorchDispatchMode (a tracer, a FakeTensorMode, a logger) results are made by
    torch's Python path, so the mode sees them; the C path would bypass it."""
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode

    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    x = rng.standard_normal((4, 64)).astype(np.float32)
    with Log() as log:
        q = qq.quantize(torch.from_numpy(x), mode="mxfp8")
    assert sum("new_empty" in o for o in log.ops) == 2, log.ops
    assert_quantized_equal(q, R.quantize(x, mode="mxfp8"), x)


@pytest.mark.gpu
def test_torch_cuda_results_through_the_c_shim(rng, monkeypatch):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    _torch_results_checks(torch, "cuda", rng, monkeypatch)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    xt = torch.randn(64, 4096, device="cuda")
    for _ in range(10):
        q = qq.quantize(xt, mode="nvfp4")
        del q
    del xt
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == base  # every result's memory went back to torch


@pytest.mark.gpu
def test_torch_cuda(rng):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    _torch_roundtrip_checks(torch, "cuda", rng)


@pytest.mark.gpu
def test_torch_cuda_stream(rng):
    """A torch stream (an object with __cuda_stream__, or its int handle) is accepted and
    the result is right once that stream is synchronized."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    x = random_data(rng, (256, 512), F32, 16)
    xt = torch.from_numpy(x).cuda()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        q = qq.quantize(xt, mode="nvfp4")  # stream=None: the current (side) stream
    q2 = qq.quantize(xt, mode="nvfp4", stream=s.cuda_stream)
    q3 = qq.quantize(xt, mode="nvfp4", stream=s)
    s.synchronize()
    ref = R.quantize(x, mode="nvfp4")
    for got in (q, q2, q3):
        assert_quantized_equal(got, ref, x)


@pytest.mark.gpu
def test_torch_cuda_current_stream_through_the_exchange_table():
    """qq reads torch's current stream (a side stream inside `with torch.cuda.stream(s)`,
    the default stream outside it) through torch's exchange table where it has one."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        inside = qq._qq._torch_fast_paths(0)
    outside = qq._qq._torch_fast_paths(0)
    assert inside["stream"] == s.cuda_stream
    assert outside["stream"] == torch.cuda.current_stream().cuda_stream
    assert inside["exchange"] == hasattr(torch.Tensor, "__dlpack_c_exchange_api__")


def _no_torch_dlpack(monkeypatch, torch):
    def refuse(self, *a, **k):
        raise AssertionError("torch's __dlpack__ was called")
    monkeypatch.setattr(torch.Tensor, "__dlpack__", refuse)


def test_torch_cpu_explicit_stream_reads_tensors_directly(rng, monkeypatch):
    """CPU tensors ignore stream=, so an explicit one takes the direct read too (not
    torch's __dlpack__, several microseconds a tensor): refused here, the call still works."""
    torch = pytest.importorskip("torch")
    x = random_data(rng, (4, 64), F32, 16, varied=False)
    _no_torch_dlpack(monkeypatch, torch)
    got = qq.quantize(torch.from_numpy(x), mode="mxfp8", torch_dtypes=False, stream=0)
    assert_quantized_equal(got, R.quantize(x, mode="mxfp8"), x)


@pytest.mark.gpu
def test_torch_cuda_explicit_current_stream(rng, monkeypatch):
    """stream= naming torch's current stream (a side stream here) reads the tensors as
    stream=None does, without torch's __dlpack__ (~10 us a tensor on CUDA); another stream
    still goes through __dlpack__, which orders it after torch's current stream."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    x = random_data(rng, (256, 512), F32, 16)
    ref = R.quantize(x, mode="nvfp4")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        xt = torch.from_numpy(x).cuda() * 1     # produced on s
        with monkeypatch.context() as m:
            _no_torch_dlpack(m, torch)
            got = [qq.quantize(xt, mode="nvfp4", stream=s.cuda_stream),
                   qq.quantize(xt, mode="nvfp4", stream=s)]
        with pytest.raises(AssertionError, match="__dlpack__"):
            with monkeypatch.context() as m:
                _no_torch_dlpack(m, torch)
                qq.quantize(xt, mode="nvfp4", stream=torch.cuda.default_stream().cuda_stream)
    s.synchronize()
    for q in got:
        assert_quantized_equal(q, ref, x)


# ---------------------------------------------------------------------------
# JAX and CuPy
# ---------------------------------------------------------------------------

def test_jax_cpu(rng):
    jnp = pytest.importorskip("jax.numpy")
    import jax

    cpu = jax.devices("cpu")[0]  # a JAX with CUDA would put arrays on the GPU by default
    x = random_data(rng, (8, 64), F32, 16)
    xj = jax.device_put(x, cpu)
    q = qq.quantize(xj, mode="nvfp4")
    assert isinstance(q.data, jax.Array)
    ref = R.quantize(x, mode="nvfp4")
    assert_quantized_equal(q, ref, x)
    d = qq.dequantize(q)
    assert isinstance(d, jax.Array) and d.dtype == jnp.bfloat16
    assert_bits_equal(np.asarray(d), ref_dequantize_qa(q))
    xb = jax.device_put(random_data(rng, (8, 64), BF16, 64), cpu)
    qa = qq.quantize(xb)
    assert qa.scales.dtype == jnp.bfloat16
    assert_quantized_equal(qa, R.quantize(np.asarray(xb)), np.asarray(xb))


@pytest.mark.gpu
def test_cupy(rng):
    cp = pytest.importorskip("cupy")
    x = random_data(rng, (64, 256), F32, 32)
    xc = cp.asarray(x)
    q = qq.quantize(xc, mode="mxfp4", scale_layout="blocked")
    assert isinstance(q.data, cp.ndarray) and isinstance(q.scales, cp.ndarray)
    ref = R.quantize(x, mode="mxfp4", scale_layout="blocked")
    assert_quantized_equal(q, ref, x)
    d = qq.dequantize(q, dtype="float32")
    assert isinstance(d, cp.ndarray)
    assert_bits_equal(to_numpy(d), ref_dequantize_qa(q, F32))
    out = cp.empty((64, 256), dtype=cp.float16)
    assert qq.dequantize(q, out=out) is out
    assert_bits_equal(out.get(), ref_dequantize_qa(q, np.float16))
