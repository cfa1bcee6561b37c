# _fast.pxi - included by _qq.pyx (one extension module, one file per job).
# Small CPU calls without the per-call objects: quantize, quantized_matmul and qqmm on
# NumPy arrays or torch CPU tensors, in their common form (every argument at its default
# but the arrays and quantize's parameters).
#
# Such a call is mostly host cost (issue 11: [1, 32] against NumPy's and torch's `x + x`):
# the general path builds a _Call, a _View per argument and shape tuples, ~1 us on the
# 2-core CI host where libqq's own work is ~0.25 us (quantize) to ~0.9 us (a [32, 32]
# matmul). Here the arrays are read into DLTensors on the stack by the general path's own
# readers (_numpy_fill, _torch_fill), the result shapes are asked of libqq, the results are
# made by the general path's allocators, and libqq is called with the GIL held (the calls
# taken here are below _Call's GIL thresholds). Anything else returns None and the general
# path runs: another framework or a device array, an argument given, a call above those
# thresholds, an array the readers do not take as it is (a lazy torch view, a dtype not
# seen yet, more than 8 dimensions) - and every call that libqq refuses, which the general
# path then makes again and refuses with its own words, its checks in their order.

cdef enum:
    _FAST_NONE = 0
    _FAST_NUMPY = 1
    _FAST_TORCH = 2


cdef struct _FastArg:
    DLTensor t
    int64_t dims[2 * _INLINE_NDIM]


cdef bint _fast_on = True
cdef int64_t _fast_calls = 0


def _fast_path(enabled=None):
    """(on, calls): whether the small calls take this path, and how many have (tests compare
    it with the general path); enabled=True / False switches it."""
    global _fast_on
    if enabled is not None:
        _fast_on = bool(enabled)
    return _fast_on, _fast_calls


cdef int _fast_read(obj, _FastArg* a, int fw) except -1:
    """obj into a.t: _FAST_NUMPY for an exact NumPy array, _FAST_TORCH for an exact torch
    tensor on the CPU (nn.Parameter too), read as the general path reads them; _FAST_NONE
    for anything else, or where fw (the call's framework so far, or _FAST_NONE) differs."""
    cdef DLTensor d
    cdef int r
    if type(obj) is cnp.ndarray:    # (the cimported type: no lookup of np.ndarray a call)
        if fw == _FAST_TORCH or cnp.PyArray_NDIM(<cnp.ndarray>obj) > _INLINE_NDIM:
            return _FAST_NONE
        if not cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>obj):
            return _FAST_NONE
        r = _numpy_fill(<cnp.ndarray>obj, &a.t, a.dims)
        if r == -2:     # (a type not seen yet: learnt as _import_numpy learns it)
            try:
                _NP_TYPENUM_TO_DL[cnp.PyArray_TYPE(<cnp.ndarray>obj)] = _numpy_code_bits(
                    (<cnp.ndarray>obj).descr, "", "")
            except TypeError:
                return _FAST_NONE
            r = _numpy_fill(<cnp.ndarray>obj, &a.t, a.dims)
        return _FAST_NUMPY if r == -1 else _FAST_NONE
    if fw == _FAST_NUMPY:
        return _FAST_NONE
    if _torch_tensor_type is None and "torch" in sys.modules:
        _torch_types_init()     # (the first torch call of the process, as _import_torch does)
    if _torch_xapi == NULL:
        return _FAST_NONE
    tp = type(obj)
    if tp is not _torch_tensor_type and tp is not _torch_param_type:
        return _FAST_NONE
    # (a CUDA tensor, the common case not taken here, costs the one C call)
    if not _torch_xapi_read(obj, &d) or d.device.device_type != kDLCPU or d.ndim < 0 or d.ndim > _INLINE_NDIM:
        return _FAST_NONE
    if _torch_neg(obj) != 0:        # (as _import_torch_c)
        return _FAST_NONE
    return _FAST_TORCH if _torch_fill(&d, &a.t, a.dims) else _FAST_NONE


cdef int64_t _fast_numel(const DLTensor* t) noexcept:
    cdef int64_t n = 1
    cdef int i
    for i in range(t.ndim):
        n *= t.shape[i]
    return n


