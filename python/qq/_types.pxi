# _types.pxi - included by _qq.pyx (one extension module, one file per job).
# Shapes (asked of libqq), QuantizedArray, PreparedWeight and prepare_weight.

# =========================================================================================
# Shapes (libqq computes them; Python only asks)
# =========================================================================================

cdef tuple _quantized_shapes(str func, const qqQuantParams_t* p, tuple x_shape, str axis="K"):
    """(data_shape, scales_shape) of quantize(x) for x of shape x_shape, from
    qqQuantizedShapes. `axis` names the caller's quantized axis in a K/group error
    (quantize_colwise quantizes along M)."""
    cdef int64_t xs[_MAX_NDIM]
    cdef int64_t ds[_MAX_NDIM]
    cdef int64_t ss[_MAX_NDIM + 1]
    cdef int nd = len(x_shape)
    cdef int sn = 0
    cdef int i
    cdef qqStatus_t st
    if nd > _MAX_NDIM:
        raise ValueError(f"{func}: {nd} dimensions; at most {_MAX_NDIM} are supported")
    for i in range(nd):
        xs[i] = x_shape[i]
    st = qqQuantizedShapes(p, nd, xs, ds, ss, &sn)     # (arithmetic: the GIL stays)
    try:
        _check_as(st, "quantized_shapes", func)  # about the caller's operation, not this helper
    except ValueError as e:
        if axis == "K":
            raise
        raise ValueError(str(e).replace(" K=", f" {axis}=").replace("pad K", f"pad {axis}")) from None
    return _int_tuple(ds, nd), _int_tuple(ss, sn)


cdef int64_t _unpacked_last(str func, str name, const qqQuantParams_t* p, tuple data_shape) except -1:
    """The logical (float) length of packed data's last axis: the K whose quantized data
    has data_shape's last axis, checked through qqQuantizedShapes."""
    if len(data_shape) == 0:
        raise ValueError(f"{func}: {name}: expected packed data with at least one axis, got a "
                         f"0-d array")
    if p.bits <= 0:
        raise QQError(f"{func}: qqQuantParamsInit left bits={p.bits}; please report this bug")
    nbytes = data_shape[-1]
    if nbytes * 8 % p.bits != 0:
        raise ValueError(f"{func}: {name}: the last axis holds {nbytes} bytes, which is not a "
                         f"whole number of {p.bits}-bit values")
    k = nbytes * 8 // p.bits
    try:
        ds, _ = _quantized_shapes(func, p, data_shape[:-1] + (k,))
    except ValueError as e:
        raise ValueError(f"{func}: {name}: packed data with {nbytes} bytes per row holds "
                         f"K={k} values of {p.bits} bits, which no quantize call produces: "
                         f"{e}") from None
    if ds[-1] != nbytes:
        raise ValueError(f"{func}: {name}: the last axis holds {nbytes} bytes, but K={k} "
                         f"values of {p.bits} bits pack into {ds[-1]} bytes")
    return k


cdef int _check_qa_shape(str func, const qqQuantParams_t* p, shape, data_shape) except -1:
    """A QuantizedArray's logical `shape` against its packed `data` (both set by whoever made
    it; its fields can be assigned afterwards). Where the shape sizes a result (dequantize's
    out, prepare_decode's layout) a stale one would give a wrong or misnamed result."""
    data_shape = tuple(int(d) for d in data_shape)
    try:
        want = _quantized_shapes(func, p, tuple(shape))[0]
    except ValueError:
        want = None
    if want != data_shape:
        raise ValueError(f"{func}: w: the QuantizedArray's shape {tuple(shape)} does not match its "
                         f"data of shape {data_shape} (were its fields changed after it was made?); "
                         f"build a new one: qq.QuantizedArray(data, scales, ..., mode=...)")
    return 0


