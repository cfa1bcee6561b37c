# _params.pxi - included by _qq.pyx (one extension module, one file per job).
# Parameters and dtypes: string arguments -> the C enums (validated once, cached).

# =========================================================================================
# Parameters and dtypes
# =========================================================================================

_MODES = {"affine": QQ_MODE_AFFINE, "nvfp4": QQ_MODE_NVFP4, "mxfp4": QQ_MODE_MXFP4,
          "mxfp8": QQ_MODE_MXFP8}
_ROUNDINGS = {"ceil": QQ_ROUNDING_CEIL, "floor": QQ_ROUNDING_FLOOR}
_LAYOUTS = {"linear": QQ_SCALE_LINEAR, "blocked": QQ_SCALE_BLOCKED}
_FP8_FORMATS = {"e4m3": QQ_FP8_E4M3, "e5m2": QQ_FP8_E5M2}
# qqmm's route= (qq.h qqRoute_t; the names are qqGetRouteString's).
_ROUTES = {"auto": QQ_ROUTE_AUTO, "cpu": QQ_ROUTE_CPU, "exact": QQ_ROUTE_EXACT,
           "blockscaled": QQ_ROUTE_BLOCKSCALED, "qmma": QQ_ROUTE_QMMA, "qmv": QQ_ROUTE_QMV}

# Float dtypes libqq reads and writes; results are created in one of these or uint8.
_FLOAT_DTYPES = ("float32", "float16", "bfloat16")
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "uint8": 1}


cdef int _enum(str func, str arg, value, dict table) except -1:
    if not isinstance(value, str):
        raise TypeError(f"{func}: {arg}: expected a string, one of {', '.join(map(repr, table))}; "
                        f"got {type(value).__name__} {value!r}")
    try:
        return table[value]
    except KeyError:
        raise ValueError(f"{func}: {arg}: expected one of {', '.join(map(repr, table))}; "
                         f"got {value!r}") from None


cdef int _int_arg(str func, str arg, value) except? -1:
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{func}: {arg}: expected an int or None, got "
                        f"{type(value).__name__} {value!r}") from None
    if not -2**31 <= v < 2**31:
        raise ValueError(f"{func}: {arg}: {v} is out of range (see docs/api.md for the values "
                         f"each mode takes)")
    return v


# Resolved and validated parameters per (mode, group_size, bits, rounding, scale_layout,
# fp8_format): a call with parameters seen before costs one dict lookup and a copy.
cdef dict _PARAMS_CACHE = {}
# The last arguments _quant_params resolved, by identity: a loop of calls with the same
# arguments skips building and hashing the key (~0.1 us a call). Both caches keep only
# arguments of the exact types str, int and None (immutable, and held here, so an identical
# object is an equal one; an object with __index__ may change its value, and one hashed by
# id would fill the dict).
cdef tuple _LAST_PARAMS_ARGS = None
cdef qqQuantParams_t _last_params


cdef inline bint _plain(x):
    return x is None or type(x) is str or type(x) is int


cdef inline bint _plain_key(tuple key):
    return (_plain(key[0]) and _plain(key[1]) and _plain(key[2]) and _plain(key[3])
            and _plain(key[4]) and _plain(key[5]))


