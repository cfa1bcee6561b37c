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

    for name, v in tensors.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"{func}: tensors: names must be non-empty strings; got {name!r}")
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
    with safe_open(str(path), framework="numpy") as f:
        meta = f.metadata() or {}
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
        result[name] = _qq.QuantizedArray(arrays[name], parts["scales"], parts["biases"],
                                          global_scale=parts["global_scale"], shape=shape, **kw)
        used.add(name)
        used.update(f"{name}_{p}" for p in _PARTS)
    for k, a in arrays.items():
        if k not in used:
            result[k] = a
    return result