cdef int64_t _weight_n(str func, const qqQuantParams_t* p, bint transpose, tuple w_shape,
                       w_logical) except -1:
    """N of a weight-only matmul: w [..., N, K*bits/8] (transpose) or W [..., K, N] (its
    logical shape when known, else unpacked from w's last axis)."""
    if transpose:
        return w_shape[-2] if len(w_shape) >= 2 else 0
    if w_logical is not None:
        return w_logical[-1]
    return _unpacked_last(func, "w", p, w_shape)


cdef tuple _gather_shape(str func, tuple x_shape, tuple w_shape, tuple idx_shape, int64_t n):
    """out's shape of gather_qmm: x [..., M, K]'s batch axes broadcast with the indices'
    shape, then [M, N]; x and the experts' w [E, ...] checked first."""
    if len(w_shape) != 3:
        raise ValueError(f"{func}: argument 'w' has shape {w_shape}; expected the experts' "
                         f"packed weights [E, N, K*bits/8] (transpose) or [E, K, N*bits/8]")
    if len(x_shape) < 2:
        raise ValueError(f"{func}: argument 'x' has shape {x_shape}; expected [..., M, K]")
    xb = x_shape[:-2]
    try:
        batch = xb if xb == idx_shape else tuple(np.broadcast_shapes(xb, idx_shape))
    except ValueError:
        raise ValueError(f"{func}: the batch axes of x {xb} and the shape of rhs_indices "
                         f"{idx_shape} do not broadcast") from None
    return batch + (x_shape[-2], n)


cdef tuple _matmul_shape(str func, tuple x_shape, tuple w_shape, int64_t n):
    """[..., M, N] for x [..., M, K] and w [..., N or K, ...]: batch axes broadcast as in
    NumPy; a 1-D x [K] gives [..., N]."""
    if len(x_shape) < 1:
        raise ValueError(f"{func}: x: expected [..., M, K], got a 0-d array")
    if len(w_shape) < 2:
        raise ValueError(f"{func}: w: expected at least 2 dimensions, got shape {w_shape}")
    if len(x_shape) == 1:
        return tuple(w_shape[:-2]) + (n,)
    xb = x_shape[:-2]
    wb = w_shape[:-2]
    if len(wb) == 0 or xb == wb:        # the common cases, without NumPy's broadcast_shapes
        return xb + (x_shape[-2], n)
    if len(xb) == 0:
        return wb + (x_shape[-2], n)
    try:
        batch = tuple(np.broadcast_shapes(x_shape[:-2], w_shape[:-2]))
    except ValueError:
        raise ValueError(f"{func}: the batch axes of x {x_shape[:-2]} and w {w_shape[:-2]} do "
                         f"not broadcast") from None
    return batch + (x_shape[-2], n)


# =========================================================================================
# QuantizedArray
# =========================================================================================

cdef object _take(str func, str arg, given, default, qa_value, str qa_name):
    """An explicit argument next to a QuantizedArray must agree with it. An argument left
    at its default (or None) takes the QuantizedArray's value."""
    if given is None or given == default or given == qa_value:
        return qa_value
    raise ValueError(f"{func}: {arg}={given!r} contradicts {qa_name}.{arg}={qa_value!r}; "
                     f"leave {arg} out to use the QuantizedArray's value")


cdef object _take_array(str func, str arg, given, qa_value, str qa_name, str qa_field):
    if given is None or given is qa_value:
        return qa_value
    if qa_value is None:
        # (the QuantizedArray was made without it: its codes were computed without it too;
        # qq._torch_ops._take_array has the same words for Dynamo)
        raise ValueError(f"{func}: {arg} was given, but {qa_name} is a QuantizedArray with no "
                         f"{qa_field} ({qa_name}.{qa_field} is None: global scales exist only for "
                         f"nvfp4, biases only for affine, and the codes were made without one); "
                         f"leave {arg} out, or quantize with it")
    raise ValueError(f"{func}: {arg} was given both as an argument and as {qa_name}.{qa_field} "
                     f"(a QuantizedArray); pass it once")