cdef str _fast_float_name(const DLTensor* t):
    """'float32', 'float16' or 'bfloat16', or None."""
    if t.dtype.lanes == 1 and (t.dtype.code == kDLFloat and (t.dtype.bits == 32 or t.dtype.bits == 16)):
        return "float32" if t.dtype.bits == 32 else "float16"
    if t.dtype.lanes == 1 and t.dtype.code == kDLBfloat and t.dtype.bits == 16:
        return "bfloat16"
    return None


cdef object _fast_result(int fw, int nd, const int64_t* dims, DLDataType dt, str dtype, int typenum,
                         _FastArg* a):
    """A new compact result of shape dims[:nd] and type dt (`dtype` its torch name, typenum its
    NumPy type number) in the call's framework, described in a.t."""
    cdef cnp.npy_intp nd_dims[_INLINE_NDIM]
    cdef void* data = NULL
    cdef int i
    if fw == _FAST_NUMPY:
        for i in range(nd):
            nd_dims[i] = dims[i]
        r = cnp.PyArray_EMPTY(nd, nd_dims, typenum, 0)
        data = cnp.PyArray_DATA(<cnp.ndarray>r)
    else:
        r = _torch_empty_dims(nd, dims, dtype, -1, &data, None)
    _fast_compact(a, nd, dims, data, dt)
    return r


cdef void _fast_compact(_FastArg* a, int nd, const int64_t* dims, void* data, DLDataType dt) noexcept:
    """a.t: a compact CPU tensor of shape dims[:nd] and type dt at data."""
    cdef int i
    for i in range(nd):
        a.dims[i] = dims[i]
    _compact_strides(nd, a.dims)
    a.t.data = data
    a.t.device.device_type = kDLCPU
    a.t.device.device_id = 0
    a.t.ndim = nd
    a.t.dtype = dt
    a.t.shape = a.dims
    a.t.strides = a.dims + nd
    a.t.byte_offset = 0


cdef dict _FAST_TYPED = {}


cdef inline int _fast_typed_key(int mode, int fp8_format) noexcept:
    return mode * 16 + fp8_format


cdef inline object _fast_typed_made(int mode, int fp8_format):
    """_fast_typed's cached answer, or None where it is not made yet (a lookup only)."""
    return _FAST_TYPED.get(_fast_typed_key(mode, fp8_format))


cdef tuple _fast_typed(int mode, int fp8_format):
    """quantize's torch result dtypes for torch_dtypes=True (_torch_typed's names): their
    CPU kinds (a list for _torch_group_handles) and DLPack types, (kinds, data DLDataType, scales
    DLDataType); cached by (mode, fp8_format) once both kinds have the shim path, else
    None."""
    cdef DLDataType d, s
    r = _fast_typed_made(mode, fp8_format)
    if r is None:
        dname, sname = _torch_typed("quantize", mode, fp8_format, True)
        kinds = [_torch_kind(dname, -1), _torch_kind(sname, -1)]
        if not ((<_TorchKind>kinds[0]).c_path and (<_TorchKind>kinds[1]).c_path):
            return None
        d, s = _dl_type_of(dname), _dl_type_of(sname)
        r = _FAST_TYPED[_fast_typed_key(mode, fp8_format)] = (kinds, (d.code, d.bits, d.lanes), (s.code, s.bits, s.lanes))
    return r


cdef inline DLDataType _dl_type(tuple cbl) noexcept:
    cdef DLDataType t
    t.code = <int>cbl[0]
    t.bits = <int>cbl[1]
    t.lanes = <int>cbl[2]
    return t


