"""What the matmul tests share (test_qqmm.py, test_qmm.py, test_qmv.py, test_qmma.py): the
configurations, random operands, the reference calls and the helpers that run a call on a device.

The reference computes the exact result in float64 from the quantized operands; a correct
fp32-accumulating GEMM lies within 1e-5 * sum|a_i b_i| of it, plus the alpha/bias
roundings and one ulp of the output dtype (reference.matmul_mismatch). A wrong code,
scale, group or transpose moves the answer by far more than that."""

from __future__ import annotations

import numpy as np
import pytest

import qq
import reference as R
from helpers import FpCfg, cast, to_device, try_import

F32 = np.float32


QQMM_CFGS = [FpCfg("nvfp4"), FpCfg("nvfp4", global_scale=True), FpCfg("mxfp4", "ceil"),
             FpCfg("mxfp4", "floor"), FpCfg("mxfp8", "ceil", "e4m3"), FpCfg("mxfp8", "floor", "e5m2")]


QQMM_PARAMS = [pytest.param(c, id=str(c)) for c in QQMM_CFGS]


def randn(rng, shape, dtype=F32, scale=1.0):
    return cast(rng.standard_normal(shape) * scale, dtype)


def dev(a, device):
    return to_device(None if a is None else np.asarray(a), device)


def qq_kwargs(cfg: FpCfg):
    kw = {"mode": cfg.mode}
    if cfg.mode != "nvfp4":
        kw["rounding"] = cfg.rounding
    if cfg.mode == "mxfp8":
        kw["fp8_format"] = cfg.fp8_format
    return kw


def ref_qqmm(x, w, cfg: FpCfg, gx=None, gw=None, bias=None):
    return R.qqmm(x, w, cfg.mode, global_scale_x=gx, global_scale_w=gw, bias=bias,
                  rounding=cfg.rounding, fp8_format=cfg.fp8_format)


def qmm(device, x, ref: R.RefQuantized, transpose=True, **kw):
    """qq.quantized_matmul with the reference's packed weight, on `device`."""
    extra = {}
    if ref.mode == "mxfp8":
        extra["fp8_format"] = ref.fp8_format
    if ref.global_scale is not None:
        extra["global_scale"] = dev(ref.global_scale, device)
    if "bias" in kw:
        kw["bias"] = dev(kw["bias"], device)
    if "out" in kw:
        extra["out"] = kw.pop("out")
    return qq.quantized_matmul(dev(x, device), dev(ref.data, device), dev(ref.scales, device),
                               dev(ref.biases, device), transpose=transpose,
                               group_size=ref.group_size, bits=ref.bits, mode=ref.mode,
                               scale_layout=ref.scale_layout, **extra, **kw)


CFGS = [FpCfg("nvfp4"), FpCfg("nvfp4", global_scale=True), FpCfg("mxfp4", "ceil"), FpCfg("mxfp4", "floor"),
        FpCfg("mxfp8", "ceil", "e4m3"), FpCfg("mxfp8", "floor", "e5m2")]


def torch_or_skip():
    torch = try_import("torch")
    if torch is None or not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA")
    return torch


def cuda(a):
    return to_device(None if a is None else np.asarray(a), "cuda")


def k_for(cfg, k):
    return k if k % cfg.group_size == 0 else k + cfg.group_size - k % cfg.group_size


QMM_WEIGHTS = [("nvfp4", {}), ("nvfp4-gs", {}), ("mxfp4", {}), ("mxfp8", {}), ("mxfp8-e5m2", {}),
               ("affine4", {"group_size": 64, "bits": 4}), ("affine8", {"group_size": 32, "bits": 8}),
               ("affine3", {"group_size": 128, "bits": 3})]


def make_weight(name, shape, rng, layout="linear"):
    """The reference's quantization of a random weight for one QMM_WEIGHTS entry."""
    wf = randn(rng, shape, F32, 0.5)
    if name.startswith("affine"):
        return R.quantize(wf, **dict(QMM_WEIGHTS)[name])
    mode = name.split("-")[0]
    kw = {"mode": mode}
    if name == "mxfp8-e5m2":
        kw["fp8_format"] = "e5m2"
    if name == "nvfp4-gs":
        kw["global_scale"] = R.amax(wf)
    if layout == "blocked":
        kw["scale_layout"] = "blocked"
    return R.quantize(wf, **kw)


def run_qmm(x, ref_q, transpose=True, **kw):
    extra = {}
    if ref_q.mode == "mxfp8":
        extra["fp8_format"] = ref_q.fp8_format
    if ref_q.global_scale is not None:
        extra["global_scale"] = cuda(ref_q.global_scale)
    if kw.get("bias") is not None:
        kw["bias"] = cuda(kw["bias"])
    return qq.quantized_matmul(cuda(x), cuda(ref_q.data), cuda(ref_q.scales), cuda(ref_q.biases),
                               transpose=transpose, group_size=ref_q.group_size, bits=ref_q.bits,
                               mode=ref_q.mode, scale_layout=ref_q.scale_layout, **extra, **kw)