def _array_summary(a):
    if a is None:
        return "None"
    mod = (type(a).__module__ or "").partition(".")[0]
    shape = tuple(getattr(a, "shape", ()))
    return f"<{mod} {getattr(a, 'dtype', '?')} {shape}>"


class QuantizedArray:
    """The result of qq.quantize: packed data, scales and (affine) biases with the
    parameters that produced them.

    Unpacks like MLX's result: ``data, scales = qq.quantize(w, mode="nvfp4")`` and
    ``data, scales, biases = qq.quantize(w)`` (affine); len() is 2 or 3 accordingly.
    Every qq function accepts it wherever it takes packed data and reads scales, biases,
    mode, group_size, bits, global_scale, scale_layout and fp8_format from it.

    Fields: data, scales, biases (None unless affine), mode, group_size, bits,
    global_scale (an array or None), rounding, scale_layout, fp8_format, and shape (the
    logical float shape, a tuple of ints).
    """
    __slots__ = ("data", "scales", "biases", "mode", "group_size", "bits", "global_scale",
                 "rounding", "scale_layout", "fp8_format", "shape")

    def __init__(self, data, scales, biases=None, *, mode="affine", group_size=None,
                 bits=None, global_scale=None, rounding="ceil", scale_layout="linear",
                 fp8_format="e4m3", shape=None):
        cdef qqQuantParams_t p
        func = "QuantizedArray"
        _quant_params(func, &p, mode, group_size, bits, rounding, scale_layout, fp8_format)
        mode, rounding, scale_layout, fp8_format = (_plain_str(mode), _plain_str(rounding),
                                                    _plain_str(scale_layout), _plain_str(fp8_format))
        if mode == "affine" and biases is None:
            raise ValueError(f"{func}: biases: affine mode needs biases")
        if mode != "affine" and biases is not None:
            raise ValueError(f"{func}: biases: mode {mode!r} has no biases")
        if global_scale is not None and mode != "nvfp4":
            raise ValueError(f"{func}: global_scale: only nvfp4 has a global scale, got mode {mode!r}")
        if shape is None:
            if not hasattr(data, "shape"):
                raise TypeError(f"{func}: data: expected an array of packed codes, got "
                                f"{type(data).__name__} (its logical shape comes from it; or pass shape=)")
            data_shape = tuple(int(d) for d in data.shape)
            shape = data_shape[:-1] + (_unpacked_last(func, "data", &p, data_shape),)
        else:
            # a logical shape that does not match the data would surface later as an error
            # about an 'out' the caller never passed, or a negative extent as NumPy's own
            try:
                shape = tuple(operator.index(d) for d in shape)
            except TypeError:
                raise TypeError(f"{func}: shape: expected a sequence of ints, got {shape!r}") from None
            if any(d < 0 for d in shape):
                raise ValueError(f"{func}: shape: {shape} has a negative extent; pass the logical "
                                 f"float shape [..., K] of the data (or leave shape out)")
            if hasattr(data, "shape"):
                data_shape = tuple(int(d) for d in data.shape)
                try:
                    want = _quantized_shapes(func, &p, shape)[0] if shape else None
                except ValueError as e:
                    why = str(e).replace(f"{func}: argument 'x': ", "")
                    raise ValueError(f"{func}: shape: {shape} is not the shape of a {mode} array "
                                     f"({why})") from None
                if want != data_shape:
                    raise ValueError(f"{func}: shape: {shape} packs into data of shape {want}, but "
                                     f"'data' has shape {data_shape}; pass the logical float shape "
                                     f"[..., K] of the data (or leave shape out)")
        self.data = data
        self.scales = scales
        self.biases = biases
        self.mode = mode
        self.group_size = p.group_size
        self.bits = p.bits
        self.global_scale = global_scale
        self.rounding = rounding
        self.scale_layout = scale_layout
        self.fp8_format = fp8_format
        self.shape = tuple(int(d) for d in shape)

    def __len__(self):
        return 3 if self.mode == "affine" else 2

    def __iter__(self):
        yield self.data
        yield self.scales
        if self.mode == "affine":
            yield self.biases

    def __getitem__(self, index):
        return tuple(self)[index]

    def __repr__(self):
        parts = [f"mode={self.mode!r}", f"shape={self.shape}", f"group_size={self.group_size}",
                 f"bits={self.bits}", f"scale_layout={self.scale_layout!r}"]
        if self.mode in ("mxfp4", "mxfp8"):
            parts.append(f"rounding={self.rounding!r}")
        if self.mode == "mxfp8":
            parts.append(f"fp8_format={self.fp8_format!r}")
        if self.mode == "nvfp4":
            parts.append(f"global_scale={_array_summary(self.global_scale)}")
        parts.append(f"data={_array_summary(self.data)}")
        parts.append(f"scales={_array_summary(self.scales)}")
        if self.mode == "affine":
            parts.append(f"biases={_array_summary(self.biases)}")
        return f"QuantizedArray({', '.join(parts)})"