cdef int _quant_params(str func, qqQuantParams_t* p, mode, group_size, bits, rounding,
                       scale_layout, fp8_format) except -1:
    """Fill *p: the mode's defaults (qqQuantParamsInit), then every explicit parameter,
    validated by libqq (so that a bad group_size or bits is named as such, not as a shape
    error of whatever array is read first).

    After this, p.group_size and p.bits hold the effective values (None -> the default),
    which is what QuantizedArray records.
    """
    global _LAST_PARAMS_ARGS, _last_params
    cdef tuple last = _LAST_PARAMS_ARGS
    if (last is not None and mode is last[0] and group_size is last[1] and bits is last[2]
            and rounding is last[3] and scale_layout is last[4] and fp8_format is last[5]):
        p[0] = _last_params
        return 0
    key = (mode, group_size, bits, rounding, scale_layout, fp8_format)
    # Only plain keys are cached and looked up: 32.0 or a str subclass would find the entry of
    # 32 or of the str (equal, of the same hash) and skip the checks that refuse them.
    cdef bint plain = _plain_key(key)
    cdef bytes cached = _PARAMS_CACHE.get(key) if plain else None
    if cached is not None:
        memcpy(p, <const char*>cached, sizeof(qqQuantParams_t))
        _last_params = p[0]     # (the struct before the key that names it)
        _LAST_PARAMS_ARGS = key
        return 0
    cdef qqStatus_t st = qqQuantParamsInit(p, <qqMode_t>_enum(func, "mode", mode, _MODES))
    _check(st)
    if group_size is not None:
        p.group_size = _int_arg(func, "group_size", group_size)
        if p.group_size <= 0:
            raise ValueError(f"{func}: group_size: {p.group_size} is not a group size; pass None "
                             f"for the mode's default ({mode!r}: docs/api.md)")
    if bits is not None:
        p.bits = _int_arg(func, "bits", bits)
        if p.bits <= 0:
            raise ValueError(f"{func}: bits: {p.bits} is not a bit width; pass None for the "
                             f"mode's default ({mode!r}: docs/api.md)")
    p.rounding = <qqRounding_t>_enum(func, "rounding", rounding, _ROUNDINGS)
    p.scale_layout = <qqScaleLayout_t>_enum(func, "scale_layout", scale_layout, _LAYOUTS)
    p.fp8_format = <qqFp8Format_t>_enum(func, "fp8_format", fp8_format, _FP8_FORMATS)
    # libqq validates the combination (qqQuantizedShapes of one group's worth of x).
    cdef int64_t xs = p.group_size
    cdef int64_t ds
    cdef int64_t ss[2]
    cdef int sn = 0
    _check_as(qqQuantizedShapes(p, 1, &xs, &ds, ss, &sn), "quantized_shapes", func)
    if plain:
        if len(_PARAMS_CACHE) < 256:
            _PARAMS_CACHE[key] = (<char*>p)[:sizeof(qqQuantParams_t)]
        _last_params = p[0]
        _LAST_PARAMS_ARGS = key
    return 0


cdef bint _flag(str func, str name, value) except -1:
    """A True / False argument (NumPy's bool too): a string or a number would be read by its
    truth value ("no" as True), so anything else is a TypeError."""
    if value is True or value is False or isinstance(value, np.bool_):
        return bool(value)
    raise TypeError(f"{func}: {name} must be True or False; got {value!r}")


cdef str _dtype_arg(str func, dtype):
    """The `dtype=` argument as one of _FLOAT_DTYPES, or None when not given."""
    if dtype is None:
        return None
    name = None
    if isinstance(dtype, str):
        name = dtype[6:] if dtype.startswith("torch.") else dtype
    elif (type(dtype).__module__ or "").startswith("torch"):
        name = str(dtype).rpartition(".")[2]        # torch.bfloat16 -> "bfloat16"
    else:
        try:                                         # NumPy, ml_dtypes, JAX and CuPy dtypes
            name = np.dtype(dtype).name
        except TypeError:
            pass
    if name not in _FLOAT_DTYPES:
        raise TypeError(f"{func}: dtype: expected 'float32', 'float16' or 'bfloat16' (or the "
                        f"matching NumPy / framework dtype), got {dtype!r}")
    return name


# NumPy dtype name -> DLPack (type code, bits). ml_dtypes' bfloat16 / float8 types are
# NumPy "void"-kind dtypes, recognised by name only; every other dtype maps by its kind
# so that libqq, not this table, decides what an operation accepts.
_NUMPY_TO_DL = {
    "float32": (kDLFloat, 32), "float16": (kDLFloat, 16), "bfloat16": (kDLBfloat, 16),
    "uint8": (kDLUInt, 8), "int8": (kDLInt, 8), "int32": (kDLInt, 32),
    "float8_e4m3fn": (kDLFloat8_e4m3fn, 8), "float8_e5m2": (kDLFloat8_e5m2, 8),
    "float8_e8m0fnu": (kDLFloat8_e8m0fnu, 8), "float8_e4m3fnuz": (kDLFloat8_e4m3fnuz, 8),
    "float8_e5m2fnuz": (kDLFloat8_e5m2fnuz, 8), "float8_e4m3b11fnuz": (kDLFloat8_e4m3b11fnuz, 8),
    "float8_e3m4": (kDLFloat8_e3m4, 8), "float8_e4m3": (kDLFloat8_e4m3, 8),
}
_KIND_TO_DL = {"f": kDLFloat, "i": kDLInt, "u": kDLUInt, "b": kDLBool, "c": kDLComplex}