cdef bint _fast_unmoved(obj, const _FastArg* a, int fw):
    """obj (read into a by _fast_read, and referenced by the caller) still has the memory a
    describes after what ran in between (the allocations: torch's may release the GIL, and
    another thread may resize_ or set_ a tensor, freeing its storage). A NumPy array keeps its
    buffer while referenced (resize refuses; a shape or dtype assigned in place leaves the same
    bytes, which a describes): nothing to read again."""
    cdef _FastArg b
    cdef DLTensor d
    cdef int i
    if fw == _FAST_NUMPY:
        return True
    if not _torch_xapi_read(obj, &d) or d.ndim != a.t.ndim or not _torch_fill(&d, &b.t, b.dims):
        return False
    if b.t.data != a.t.data or b.t.ndim != a.t.ndim or b.t.dtype.code != a.t.dtype.code \
            or b.t.dtype.bits != a.t.dtype.bits:
        return False
    for i in range(2 * a.t.ndim):
        if a.dims[i] != b.dims[i]:
            return False
    return True


# ---- quantize -------------------------------------------------------------------------------

cdef object _quantize_fast(x, group_size, bits, mode, rounding, scale_layout, fp8_format):
    """quantize(x, ...) of a small NumPy array or torch CPU tensor (global_scale, stream and
    torch_dtypes at their defaults), or None."""
    global _fast_calls
    cdef _FastArg ax, ad, asc, ab
    cdef qqQuantParams_t p
    cdef int64_t ds[_INLINE_NDIM]
    cdef int64_t ss[_INLINE_NDIM + 1]
    cdef int sn = 0, nd
    cdef void* ptrs[_MAX_GROUP]
    cdef const int64_t* shapes[2]
    cdef int nds[2]
    cdef DLDataType u8
    cdef void* hs[2]
    cdef bint handles = False, reread = False
    # The parameters first: that may run Python code. Then, for torch results of kinds already
    # made, only C code runs from x's read to libqq's call (as _matmul_fast: the results are
    # shim handles until then), so x is not read again.
    _quant_params("quantize", &p, mode, group_size, bits, rounding, scale_layout, fp8_format)
    cdef int fw = _fast_read(x, &ax, _FAST_NONE)
    if fw == _FAST_NONE or ax.t.ndim < 1 or _fast_numel(&ax.t) > _HOLD_GIL_ELEMS:
        return None
    xname = _fast_float_name(&ax.t)
    if xname is None:
        return None
    nd = ax.t.ndim
    if qqQuantizedShapes(&p, nd, ax.t.shape, ds, ss, &sn) != QQ_STATUS_SUCCESS or sn > _INLINE_NDIM:
        return None
    affine = p.mode == QQ_MODE_AFFINE
    biases = None
    if fw == _FAST_NUMPY:
        tn = cnp.PyArray_TYPE(<cnp.ndarray>x)
        u8.code, u8.bits, u8.lanes = kDLUInt, 8, 1
        data = _fast_result(fw, nd, ds, u8, "uint8", cnp.NPY_UINT8, &ad)
        if affine:
            scales = _fast_result(fw, sn, ss, ax.t.dtype, xname, tn, &asc)
            biases = _fast_result(fw, sn, ss, ax.t.dtype, xname, tn, &ab)
        else:
            scales = _fast_result(fw, sn, ss, u8, "uint8", cnp.NPY_UINT8, &asc)
    else:
        if affine:      # three results of two sizes of element: the general path's separate storages
            return None
        # (made before, these are lookups; making them may run Python code: x is read again then)
        reread = _cpu_group_base is None or _fast_typed_made(p.mode, p.fp8_format) is None
        k8 = _torch_group_base(-1)
        typed = _fast_typed(p.mode, p.fp8_format) if k8 is not None else None
        if typed is None:
            return None
        kinds, dt_d, dt_s = typed
        shapes[0] = ds
        shapes[1] = ss
        nds[0] = nd
        nds[1] = sn
        # the results shim handles (no Python object) until libqq has run
        if _torch_group_handles(<_TorchKind>k8, <list>kinds, 2, nds, shapes, ptrs, hs) != 0:
            return None
        handles = True
        _fast_compact(&ad, nd, ds, ptrs[0], _dl_type(dt_d))
        _fast_compact(&asc, sn, ss, ptrs[1], _dl_type(dt_s))
    try:
        if reread and not _fast_unmoved(x, &ax, fw):
            return None
        if qqQuantize(NULL, &ax.t, &p, NULL, &ad.t, &asc.t, &ab.t if affine else NULL, NULL) != QQ_STATUS_SUCCESS:
            return None
        if handles:
            handles = False
            rs = _torch_group_wrap(<list>kinds, 2, hs)     # (deletes the handles)
            if rs is None:
                return None
            data, scales = rs[0], rs[1]
    finally:
        if handles:
            _aoti_delete(hs[0])
            _aoti_delete(hs[1])
    _fast_calls += 1
    return _new_quantized_array(data, scales, biases, mode, &p, None, rounding, scale_layout,
                                fp8_format, _int_tuple(ax.t.shape, nd))