# QuantizedArray stays a plain Python class (torch.compile traces code that builds one, and
# cannot trace a Cython type). Its __slots__ are fixed offsets in the object; the results
# of every quantize call are stored there directly (11 generic setattr calls were ~2k
# instructions, more than the rest of a small NumPy quantize's Python side).
cdef Py_ssize_t _QA_SLOT[11]
cdef bint _qa_slots_known = False


cdef bint _slot_offsets(cls, tuple names, Py_ssize_t* out) except -1:
    """The object offsets of class cls's __slots__ `names` into out; False where one is not
    a plain object slot (then the caller keeps to getattr / setattr)."""
    for i, name in enumerate(names):
        d = cls.__dict__.get(name)
        if type(d).__name__ != "member_descriptor" or (<PyMemberDescrObject*>d).d_member.type != T_OBJECT_EX:
            return False
        out[i] = (<PyMemberDescrObject*>d).d_member.offset
    return True


cdef inline PyObject* _slot_ptr(object obj, Py_ssize_t offset) noexcept:
    """The slot of obj at offset (from _slot_offsets), borrowed; NULL where it is empty."""
    return (<PyObject**>((<char*><PyObject*>obj) + offset))[0]


# (the order _new_quantized_array writes)
_qa_slots_known = QuantizedArray.__slots__ == (
    "data", "scales", "biases", "mode", "group_size", "bits", "global_scale", "rounding",
    "scale_layout", "fp8_format", "shape") and _slot_offsets(QuantizedArray, QuantizedArray.__slots__, _QA_SLOT)


cdef inline void _qa_set(object qa, int slot, object value) noexcept:
    """Store `value` in an empty slot of a new QuantizedArray (the slot holds no reference)."""
    Py_INCREF(value)
    (<PyObject**>((<char*><PyObject*>qa) + _QA_SLOT[slot]))[0] = <PyObject*>value


cdef inline object _qa_get(object qa, int slot):
    """A slot of a QuantizedArray (its exact type: a subclass may redefine a field) read
    directly, as getattr would; an empty slot raises getattr's AttributeError."""
    cdef PyObject* v = (<PyObject**>((<char*><PyObject*>qa) + _QA_SLOT[slot]))[0]
    if v == NULL:
        return getattr(qa, QuantizedArray.__slots__[slot])
    return <object>v


cdef inline object _plain_str(v):
    """A validated string parameter as a plain str (a str subclass such as numpy.str_ passes
    the checks; the QuantizedArray keeps the str it names)."""
    return v if v is None or type(v) is str else str(v)


