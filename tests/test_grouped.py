"""qq.grouped_qqmm (mixture of experts): tokens sorted by expert, int32 cumulative group
ends, one weight per expert. Checked against a per-expert loop of the reference qqmm,
including empty and single-token groups, per-expert nvfp4 global scales, stored weights
(QuantizedArray, linear and blocked scales) and quantize_moe's 32x1 / 32x32 weights."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import qq
import reference as R
from helpers import BF16, DEVICES, FpCfg, assert_matmul_close, cast, raises, to_device, to_numpy
from test_colwise import ref_moe

F32 = np.float32
SIZES = [0, 5, 1, 34, 0, 17]  # tokens per expert: empty and single-token groups included


def blackwell_grouped(mode="mxfp8"):
    """Whether grouped_qqmm's Blackwell route can run here: compute capability 10.x / 11.0,
    libqq built against cuBLASLt 13.3 or newer, and the loaded one new enough for `mode`
    (13.3 for mxfp8, 13.4 for nvfp4)."""
    if qq.device_count() == 0 or qq.device_capability(0)[0] not in (10, 11):
        return False
    if qq.build_info().get("cublaslt", 0) < 130300:
        return False
    v = qq.cuda_info()["cublaslt_version"] or "0.0.0"
    return tuple(int(p) for p in v.split(".")) >= ((13, 4, 0) if mode == "nvfp4" else (13, 3, 0))


def hopper_one_launch(device):
    """Whether grouped_qqmm and grouped_qqmm_wgrad take Hopper's one-launch path here (built
    with CUTLASS's headers): the group ends are then read on the device, bad ones give NaN."""
    return (device == "cuda" and qq.build_info().get("grouped_sm90") == "ON"
            and qq.device_capability(0)[0] == 9)


def one_launch(device, mode="mxfp8"):
    """Whether grouped_qqmm reads the group ends on the device here: Hopper's one-launch path,
    or Blackwell's grouped block-scaled GEMM for nvfp4 / mxfp8 calls it takes."""
    return hopper_one_launch(device) or (device == "cuda" and blackwell_grouped(mode))


def dev(a, device):
    return to_device(None if a is None else np.asarray(a), device)


def offsets_of(sizes):
    return np.cumsum(sizes).astype(np.int32)


def ref_grouped(x, ws, sizes, per_expert):
    """Stack per_expert(x rows of e, e) -> MatmulRef over the experts."""
    vals, sums = [], []
    r0 = 0
    for e, n in enumerate(sizes):
        if n:
            ref = per_expert(x[r0:r0 + n], e)
            vals.append(ref.value)
            sums.append(ref.abs_sum)
        r0 += n
    return R.MatmulRef(np.concatenate(vals), np.concatenate(sums))


