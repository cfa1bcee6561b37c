"""Regression tests of a hostile-input probe of the less-travelled Python API on the CPU
(gather_qmm, grouped_qqmm(_wgrad), quantized_matmul(_swiglu), prepare_decode,
unswizzle_scales, QuantizedArray, qq.checkpoint): each test names the defect it pins down."""

from __future__ import annotations

import json

import numpy as np
import pytest

import qq
import qq.checkpoint as ck
from helpers import raises

F32 = np.float32
RNG = np.random.default_rng(0)
X = RNG.standard_normal((8, 64)).astype(F32)
W3 = RNG.standard_normal((3, 16, 64)).astype(F32)
OFF = np.array([2, 5, 8], np.int32)


def _big(shape, base):
    """A stride-0 view of `base` with a huge leading batch (no memory behind it)."""
    return np.lib.stride_tricks.as_strided(base, shape, (0,) * (len(shape) - base.ndim) + base.strides)


# ---- 1. None where a required array goes: a segfault (a None view dereferenced) ------------

def _qa_without_data(shape, **kw):
    q = qq.quantize(RNG.standard_normal(shape).astype(F32), **kw)
    q.data = None
    return q


@pytest.mark.parametrize("call, names", [
    (lambda: qq.quantized_matmul(X, None), ("quantized_matmul", "w")),
    (lambda: qq.quantized_matmul(X, None, transpose=False), ("quantized_matmul", "w")),
    (lambda: qq.quantized_matmul_swiglu(X, None), ("w",)),
    (lambda: qq.gather_qmm(X[None], None, rhs_indices=np.array([0], np.int32)), ("gather_qmm", "w")),
    (lambda: qq.grouped_qqmm(X, None, OFF), ("grouped_qqmm", "w")),
    (lambda: qq.grouped_qqmm_wgrad(X, None, OFF), ("grouped_qqmm_wgrad", "dy")),
    (lambda: qq.grouped_qqmm_wgrad(X, X[:, :16], None), ("grouped_qqmm_wgrad", "offsets")),
    (lambda: qq.grouped_qqmm(X, W3, None), ("grouped_qqmm", "offsets")),
    (lambda: qq.qqmm(X, _qa_without_data((16, 64), mode="mxfp8"), mode="mxfp8"), ("qqmm", "w")),
    (lambda: qq.quantized_matmul(X, _qa_without_data((16, 64), mode="mxfp8")), ("quantized_matmul", "w")),
    (lambda: qq.gather_qmm(X[None], _qa_without_data((3, 16, 64), mode="mxfp8"),
                           rhs_indices=np.array([0], np.int32)), ("gather_qmm", "w")),
    (lambda: qq.grouped_qqmm(X, _qa_without_data((3, 16, 64), mode="mxfp8"), OFF), ("grouped_qqmm", "w")),
], ids=["qmm-w", "qmm-w-T", "qmm-swiglu-w", "gather-w", "grouped-w", "wgrad-dy", "wgrad-offsets",
        "grouped-offsets", "qqmm-qa-data", "qmm-qa-data", "gather-qa-data", "grouped-qa-data"])
def test_none_for_a_required_array_is_a_type_error(call, names):
    """Before: a segfault (grouped_qqmm(x, w, None): a ValueError 'offsets is NULL')."""
    raises(TypeError, names, call)


# ---- 2. grouped_qqmm with no experts but tokens: uninitialized memory returned --------------

def test_grouped_no_experts_with_tokens_is_refused():
    """Before: offsets [] with T = 8 returned np.empty's garbage (no expert wrote out)."""
    raises(ValueError, ("grouped_qqmm", "offsets"), qq.grouped_qqmm, X, W3[:0], np.array([], np.int32))
    y = qq.grouped_qqmm(X[:0], W3[:0], np.array([], np.int32))    # T = 0, E = 0 stays valid
    assert y.shape == (0, 16)


# ---- 3. results too large for any array: NumPy's / torch's bare errors ----------------------

W64 = RNG.standard_normal((3, 64, 32)).astype(F32)
XBIG = _big((2**28, 2**28, 1, 32), np.ones((1, 32), np.float16))   # 2^62 bytes of view, no memory