cdef object _new_quantized_array(data, scales, biases, mode, const qqQuantParams_t* p,
                                  global_scale, rounding, scale_layout, fp8_format, tuple shape):
    """A QuantizedArray from an operation that has validated everything already: the fields
    are set directly (QuantizedArray() would resolve the parameters again; 1.5 us a call)."""
    if not (type(mode) is str and type(rounding) is str and type(scale_layout) is str
            and type(fp8_format) is str):      # (the rare case: pointer compares on the hot path)
        mode, rounding, scale_layout, fp8_format = (_plain_str(mode), _plain_str(rounding),
                                                    _plain_str(scale_layout), _plain_str(fp8_format))
    if not _qa_slots_known:
        qa = QuantizedArray.__new__(QuantizedArray)
        (qa.data, qa.scales, qa.biases, qa.mode, qa.group_size, qa.bits, qa.global_scale,
         qa.rounding, qa.scale_layout, qa.fp8_format, qa.shape) = (
            data, scales, biases, mode, p.group_size, p.bits, global_scale, rounding,
            scale_layout, fp8_format, shape)
        return qa
    qa = PyType_GenericAlloc(QuantizedArray, 0)    # what object.__new__ does, without the lookups
    # the order of QuantizedArray.__slots__
    _qa_set(qa, 0, data)
    _qa_set(qa, 1, scales)
    _qa_set(qa, 2, biases)
    _qa_set(qa, 3, mode)
    _qa_set(qa, 4, p.group_size)
    _qa_set(qa, 5, p.bits)
    _qa_set(qa, 6, global_scale)
    _qa_set(qa, 7, rounding)
    _qa_set(qa, 8, scale_layout)
    _qa_set(qa, 9, fp8_format)
    _qa_set(qa, 10, shape)
    return qa


class DecodeWeight:
    """An nvfp4 / mxfp4 / mxfp8 (e4m3) / affine 4- or 8-bit weight in the decode layout (from
    qq.prepare_decode), for qq.quantized_matmul at decode shapes: with bfloat16 x of at most
    64 rows (gather_qmm: 16 per entry) on a GPU of compute capability 9.0+, the kernel reads
    this layout at close to copy bandwidth; any other call uses the packed weight kept beside it. See
    docs/formats.md (Decode layout).

    Fields: data (uint8, the layout's bytes, on w's device), quantized (the QuantizedArray
    it came from), mode, global_scale, shape ([N, K]), gated (True: a gate/up weight in
    the gated layout, for qq.quantized_matmul_swiglu).
    """
    __slots__ = ("data", "quantized", "mode", "global_scale", "shape", "gated")

    def __init__(self, data, quantized, gated=False):
        self.data = data
        self.quantized = quantized
        self.mode = quantized.mode
        self.global_scale = quantized.global_scale
        self.shape = quantized.shape
        self.gated = bool(gated)

    def __repr__(self):
        return (f"DecodeWeight(mode={self.mode!r}, shape={self.shape}, "
                f"{'gated=True, ' if self.gated else ''}data={_array_summary(self.data)})")


class PreparedWeight:
    """A qqmm weight kept in the form the current device multiplies fastest (from
    qq.prepare_weight): the QuantizedArray, plus - where qqmm dequantizes to bfloat16
    (Hopper, Ampere, the CPU) - q(w)'s exact values in bfloat16 without the global scale,
    so that no call dequantizes w again. qq.qqmm picks the form per call: the packed one
    for small M (the weight-only kernel reads it once), the values otherwise.

    Fields: quantized (QuantizedArray), values (bfloat16 [N, K] or None), mode,
    global_scale, shape.
    """
    __slots__ = ("quantized", "values", "mode", "global_scale", "shape")

    def __init__(self, quantized, values):
        self.quantized = quantized
        self.values = values
        self.mode = quantized.mode
        self.global_scale = quantized.global_scale
        self.shape = quantized.shape

    def __repr__(self):
        return (f"PreparedWeight(mode={self.mode!r}, shape={self.shape}, "
                f"values={_array_summary(self.values)}, quantized={self.quantized!r})")