CFGS = [FpCfg("mxfp8"), FpCfg("mxfp8", "floor", "e5m2"), FpCfg("mxfp4"), FpCfg("nvfp4"),
        FpCfg("nvfp4", global_scale=True)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("stored", [False, True], ids=["float_w", "stored_w"])
@pytest.mark.parametrize("cfg", CFGS, ids=str)
def test_grouped_qqmm(cfg, stored, device, rng):
    """Float x; w float (quantized on the fly) or a QuantizedArray [E, N, K] with blocked
    scales; nvfp4 with a global scale per expert."""
    e, n, k = len(SIZES), 40, 128
    t = sum(SIZES)
    x = cast(rng.standard_normal((t, k)), BF16)
    w = cast(rng.standard_normal((e, n, k)), BF16)
    gx = R.amax(x) if cfg.global_scale else None
    gw = np.array([R.amax(w[i]) for i in range(e)], F32) if cfg.global_scale else None
    kw = {"mode": cfg.mode, "fp8_format": cfg.fp8_format}
    if cfg.mode != "nvfp4":
        kw["rounding"] = cfg.rounding
    if stored:
        if cfg.global_scale:
            pytest.skip("qq.quantize takes one global scale; per-expert ones come with packed w")
        wq = qq.quantize(dev(w, device), scale_layout="blocked", **kw)
        got = qq.grouped_qqmm(dev(x, device), wq, dev(offsets_of(SIZES), device), rounding=cfg.rounding)
    else:
        got = qq.grouped_qqmm(dev(x, device), dev(w, device), dev(offsets_of(SIZES), device),
                              global_scale_x=dev(gx, device), global_scale_w=dev(gw, device), **kw)
    assert tuple(got.shape) == (t, n)
    ref = ref_grouped(x, w, SIZES, lambda xe, i: R.qqmm(
        xe, w[i], cfg.mode, global_scale_x=gx, global_scale_w=None if gw is None else gw[i],
        rounding=cfg.rounding, fp8_format=cfg.fp8_format))
    assert_matmul_close(got, ref, f"grouped_qqmm {cfg}", dtype=BF16)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scaling", ["32x1", "32x32"])
def test_grouped_qqmm_moe_weights(scaling, device, rng):
    """Weights [E, K, N] quantized by qq.quantize_moe (32x1 or 32x32 along D1 = K, blocked
    scales) go in as they are; the reference multiplies by the same quantized values."""
    sizes = [3, 0, 40, 1]
    e, k, n = len(sizes), 64, 96
    t = sum(sizes)
    x = cast(rng.standard_normal((t, k)), BF16)
    w = cast(rng.standard_normal((e, k, n)), BF16)        # [E, D1 = K, D2 = N]
    data, scales = qq.quantize_moe(dev(w, device), scaling, scale_layout="blocked")
    got = qq.grouped_qqmm(dev(x, device), (data, scales), dev(offsets_of(sizes), device),
                          moe_scaling=scaling, scale_layout="blocked", dtype="float32")
    # per expert: w_e^T [N, K] quantized along K with the MoE scales (blocked: one scale
    # per (n, 32 k), the 32x32 one replicated)
    codes, blocked = ref_moe(w, scaling, layout="blocked")

    def per_expert(xe, i):
        s = R.unswizzle(blocked[i], (n, k // 32))
        rq = dataclasses.replace(R.quantize(np.zeros((n, k), F32), mode="mxfp8"),
                                 data=np.ascontiguousarray(codes[i].T), scales=s)
        return R.qqmm(xe, rq, "mxfp8")

    assert_matmul_close(got, ref_grouped(x, w, sizes, per_expert), f"grouped_qqmm moe {scaling}",
                        dtype=F32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [8, 12], ids=["one_launch", "per_expert"])
def test_grouped_qqmm_errors(n, device, rng):
    """Bad group ends raise where they are read on the host (the CPU, and the per-expert
    loop: N = 12 is not a whole number of 16-byte rows); the one-launch path reads them on
    the device and gives a result of NaN instead (docs/api.md)."""
    x = cast(rng.standard_normal((6, 64)), BF16)
    w = cast(rng.standard_normal((2, n, 64)), BF16)
    for bad in ([4, 5], [4, 2], [7, 6], [-1, 6]):     # last != T, decreasing, past T, negative
        ends = dev(np.array(bad, np.int32), device)
        if one_launch(device) and n % 8 == 0:
            got = to_numpy(qq.grouped_qqmm(dev(x, device), dev(w, device), ends)).astype(F32)
            assert got.shape == (6, n) and np.isnan(got).all(), bad
        else:
            raises(ValueError, "offsets", qq.grouped_qqmm, dev(x, device), dev(w, device), ends)
    raises((ValueError, TypeError), "offsets", qq.grouped_qqmm, dev(x, device), dev(w, device),
           dev(np.array([4, 6], np.int64), device))           # wrong dtype
    raises(ValueError, "w", qq.grouped_qqmm, dev(x, device), dev(w[0], device),
           dev(np.array([4, 6], np.int32), device))           # 2D w
    got = to_numpy(qq.grouped_qqmm(dev(x, device), dev(w, device), dev(np.array([0, 6], np.int32), device),
                                   dtype="float32"))
    assert got.shape == (6, n) and np.isfinite(got).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("wform", ["float", "packed", "prepared"])
@pytest.mark.parametrize("mode", ["mxfp8", "nvfp4"])
def test_grouped_qqmm_many_experts(mode, wform, device, rng):
    """The shapes of the one-launch path on Hopper: 24 experts with Zipf-like sizes and
    empty groups, several 128-row tiles per expert and tiles split across experts, N and K
    over one 256 x 64 tile; weights float (quantized on the fly, per-expert nvfp4 global
    scales), packed with blocked scales (per-expert global scales), or a PreparedWeight
    [E, N, K] (bf16 values, one global scale). Checked against the per-expert reference;
    on the GPU also against the per-expert loop, which a float32 result takes."""
    sizes = [300, 0, 0, 150, 1, 77, 40, 0, 9, 2, 129, 64] + [0] * 6 + [33, 5, 0, 1, 0, 11]
    e, n, k = len(sizes), 264, 192
    t = sum(sizes)
    x = cast(rng.standard_normal((t, k)), BF16)
    w = cast(rng.standard_normal((e, n, k)), BF16)
    nv = mode == "nvfp4"
    gx = R.amax(x) if nv else None
    if wform == "prepared":
        gw = np.full(e, float(R.amax(w)), F32) if nv else None
        wa = qq.prepare_weight(dev(w, device), mode=mode, global_scale=dev(None if gw is None else gw[:1], device))
        kw = {}
    elif wform == "float":
        gw = np.array([float(R.amax(w[i])) for i in range(e)], F32) if nv else None
        wa, kw = dev(w, device), {"global_scale_w": dev(gw, device)}
    else:
        gw = np.array([float(R.amax(w[i])) for i in range(e)], F32) if nv else None
        qs = [qq.quantize(w[i], mode=mode, global_scale=None if gw is None else gw[i:i + 1],
                          scale_layout="blocked") for i in range(e)]
        wa = dev(np.stack([np.asarray(q.data) for q in qs]), device)
        kw = {"scales": dev(np.stack([np.asarray(q.scales) for q in qs]), device), "scale_layout": "blocked",
              "global_scale_w": dev(gw, device)}
    ends = dev(offsets_of(sizes), device)
    got = qq.grouped_qqmm(dev(x, device), wa, ends, mode=mode, global_scale_x=dev(gx, device), **kw)
    assert tuple(got.shape) == (t, n)
    ref = ref_grouped(x, w, sizes, lambda xe, i: R.qqmm(
        xe, w[i], mode, global_scale_x=gx, global_scale_w=None if gw is None else gw[i]))
    assert_matmul_close(got, ref, f"grouped_qqmm {mode} {wform}", dtype=BF16)
    if device == "cuda":
        loop = qq.grouped_qqmm(dev(x, device), wa, ends, mode=mode, global_scale_x=dev(gx, device),
                               dtype="float32", **kw)
        assert_matmul_close(loop, ref, f"grouped_qqmm {mode} {wform} (per-expert loop)", dtype=F32)
        # the same products rounded to bf16 once: equal up to one bf16 step where the fp32
        # sums of the two GEMMs land on different sides of a rounding boundary. The two GEMMs
        # add in different orders, so their fp32 sums differ by a few fp32 ulps of the partial
        # sums: at an output near 0 by cancellation that is no bf16 step of the output (seed
        # 6152558571062015966 on an H200: 1.43e-5 against 1.53e-5, outputs in the tens), hence
        # the absolute term, 2^-20 of the largest output (a wrong expert is off by O(1)).
        a, b = to_numpy(got).astype(F32), to_numpy(loop).astype(F32)
        np.testing.assert_allclose(a, b, rtol=2.0 ** -7, atol=2.0 ** -20 * float(np.abs(b).max()))


# ---------------------------------------------------------------------------
# Blackwell's one-launch form: cuBLASLt's grouped block-scaled GEMM
# ---------------------------------------------------------------------------

def _hook(name, value=1):
    return qq._qq._set_test_hook(name, value)


def _grouped_plans():
    """Grouped block-scaled plans made so far in this process (a counter hook)."""
    return _hook("grouped_blockscaled_queries", 0)


_WFORMS = ["float", "linear", "blocked"]


def _fresh_n(mode, wform, extra=0):
    """An N of this case's own: a plan is per shape, and a test that counts plans needs one
    no other test of the process has made."""
    return 136 + 8 * (_WFORMS.index(wform) + 3 * ["mxfp8", "nvfp4"].index(mode) + 6 * extra)


def _grouped_case(mode, wform, rng, n, sizes=(130, 0, 7, 64, 1, 0, 200)):
    """x, the weight argument, its kwargs, the ends and the reference of one grouped call."""
    e, k = len(sizes), 128
    t = sum(sizes)
    x = cast(rng.standard_normal((t, k)), BF16)
    w = cast(rng.standard_normal((e, n, k)), BF16)
    nv = mode == "nvfp4"
    gx = R.amax(x) if nv else None
    gw = np.array([float(R.amax(w[i])) for i in range(e)], F32) if nv else None
    kw = {"mode": mode, "global_scale_x": dev(gx, "cuda")}
    if wform == "float":  # (quantized in one pass by the route, each expert with its own nvfp4 scale)
        wa = dev(w, "cuda")
        kw["global_scale_w"] = dev(gw, "cuda")
    else:
        qs = [qq.quantize(w[i], mode=mode, global_scale=None if gw is None else gw[i:i + 1],
                          scale_layout=wform) for i in range(e)]
        wa = dev(np.stack([np.asarray(q.data) for q in qs]), "cuda")
        kw.update(scales=dev(np.stack([np.asarray(q.scales) for q in qs]), "cuda"), scale_layout=wform,
                  global_scale_w=dev(gw, "cuda"))
    ref = ref_grouped(x, w, list(sizes), lambda xe, i: R.qqmm(
        xe, w[i], mode, global_scale_x=gx, global_scale_w=None if gw is None else gw[i]))
    return dev(x, "cuda"), wa, kw, dev(offsets_of(list(sizes)), "cuda"), ref


@pytest.mark.gpu
@pytest.mark.parametrize("wform", _WFORMS)
@pytest.mark.parametrize("mode", ["mxfp8", "nvfp4"])
def test_grouped_blockscaled_forced_refusal(mode, wform, rng):
    """On a GPU without cuBLASLt's grouped block-scaled GEMM, the force_blockscaled hook sends
    grouped_qqmm into that route (libqq/src/cuda/qqmm.cu, grouped_qqmm_blockscaled): it builds
    its arguments, cuBLASLt refuses before anything runs, and the call takes the route it takes
    without the hook - bit for bit the same result. The refusal is remembered: one plan for
    the shape, none more on the second call; mxfp4 is refused by rule without a plan."""
    if qq.device_capability(0)[0] in (10, 11):
        pytest.skip("this GPU has the grouped block-scaled GEMM; test_grouped_blockscaled_on_blackwell covers it")
    if qq.build_info().get("cublaslt", 0) < 130300 or not qq.cuda_info()["cublaslt_loaded"]:
        pytest.skip("libqq was built against a cuBLASLt without the grouped GEMM, or none is loaded: no plan is made")
    n = _fresh_n(mode, wform)
    x, wa, kw, ends, ref = _grouped_case(mode, wform, rng, n)
    want = qq.grouped_qqmm(x, wa, ends, **kw)
    route = qq.last_route()
    old = _hook("force_blockscaled", 1)
    try:
        p0 = _grouped_plans()
        got = qq.grouped_qqmm(x, wa, ends, **kw)
        p1 = _grouped_plans()
        again = qq.grouped_qqmm(x, wa, ends, **kw)
        p2 = _grouped_plans()
        qq.grouped_qqmm(x, dev(cast(np.zeros((7, n, 128), F32), BF16), "cuda"), ends, mode="mxfp4")
        p3 = _grouped_plans()
    finally:
        _hook("force_blockscaled", old)
    assert route != "blockscaled"
    np.testing.assert_array_equal(to_numpy(got).view(np.uint16), to_numpy(want).view(np.uint16))
    np.testing.assert_array_equal(to_numpy(again).view(np.uint16), to_numpy(want).view(np.uint16))
    assert (p1 - p0, p2 - p1, p3 - p2) == (1, 0, 0), (p0, p1, p2, p3)
    assert_matmul_close(got, ref, f"grouped_qqmm {mode} {wform} (forced, refused)", dtype=BF16)


def test_grouped_blockscaled_hooks():
    """The two hooks the GPU tests below use exist (a misspelt name would raise there only on
    a GPU): emulate_grouped_blockscaled is a switch, grouped_blockscaled_queries a counter."""
    old = _hook("emulate_grouped_blockscaled", 1)
    assert _hook("emulate_grouped_blockscaled", old) == 1
    n = _grouped_plans()
    assert _hook("grouped_blockscaled_queries", 0) == n


class _Emulated:
    """The emulate_grouped_blockscaled hook for a block: the block-scaled grouped route runs
    on this GPU with a plain kernel in place of cuBLASLt's grouped GEMM, reading the same
    per-expert arrays (libqq/src/cuda/qqmm.cu, grouped_bs_emulate_kernel)."""

    def __enter__(self):
        self.old = _hook("emulate_grouped_blockscaled", 1)

    def __exit__(self, *exc):
        _hook("emulate_grouped_blockscaled", self.old)


def _out_dtype(dtype):
    return F32 if dtype == "float32" else (np.float16 if dtype == "float16" else BF16)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float16"])
@pytest.mark.parametrize("wform", _WFORMS)
@pytest.mark.parametrize("mode", ["mxfp8", "nvfp4"])
def test_grouped_blockscaled_emulated(mode, wform, dtype, rng):
    """Everything of Blackwell's grouped route but cuBLASLt, on this GPU: x quantized for all
    tokens, each expert's scales placed in blocked tiles of their own (P_e), w's scales used,
    swizzled or quantized, the per-expert arrays and alpha (per-expert nvfp4 global scales)
    derived on the device from the ends, with empty, single-token, multi-tile and
    tile-straddling experts: the route is `blockscaled` and the result the per-expert
    reference within the fp32 accumulation bound. fp16 out with nvfp4 is refused by rule and
    takes the next route."""
    x, wa, kw, ends, ref = _grouped_case(mode, wform, rng, 136)
    with _Emulated():
        got = qq.grouped_qqmm(x, wa, ends, dtype=dtype, **kw)
        route = qq.last_route()
    refused = mode == "nvfp4" and dtype == "float16"
    assert (route != "blockscaled") if refused else (route == "blockscaled"), route
    assert_matmul_close(got, ref, f"grouped_qqmm {mode} {wform} emulated", dtype=_out_dtype(dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["mxfp8", "nvfp4"])
def test_grouped_blockscaled_emulated_packed_x_and_bad_ends(mode, rng):
    """Packed x with linear scales (its rows used in place, its scales placed per expert), and
    bad group ends: every group empty, the result all NaN (as Hopper's one-launch path)."""
    sizes = [5, 0, 140, 3]
    e, n, k = len(sizes), 64, 256
    t = sum(sizes)
    x = cast(rng.standard_normal((t, k)), BF16)
    w = cast(rng.standard_normal((e, n, k)), BF16)
    xq = qq.quantize(dev(x, "cuda"), mode=mode)
    with _Emulated():
        got = qq.grouped_qqmm(xq, dev(w, "cuda"), dev(offsets_of(sizes), "cuda"), mode=mode, dtype="float32")
        route = qq.last_route()
        bad = qq.grouped_qqmm(xq, dev(w, "cuda"), dev(np.array([5, 3, 148, 148], np.int32), "cuda"), mode=mode,
                              dtype="float32")
    assert route == "blockscaled", route
    ref = ref_grouped(x, w, sizes, lambda xe, i: R.qqmm(xe, w[i], mode))
    assert_matmul_close(got, ref, f"grouped_qqmm {mode} packed x emulated", dtype=F32)
    assert np.isnan(to_numpy(bad)).all()


@pytest.mark.gpu
def test_grouped_blockscaled_emulated_in_a_cuda_graph(rng):
    """The route reads the ends only on the device: captured once, replayed with other ends in
    the same tensor, it gives the eager result of those ends."""
    torch = pytest.importorskip("torch")
    x, wa, kw, ends, _ = _grouped_case("mxfp8", "blocked", rng, 136)
    other = torch.tensor(np.cumsum([0, 200, 1, 7, 64, 130, 0]).astype(np.int32), device="cuda")
    with _Emulated():
        qq.grouped_qqmm(x, wa, ends, **kw)  # warm-up (the handle, the scratch pool)
        assert qq.last_route() == "blockscaled", qq.last_route()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = qq.grouped_qqmm(x, wa, ends, **kw)
        ends.copy_(other)
        g.replay()
        want = qq.grouped_qqmm(x, wa, other, **kw)
    torch.cuda.synchronize()
    assert torch.equal(y, want)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("wform", _WFORMS)
@pytest.mark.parametrize("mode", ["mxfp8", "nvfp4"])
def test_grouped_blockscaled_on_blackwell(mode, wform, dtype, rng):
    """Blackwell (compute capability 10.x / 11.0; skipped elsewhere, never run by us: see
    docs/blackwell.md): grouped_qqmm takes cuBLASLt's grouped block-scaled GEMM when the
    loaded cuBLASLt has it (13.3 for mxfp8, 13.4 for nvfp4), with empty, single-token and
    multi-tile experts, and equals the per-expert reference within the fp32 accumulation
    bound; a simulated cublasLtMatmul failure falls back to the per-expert loop."""
    if qq.device_count() == 0 or qq.device_capability(0)[0] not in (10, 11):
        pytest.skip("needs compute capability 10.x or 11.0 (cuBLASLt's grouped block-scaled GEMM)")
    x, wa, kw, ends, ref = _grouped_case(mode, wform, rng, 136)
    got = qq.grouped_qqmm(x, wa, ends, dtype=dtype, **kw)
    route = qq.last_route()
    if blackwell_grouped(mode):
        assert route == "blockscaled", route
    assert_matmul_close(got, ref, f"grouped_qqmm {mode} {wform} on Blackwell", dtype=np.dtype(dtype)
                        if dtype == "float32" else BF16)
    old = _hook("fail_blockscaled_matmul", 1)
    try:
        sizes = (3, 0, 129, 5)  # a shape of its own: a fresh plan, whose matmul "fails"
        n2 = _fresh_n(mode, wform, 1 + ["bfloat16", "float32"].index(dtype))
        x2, wa2, kw2, ends2, ref2 = _grouped_case(mode, wform, rng, n2, sizes)
        fell_back = qq.grouped_qqmm(x2, wa2, ends2, dtype=dtype, **kw2)
    finally:
        _hook("fail_blockscaled_matmul", old)
    assert_matmul_close(fell_back, ref2, f"grouped_qqmm {mode} {wform} after a failed matmul",
                        dtype=np.dtype(dtype) if dtype == "float32" else BF16)


# ---------------------------------------------------------------------------
# the weight-gradient form: dw[e] = q(x_e)^T @ q(dy_e), blocks along the tokens
# ---------------------------------------------------------------------------

def ref_wgrad_expert(xe, dye, cfg, gx, gdy):
    """The definition: each expert's rows padded with zeros to the block, x_e^T and
    dy_e^T quantized along T by the reference, float64 product."""
    g = cfg.group_size
    pad = (-xe.shape[0]) % g
    xt = np.concatenate([xe.astype(F32), np.zeros((pad, xe.shape[1]), F32)]).T
    dyt = np.concatenate([dye.astype(F32), np.zeros((pad, dye.shape[1]), F32)]).T
    return R.qqmm(xt, dyt, cfg.mode, global_scale_x=gx, global_scale_w=gdy, rounding=cfg.rounding,
                  fp8_format=cfg.fp8_format)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("cfg", CFGS, ids=str)
@pytest.mark.parametrize("n", [48, 44], ids=["n48", "n44"])
def test_grouped_qqmm_wgrad(n, cfg, dtype, device, rng):
    """Empty, single-token and ragged groups (5, 1, 34, 17 tokens: none a multiple of the
    block), every fp mode, fp32 and bf16 results, nvfp4 with per-tensor global scales; on
    Hopper N = 48 takes the grouped GEMM, N = 44 (rows not 16-byte multiples) the loop."""
    k = 64
    t = sum(SIZES)
    x = cast(rng.standard_normal((t, k)), BF16)
    dy = cast(rng.standard_normal((t, n)), BF16)
    gx = R.amax(x) if cfg.global_scale else None
    gdy = R.amax(dy) if cfg.global_scale else None
    got = qq.grouped_qqmm_wgrad(dev(x, device), dev(dy, device), dev(offsets_of(SIZES), device), cfg.mode,
                                global_scale_x=dev(gx, device), global_scale_dy=dev(gdy, device),
                                rounding=cfg.rounding, fp8_format=cfg.fp8_format, dtype=dtype)
    got = to_numpy(got)
    assert got.shape == (len(SIZES), k, n) and got.dtype == np.dtype(BF16 if dtype == "bfloat16" else F32)
    r0 = 0
    for e, s in enumerate(SIZES):
        if s == 0:
            assert not got[e].astype(F32).any(), f"expert {e} (empty) must be zero"
        else:
            assert_matmul_close(got[e], ref_wgrad_expert(x[r0:r0 + s], dy[r0:r0 + s], cfg, gx, gdy),
                                f"wgrad expert {e} ({s} tokens)")
        r0 += s


@pytest.mark.gpu
@pytest.mark.parametrize("xdtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("cfg", [FpCfg("mxfp8"), FpCfg("nvfp4", global_scale=True)], ids=str)
@pytest.mark.parametrize("n", [40, 36], ids=["n40", "n36"])
def test_grouped_qqmm_wgrad_many_tiles(n, cfg, xdtype, rng):
    """Enough 128-token x 64-column tiles that the GPU's blocks of threads take several each
    (seg_qdq_kernel: tile n + 1 loaded while tile n is worked on): 553 experts, empty ones
    first, last and in between, of 1 to 64 tokens (605 padded 32-token blocks, 152 tiles
    along T), K = 488 (8 tiles across, the last 40 columns wide) - 2-3 tiles a block with
    up to ~200 SMs. x and dy in fp32, fp16 or bf16; dy with N = 40 (16-byte rows) or N = 36
    (the element-wise kernel, and the per-expert GEMMs)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    sizes = [0] + [1, 33, 0, 17, 40, 5, 64, 0, 31, 2] * 55 + [0, 0]
    t, k = sum(sizes), 488
    x = cast(rng.standard_normal((t, k)) * 3, xdtype)
    dy = cast(rng.standard_normal((t, n)), xdtype)
    gx = R.amax(x) if cfg.global_scale else None
    gdy = R.amax(dy) if cfg.global_scale else None
    got = qq.grouped_qqmm_wgrad(dev(x, "cuda"), dev(dy, "cuda"), dev(offsets_of(sizes), "cuda"), cfg.mode,
                                global_scale_x=dev(gx, "cuda"), global_scale_dy=dev(gdy, "cuda"),
                                rounding=cfg.rounding, fp8_format=cfg.fp8_format, dtype="float32")
    got = to_numpy(got)
    assert got.shape == (len(sizes), k, n)
    r0 = 0
    for e, s in enumerate(sizes):
        if s == 0:
            assert not got[e].any(), f"expert {e} (empty) must be zero"
        else:
            assert_matmul_close(got[e], ref_wgrad_expert(x[r0:r0 + s], dy[r0:r0 + s], cfg, gx, gdy),
                                f"wgrad expert {e} ({s} tokens)")
        r0 += s


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("cfg", CFGS, ids=str)
@pytest.mark.parametrize("shape", [(45, 64, 48), (70, 44, 37), (64, 1024 + 8, 40)],
                         ids=["ragged_t", "ragged_cols", "wide_k"])
def test_grouped_qqmm_wgrad_one_expert(shape, cfg, dtype, device, rng):
    """One expert (qq.torch's dense weight gradient; the GPU quantizes x and dy in their own
    orientation and reads them transposed in one GEMM, no host read): a ragged last block of
    tokens, columns that are not whole 8-byte pieces (K = 44, N = 37: the element-wise
    loads), K wider than one block of threads, every input dtype (2 or 4 columns a thread),
    every fp mode."""
    t, k, n = shape
    x = cast(rng.standard_normal((t, k)) * 3, dtype)
    dy = cast(rng.standard_normal((t, n)), dtype)
    gx = R.amax(x) if cfg.global_scale else None
    gdy = R.amax(dy) if cfg.global_scale else None
    got = qq.grouped_qqmm_wgrad(dev(x, device), dev(dy, device), dev(np.array([t], np.int32), device), cfg.mode,
                                global_scale_x=dev(gx, device), global_scale_dy=dev(gdy, device),
                                rounding=cfg.rounding, fp8_format=cfg.fp8_format, dtype="float32")
    got = to_numpy(got)
    assert got.shape == (1, k, n)
    assert_matmul_close(got[0], ref_wgrad_expert(x, dy, cfg, gx, gdy), f"one-expert wgrad {shape}")


@pytest.mark.parametrize("device", DEVICES)
def test_grouped_qqmm_wgrad_one_expert_edges(device, rng):
    """One expert with no tokens gives zeros; a bad end (other than T) raises on the CPU and
    gives NaN on the GPU (the end is read on the device there, on every GPU)."""
    x = dev(cast(rng.standard_normal((0, 64)), BF16), device)
    dy = dev(cast(rng.standard_normal((0, 32)), BF16), device)
    got = to_numpy(qq.grouped_qqmm_wgrad(x, dy, dev(np.array([0], np.int32), device)))
    assert got.shape == (1, 64, 32) and not got.any()
    x = dev(cast(rng.standard_normal((10, 64)), BF16), device)
    dy = dev(cast(rng.standard_normal((10, 32)), BF16), device)
    for bad in ([11], [9], [-1]):
        ends = dev(np.array(bad, np.int32), device)
        if device == "cpu":
            raises(ValueError, "offsets", qq.grouped_qqmm_wgrad, x, dy, ends)
        else:
            got = to_numpy(qq.grouped_qqmm_wgrad(x, dy, ends)).astype(F32)
            assert got.shape == (1, 64, 32) and np.isnan(got).all(), bad


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [32, 36], ids=["n32", "n36"])
def test_grouped_qqmm_wgrad_errors(n, device, rng):
    """Bad offsets raise where they are read on the host (the CPU; on Hopper N = 36 is not a
    multiple of 8, so the GPU loops per expert); a one-launch path (Hopper's grouped GEMM,
    Blackwell's grouped block-scaled one, where the good call took it) reads them on the
    device and fills dw with NaN."""
    x = dev(cast(rng.standard_normal((10, 64)), BF16), device)
    dy = dev(cast(rng.standard_normal((10, n)), BF16), device)
    good = dev(np.array([4, 10], np.int32), device)
    qq.grouped_qqmm_wgrad(x, dy, good)
    on_device = (hopper_one_launch(device) and n % 8 == 0) or (device == "cuda" and qq.last_route() == "blockscaled")
    if device == "cuda" and blackwell_grouped() and not on_device:  # (the route refused the shape)
        print(f"Blackwell's wgrad route did not take N = {n}: route {qq.last_route()}")
    for bad in ([4, 9], [6, 4, 10], [4, 11], [-2, 10]):
        ends = dev(np.array(bad, np.int32), device)
        if on_device:
            got = to_numpy(qq.grouped_qqmm_wgrad(x, dy, ends)).astype(F32)
            assert got.shape == (len(bad), 64, n) and np.isnan(got).all(), bad
        else:
            raises(ValueError, "offsets", qq.grouped_qqmm_wgrad, x, dy, ends)
    raises((ValueError, TypeError), "offsets", qq.grouped_qqmm_wgrad, x, dy,
           dev(np.array([4, 10], np.int64), device))
    raises(ValueError, "offsets", qq.grouped_qqmm_wgrad, x, dy, dev(np.zeros(0, np.int32), device))
    raises(ValueError, "mode", qq.grouped_qqmm_wgrad, x, dy, good, mode="affine")
    raises(ValueError, ("x", "dy"), qq.grouped_qqmm_wgrad, x, dev(cast(rng.standard_normal((9, 32)), BF16), device),
           good)
    raises(TypeError, "dtype", qq.grouped_qqmm_wgrad, x, dy, good, dtype="int8")
    raises(ValueError, "global", qq.grouped_qqmm_wgrad, x, dy, good, global_scale_x=1.0)


# ---------------------------------------------------------------------------
# the weight gradient's Blackwell route: cuBLASLt's grouped block-scaled GEMM with the
# tokens as each group's own reduction (libqq/src/cuda/qqmm.cu, grouped_wgrad_blockscaled)
# ---------------------------------------------------------------------------

_WG_SIZES = [33, 0, 1, 130, 0, 64, 7]  # empty, single-token, multi-block and ragged experts


def _wgrad_refs(x, dy, sizes, cfg, gx, gdy):
    """Each expert's reference (None for an empty one)."""
    refs, r0 = [], 0
    for s in sizes:
        refs.append(ref_wgrad_expert(x[r0:r0 + s], dy[r0:r0 + s], cfg, gx, gdy) if s else None)
        r0 += s
    return refs


def _wgrad_case(mode, rng, n=48, k=200, sizes=_WG_SIZES, scale=3.0):
    """x, dy, the kwargs, the ends and the per-expert references of one wgrad call."""
    t = sum(sizes)
    x = cast(rng.standard_normal((t, k)) * scale, BF16)
    dy = cast(rng.standard_normal((t, n)), BF16)
    cfg = FpCfg(mode, global_scale=mode == "nvfp4")
    gx = R.amax(x) if cfg.global_scale else None
    gdy = R.amax(dy) if cfg.global_scale else None
    refs = _wgrad_refs(x, dy, sizes, cfg, gx, gdy)
    kw = {"global_scale_x": dev(gx, "cuda"), "global_scale_dy": dev(gdy, "cuda")}
    return dev(x, "cuda"), dev(dy, "cuda"), kw, dev(offsets_of(sizes), "cuda"), refs


def _check_wgrad(got, refs, what):
    got = to_numpy(got)
    assert got.shape[0] == len(refs)
    for e, ref in enumerate(refs):
        if ref is None:
            assert not got[e].astype(F32).any(), f"{what}: expert {e} (empty) must be zero"
        else:
            assert_matmul_close(got[e], ref, f"{what}: expert {e}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("mode", ["mxfp8", "nvfp4"])
def test_grouped_wgrad_blockscaled_emulated(mode, dtype, rng):
    """Everything of Blackwell's wgrad route but cuBLASLt, on this GPU (the
    emulate_grouped_blockscaled hook): x and dy quantized along each expert's tokens into
    codes, each expert's scales in blocked tiles as wide as its own token count, the
    per-expert arrays with a reduction length each, alpha from both nvfp4 global scales,
    empty experts zeroed: the route is `blockscaled` and every expert equals the reference
    within the fp32 accumulation bound. K = 200 is not a whole 128-row scale tile (padding
    rows) and spans four 64-column tiles of the quantizer. fp16 out with nvfp4 is refused by
    rule and takes the next route."""
    x, dy, kw, ends, refs = _wgrad_case(mode, rng)
    with _Emulated():
        got = qq.grouped_qqmm_wgrad(x, dy, ends, mode, dtype=dtype, **kw)
        route = qq.last_route()
    refused = mode == "nvfp4" and dtype == "float16"
    assert (route != "blockscaled") if refused else (route == "blockscaled"), route
    assert to_numpy(got).dtype == np.dtype(_out_dtype(dtype))
    _check_wgrad(got, refs, f"wgrad {mode} {dtype} emulated")


@pytest.mark.gpu
@pytest.mark.parametrize("xdtype", ["float32", "float16"])
@pytest.mark.parametrize("mode", ["mxfp8", "nvfp4"])
def test_grouped_wgrad_blockscaled_emulated_many_experts(mode, xdtype, rng):
    """Many experts (a quantizer block takes several tiles; scale tiles of many widths),
    N = 36 (8 does not divide it: dy takes the element-wise quantizer) and fp32 / fp16
    inputs, all through the emulated route."""
    sizes = [0] + [1, 33, 0, 17, 40, 5, 64, 0, 31, 2] * 12 + [0]
    t, k, n = sum(sizes), 136, 36
    x = cast(rng.standard_normal((t, k)) * 3, xdtype)
    dy = cast(rng.standard_normal((t, n)), xdtype)
    cfg = FpCfg(mode, global_scale=mode == "nvfp4")
    gx = R.amax(x) if cfg.global_scale else None
    gdy = R.amax(dy) if cfg.global_scale else None
    with _Emulated():
        got = qq.grouped_qqmm_wgrad(dev(x, "cuda"), dev(dy, "cuda"), dev(offsets_of(sizes), "cuda"), mode,
                                    global_scale_x=dev(gx, "cuda"), global_scale_dy=dev(gdy, "cuda"))
        route = qq.last_route()
    assert route == "blockscaled", route
    refs = _wgrad_refs(x, dy, sizes, cfg, gx, gdy)
    _check_wgrad(got, refs, f"wgrad {mode} {xdtype} many experts emulated")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["mxfp8", "nvfp4"])
def test_grouped_wgrad_blockscaled_emulated_bad_ends(mode, rng):
    """Bad group ends on the device: every expert empty in the GEMM and the whole result NaN
    (as Hopper's grouped GEMM); all-empty good ends give zeros."""
    x, dy, kw, _, _ = _wgrad_case(mode, rng, sizes=[5, 0, 140, 3])
    with _Emulated():
        bad = qq.grouped_qqmm_wgrad(x, dy, dev(np.array([5, 3, 148, 148], np.int32), "cuda"), mode, **kw)
        assert qq.last_route() == "blockscaled", qq.last_route()
        x0, dy0 = x[:0], dy[:0]
        none = qq.grouped_qqmm_wgrad(x0, dy0, dev(np.zeros(3, np.int32), "cuda"), mode, **kw)
    assert np.isnan(to_numpy(bad)).all()
    assert to_numpy(none).shape == (3, 200, 48) and not to_numpy(none).any()


@pytest.mark.gpu
def test_grouped_wgrad_blockscaled_emulated_in_a_cuda_graph(rng):
    """The wgrad route reads the ends only on the device: captured once, replayed with other
    ends in the same tensor, it gives the eager result of those ends."""
    torch = pytest.importorskip("torch")
    x, dy, kw, ends, _ = _wgrad_case("nvfp4", rng)
    other = torch.tensor(np.cumsum([64, 0, 7, 1, 130, 33, 0]).astype(np.int32), device="cuda")
    with _Emulated():
        qq.grouped_qqmm_wgrad(x, dy, ends, "nvfp4", **kw)  # warm-up (the handle, the scratch pool)
        assert qq.last_route() == "blockscaled", qq.last_route()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = qq.grouped_qqmm_wgrad(x, dy, ends, "nvfp4", **kw)
        ends.copy_(other)
        g.replay()
        want = qq.grouped_qqmm_wgrad(x, dy, other, "nvfp4", **kw)
    torch.cuda.synchronize()
    assert torch.equal(y, want)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["mxfp8", "nvfp4"])
def test_grouped_wgrad_blockscaled_forced_refusal(mode, rng):
    """On a GPU without cuBLASLt's grouped block-scaled GEMM, force_blockscaled sends the
    weight gradient into that route: cuBLASLt refuses before any work and the call takes
    the route it takes without the hook - bit for bit the same result; the refusal is
    remembered (one plan for the shape, none on the second call)."""
    if qq.device_capability(0)[0] in (10, 11):
        pytest.skip("this GPU has the grouped block-scaled GEMM; test_grouped_wgrad_blockscaled_on_blackwell covers it")
    if qq.build_info().get("cublaslt", 0) < 130300 or not qq.cuda_info()["cublaslt_loaded"]:
        pytest.skip("libqq was built against a cuBLASLt without the grouped GEMM, or none is loaded: no plan is made")
    x, dy, kw, ends, refs = _wgrad_case(mode, rng, n=56 + 8 * ["mxfp8", "nvfp4"].index(mode))
    want = qq.grouped_qqmm_wgrad(x, dy, ends, mode, **kw)
    route = qq.last_route()
    old = _hook("force_blockscaled", 1)
    try:
        p0 = _grouped_plans()
        got = qq.grouped_qqmm_wgrad(x, dy, ends, mode, **kw)
        p1 = _grouped_plans()
        again = qq.grouped_qqmm_wgrad(x, dy, ends, mode, **kw)
        p2 = _grouped_plans()
    finally:
        _hook("force_blockscaled", old)
    assert route != "blockscaled"
    np.testing.assert_array_equal(to_numpy(got), to_numpy(want))
    np.testing.assert_array_equal(to_numpy(again), to_numpy(want))
    assert (p1 - p0, p2 - p1) == (1, 0), (p0, p1, p2)
    _check_wgrad(got, refs, f"wgrad {mode} (forced, refused)")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("mode", ["mxfp8", "nvfp4"])
def test_grouped_wgrad_blockscaled_on_blackwell(mode, dtype, rng):
    """Blackwell (compute capability 10.x / 11.0; skipped elsewhere, never run by us: see
    docs/blackwell.md): grouped_qqmm_wgrad takes cuBLASLt's grouped block-scaled GEMM when the
    loaded cuBLASLt has it, and every expert equals the reference within the fp32
    accumulation bound; a simulated cublasLtMatmul failure falls back to the per-expert loop."""
    if qq.device_count() == 0 or qq.device_capability(0)[0] not in (10, 11):
        pytest.skip("needs compute capability 10.x or 11.0 (cuBLASLt's grouped block-scaled GEMM)")
    x, dy, kw, ends, refs = _wgrad_case(mode, rng)
    got = qq.grouped_qqmm_wgrad(x, dy, ends, mode, dtype=dtype, **kw)
    if blackwell_grouped(mode):
        assert qq.last_route() == "blockscaled", qq.last_route()
    _check_wgrad(got, refs, f"wgrad {mode} {dtype} on Blackwell")
    old = _hook("fail_blockscaled_matmul", 1)
    try:  # a shape of its own: a fresh plan, whose matmul "fails"
        x2, dy2, kw2, ends2, refs2 = _wgrad_case(mode, rng, n=72 + 8 * ["float32", "bfloat16"].index(dtype))
        fell_back = qq.grouped_qqmm_wgrad(x2, dy2, ends2, mode, dtype=dtype, **kw2)
        route2 = qq.last_route()
    finally:
        _hook("fail_blockscaled_matmul", old)
    assert route2 != "blockscaled", route2
    _check_wgrad(fell_back, refs2, f"wgrad {mode} {dtype} after a failed matmul")


@pytest.mark.gpu
def test_grouped_wgrad_blockscaled_emulated_over_1024_experts(rng):
    """1100 experts: the plan kernel's prefixes (each expert's first block and first scale
    column) run over two chunks of its 1024 threads, the second carrying the first's sums."""
    sizes = [0, 1, 3, 32, 0, 33, 2, 0, 64, 5, 1] * 100
    t, k, n = sum(sizes), 64, 32
    x = cast(rng.standard_normal((t, k)), BF16)
    dy = cast(rng.standard_normal((t, n)), BF16)
    cfg = FpCfg("mxfp8")
    with _Emulated():
        got = qq.grouped_qqmm_wgrad(dev(x, "cuda"), dev(dy, "cuda"), dev(offsets_of(sizes), "cuda"), "mxfp8")
        route = qq.last_route()
    assert route == "blockscaled", route
    refs = _wgrad_refs(x, dy, sizes, cfg, None, None)
    _check_wgrad(got, refs, "wgrad mxfp8, 1100 experts, emulated")