def _torch_big():
    torch = pytest.importorskip("torch")
    x = torch.ones(1, 1, 1, 64).expand(2**26, 2**26, 1, 64)
    return qq.qqmm(x, torch.ones(64, 64), mode="mxfp8")


@pytest.mark.parametrize("call, func", [
    (lambda: qq.unswizzle_scales(np.zeros((128, 4), np.uint8), (2**62, 3)), "unswizzle_scales"),
    (lambda: qq.unswizzle_scales(np.zeros((128, 4), np.uint8), (2**70, 3)), "unswizzle_scales"),
    (lambda: qq.gather_qmm(XBIG, qq.quantize(W64, mode="mxfp8"), rhs_indices=np.array(0, np.int32),
                           dtype="float32"), "gather_qmm"),
    (lambda: qq.qqmm(XBIG, W64[0], mode="mxfp8", dtype="float32"), "qqmm"),
    (lambda: qq.quantized_matmul(XBIG, qq.quantize(W64[0], mode="mxfp8"), dtype="float32"), "quantized_matmul"),
    (_torch_big, "qqmm"),
], ids=["unswizzle-2^62", "unswizzle-2^70", "gather_qmm", "qqmm", "quantized_matmul", "qqmm-torch"])
def test_result_beyond_any_array_names_the_function(call, func):
    """Before: NumPy's 'array is too big; arr.size * arr.dtype.itemsize ...', 'Python int too
    large to convert to C long' or torch's 'Storage size calculation overflowed', naming no
    function or argument (broadcast batch axes of stride-0 views, a huge `shape`)."""
    e = raises(ValueError, (func,), call)
    assert str(e).startswith(func + ":"), str(e)


def test_unswizzle_shape_larger_than_the_scales_is_refused_before_allocating():
    raises(ValueError, ("unswizzle_scales", "shape"), qq.unswizzle_scales,
           np.zeros((128, 4), np.uint8), (2**40, 2**20))


# ---- 4. a Python int global scale beyond float64 ----------------------------------------------

@pytest.mark.parametrize("gs", [10**400, -10**400, 1e300], ids=["10^400", "-10^400", "1e300"])
def test_python_global_scale_beyond_float32(gs):
    """Before: 10**400 gave a bare OverflowError 'int too large to convert to float'; 1e300 a
    NumPy overflow RuntimeWarning and then 'is inf'."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        raises(ValueError, ("quantize", "global_scale"), qq.quantize, X, mode="nvfp4", global_scale=gs)


# ---- 5. QuantizedArray(shape=...) that contradicts its data ---------------------------------

def test_quantized_array_shape_must_match_data():
    """Before: accepted; dequantize then said "argument 'out' has shape (16, 64)" (no out was
    given) or, for a negative extent, NumPy's bare 'negative dimensions are not allowed'."""
    q = qq.quantize(X, mode="nvfp4")
    raises(ValueError, ("QuantizedArray", "shape"), qq.QuantizedArray, q.data, q.scales, mode="nvfp4",
           shape=(16, 64))
    raises(ValueError, ("QuantizedArray", "shape"), qq.QuantizedArray, q.data, q.scales, mode="nvfp4",
           shape=(-8, 64))
    raises(ValueError, ("QuantizedArray", "shape"), qq.QuantizedArray, q.data, q.scales, mode="nvfp4",
           shape=(8, 40))
    raises(TypeError, ("QuantizedArray", "shape"), qq.QuantizedArray, q.data, q.scales, mode="nvfp4",
           shape="ab")
    assert qq.QuantizedArray(q.data, q.scales, mode="nvfp4", shape=np.array([8, 64])).shape == (8, 64)


# ---- 6. prepare_decode's messages named C entry points ----------------------------------------

