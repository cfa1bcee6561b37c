"""The tensor-core weight-only kernel (cuda/qmma.cu: bf16 x, fp modes, M <= 64) through
quantized_matmul: M tiles, K split, ragged chunks, blocked scales, the whole code space, batched
weights with bias."""

from __future__ import annotations

import numpy as np
import pytest

import qq
import reference as R
from helpers import BF16, assert_matmul_close, poison, to_numpy
from matmul_cases import F32, randn, cuda, make_weight, run_qmm


QMMA_WEIGHTS = ["nvfp4", "nvfp4-gs", "mxfp4", "mxfp8", "mxfp8-e5m2"]


def _qmma_route(name, m):
    """The route these tests' calls take: qmma, but for mxfp8 at one row, which qmv.cu's
    kernel takes (cuda/qmma.cu, plan())."""
    return "qmv" if name.startswith("mxfp8") and m == 1 else "qmma"


def _raw_weight(name, n, k, rng):
    """Packed codes and scales drawn over whole code spaces (no quantizer involved):
    subnormal and zero elements, both signs, fp8 NaN / Inf codes in row 0 only, and
    extreme scales in rows 1-3 (UE8M0 0 = 2^-127, 254 = 2^127, 255 = NaN; E4M3 NaN)."""
    import types
    mode = name.split("-")[0]
    fp8 = "e5m2" if name.endswith("e5m2") else "e4m3"
    bits, g = (8, 32) if mode == "mxfp8" else (4, 16 if mode == "nvfp4" else 32)
    codes = rng.integers(0, 1 << bits, size=(n, k), dtype=np.uint8)
    if mode == "mxfp8":
        special = (codes & 0x7f) >= (0x7f if fp8 == "e4m3" else 0x7c)
        special[0] = False
        codes[special] &= 0x3f  # finite everywhere but row 0
    if mode == "nvfp4":
        scales = rng.integers(0x08, 0x7f, size=(n, k // g), dtype=np.uint8)  # positive finite E4M3
        scales[3, 0] = 0x7f
    else:
        scales = rng.integers(110, 140, size=(n, k // g), dtype=np.uint8)
        scales[1, :] = 0
        scales[2, 0] = 254
        scales[3, 1] = 255
    data = R.pack(codes, bits)
    gs = np.asarray(3.0e3, F32) if name == "nvfp4-gs" else None
    return types.SimpleNamespace(data=data, scales=scales, biases=None, group_size=g, bits=bits, mode=mode,
                                 global_scale=gs, scale_layout="linear", fp8_format=fp8)


@pytest.mark.gpu
@pytest.mark.parametrize("nk", [(24, 4096), (200, 160), (130, 1056), (16, 16384)],
                         ids=["ksplit", "ragged-chunks", "blocked", "k16384"])
@pytest.mark.parametrize("m", [1, 8, 9, 16, 17, 33, 64])
@pytest.mark.parametrize("name", QMMA_WEIGHTS)
def test_qmma_shapes(name, m, nk, rng):
    """M across every tile of the kernel (8, 16, 32, 64 rows of x), N not a multiple of
    its 16-row tiles, K whose chunks do not fill the last step (160), K split over
    several warps (few rows, long K), blocked scales (N = 130), a poisoned bf16 out."""
    n, k = nk
    x = randn(rng, (m, k), BF16)
    ref_q = make_weight(name, (n, k), rng, layout="blocked" if n == 130 else "linear")
    out = cuda(poison((m, n), BF16))
    got = run_qmm(x, ref_q, out=out)
    assert got is out
    assert qq.last_route() == _qmma_route(name, m), qq.last_route()
    assert_matmul_close(out, R.quantized_matmul(x, ref_q), f"qmma {name} m={m} {nk}", dtype=BF16)


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("m", [1, 5, 40])
@pytest.mark.parametrize("name", QMMA_WEIGHTS)
def test_qmma_code_space(name, m, out_dtype, rng):
    """Every element code, subnormals, NaN/Inf elements and scales at the ends of their
    range; x with zeros and both signs. NaN/Inf rows must come out NaN/Inf exactly where
    the float64 reference says so."""
    n, k = 40, 256
    ref_q = _raw_weight(name, n, k, rng)
    x = randn(rng, (m, k), BF16)
    x[:, ::7] = 0
    got = run_qmm(x, ref_q, dtype=out_dtype)
    assert qq.last_route() == _qmma_route(name, m), qq.last_route()
    assert_matmul_close(got, R.quantized_matmul(x, ref_q), f"qmma codes {name} m={m}", dtype=np.dtype(
        BF16 if out_dtype == "bfloat16" else F32))


@pytest.mark.gpu
@pytest.mark.parametrize("m", [3, 24])
def test_qmma_batched_bias(m, rng):
    """A 3D weight [B, N, K] with a batch of x, bias, fp32 output."""
    k, n = 512, 72
    x = randn(rng, (2, m, k), BF16)
    wf = randn(rng, (2, n, k), F32)
    ref_q = R.quantize(wf, mode="mxfp8")
    bias = randn(rng, (n,), F32)
    got = run_qmm(x, ref_q, bias=bias, dtype="float32")
    assert_matmul_close(got, R.quantized_matmul(x, ref_q, bias=bias), "qmma batched", dtype=F32)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [128 * 66 + 16, 128 * 264 - 5], ids=["rows-8464", "rows-33787"])
@pytest.mark.parametrize("m", [1, 16])
@pytest.mark.parametrize("name", ["nvfp4-gs", "mxfp4", "mxfp8"])
def test_qmma_bit_stable(name, m, n, rng):
    """Many row tiles (one k-slice per warp or several, by how many tiles fill the device):
    the reference's result, and the same bits on a second run (k-slices are added in a
    fixed order, never with atomics)."""
    k = 1024
    x = randn(rng, (m, k), BF16)
    ref_q = make_weight(name, (n, k), rng)
    out = cuda(poison((m, n), BF16))
    got = run_qmm(x, ref_q, out=out)
    assert qq.last_route() == _qmma_route(name, m), qq.last_route()
    first = np.array(to_numpy(got), copy=True)
    assert_matmul_close(out, R.quantized_matmul(x, ref_q), f"qmma {name} m={m} n={n}", dtype=BF16)
    second = to_numpy(run_qmm(x, ref_q))
    assert np.array_equal(first.view(np.uint16), second.view(np.uint16)), "not bit-stable run to run"


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 8])
def test_qmma_odd_scale_address(m, rng):
    """nvfp4 scales that start at an odd device address (a view one byte into a buffer):
    qmma reads scales two bytes at a time, so it must leave such a call to another kernel,
    and the result must still be right."""
    torch = pytest.importorskip("torch")
    n, k = 48, 512
    x = randn(rng, (m, k), BF16)
    ref_q = make_weight("nvfp4", (n, k), rng)
    buf = torch.zeros(ref_q.scales.size + 1, dtype=torch.uint8, device="cuda")
    scales = buf[1:].view(ref_q.scales.shape)
    scales.copy_(torch.from_numpy(np.ascontiguousarray(ref_q.scales)))
    assert scales.data_ptr() % 2 == 1
    got = qq.quantized_matmul(cuda(x), cuda(ref_q.data), scales, mode="nvfp4", group_size=16, bits=4)
    assert qq.last_route() != "qmma", qq.last_route()
    assert_matmul_close(got, R.quantized_matmul(x, ref_q), f"qmma odd scales m={m}", dtype=BF16)


# ---- affine 4 / 8 bits (bf16 x, bf16 scales and biases; M <= 16) -------------------------

# (bits, group_size): one scale group per step of the kernel (4-bit 128, 8-bit 64 / 128) or two
# (4-bit 64, 8-bit 32); 4-bit group 32 is qmv's (docs/api.md, "Dispatch")
QMMA_AFFINE = [(4, 64), (4, 128), (8, 32), (8, 64), (8, 128)]
AFF_IDS = [f"affine{b}-g{g}" for b, g in QMMA_AFFINE]


def _affine_raw(n, k, bits, g, rng, special=False):
    """Codes over the whole code space, bf16 scales and biases of both signs (zero, tiny,
    large); with special, an Inf scale in row 1, a NaN bias in row 2 and a -Inf bias in row 5
    (one group each), which send their warps' row tiles down the exact path."""
    import types
    import ml_dtypes
    codes = rng.integers(0, 1 << bits, size=(n, k), dtype=np.uint8)
    scales = (rng.standard_normal((n, k // g)) * 0.05).astype(ml_dtypes.bfloat16)
    biases = (rng.standard_normal((n, k // g)) * 0.5).astype(ml_dtypes.bfloat16)
    scales[0, 0], biases[0, -1] = 0, 0
    scales[3 % n, 0], biases[4 % n, 0] = 1e-30, -3e4
    if special:
        scales[1, 0] = np.inf
        biases[2, -1] = np.nan
        biases[5, k // g // 2] = -np.inf
    return types.SimpleNamespace(data=R.pack(codes, bits), scales=scales, biases=biases, group_size=g, bits=bits,
                                 mode="affine", global_scale=None, scale_layout="linear", fp8_format="e4m3")


def _affine_k(bits, g, steps_of_chunks):
    """K whose rows hold `steps_of_chunks` 16-byte chunks (4 make a step), a multiple of g."""
    k = steps_of_chunks * 16 * 8 // bits
    return k if k % g == 0 else k + g - k % g


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 3, 8, 9, 16])
@pytest.mark.parametrize("shape", ["ksplit", "ragged", "rows"])
@pytest.mark.parametrize("bits,g", QMMA_AFFINE, ids=AFF_IDS)
def test_qmma_affine(bits, g, shape, m, rng):
    """Affine weights through the tensor-core kernel (the route is checked): a quantizer's
    bf16 weight, K split over warps (long K, few rows), chunks that do not fill the last step,
    N not a multiple of the 16-row tiles; a poisoned out."""
    n, k = {"ksplit": (24, 8192), "ragged": (40, _affine_k(bits, g, 6)), "rows": (200, 512)}[shape]
    x = randn(rng, (m, k), BF16)
    wf = randn(rng, (n, k), BF16, 0.5)
    ref_q = R.quantize(wf, group_size=g, bits=bits)
    assert ref_q.scales.dtype == BF16
    out = cuda(poison((m, n), BF16))
    got = run_qmm(x, ref_q, out=out)
    assert qq.last_route() == "qmma"
    assert_matmul_close(got, R.quantized_matmul(x, ref_q), f"qmma affine{bits}-g{g} m={m} {shape}", dtype=BF16)


@pytest.mark.gpu
@pytest.mark.parametrize("special", [False, True, "x-inf"], ids=["finite", "inf-nan", "x-inf"])
@pytest.mark.parametrize("m", [1, 5, 16])
@pytest.mark.parametrize("bits,g", QMMA_AFFINE, ids=AFF_IDS)
def test_qmma_affine_code_space(bits, g, m, special, rng):
    """Every code, scales and biases of both signs, zero, tiny and large; x with zeros.
    Inf / NaN scales and biases (special), or +-Inf in x (x-inf: Inf * a weight of exactly
    b, Inf - Inf between the scale and bias terms), must give NaN / Inf exactly where the
    float64 reference does (those row tiles take the weight-by-weight path), the other rows
    as usual; fp32 and bf16 outputs."""
    n, k = 48, _affine_k(bits, g, 10)
    ref_q = _affine_raw(n, k, bits, g, rng, special is True)
    x = randn(rng, (m, k), BF16)
    x[:, ::5] = 0
    if special == "x-inf":
        x[0, 7] = np.inf
        x[m - 1, k - 3] = -np.inf
    for out_dtype in ("float32", "bfloat16"):
        got = run_qmm(x, ref_q, dtype=out_dtype)
        assert qq.last_route() == "qmma"
        assert_matmul_close(got, R.quantized_matmul(x, ref_q), f"qmma affine codes m={m} {out_dtype}",
                            dtype=np.dtype(BF16 if out_dtype == "bfloat16" else F32))
    if special is True:
        y = to_numpy(got).astype(F32)
        assert np.isnan(y[:, 1]).all() or not np.isfinite(y[:, 1]).any()   # the Inf scale's row
        assert np.isnan(y[:, 2]).all()                                       # the NaN bias's row


@pytest.mark.gpu
@pytest.mark.parametrize("bits,g", [(4, 32), (3, 64)], ids=["affine4-g32", "affine3-g64"])
def test_qmma_affine_declines(bits, g, rng):
    """Layouts the tensor-core kernel leaves to qmv (4-bit group 32: four groups per step;
    other widths; float32 scales; M > 16 goes to the GEMM), each still right."""
    k = 256
    x = randn(rng, (4, k), BF16)
    ref_q = R.quantize(randn(rng, (32, k), BF16, 0.5), group_size=g, bits=bits)
    got = run_qmm(x, ref_q)
    assert qq.last_route() == "qmv"
    assert_matmul_close(got, R.quantized_matmul(x, ref_q), "affine declined", dtype=BF16)
    ref32 = R.quantize(randn(rng, (32, k), F32, 0.5), group_size=64, bits=4)
    run_qmm(x, ref32)
    assert qq.last_route() == "qmv"