# ---- quantized_matmul and qqmm --------------------------------------------------------------

cdef object _MISSING = object()


cdef inline object _qa_peek(object qa, int slot):
    """A slot of a QuantizedArray of the exact type (_qa_slots_known), or _MISSING where it is
    empty (a deleted field: the general path reads it and raises, in its own order)."""
    cdef PyObject* v = _slot_ptr(qa, _QA_SLOT[slot])
    return _MISSING if v == NULL else <object>v


cdef inline bint _qa_empty(object qa, int slot) noexcept:
    return (<PyObject**>((<char*><PyObject*>qa) + _QA_SLOT[slot]))[0] == NULL


cdef inline object _pw_peek(object pw, int slot):
    """A slot of a PreparedWeight of the exact type (_pw_slots_known: 0 quantized, 1 values,
    2 shape), or _MISSING where it is empty."""
    cdef PyObject* v = _slot_ptr(pw, _PW_SLOT[slot])
    return _MISSING if v == NULL else <object>v


cdef tuple _fast_weight(qa, qqQuantParams_t* p, str func, bint qmm):
    """(data, scales, biases or None, global scale or None) of a QuantizedArray weight and its
    parameters in *p, or None. Only where every field the general path reads is there
    (quantized_matmul's _unpack_weight reads biases and shape too; qqmm neither)."""
    if type(qa) is not QuantizedArray or not _qa_slots_known:
        return None
    if (_qa_empty(qa, 0) or _qa_empty(qa, 1) or _qa_empty(qa, 3) or _qa_empty(qa, 4) or _qa_empty(qa, 5)
            or _qa_empty(qa, 6) or _qa_empty(qa, 8) or _qa_empty(qa, 9)
            or (qmm and (_qa_empty(qa, 2) or _qa_empty(qa, 10)))):
        return None
    _quant_params(func, p, _qa_peek(qa, 3), _qa_peek(qa, 4), _qa_peek(qa, 5), "ceil", _qa_peek(qa, 8),
                  _qa_peek(qa, 9))
    return (_qa_peek(qa, 0), _qa_peek(qa, 1), _qa_peek(qa, 2) if qmm else None, _qa_peek(qa, 6))