def test_prepare_decode_messages_name_prepare_decode():
    """Before: 'to_decode_layout_gated: w has N = 96 rows ...', 'to_decode_layout: argument 'w'
    has stride 2 ...'."""
    w = RNG.standard_normal((96, 256)).astype(F32)
    e = raises(ValueError, ("prepare_decode",), qq.prepare_decode, qq.quantize(w, mode="nvfp4"), gated=True)
    assert str(e).startswith("prepare_decode:"), str(e)
    q = qq.quantize(w[:64], mode="nvfp4")
    d = np.zeros((64, 256), np.uint8)
    d[:, ::2] = q.data
    e = raises(ValueError, ("w",), qq.prepare_decode, qq.QuantizedArray(d[:, ::2], q.scales, mode="nvfp4"))
    assert str(e).startswith("prepare_decode:"), str(e)


# ---- 7. quantized_matmul_swiglu's refusals named swiglu and its x -----------------------------

def test_quantized_matmul_swiglu_names_itself():
    """Before: an odd N gave "swiglu: argument 'x' has shape (4, 3)", a wrong out "swiglu:
    argument 'out' ... (x's shape with the last axis halved)"."""
    x = RNG.standard_normal((4, 64)).astype(F32)
    q3 = qq.quantize(RNG.standard_normal((3, 64)).astype(F32), mode="nvfp4")
    e = raises(ValueError, ("w",), qq.quantized_matmul_swiglu, x, q3, mode="nvfp4")
    assert str(e).startswith("quantized_matmul_swiglu:"), str(e)
    q8 = qq.quantize(RNG.standard_normal((8, 64)).astype(F32), mode="nvfp4")
    e = raises(ValueError, ("out",), qq.quantized_matmul_swiglu, x, q8, out=np.empty((4, 8), F32))
    assert str(e).startswith("quantized_matmul_swiglu:"), str(e)
    y = qq.quantized_matmul_swiglu(x, q8)
    assert y.shape == (4, 4)


# ---- 8. qq.checkpoint on malformed files -------------------------------------------------------

def _file(tmp_path):
    p = tmp_path / "a.safetensors"
    ck.save(p, {"w": qq.quantize(X, mode="nvfp4", global_scale=qq.amax(X)), "b": np.ones(3, F32)})
    raw = p.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return p, raw, n, json.loads(raw[8:8 + n])


def _write(tmp_path, header, body):
    hb = json.dumps(header).encode()
    q = tmp_path / "b.safetensors"
    q.write_bytes(len(hb).to_bytes(8, "little") + hb + body)
    return q


def test_read_raw_malformed_files(tmp_path):
    """Before: NumPy's 'cannot reshape array of size 22 into shape (8,4)' (truncated file),
    KeyError 'data_offsets', TypeError 'pop expected at most 1 argument' (a JSON list
    header), IndexError (0-d F4), and a shape of [-1, 32] silently inferred."""
    pytest.importorskip("safetensors")  # (the sanitizer stage of .ci/run installs no extras)
    p, raw, n, hdr = _file(tmp_path)
    body = raw[8 + n:]
    t = tmp_path / "t.safetensors"
    t.write_bytes(raw[:-10])
    cases = [t, _write(tmp_path, [1, 2], body)]
    for entry in [5, {"dtype": "U8", "shape": [8, 32]}, dict(hdr["w"], shape=[-1, 32]),
                  dict(hdr["w"], shape=[9, 32]), dict(hdr["w"], dtype="F4", shape=[]),
                  dict(hdr["w"], data_offsets=[0, 10**6]), dict(hdr["w"], data_offsets=hdr["w"]["data_offsets"][::-1]),
                  dict(hdr["w"], dtype="F32", shape=[7])]:
        cases.append(_write(tmp_path, dict(hdr, w=entry), body))
        for bad in cases[-1:]:
            raises(ValueError, ("qq.checkpoint.read_raw",), ck.read_raw, bad)
    raises(ValueError, ("qq.checkpoint.read_raw",), ck.read_raw, cases[0])
    raises(ValueError, ("qq.checkpoint.read_raw",), ck.read_raw, cases[1])