# DLPack (type code, bits) -> the name we use for output dtypes (floats and uint8 only).
_DL_TO_NAME = {(kDLFloat, 32): "float32", (kDLFloat, 16): "float16",
               (kDLBfloat, 16): "bfloat16", (kDLUInt, 8): "uint8"}
_DL_TO_NAME_CODES = {"float32": (kDLFloat, 32), "float16": (kDLFloat, 16),
                     "bfloat16": (kDLBfloat, 16), "uint8": (kDLUInt, 8)}


# torch_dtypes= (torch callers only; docs/api.md, "torch dtypes"): what a quantize result's
# bytes are typed as. True (the default): fp scales as float8_e4m3fn (nvfp4's E4M3) or
# float8_e8m0fnu (mx UE8M0), mxfp8 elements as float8_e4m3fn / float8_e5m2, packed fp4 as
# uint8 (as torchao's NVFP4Tensor / MXTensor hold them); "float4": packed fp4 as
# float4_e2m1fn_x2 too; False: every byte result uint8. A torch without a dtype keeps uint8.
# Affine scales and biases always have x's float dtype. The bytes are the same either way.
_TORCH_BYTE_DTYPES = {"float8_e4m3fn": (kDLFloat8_e4m3fn, 8, 1), "float8_e5m2": (kDLFloat8_e5m2, 8, 1),
                      "float8_e8m0fnu": (kDLFloat8_e8m0fnu, 8, 1),
                      "float4_e2m1fn_x2": (kDLFloat4_e2m1fn, 4, 2)}
cdef dict _TYPED_CACHE = {}


cdef inline int _check_torch_dtypes(str func, value) except -1:
    """torch_dtypes= is True, False or "float4" (qq/_dispatch.py's check_torch_dtypes is the
    pure-Python twin, for code that Dynamo traces)."""
    if value is not True and value is not False and value != "float4":
        raise ValueError(f"{func}: torch_dtypes: expected True, False or 'float4', got {value!r}")
    return 0


cdef tuple _torch_typed(str func, int mode, int fp8_format, torch_dtypes):
    """(data dtype name, scales dtype name) of a quantize result for a torch caller (scales:
    the name for fp modes; affine callers use x's dtype)."""
    key = (mode, fp8_format, torch_dtypes)
    try:
        r = _TYPED_CACHE.get(key)
    except TypeError:
        r = None
    if r is not None:
        return r
    _check_torch_dtypes(func, torch_dtypes)
    data, scales = "uint8", "uint8"
    if torch_dtypes is not False:
        if mode == QQ_MODE_NVFP4:
            scales = "float8_e4m3fn"
        elif mode == QQ_MODE_MXFP4 or mode == QQ_MODE_MXFP8:
            scales = "float8_e8m0fnu"
        if mode == QQ_MODE_MXFP8:
            data = "float8_e4m3fn" if fp8_format == QQ_FP8_E4M3 else "float8_e5m2"
        elif torch_dtypes == "float4" and (mode == QQ_MODE_NVFP4 or mode == QQ_MODE_MXFP4):
            data = "float4_e2m1fn_x2"
    torch = sys.modules["torch"]
    if not hasattr(torch, data):
        data = "uint8"
    if not hasattr(torch, scales):
        scales = "uint8"
    r = (data, scales)
    if len(_TYPED_CACHE) < 256:
        _TYPED_CACHE[key] = r
    return r


def _torch_result_dtypes(mode, fp8_format="e4m3", torch_dtypes=True):
    """(data, scales) dtype names of quantize's results for a torch caller: the rule the
    torch.compile fake implementations use (qq/_torch_ops.py)."""
    return _torch_typed("quantize", _enum("quantize", "mode", mode, _MODES),
                        _enum("quantize", "fp8_format", fp8_format, _FP8_FORMATS), torch_dtypes)


cdef object _numpy_dtype(str name):
    if name == "bfloat16":
        import ml_dtypes                            # a dependency of qq; NumPy has no bfloat16
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _mode_defaults():
    """{mode: (group_size, bits)} of every mode, as qqQuantParamsInit fills them: the one
    table the Python modules use (the torch.compile shape rules, qq.torch, qq.jax)."""
    cdef qqQuantParams_t p
    out = {}
    for name, m in _MODES.items():
        _check(qqQuantParamsInit(&p, <qqMode_t>m))
        out[name] = (p.group_size, p.bits)
    return out
