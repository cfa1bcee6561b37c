"""qq.checkpoint: quantized weights in safetensors files (docs/checkpoints.md).

    qq.checkpoint.save("w.safetensors", {"layer0.weight": qq.quantize(w, mode="nvfp4"), "bias": b})
    tensors = qq.checkpoint.load("w.safetensors")          # {"layer0.weight": QuantizedArray, ...}

A QuantizedArray named `name` is stored as plain tensors - `name` (the packed data, uint8),
`name_scales`, `name_biases` (affine), `name_global_scale` (nvfp4 with a global scale) - the
names qq.torch.QuantizedLinear's state dict uses for its weight, plus one metadata entry
`qq.quantized.<name>` (JSON: mode, group_size, bits, rounding, scale_layout, fp8_format,
shape) from which load() rebuilds it exactly. Other arrays pass through. The file says
`qq.format = qq-1`. Needs the `safetensors` package (pip install safetensors); works on
NumPy arrays and host copies of torch / CuPy / JAX arrays.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Optional

import numpy as np

from . import _qq

FORMAT = "qq-1"
_META_PREFIX = "qq.quantized."
_PARTS = ("scales", "biases", "global_scale")
_FIELDS = ("mode", "group_size", "bits", "rounding", "scale_layout", "fp8_format")


def _safetensors_numpy(func: str):
    try:
        import safetensors.numpy as sn
    except ImportError as e:  # pragma: no cover - exercised only without the package
        raise ImportError(f"{func}: needs the safetensors package: pip install safetensors "
                          f"(or pip install 'libqq[checkpoint]')") from e
    return sn


def _host(a, func: str, name: str) -> np.ndarray:
    """A NumPy (host) copy or view of array `a` (NumPy, torch, CuPy, JAX)."""
    if isinstance(a, np.ndarray):
        return a
    mod = type(a).__module__.split(".")[0]
    if mod == "torch":
        import torch
        t = a.detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:  # NumPy has no bfloat16: ml_dtypes' (a qq dependency)
            import ml_dtypes
            return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        if t.is_floating_point() and t.element_size() == 1:
            return t.view(torch.uint8).numpy()   # float8 / float4 bytes, as libqq stores them
        return t.numpy()
    if mod == "cupy":
        return a.get()
    try:
        return np.asarray(a)
    except Exception as e:
        raise TypeError(f"{func}: {name}: cannot make a host array of {type(a).__name__}; pass a NumPy, "
                        f"torch, CuPy or JAX array") from e


def save(path, tensors: Mapping[str, Any], metadata: Optional[Mapping[str, str]] = None) -> None:
    """Write `tensors` ({name: QuantizedArray or array}) to the safetensors file `path`.
    `metadata` ({str: str}) is stored as is; its keys must not start with "qq."."""
    func = "qq.checkpoint.save"
    sn = _safetensors_numpy(func)
    if not isinstance(tensors, Mapping):
        raise TypeError(f"{func}: tensors must be a mapping of names to QuantizedArray or arrays; "
                        f"got {type(tensors).__name__}")
    meta = {"qq.format": FORMAT}
    for k, v in (metadata or {}).items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"{func}: metadata must map str to str; got {k!r}: {type(v).__name__}")
        if k.startswith("qq."):
            raise ValueError(f"{func}: metadata key {k!r}: keys starting with 'qq.' are qq's own; rename it")
        meta[k] = v
    out: dict = {}

    def put(key, arr, what):
        if key in out:
            raise ValueError(f"{func}: tensors: the name {key!r} is used twice ({what}); rename one")
        out[key] = np.require(_host(arr, func, key), requirements="C")  # keeps 0-d arrays 0-d

    # every {name}_{part} of a QuantizedArray entry is its own, present or not: load() takes
    # a tensor of that name as the part (a plain array "w_global_scale" beside an nvfp4 "w"
    # without one came back as w's global scale, and beside an mx "w" made the file unreadable)
    reserved = {f"{n}_{p}": n for n, v in tensors.items() if isinstance(v, _qq.QuantizedArray)
                for p in _PARTS}
    for name, v in tensors.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"{func}: tensors: names must be non-empty strings; got {name!r}")
        if not isinstance(v, _qq.QuantizedArray) and name in reserved:
            raise ValueError(f"{func}: tensors: the name {name!r} is reserved for a part of the "
                             f"QuantizedArray {reserved[name]!r} (load() would read it as that "
                             f"part); rename the array")
        if isinstance(v, _qq.QuantizedArray):
            put(name, v.data, f"data of {name}")
            for part in _PARTS:
                arr = getattr(v, part)
                if arr is not None:
                    put(f"{name}_{part}", arr, f"{part} of {name}")
            info = {f: getattr(v, f) for f in _FIELDS}
            info["shape"] = list(v.shape)
            meta[_META_PREFIX + name] = json.dumps(info, sort_keys=True)
        else:
            put(name, v, "an array")
    sn.save_file(out, str(path), metadata=meta)


def load(path) -> dict:
    """Read a file written by save(): {name: QuantizedArray or NumPy array}. Arrays are
    NumPy (host); move them with your framework (e.g. torch.from_numpy(a).cuda())."""
    func = "qq.checkpoint.load"
    sn = _safetensors_numpy(func)
    from safetensors import safe_open
    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
    except OSError:
        raise
    except Exception as e:  # safetensors' SafetensorError: a truncated or damaged file
        raise ValueError(f"{func}: {path}: not a readable safetensors file ({e})") from e
    fmt = meta.get("qq.format")
    if fmt != FORMAT:
        raise ValueError(f"{func}: {path}: not a qq checkpoint of format {FORMAT!r} (qq.format = {fmt!r}); "
                         f"public layouts load through qq.checkpoint.load_layout")
    import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy: safetensors looks it up by name)
    arrays = sn.load_file(str(path))
    result: dict = {}
    used = set()
    for key, value in meta.items():
        if not key.startswith(_META_PREFIX):
            continue
        name = key[len(_META_PREFIX):]
        try:
            info = json.loads(value)
            kw = {f: info[f] for f in _FIELDS}
            shape = tuple(int(d) for d in info["shape"])
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{func}: {path}: metadata {key!r} is damaged ({e}); the file cannot be read") from e
        if name not in arrays:
            raise ValueError(f"{func}: {path}: {name!r}: the packed data tensor is missing")
        parts = {p: arrays.get(f"{name}_{p}") for p in _PARTS}
        if parts["scales"] is None:
            raise ValueError(f"{func}: {path}: {name!r}: the tensor {name}_scales is missing")
        try:
            result[name] = _qq.QuantizedArray(arrays[name], parts["scales"], parts["biases"],
                                              global_scale=parts["global_scale"], shape=shape, **kw)
        except (ValueError, TypeError) as e:   # metadata that contradicts the tensors
            raise ValueError(f"{func}: {path}: {name!r} is damaged: {e}") from None
        used.add(name)
        used.update(f"{name}_{p}" for p in _PARTS)
    for k, a in arrays.items():
        if k not in used:
            result[k] = a
    return result


# ---------------------------------------------------------------------------
# Public layouts (docs/checkpoints.md has each one's names, shapes and scale convention)
# ---------------------------------------------------------------------------

# safetensors dtype strings -> NumPy dtypes of the same bytes. float8 block scales (F8_E4M3,
# F8_E8M0) come back as uint8 bytes, which is how libqq reads them; F4 likewise (two codes per
# byte, low nibble first).
_RAW_DTYPES = {"U8": np.uint8, "I8": np.int8, "U16": np.uint16, "I16": np.int16, "U32": np.uint32,
               "I32": np.int32, "U64": np.uint64, "I64": np.int64, "F16": np.float16, "F32": np.float32,
               "F64": np.float64, "BOOL": np.bool_, "F8_E4M3": np.uint8, "F8_E5M2": np.uint8,
               "F8_E8M0": np.uint8, "F4": np.uint8}


def read_raw(path) -> tuple:
    """(metadata, {name: (dtype string, NumPy array)}) of a safetensors file, float8 / float4
    tensors as their bytes (uint8; F4 with its last axis halved). safetensors' own NumPy
    reader has no float8 types (it raises on the F8_E4M3 scales ModelOpt and
    compressed-tensors store), so this reads the format directly: an 8-byte little-endian
    header length, a JSON header {name: {dtype, shape, data_offsets}} with an optional
    __metadata__, then the data."""
    func = "qq.checkpoint.read_raw"
    import ml_dtypes
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{func}: {path}: not a safetensors file (shorter than its header length)")
    n = int.from_bytes(raw[:8], "little")
    if 8 + n > len(raw):  # (before parsing: a file cut inside its header is truncated, not "not JSON")
        raise ValueError(f"{func}: {path}: the file is truncated (its header claims {n} bytes; "
                         f"{len(raw) - 8} follow the header length)")
    try:
        header = json.loads(raw[8:8 + n])
    except ValueError as e:
        raise ValueError(f"{func}: {path}: not a safetensors file (its header is not JSON)") from e
    if not isinstance(header, dict):
        raise ValueError(f"{func}: {path}: not a safetensors file (its header is not a JSON object)")
    meta = header.pop("__metadata__", None) or {}
    data = memoryview(raw)[8 + n:]
    out = {}
    for name, info in header.items():
        damaged = f"{func}: {path}: tensor {name!r}: its header entry is damaged"
        try:
            dt, shape, (b0, b1) = info["dtype"], list(info["shape"]), info["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise ValueError(f"{damaged} (expected {{dtype, shape, data_offsets: [begin, end]}}, got "
                             f"{info!r:.200})") from None
        if (not all(type(d) is int and d >= 0 for d in shape) or type(b0) is not int or type(b1) is not int
                or not 0 <= b0 <= b1 or (dt == "F4" and not shape)):
            raise ValueError(f"{damaged} (shape {shape!r:.100}, data_offsets {info['data_offsets']!r:.100})")
        if b1 > len(data):
            raise ValueError(f"{func}: {path}: tensor {name!r}: its data ends at byte {b1} of {len(data)}; "
                             f"the file is truncated")
        npdt = ml_dtypes.bfloat16 if dt == "BF16" else _RAW_DTYPES.get(dt)
        if npdt is None:
            raise ValueError(f"{func}: {path}: tensor {name!r} has dtype {dt}, which qq does not read")
        if dt == "F4":
            shape[-1] = (shape[-1] + 1) // 2
        try:
            out[name] = (dt, np.frombuffer(data[b0:b1], dtype=npdt).reshape(shape))
        except ValueError:
            raise ValueError(f"{func}: {path}: tensor {name!r}: its {b1 - b0} bytes do not hold a {dt} "
                             f"tensor of shape {list(info['shape'])} (a damaged file)") from None
    return meta, out


def _need(tensors, key, func, hint):
    if key not in tensors:
        raise ValueError(f"{func}: the tensor {key!r} is missing ({hint})")
    v = tensors[key]
    return v[1] if isinstance(v, tuple) else _host(v, func, key)


# The safetensors dtype of a one-byte tensor where it can be told: read_raw's (dtype, array)
# pairs say it; torch and NumPy (ml_dtypes) arrays by their dtype's name.
_BYTE_DTYPES = {"uint8": "U8", "int8": "I8", "bool": "BOOL", "float8_e4m3fn": "F8_E4M3",
                "float8_e5m2": "F8_E5M2", "float8_e8m0fnu": "F8_E8M0", "float4_e2m1fn_x2": "F4"}
# What each kind of byte tensor may be stored as: its own float type, or plain bytes. A
# float8 type of another kind means other values (E5M2 or E8M0 bytes read as E4M3 scales
# would be silently wrong numbers), so it is refused.
PACKED = ("U8", "I8", "F4")
E4M3 = ("F8_E4M3", "U8")
E8M0 = ("F8_E8M0", "U8")


def _stored_dtype(v):
    if isinstance(v, tuple):
        return v[0]
    dt = getattr(v, "dtype", None)
    return _BYTE_DTYPES.get(str(dt).rpartition(".")[2]) if dt is not None else None


def _bytes(tensors, key, func, what, allowed):
    """tensors[key] as its bytes (uint8), refused unless it holds one byte an element and,
    where its stored dtype is known, that dtype is one of `allowed`."""
    v = tensors[key] if key in tensors else None
    a = _need(tensors, key, func, what)
    dt = _stored_dtype(v)
    if dt is not None and dt not in allowed:
        raise ValueError(f"{func}: {key!r} is stored as {dt}; {what} are stored as "
                         f"{' or '.join(allowed)} (another type means other values): the checkpoint "
                         f"does not have the layout this reader expects")
    a = np.asarray(a)
    if a.dtype.itemsize != 1:
        raise ValueError(f"{func}: {key!r} must hold {what} as one byte each ({' / '.join(allowed)}); "
                         f"got {a.dtype}")
    return a.view(np.uint8)


def _f32_scalar(a, func, key, *, divisor=False):
    """A per-tensor scale as float32 values: finite and >= 0; where it divides, > 0 (+Inf
    included: 2688 / amax of an all-zero weight, which makes no global scale)."""
    try:
        a = np.asarray(a, dtype=np.float32).reshape(-1)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{func}: {key!r} is not a float32 per-tensor scale ({e})") from None
    if a.size == 0:
        raise ValueError(f"{func}: {key!r} is empty")
    if not ((a > 0).all() if divisor else (np.isfinite(a) & (a >= 0)).all()):
        raise ValueError(f"{func}: {key!r} holds {a[:4].tolist()}{' ...' if a.size > 4 else ''}; a per-tensor "
                         f"scale must be {'positive (it divides)' if divisor else 'finite and non-negative'}: "
                         f"the checkpoint is damaged")
    return a


def from_modelopt(tensors: Mapping[str, Any], prefix: str) -> "_qq.QuantizedArray":
    """NVIDIA ModelOpt NVFP4 linear `prefix` ({prefix}.weight U8 [N, K/2], .weight_scale E4M3
    [N, K/16], .weight_scale_2 F32 = amax / 2688) -> nvfp4 QuantizedArray with global_scale
    2688 * weight_scale_2 (libqq's factor is global_scale / 2688). Several fused shards'
    weight_scale_2 values: the largest, as vLLM does."""
    func = "qq.checkpoint.from_modelopt"
    data = _bytes(tensors, f"{prefix}.weight", func, "packed E2M1 codes", PACKED)
    scales = _bytes(tensors, f"{prefix}.weight_scale", func, "E4M3 block scales", E4M3)
    s2 = _f32_scalar(_need(tensors, f"{prefix}.weight_scale_2", func, "per-tensor scale"), func,
                     f"{prefix}.weight_scale_2")
    with np.errstate(over="ignore"):
        gs = np.asarray([np.float32(2688.0) * s2.max()], dtype=np.float32)
    _check_global(func, f"{prefix}.weight_scale_2", gs, scales)
    return _qq.QuantizedArray(data, scales, None, mode="nvfp4", global_scale=gs)


def from_compressed_tensors(tensors: Mapping[str, Any], prefix: str, *, format: Optional[str] = None
                            ) -> "_qq.QuantizedArray":
    """llm-compressor / compressed-tensors linear `prefix`: "nvfp4-pack-quantized"
    ({prefix}.weight_packed U8, .weight_scale E4M3, .weight_global_scale F32 = 2688 / amax)
    -> nvfp4 with global_scale 2688 / weight_global_scale; "mxfp4-pack-quantized" (no global
    scale, .weight_scale U8 E8M0) -> mxfp4. Which one: `format` (the config's) where given,
    and the scales' shape always (one a 16 elements is nvfp4, one a 32 mxfp4): a layer whose
    tensors contradict it is refused, not read as the other format."""
    func = "qq.checkpoint.from_compressed_tensors"
    data = _bytes(tensors, f"{prefix}.weight_packed", func, "packed E2M1 codes", PACKED)
    scales = _bytes(tensors, f"{prefix}.weight_scale", func, "block scales", E4M3 + E8M0[:1])
    key = f"{prefix}.weight_global_scale"
    k = 2 * data.shape[-1] if data.ndim else 0
    by_shape = {k // 16: "nvfp4", k // 32: "mxfp4"}.get(scales.shape[-1] if scales.ndim else -1)
    want = {"nvfp4-pack-quantized": "nvfp4", "mxfp4-pack-quantized": "mxfp4", None: None}.get(format, "?")
    if want == "?":
        raise ValueError(f"{func}: format {format!r}; qq reads nvfp4-pack-quantized and mxfp4-pack-quantized")
    mode = want or by_shape or ("nvfp4" if key in tensors else "mxfp4")
    if by_shape != mode or (mode == "nvfp4") != (key in tensors):
        raise ValueError(f"{func}: {prefix!r} is not a {mode} layer of compressed-tensors: "
                         f"{prefix}.weight_scale has shape {list(scales.shape)} for "
                         f"{prefix}.weight_packed {list(data.shape)} (nvfp4: one scale a 16 elements, with "
                         f"{key}; mxfp4: one a 32, without it), and {key} is "
                         f"{'present' if key in tensors else 'missing'}")
    # (checked against the mode: E4M3 and E8M0 are both one byte a scale)
    _bytes(tensors, f"{prefix}.weight_scale", func, f"{mode}'s block scales", E4M3 if mode == "nvfp4" else E8M0)
    if mode == "mxfp4":
        return _qq.QuantizedArray(data, scales, None, mode="mxfp4")
    gsd = _f32_scalar(_need(tensors, key, func, ""), func, key, divisor=True)
    if np.isinf(gsd).any() and not np.isinf(gsd).all():
        # fused shards: an all-zero shard's +Inf would make the max Inf and drop the others' scale
        raise ValueError(f"{func}: {key!r} mixes +Inf (an all-zero shard) with finite shard scales "
                         f"{gsd[np.isfinite(gsd)][:4].tolist()}; qq keeps one global scale per weight: "
                         f"requantize the fused weight with one scale")
    gs = np.asarray([np.float32(2688.0) / gsd.max()], dtype=np.float32)
    _check_global(func, key, gs, scales)
    return _qq.QuantizedArray(data, scales, None, mode="nvfp4", global_scale=gs)


def _check_global(func, key, gs, scales):
    """A per-tensor scale qq can hold as nvfp4's global scale: finite, and 0 (qq's "no global
    scale", a factor of 1) only where every block scale is 0 too (an all-zero weight reads as
    zeros either way; with non-zero block scales the file's factor 0 would read as 1)."""
    g = float(gs.reshape(-1)[0])
    if not np.isfinite(g):
        raise ValueError(f"{func}: {key!r} gives a global scale of {g} (beyond float32); the checkpoint "
                         f"is damaged")
    if g == 0.0 and np.asarray(scales).any():
        raise ValueError(f"{func}: {key!r} makes the weight's factor 0 while its block scales are not 0; qq "
                         f"cannot hold that (its global scale 0 means 'none'): the checkpoint is damaged")


def from_gpt_oss(tensors: Mapping[str, Any], prefix: str) -> "_qq.QuantizedArray":
    """gpt-oss MXFP4 expert weights `prefix` (e.g. model.layers.0.mlp.experts.gate_up_proj:
    {prefix}_blocks U8 [E, N, K/32, 16], {prefix}_scales U8 E8M0 [E, N, K/32]; the original
    checkpoint's {prefix}.blocks / .scales too) -> mxfp4 QuantizedArray [E, N, K], no byte
    changed. The bias ({prefix}_bias) is a plain tensor of the file."""
    func = "qq.checkpoint.from_gpt_oss"
    sep = "_" if f"{prefix}_blocks" in tensors else "."
    blocks = _bytes(tensors, f"{prefix}{sep}blocks", func, "packed E2M1 blocks", PACKED)
    scales = _bytes(tensors, f"{prefix}{sep}scales", func, "E8M0 scales", E8M0)
    if blocks.ndim < 2 or blocks.shape[-1] != 16:
        raise ValueError(f"{func}: {prefix}{sep}blocks must be [..., K/32, 16]; got {blocks.shape}")
    data = blocks.reshape(*blocks.shape[:-2], blocks.shape[-2] * 16)
    return _qq.QuantizedArray(data, scales, None, mode="mxfp4")


def deinterleave(qa: "_qq.QuantizedArray", parts: int = 2) -> tuple:
    """Split a quantized weight [..., N, K] whose rows interleave `parts` matrices (row
    parts*j + i is matrix i's row j) into `parts` QuantizedArrays [..., N/parts, K] - e.g.
    gpt-oss's fused gate_up_proj experts, whose even rows are the gate and odd rows the up
    projection: ``gate, up = qq.checkpoint.deinterleave(from_gpt_oss(t, prefix))``. Packed
    data, linear scales and affine biases are sliced the same way (no byte changes; contiguous
    copies), the global scale is shared. Blocked scales cannot be sliced by row: unswizzle
    them first (qq.unswizzle_scales)."""
    func = "qq.checkpoint.deinterleave"
    if not isinstance(qa, _qq.QuantizedArray):
        raise TypeError(f"{func}: qa: expected a qq.QuantizedArray, got {type(qa).__name__}")
    if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:  # (True is an int: 1)
        raise ValueError(f"{func}: parts: expected a positive int, got {parts!r}")
    shape = tuple(qa.shape)
    if len(shape) < 2 or shape[-2] % parts:
        raise ValueError(f"{func}: qa has shape {shape}; its rows (axis -2) must be a multiple of parts={parts}")
    if qa.scale_layout != "linear":
        raise ValueError(f"{func}: qa has blocked scales, which interleave 128-row tiles; pass linear scales "
                         f"(qq.unswizzle_scales)")

    def rows(a, i):
        if a is None:
            return None
        v = a[..., i::parts, :]
        return v.contiguous() if hasattr(v, "contiguous") else np.ascontiguousarray(v)

    out_shape = shape[:-2] + (shape[-2] // parts, shape[-1])
    return tuple(_qq.QuantizedArray(rows(qa.data, i), rows(qa.scales, i), rows(qa.biases, i), mode=qa.mode,
                                    group_size=qa.group_size, bits=qa.bits, global_scale=qa.global_scale,
                                    rounding=qa.rounding, fp8_format=qa.fp8_format, shape=out_shape)
                 for i in range(parts))


def from_mlx(tensors: Mapping[str, Any], prefix: str, *, mode: str = "affine", group_size: Optional[int] = None,
             bits: Optional[int] = None) -> "_qq.QuantizedArray":
    """MLX (mlx-lm / mlx-community) QuantizedLinear `prefix` ({prefix}.weight U32
    [N, K*bits/32], .scales, .biases for affine, .global_scale for nvfp4 if present) with
    the model config's quantization mode / group_size / bits -> QuantizedArray. MLX's
    uint32 words read as little-endian bytes are libqq's packed rows."""
    func = "qq.checkpoint.from_mlx"
    w = np.asarray(_need(tensors, f"{prefix}.weight", func, "packed uint32 words"))
    if w.dtype != np.uint32:
        raise ValueError(f"{func}: {prefix}.weight must be uint32 (MLX's packed words); got {w.dtype}")
    if w.ndim < 2:
        raise ValueError(f"{func}: {prefix}.weight has shape {w.shape}; MLX's packed weights are "
                         f"[..., N, K*bits/32]")
    data = w.astype("<u4", copy=False).view(np.uint8)
    scales = np.asarray(_need(tensors, f"{prefix}.scales", func, "scales"))
    bkey = f"{prefix}.biases"
    biases = _need(tensors, bkey, func, "") if bkey in tensors else None
    if mode == "affine" and biases is None:
        raise ValueError(f"{func}: {prefix}.biases is missing (mode 'affine'); pass the model's quantization mode")
    gs = None
    if mode == "nvfp4" and f"{prefix}.global_scale" in tensors:
        gs = _f32_scalar(_need(tensors, f"{prefix}.global_scale", func, ""), func, f"{prefix}.global_scale")
    if mode != "affine":
        scales = _bytes(tensors, f"{prefix}.scales", func, f"{mode}'s scales", E4M3 if mode == "nvfp4" else E8M0)
    return _qq.QuantizedArray(data, scales, biases if mode == "affine" else None, mode=mode,
                              group_size=group_size, bits=bits, global_scale=gs)


_LAYOUTS = {
    # layout: (suffix that marks one quantized tensor, its weight name's suffix, loader)
    "modelopt": (".weight_scale_2", ".weight", from_modelopt),
    "compressed-tensors": (".weight_packed", ".weight", from_compressed_tensors),
    "gpt-oss": ("_blocks", "", from_gpt_oss),
    "mlx": (".scales", ".weight", from_mlx),
}


def load_layout(path, layout: str, **kwargs) -> dict:
    """Read a safetensors file in a public layout ("modelopt", "compressed-tensors",
    "gpt-oss", "mlx"; kwargs go to the layout's from_* function, e.g. mode / group_size /
    bits for "mlx") -> {name: QuantizedArray or NumPy array}: each quantized weight under
    its weight's name ({prefix}.weight; gpt-oss: the expert prefix), every other tensor as
    is (fp8 / fp4 ones as bytes)."""
    func = "qq.checkpoint.load_layout"
    if layout not in _LAYOUTS:
        raise ValueError(f"{func}: layout must be one of {sorted(_LAYOUTS)}; got {layout!r}")
    _, tensors = read_raw(path)
    return _from_layout(func, tensors, layout, kwargs)


def _from_layout(func, tensors, layout, kwargs, overrides=None) -> dict:
    """load_layout's conversion of {name: (dtype, array)} (one file, or every shard of a
    model directory together: a weight's parts may lie in different shards). `overrides`: MLX
    per-module {prefix: {mode, group_size, bits}}. A part of a quantized weight whose weight
    the layout does not find (a missing marker tensor, or tensors of another layout) is
    refused, not passed through as a plain array."""
    marker, wsuffix, loader = _LAYOUTS[layout]
    prefixes = [k[:-len(marker)] for k in tensors if k.endswith(marker)]
    if layout == "gpt-oss":
        prefixes += [k[:-len(".blocks")] for k in tensors if k.endswith(".blocks")]
    found = set(prefixes)
    for k in tensors:
        for part in _ORPHANS[layout]:
            if k.endswith(part) and k[:-len(part)] not in found:
                raise ValueError(f"{func}: {k!r} is a part of a {layout} quantized weight, but "
                                 f"{k[:-len(part)] + marker!r} is missing (or the tensors are in another "
                                 f"layout than {layout!r}); the checkpoint is incomplete")
    result, used = {}, set()
    for p in sorted(prefixes):
        kw = dict(kwargs)
        o = (overrides or {}).get(p)
        if isinstance(o, dict):
            kw.update({k: o[k] for k in ("mode", "group_size", "bits") if k in o})
        result[p + wsuffix] = loader(tensors, p, **kw)
        # the layer's tensor names (a scan of every tensor a layer was quadratic in a model's)
        used.update([p + wsuffix] + [p + part for part in _PART_NAMES[layout]])
    for k, (_, a) in tensors.items():
        if k not in used and k not in result:
            result[k] = a
    return result


# the tensors of one quantized weight, per layout (what load_layout does not pass through)
_ORPHANS = {  # parts that exist only beside the layout's marker tensor
    "modelopt": (".weight_scale",),
    "compressed-tensors": (".weight_scale", ".weight_global_scale"),
    "gpt-oss": ("_scales",),
    "mlx": (".biases",),
}
_PART_NAMES = {
    "modelopt": {".weight", ".weight_scale", ".weight_scale_2"},
    "compressed-tensors": {".weight_packed", ".weight_scale", ".weight_global_scale"},
    "gpt-oss": {"_blocks", "_scales", ".blocks", ".scales"},
    "mlx": {".weight", ".scales", ".biases", ".global_scale"},
}


def _detect_layout(cfg: dict, hf_quant: Optional[dict]) -> tuple:
    """(layout, kwargs for its loader) from a model directory's config.json and
    hf_quant_config.json (docs/checkpoints.md, "Model directories")."""
    func = "qq.checkpoint.load_pretrained"
    hq = (hf_quant or {}).get("quantization")
    if isinstance(hq, dict) and str(hq.get("quant_algo", "")).upper() == "NVFP4":
        return "modelopt", {}
    qc = cfg.get("quantization_config") or {}
    if not isinstance(qc, dict):
        raise ValueError(f"{func}: config.json's quantization_config is a {type(qc).__name__}; expected an object")
    method = str(qc.get("quant_method", "")).lower()
    if method == "modelopt":
        if str(qc.get("quant_algo", "")).upper() != "NVFP4":
            raise ValueError(f"{func}: a ModelOpt checkpoint with quant_algo {qc.get('quant_algo')!r}; "
                             f"qq loads NVFP4 only")
        return "modelopt", {}
    if method == "compressed-tensors":
        fmt = qc.get("format")
        if fmt not in ("nvfp4-pack-quantized", "mxfp4-pack-quantized"):
            raise ValueError(f"{func}: a compressed-tensors checkpoint in format {fmt!r}; qq loads "
                             f"nvfp4-pack-quantized and mxfp4-pack-quantized")
        return "compressed-tensors", {"format": fmt}
    if method == "mxfp4":
        return "gpt-oss", {}
    q = cfg.get("quantization")
    if isinstance(q, dict) and "bits" in q and "group_size" in q:
        return "mlx", {"mode": q.get("mode", "affine"), "group_size": int(q["group_size"]), "bits": int(q["bits"])}
    raise ValueError(f"{func}: config.json names no quantization qq reads (quantization_config.quant_method "
                     f"{method or None!r}, no MLX 'quantization' entry); pass a layout to load_layout instead")


def load_pretrained(directory) -> dict:
    """Every tensor of a quantized model directory (config.json, optional
    hf_quant_config.json, model.safetensors or shards listed in
    model.safetensors.index.json): the layout comes from the config (ModelOpt NVFP4,
    compressed-tensors nvfp4/mxfp4-pack-quantized, gpt-oss mxfp4, MLX with per-module
    overrides of mode / group_size / bits), each quantized weight becomes a QuantizedArray
    as load_layout gives it, every other tensor an array."""
    import os
    func = "qq.checkpoint.load_pretrained"
    d = os.fspath(directory)

    def read_json(name):
        p = os.path.join(d, name)
        if not os.path.exists(p):
            return None
        try:
            with open(p) as f:
                v = json.load(f)
        except ValueError as e:
            raise ValueError(f"{func}: {p}: not valid JSON ({e})") from None
        if not isinstance(v, dict):
            raise ValueError(f"{func}: {p}: expected a JSON object; got {type(v).__name__}")
        return v

    cfg = read_json("config.json")
    if cfg is None:
        raise ValueError(f"{func}: {d}: no config.json; pass a model directory, or load one file with load_layout")
    layout, kwargs = _detect_layout(cfg, read_json("hf_quant_config.json"))
    index = read_json("model.safetensors.index.json")
    if index is not None:
        files = sorted(set((index.get("weight_map") or {}).values()))
    else:
        files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    if not files:
        raise ValueError(f"{func}: {d}: no .safetensors files")
    overrides = cfg.get("quantization") if layout == "mlx" else None
    # every shard's tensors together first: a weight's parts may lie in different shards
    tensors: dict = {}
    for fname in files:
        path = os.path.join(d, fname)
        if not os.path.isfile(path):
            raise ValueError(f"{func}: {d}: the shard {fname!r} (model.safetensors.index.json) is missing")
        _, part = read_raw(path)
        dup = set(part) & set(tensors)
        if dup:
            raise ValueError(f"{func}: {d}: {sorted(dup)[0]!r} appears in two files")
        tensors.update(part)
    return _from_layout(func, tensors, layout, kwargs, overrides if isinstance(overrides, dict) else None)