def test_load_malformed_files(tmp_path):
    """Before: safetensors' own SafetensorError (no function, no path) for a truncated file;
    metadata whose shape contradicts the data loaded, and failed later with a message about an
    'out' never passed."""
    pytest.importorskip("safetensors")  # (the sanitizer stage of .ci/run installs no extras)
    p, raw, n, hdr = _file(tmp_path)
    t = tmp_path / "t.safetensors"
    t.write_bytes(raw[:-10])
    raises(ValueError, ("qq.checkpoint.load",), ck.load, t)
    for shape in ([16, 64], [-8, 64]):
        meta = dict(hdr["__metadata__"])
        info = json.loads(meta["qq.quantized.w"])
        info["shape"] = shape
        meta["qq.quantized.w"] = json.dumps(info)
        raises(ValueError, ("qq.checkpoint.load", "'w'"), ck.load, _write(tmp_path, dict(hdr, __metadata__=meta),
                                                                          raw[8 + n:]))
    assert sorted(ck.load(p)) == ["b", "w"]


# ---- dtype errors are TypeErrors, arguments named as the caller passed them ----------------

def test_gather_qmm_float_indices_is_a_type_error():
    """Before: a ValueError (libqq's INVALID_VALUE); a wrong dtype is a TypeError everywhere else."""
    w = qq.quantize(W3, mode="mxfp8")
    with pytest.raises(TypeError, match="gather_qmm: argument 'rhs_indices' must be int32"):
        qq.gather_qmm(X[:2, None], w, rhs_indices=np.array([0, 1], F32))


def test_grouped_qqmm_wgrad_dtype_is_checked_as_everywhere():
    """Before: dtype='int32' was a ValueError in eager calls and a TypeError under torch.compile,
    and a NumPy dtype (np.float32) was refused."""
    dy = RNG.standard_normal((8, 32)).astype(F32)
    with pytest.raises(TypeError, match="grouped_qqmm_wgrad: dtype: expected"):
        qq.grouped_qqmm_wgrad(X, dy, OFF, dtype="int32")
    a = qq.grouped_qqmm_wgrad(X, dy, OFF, dtype=np.float32)
    b = qq.grouped_qqmm_wgrad(X, dy, OFF)
    assert a.dtype == np.float32 and np.array_equal(a, b)


def test_prepare_weight_none_names_w():
    """Before: "prepare_weight: x: expected a NumPy array ..." for prepare_weight(None)."""
    with pytest.raises(TypeError, match="^prepare_weight: w: expected a NumPy array"):
        qq.prepare_weight(None)


@pytest.mark.parametrize("call, name", [
    (lambda: qq.quantize_colwise(X, mode="mxfp8", rowwise="yes"), "rowwise"),
    (lambda: qq.quantize_dequantize(X, colwise="no"), "colwise"),
    (lambda: qq.quantize_dequantize(X, rowwise=1), "rowwise"),
])
def test_flags_must_be_bools(call, name):
    """Before: a string or a number was read by its truth value (colwise="no" as True)."""
    with pytest.raises(TypeError, match=f": {name} must be True or False"):
        call()


def test_numpy_bools_are_flags():
    a = qq.quantize_dequantize(X, rowwise=np.bool_(True), colwise=np.bool_(False))
    assert np.array_equal(np.asarray(a), np.asarray(qq.quantize_dequantize(X)))


def test_checkpoint_per_tensor_scales_checked():
    """Before: a string weight_scale_2 and a 0-d MLX weight gave NumPy's own errors; a zero
    compressed-tensors weight_global_scale became an infinite global scale (with a warning)."""
    mo = {"l.weight": np.zeros((4, 16), np.uint8), "l.weight_scale": np.zeros((4, 2), np.uint8)}
    with pytest.raises(ValueError, match="from_modelopt: 'l.weight_scale_2' is not a float32"):
        ck.from_modelopt({**mo, "l.weight_scale_2": "abc"}, "l")
    with pytest.raises(ValueError, match="from_modelopt: 'l.weight_scale_2' holds"):
        ck.from_modelopt({**mo, "l.weight_scale_2": np.array([np.nan], F32)}, "l")
    ct = {"l.weight_packed": np.zeros((4, 16), np.uint8), "l.weight_scale": np.zeros((4, 2), np.uint8),
          "l.weight_global_scale": np.zeros(1, F32)}
    with pytest.raises(ValueError, match="from_compressed_tensors: 'l.weight_global_scale' holds .*positive"):
        ck.from_compressed_tensors(ct, "l")
    # 2688 / amax of an all-zero weight: +Inf, no global scale (as before)
    q = ck.from_compressed_tensors({**ct, "l.weight_global_scale": np.array([np.inf], F32)}, "l")
    assert float(np.asarray(q.global_scale).reshape(-1)[0]) == 0.0
    with pytest.raises(ValueError, match="mixes \\+Inf"):  # fused shards: one all-zero, one not
        ck.from_compressed_tensors({**ct, "l.weight_global_scale": np.array([np.inf, 448.0], F32)}, "l")
    mlx = {"l.weight": np.zeros((), np.uint32), "l.scales": np.zeros((4, 2), np.float16),
           "l.biases": np.zeros((4, 2), np.float16)}
    with pytest.raises(ValueError, match="from_mlx: l.weight has shape"):
        ck.from_mlx(mlx, "l")