# PreparedWeight's slots read directly too (_fast.pxi: three getattr calls were ~1k
# instructions of a small CPU qqmm). Offsets of "quantized", "values", "shape".
cdef Py_ssize_t _PW_SLOT[3]
cdef bint _pw_slots_known = False


_pw_slots_known = _slot_offsets(PreparedWeight, ("quantized", "values", "shape"), _PW_SLOT)


def _blockscaled_device(w):
    """True when qqmm runs on block-scaled tensor cores for arrays like w (Blackwell)."""
    dev = w.__dlpack_device__() if hasattr(w, "__dlpack_device__") else (kDLCPU, 0)
    if int(dev[0]) not in (kDLCUDA, kDLCUDAManaged):
        return False
    return _blockscaled_capability(int(dev[1]))


def _blockscaled_capability(int device):
    """True when CUDA device `device` has block-scaled tensor cores, as libqq decides it
    (qqGetDeviceFeature)."""
    cdef int has = 0
    cdef qqStatus_t st
    with nogil:
        st = qqGetDeviceFeature(device, QQ_DEVICE_FEATURE_BLOCKSCALED, &has)
    _check(st)
    return has != 0


def prepare_weight(w, mode="nvfp4", *, global_scale=None, rounding="ceil", fp8_format="e4m3",
                   torch_dtypes=True, stream=None):
    """Quantize a qqmm weight once and keep what qqmm needs per call (a PreparedWeight).

    w: float [N, K] (quantized here with mode, global_scale, rounding, fp8_format, blocked
    scales) or a QuantizedArray; [E, N, K] prepares grouped_qqmm's expert weights (one
    global scale for all experts). On GPUs without block-scaled tensor cores (and on the
    CPU) the result also holds q(w)'s exact bfloat16 values, which costs 2 bytes per
    element of memory and saves qqmm a dequantization of w per call.
    """
    func = "prepare_weight"
    if isinstance(w, QuantizedArray):
        qa = w
        if qa.mode == "affine":
            raise ValueError(f"{func}: w is an affine QuantizedArray; affine has no qqmm: pass it to "
                             f"qq.quantized_matmul instead")
        # the QuantizedArray decides; an explicit argument may only agree with it (qqmm's rule)
        _take(func, "mode", mode, "nvfp4", qa.mode, "w")
        _take(func, "rounding", rounding, "ceil", qa.rounding, "w")
        _take(func, "fp8_format", fp8_format, "e4m3", qa.fp8_format, "w")
        _take_array(func, "global_scale", global_scale, qa.global_scale, "w", "global_scale")
    else:
        if mode == "affine":
            raise ValueError(f"{func}: mode 'affine' has no qqmm; use qq.quantize and "
                             f"qq.quantized_matmul for affine weights")
        try:
            qa = quantize(w, mode=mode, global_scale=global_scale, rounding=rounding,
                          scale_layout="blocked", fp8_format=fp8_format,
                          torch_dtypes=torch_dtypes, stream=stream)
        except (ValueError, TypeError) as e:    # name this function, not the one it calls
            msg = str(e)
            if msg.startswith("quantize:"):
                msg = func + ":" + msg[len("quantize:"):].replace("argument 'x'", "argument 'w'")
                if msg.startswith(func + ": x:"):     # (the "func: name:" form of a non-array)
                    msg = func + ": w:" + msg[len(func) + 4:]
            raise type(e)(msg) from None
    if len(qa.shape) not in (2, 3):
        raise ValueError(f"{func}: w: qqmm weights are [N, K] (or grouped_qqmm's experts [E, N, K]); "
                         f"got shape {qa.shape}")
    values = None
    if not _blockscaled_device(qa.data):
        values = dequantize(qa.data, qa.scales, group_size=qa.group_size, bits=qa.bits,
                            mode=qa.mode, scale_layout=qa.scale_layout, fp8_format=qa.fp8_format,
                            dtype="bfloat16", stream=stream)
    return PreparedWeight(qa, values)