cdef object _matmul_fast(str func, x, w, bint prepared):
    """quantized_matmul(x, w) (w a QuantizedArray) or qqmm(x, w) (w a PreparedWeight:
    prepared) of a small x [..., M, K] on a weight of [N, K], everything else at its
    default; or None (also for anything that raises here: the general path raises it).

    The weight's fields and parameters are read first: that may run Python code (a parameter
    of a type not seen yet, an allocation that starts the garbage collector, whose finalizers
    may do anything). From the first array read to libqq's call only C code runs where the
    result is a torch tensor of a kind already made: torch's C shim allocates it, and it is
    wrapped as a Python tensor after libqq has run - so no code can free or resize an array
    in between. Otherwise (NumPy, whose arrays keep their buffers while referenced, or a
    torch result made through Python) the arrays are read again after the allocation
    (_fast_unmoved)."""
    global _fast_calls
    cdef _FastArg ax, ad, asc, ab, ag, av, ao
    cdef qqQuantParams_t p
    cdef qqQqmmParams_t qp
    cdef int64_t od[_INLINE_NDIM]
    cdef int fw, nd, i
    cdef qqStatus_t st
    cdef int64_t m = 1
    cdef void* h = NULL
    cdef void* data = NULL
    _route_pending()        # (as the general path: a call that fails before libqq has no route)
    values = None
    if prepared:
        if type(w) is not PreparedWeight or not _pw_slots_known:
            return None
        # (the values go with a 2-D weight only, as the general path decides; a deleted
        # field is the general path's to report)
        values, shape, w = _pw_peek(w, 1), _pw_peek(w, 2), _pw_peek(w, 0)
        if (values is None or values is _MISSING or type(shape) is not tuple or len(<tuple>shape) != 2
                or type(w) is not QuantizedArray or _qa_peek(w, 3) == "affine"):
            return None
    # The weight's arrays stay referenced here until libqq has run (another thread may assign a
    # QuantizedArray's fields meanwhile).
    arrays = _fast_weight(w, &p, func, not prepared)
    if arrays is None:
        return None
    fw = _fast_read(x, &ax, _FAST_NONE)
    if fw == _FAST_NONE or ax.t.ndim < 1:
        return None
    xname = _fast_float_name(&ax.t)
    if xname is None or _fast_read(arrays[0], &ad, fw) != fw or ad.t.ndim != 2:
        return None
    nd = ax.t.ndim
    for i in range(nd - 1):
        m *= ax.t.shape[i]
        if m > _HOLD_GIL_MACS:      # (each factor bounded first: no overflow)
            return None
    if ad.t.shape[0] > _HOLD_GIL_MACS or ax.t.shape[nd - 1] > _HOLD_GIL_MACS \
            or m * ad.t.shape[0] * ax.t.shape[nd - 1] > _HOLD_GIL_MACS:
        return None
    for i in range(nd - 1):
        od[i] = ax.t.shape[i]
    od[nd - 1] = ad.t.shape[0]      # N (transpose: w [N, K*bits/8])
    out = None
    k = _torch_kind_made(xname, -1) if fw == _FAST_TORCH else None
    if (k is not None and (<_TorchKind>k).c_path and _torch_dispatch_depth() == 0
            and _torch_empty_handle(<_TorchKind>k, nd, od, &h, &data) == 0):
        # the result a shim handle (no Python object) until libqq has run
        _fast_compact(&ao, nd, od, data, ax.t.dtype)
    else:
        out = _fast_result(fw, nd, od, ax.t.dtype, xname,
                           cnp.PyArray_TYPE(<cnp.ndarray>x) if fw == _FAST_NUMPY else 0, &ao)
        if not _fast_unmoved(x, &ax, fw) or not _fast_unmoved(arrays[0], &ad, fw):
            return None
    try:
        if _fast_read(arrays[1], &asc, fw) != fw:
            return None
        if arrays[2] is not None and _fast_read(arrays[2], &ab, fw) != fw:
            return None
        if arrays[3] is not None and _fast_read(arrays[3], &ag, fw) != fw:
            return None
        if prepared and (_fast_read(values, &av, fw) != fw or av.t.ndim != 2):
            return None
        if prepared:
            # as qqmm's general path: x quantized with the defaults (linear, "ceil"), w's scales
            # in w's layout
            _check(qqQqmmParamsInit(&qp, p.mode))
            qp.quant = p
            qp.w_scale_layout = p.scale_layout
            qp.x_scale_layout = QQ_SCALE_LINEAR
            qp.quant.scale_layout = QQ_SCALE_LINEAR
            qp.w_values = &av.t
            st = qqQqmm(NULL, &ax.t, NULL, &ad.t, &asc.t, &qp, NULL, &ag.t if arrays[3] is not None else NULL,
                        NULL, &ao.t, NULL)
        else:
            st = qqQuantizedMatmul(NULL, &ax.t, &ad.t, &asc.t, &ab.t if arrays[2] is not None else NULL, &p, 1,
                                   &ag.t if arrays[3] is not None else NULL, NULL, &ao.t, NULL)
        _route_recorded()
        if st != QQ_STATUS_SUCCESS:
            return None
        if h != NULL:
            out = _wrap_and_delete((<_TorchKind>k).direct, h)    # (deletes the handle)
            h = NULL
            if out is None:
                return None
    finally:
        if h != NULL:
            _aoti_delete(h)
    _fast_calls += 1
    return out