def test_quantized_matmul_swiglu_names_itself_for_its_matmul():
    """Before: its matmul half's refusals began "quantized_matmul:"."""
    w = qq.quantize(RNG.standard_normal((16, 64)).astype(F32), mode="mxfp8")
    with pytest.raises(ValueError, match="^quantized_matmul_swiglu: 'x' has K=32"):
        qq.quantized_matmul_swiglu(np.zeros((2, 32), F32), w)


def test_checkpoint_cut_inside_header_is_truncated(tmp_path):
    """Review: a file cut inside its JSON header said "its header is not JSON"."""
    pytest.importorskip("safetensors")  # (the sanitizer stage of .ci/run installs no extras)
    p, raw, n, hdr = _file(tmp_path)
    t = tmp_path / "cut.safetensors"
    t.write_bytes(raw[:20])
    with pytest.raises(ValueError, match="read_raw: .* the file is truncated"):
        ck.read_raw(t)


def test_deinterleave_parts_is_not_a_bool():
    """The probe's report: parts=True was taken as 1 (a bool is an int)."""
    qa = qq.quantize(RNG.standard_normal((8, 64)).astype(F32), mode="mxfp8")
    with pytest.raises(ValueError, match="deinterleave: parts: expected a positive int, got True"):
        ck.deinterleave(qa, parts=True)
    assert len(ck.deinterleave(qa, parts=2)) == 2


# ---- Session aa's probe (quantize family, MoE / prepared weights, qq.torch) -----------------

def test_mode_as_a_str_subclass():
    """Before: numpy.str_ passed the checks, libqq ran, then building the QuantizedArray raised a
    Cython TypeError naming neither the function nor the argument."""
    x = np.ones((32, 32), F32)
    for fn in (qq.quantize, qq.quantize_colwise):
        q = fn(x, mode=np.str_("mxfp8"), scale_layout=np.str_("linear"))
        assert type(q.mode) is str and q.mode == "mxfp8" and type(q.scale_layout) is str
    assert type(qq.QuantizedArray(q.data, q.scales, mode=np.str_("mxfp8")).mode) is str


def test_group_size_check_does_not_depend_on_earlier_calls():
    """Before: group_size=32.0 was refused in a fresh process but accepted once 32 had been
    seen (the cache of resolved parameters matched 32.0 to 32's entry)."""
    x = np.ones((64, 64), F32)
    qq.quantize_colwise(x, group_size=32, mode="affine")
    raises(TypeError, "group_size", qq.quantize_colwise, x, group_size=32.0, mode="affine")
    qq.quantize(x, bits=4, mode="affine")
    raises(TypeError, "bits", qq.quantize, x, bits=4.0, mode="affine")


def test_qdq_moe_flags_are_true_or_false():
    """Before: values= / transposed= took truth values ("no" meant True, 0 False)."""
    w = np.ones((64, 64), F32)
    raises(TypeError, "transposed", qq.quantize_dequantize_moe, w, transposed="no")
    raises(TypeError, "values", qq.quantize_dequantize_moe, w, values=0)


def test_qdq_moe_shape_error_shows_the_callers_shape():
    """Before: a 2-D w of a bad shape was reported as (1, D1, D2)."""
    e = raises(ValueError, "w", qq.quantize_dequantize_moe, np.ones((32, 48), F32))
    assert "(32, 48)" in str(e) and "(1, 32, 48)" not in str(e)


def test_swizzle_size_refusal_names_scales():
    """Before: the message named 'x_shape' (no such argument) and a shape 32 times wider."""
    e = raises(ValueError, "scales", qq.swizzle_scales, np.broadcast_to(np.uint8(1), (1, 2 ** 52)))
    assert "x_shape" not in str(e) and "2^56" in str(e)


def test_negative_row_stride_is_named_as_such():
    """Before: reversed rows were refused as 'a transposed or overlapping view'."""
    x = RNG.standard_normal((8, 40)).astype(F32)
    e = raises(ValueError, "x", qq.swiglu, x[::-1])
    assert "negative row stride" in str(e) and "transposed" not in str(e)


def test_wrong_out_dtype_is_a_value_error_everywhere():
    """Before: grouped_qqmm and DecodeWeight matmuls raised TypeError for a float64 out=
    (docs/api.md: a wrong out= buffer is a ValueError)."""
    raises(ValueError, "out", qq.grouped_qqmm, X, W3, OFF, out=np.zeros((8, 16), np.float64))
    ml_dtypes = pytest.importorskip("ml_dtypes")
    qa = qq.quantize(np.ones((64, 256), ml_dtypes.bfloat16), mode="nvfp4")
    xb = np.ones((4, 256), ml_dtypes.bfloat16)
    raises(ValueError, "out", qq.quantized_matmul, xb, qq.prepare_decode(qa), out=np.zeros((4, 64), np.float64))


def test_grouped_out_shape_error_names_the_callers_out():
    """Before: a wrong out was described as an expert's slice of it: '(2, 17); expected (2, 16)'."""
    e = raises(ValueError, "out", qq.grouped_qqmm, X, W3, OFF, out=np.zeros((8, 17), F32))
    assert "(8, 17)" in str(e) and "(8, 16)" in str(e)


def test_prepare_weight_of_a_quantized_array():
    """Before: an affine QuantizedArray got dequantize's error; contradicting arguments were
    silently ignored (qqmm refuses them)."""
    w = RNG.standard_normal((16, 64)).astype(F32)
    raises(ValueError, ("prepare_weight", "affine"), qq.prepare_weight, qq.quantize(w, mode="affine"))
    raises(ValueError, "global_scale", qq.prepare_weight, qq.quantize(w, mode="nvfp4"), global_scale=np.float32(5))
    raises(ValueError, "fp8_format", qq.prepare_weight, qq.quantize(w, mode="mxfp8"), fp8_format="e5m2")
    raises(ValueError, "mode", qq.prepare_weight, qq.quantize(w, mode="mxfp8"), mode="mxfp4")
    assert qq.prepare_weight(qq.quantize(w, mode="mxfp8")).quantized.mode == "mxfp8"


def test_swiglu_matmul_out_errors_name_it():
    """Before: a float64 out blamed a dtype= never passed; a mismatch with dtype= named swiglu."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = RNG.standard_normal((3, 64)).astype(F32)
    qa = qq.quantize(RNG.standard_normal((128, 64)).astype(F32), mode="mxfp8")
    e = raises(ValueError, "out", qq.quantized_matmul_swiglu, x, qa, out=np.zeros((3, 64), np.float64))
    assert str(e).startswith("quantized_matmul_swiglu:") and "dtype:" not in str(e)
    e = raises(ValueError, "out", qq.quantized_matmul_swiglu, x, qa, out=np.zeros((3, 64), ml_dtypes.bfloat16),
               dtype="float32")
    assert str(e).startswith("quantized_matmul_swiglu:")


def test_qqmm_beta_string_is_refused():
    """Before: float() parsed beta="2" (and b"2")."""
    c = np.ones((8, 16), F32)
    for beta in ("2", b"2"):
        raises(TypeError, "beta", qq.qqmm, X, W3[0], mode="mxfp8", c=c, beta=beta)


def test_result_beyond_2_56_is_a_value_error():
    """Before: NumPy's MemoryError for 2^58 elements came through as MemoryError."""
    qa = qq.quantize(RNG.standard_normal((2, 16, 64)).astype(F32), mode="mxfp8")
    x = _big((2 ** 27, 1, 1, 64), np.ones((1, 1, 64), F32))
    idx = np.broadcast_to(np.int32(0), (1, 2 ** 27))
    raises(ValueError, ("out", "2^56"), qq.gather_qmm, x, qa, rhs_indices=idx)


def test_group_checks_do_not_depend_on_the_data():
    """Before: wgrad with K or N = 0 took any offsets; a negative global_scale_w entry passed
    while its expert had no tokens."""
    bad = np.array([9, 1], np.int32)
    raises(ValueError, "offsets", qq.grouped_qqmm_wgrad, np.ones((6, 32), F32),
           np.ones((6, 0), F32), bad)
    gw = np.array([1, -1, 1], F32)
    raises(ValueError, "global_scale_w", qq.grouped_qqmm, X, W3, np.array([2, 2, 8], np.int32), mode="nvfp4",
           global_scale_w=gw)


def test_last_route_after_a_call_refused_in_python():
    """Before: a qqmm / quantized_matmul refused before libqq ran left last_route() at the route
    of the call before (docs/api.md: None after a failed call)."""
    w = RNG.standard_normal((16, 64)).astype(F32)
    qq.qqmm(X, w, mode="mxfp8")
    assert qq.last_route() == "cpu"
    with pytest.raises(ValueError):
        qq.qqmm(X, w, mode="affine")
    assert qq.last_route() is None
    qq.quantized_matmul(X, qq.quantize(w, mode="mxfp8"))
    assert qq.last_route() == "cpu"
    with pytest.raises(ValueError):
        qq.quantized_matmul(X, qq.quantize(w, mode="mxfp8"), mode="nvfp4")
    assert qq.last_route() is None


class _OnlyDLPack:
    def __init__(self, a):
        self.a = a

    def __dlpack__(self, **kw):
        return self.a.__dlpack__(**kw)


class _BrokenDevice(_OnlyDLPack):
    def __dlpack_device__(self):
        raise TypeError("object of type 'NoneType' has no len()")


def test_dlpack_producers_named():
    """Before: an object with __dlpack__ alone was told it had no __dlpack__ (first argument) or
    got a bare AttributeError (elsewhere); a producer's own error came through unnamed."""
    q = qq.quantize(RNG.standard_normal((16, 64)).astype(F32), mode="mxfp8")
    e = raises(TypeError, "x", qq.amax, _OnlyDLPack(X))
    assert "__dlpack_device__" in str(e)
    e = raises(TypeError, "w", qq.quantized_matmul, X, _OnlyDLPack(q.data), q.scales, mode="mxfp8")
    assert "__dlpack_device__" in str(e)
    e = raises(TypeError, "x", qq.amax, _BrokenDevice(X))
    assert str(e).startswith("amax: x:")


def test_quantized_array_with_a_changed_shape():
    """Before: prepare_decode sized the layout from a QuantizedArray's assigned .shape: a weight
    of 32 rows given shape (64, 256) gave 32 columns of zeros; dequantize blamed an 'out'."""
    q = qq.quantize(RNG.standard_normal((64, 256)).astype(F32), mode="nvfp4")
    q.data, q.scales = q.data[:32], q.scales[:32]
    raises(ValueError, ("w", "shape"), qq.prepare_decode, q)
    e = raises(ValueError, ("w", "shape"), qq.dequantize, q)
    assert "'out'" not in str(e)


def test_quantized_array_without_data_is_a_type_error():
    raises(TypeError, "data", qq.QuantizedArray, None, np.zeros((4, 2), np.uint8), mode="mxfp8")


def test_moe_scaling_weights_are_mxfp8():
    """Before: grouped_qqmm(mode='nvfp4', moe_scaling=...) ran as mxfp8 without a word."""
    d, s = qq.quantize_moe(RNG.standard_normal((2, 64, 32)).astype(F32), scaling="32x32", scale_layout="blocked")
    raises(ValueError, "mode", qq.grouped_qqmm, RNG.standard_normal((4, 64)).astype(F32), (d, s),
           np.array([2, 4], np.int32), mode="nvfp4", moe_scaling="32x32", scale_layout="blocked")
