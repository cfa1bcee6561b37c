# _dlpack.pxi - included by _qq.pyx (one extension module, one file per job).
# DLPack: _View (a DLTensor of someone else's memory for one call) and _DeviceBuffer
# (device memory libqq allocated for a result, exported through DLPack). Declarations: _dlpack.pxd.

# =========================================================================================
# DLPack import: a _View is a DLTensor describing someone else's memory for one call
# =========================================================================================

cdef const char* _CAPSULE = b"dltensor"
cdef const char* _CAPSULE_VERSIONED = b"dltensor_versioned"
cdef const char* _CAPSULE_USED = b"used_dltensor"
cdef const char* _CAPSULE_VERSIONED_USED = b"used_dltensor_versioned"

cdef enum:
    _MAX_NDIM = 64     # NumPy's limit; shapes are copied into stack arrays of this size
    _INLINE_NDIM = 8   # libqq's limit (kMaxDims): shapes and strides up to this fit in the view


# Views live for one call and never join a reference cycle: a free list instead of malloc,
# and no GC tracking (with _Call's: ~0.08 us off a NumPy quantize call on the 2-core machine).
@cython.freelist(16)
@cython.no_gc
cdef class _View:
    """A DLTensor over an argument's memory, valid until _release_view.

    Exactly one of these owns the memory's lifetime for the call:
      - owner for a NumPy array (read through NumPy's C API; dims holds shape and strides),
      - versioned / legacy (a consumed DLPack capsule's managed tensor, whose deleter we
        call exactly once),
      - owner (a _DeviceBuffer of ours).
    """
    cdef DLTensor tensor
    cdef int64_t* dims          # shape then strides: inline_dims, or PyMem_Malloc'ed beyond 8 dims
    cdef int64_t inline_dims[2 * _INLINE_NDIM + 1]
    cdef DLManagedTensorVersioned* versioned
    cdef DLManagedTensor* legacy
    cdef object owner
    cdef bint readonly
    cdef str name
    cdef _View next             # the call's previous view (_Call.release walks the chain)

    def __dealloc__(self):
        # Safety net only: _Call.release() has normally released the view already.
        _release_view(self)

    @property
    def shape(self):
        return self.pyshape()

    cdef tuple pyshape(self):
        """The shape as a tuple of ints (a C call from the op wrappers, not a property
        lookup)."""
        return _int_tuple(self.tensor.shape, self.tensor.ndim)

    cdef str dtype_name(self):
        """'float32', 'float16', 'bfloat16', 'uint8', or None for anything else."""
        if self.tensor.dtype.lanes != 1:
            return None
        return _DL_TO_NAME.get((self.tensor.dtype.code, self.tensor.dtype.bits))

    cdef str float_dtype(self):
        """The view's float dtype, or float32 as a placeholder when it has none: the output
        is then only allocated so that libqq can reject the input dtype with its message."""
        name = self.dtype_name()
        return name if name in _FLOAT_DTYPES else "float32"


cdef tuple _int_tuple(const int64_t* values, int n):
    """A tuple of n Python ints, built in place (no intermediate list)."""
    cdef tuple t = PyTuple_New(n)
    cdef int i
    for i in range(n):
        o = PyLong_FromLongLong(values[i])
        Py_INCREF(o)                # PyTuple_SET_ITEM steals a reference; `o` keeps its own
        PyTuple_SET_ITEM(t, i, o)
    return t


cdef void _release_view(_View v) noexcept:
    """Give everything a view holds back to its producer. Never raises; idempotent."""
    cdef DLManagedTensorVersioned* mv = v.versioned
    cdef DLManagedTensor* ml = v.legacy
    # Clear first, call after: whatever happens inside a deleter, it cannot run twice.
    v.versioned = NULL
    v.legacy = NULL
    if mv != NULL and mv.deleter != NULL:
        mv.deleter(mv)
    if ml != NULL and ml.deleter != NULL:
        ml.deleter(ml)
    if v.dims != NULL:
        if v.dims != v.inline_dims:
            PyMem_Free(v.dims)
        v.dims = NULL
    v.owner = None


cdef DLDataType _dl_type_of(str dtype) except *:
    """The DLPack type of a result dtype name (_DL_TO_NAME_CODES, or a torch byte dtype of
    _TORCH_BYTE_DTYPES)."""
    cdef DLDataType t
    cb = _DL_TO_NAME_CODES.get(dtype)
    if cb is not None:
        t.code, t.bits, t.lanes = <int>(<tuple>cb)[0], <int>(<tuple>cb)[1], 1
    else:
        cb = _TORCH_BYTE_DTYPES[dtype]
        t.code, t.bits, t.lanes = <int>(<tuple>cb)[0], <int>(<tuple>cb)[1], <int>(<tuple>cb)[2]
    return t


cdef void _compact_strides(int nd, int64_t* dims) noexcept:
    """dims[nd:2nd] = the compact row-major strides (in elements) of the shape dims[0:nd]."""
    cdef int i
    cdef int64_t stride = 1
    for i in range(nd - 1, -1, -1):
        dims[nd + i] = stride
        stride *= dims[i]


cdef int64_t* _view_dims(_View v, int nd) except NULL:
    """Room for nd extents and nd strides: inside the view up to 8 dims (no allocation)."""
    if nd <= _INLINE_NDIM:
        v.dims = v.inline_dims
    else:
        v.dims = <int64_t*>PyMem_Malloc((2 * nd + 1) * sizeof(int64_t))
        if v.dims == NULL:
            raise MemoryError()
    return v.dims


# NumPy type number -> DLPack (code, bits), filled on first sight of each type (ml_dtypes'
# bfloat16 / float8 are user types, recognised by name; others map by kind and size).
# (the result types of the small calls, _fast.pxi, are here from the start)
cdef dict _NP_TYPENUM_TO_DL = {np.dtype(n).num: _NUMPY_TO_DL[n] for n in ("uint8", "float32", "float16")}


cdef tuple _numpy_code_bits(object dt, str func, str name):
    # (dt as a Python object: kind and itemsize as NumPy's Python attributes, not C fields)
    code_bits = _NUMPY_TO_DL.get(dt.name)
    if code_bits is None:
        code = _KIND_TO_DL.get(dt.kind)
        if code is None:
            raise TypeError(f"{func}: {name}: NumPy dtype {dt.name!r} has no DLPack equivalent; "
                            f"libqq takes float32, float16, bfloat16, uint8 and float8 arrays")
        code_bits = (code, dt.itemsize * 8)
    return code_bits


cdef int _import_numpy(_View v, cnp.ndarray arr, str func, str name) except -1:
    """NumPy path: pointer, shape, strides and dtype read through NumPy's C API (no buffer
    export, no DLPack capsule: a few dozen instructions). NumPy's own __dlpack__ refuses
    ml_dtypes' bfloat16 / float8 arrays, which this path reads by type number. The array
    is kept alive (v.owner) until the view is released."""
    cdef cnp.dtype dt = arr.descr
    if not cnp.PyArray_ISNOTSWAPPED(arr):
        raise TypeError(f"{func}: {name}: byte-swapped (non-native) dtype {dt.str!r} is not "
                        f"supported; convert it with .astype({dt.name!r})")
    cdef int nd = cnp.PyArray_NDIM(arr)
    if nd > _MAX_NDIM:
        raise ValueError(f"{func}: {name}: {nd} dimensions; at most {_MAX_NDIM} are supported")
    cdef int64_t* dims = _view_dims(v, nd)
    cdef int axis = _numpy_fill(arr, &v.tensor, dims)
    if axis == -2:      # a type not seen yet
        _NP_TYPENUM_TO_DL[dt.type_num] = _numpy_code_bits(dt, func, name)
        axis = _numpy_fill(arr, &v.tensor, dims)
    if axis >= 0:
        raise ValueError(f"{func}: {name}: stride {cnp.PyArray_STRIDES(arr)[axis]} bytes of axis "
                         f"{axis} is not a multiple of the item size {cnp.PyArray_ITEMSIZE(arr)}; "
                         f"make the array contiguous (numpy.ascontiguousarray)")
    v.owner = arr
    v.readonly = not cnp.PyArray_ISWRITEABLE(arr)
    return 0


cdef int _numpy_fill(cnp.ndarray arr, DLTensor* t, int64_t* dims) except -3:
    """The DLTensor of a native-order NumPy array, its shape and strides (in elements) written
    to dims (room for 2 * ndim): -1; -2 where _NP_TYPENUM_TO_DL does not hold its type number
    yet (the caller learns it, _numpy_code_bits); or the first axis whose byte stride is not a
    whole number of items. t is usable on -1 only. For _import_numpy and the small calls'
    readers (_fast.pxi)."""
    cb = _NP_TYPENUM_TO_DL.get(cnp.PyArray_TYPE(arr))
    if cb is None:
        return -2
    cdef int nd = cnp.PyArray_NDIM(arr)
    cdef Py_ssize_t itemsize = cnp.PyArray_ITEMSIZE(arr)
    cdef cnp.npy_intp* shape = cnp.PyArray_DIMS(arr)
    cdef cnp.npy_intp* strides = cnp.PyArray_STRIDES(arr)
    cdef int i
    for i in range(nd):
        dims[i] = shape[i]
        # DLPack strides count elements, NumPy's count bytes.
        if strides[i] % itemsize != 0:
            return i
        dims[nd + i] = strides[i] // itemsize
    code, bits = <tuple>cb
    t.data = cnp.PyArray_DATA(arr)
    t.device.device_type = kDLCPU
    t.device.device_id = 0
    t.ndim = nd
    t.dtype.code = <int>code
    t.dtype.bits = <int>bits
    t.dtype.lanes = 1
    t.shape = dims
    t.strides = dims + nd
    t.byte_offset = 0
    return -1


cdef dict _TORCH_TO_DL = {}


cdef extern from "<dlfcn.h>" nogil:
    void* dlopen(const char* filename, int flags)
    void* dlsym(void* handle, const char* symbol)
    int RTLD_LAZY
    int RTLD_NOLOAD

cdef extern from *:
    """
    int qq_call_is_neg(void* fn, void* impl);  /* python/qq/_cxx_call.cpp */
    """
    int qq_call_is_neg(void* fn, void* impl) noexcept nogil


# torch's negative bit read in C (_torch_neg): at::native::is_neg from the loaded libtorch_cpu
# and the offset of a torch.Tensor object's at::Tensor (a TensorImpl pointer) in it; NULL
# where _torch_neg_init did not confirm both, and t.is_neg() is called instead.
cdef void* _torch_is_neg_fn = NULL
cdef Py_ssize_t _torch_impl_offset = 0


cdef object _torch_tensor_type = None     # torch.Tensor, once _torch_types_init has run
cdef object _torch_param_type = None
# torch's DLPack C exchange table (torch.Tensor.__dlpack_c_exchange_api__, _dlpack.pxd), or
# NULL where this torch has none: then tensors are read through their Python attributes.
cdef const DLPackExchangeAPI* _torch_xapi = NULL
# The DLPack (code, bits) pairs of the torch dtypes read directly (_TORCH_TO_DL's values): a
# bit per type code, one mask per width (8, 16, 32, 64 bits).
cdef uint64_t _torch_code_mask[4]


cdef int _torch_types_init() except -1:
    """Once, on the first torch tensor: torch's dtypes as DLPack codes, and its exchange
    table when it has one of DLPack major version 1 with the two functions used here."""
    global _torch_tensor_type, _torch_param_type, _torch_xapi
    torch = sys.modules["torch"]
    for name, code_bits in (("float32", (kDLFloat, 32)), ("float16", (kDLFloat, 16)),
                            ("bfloat16", (kDLBfloat, 16)), ("float64", (kDLFloat, 64)),
                            ("uint8", (kDLUInt, 8)), ("int8", (kDLInt, 8)),
                            ("int32", (kDLInt, 32)), ("int64", (kDLInt, 64)),
                            ("float8_e4m3fn", (kDLFloat8_e4m3fn, 8)),
                            ("float8_e5m2", (kDLFloat8_e5m2, 8)),
                            ("float8_e8m0fnu", (kDLFloat8_e8m0fnu, 8))):
        dt = getattr(torch, name, None)
        if dt is not None:
            _TORCH_TO_DL[dt] = code_bits
            _torch_code_mask[_width_index(code_bits[1])] |= (<uint64_t>1) << <int>code_bits[0]
    cap = getattr(torch.Tensor, "__dlpack_c_exchange_api__", None)
    cdef const DLPackExchangeAPI* api
    if cap is not None and PyCapsule_IsValid(cap, b"dlpack_exchange_api"):
        api = <const DLPackExchangeAPI*>PyCapsule_GetPointer(cap, b"dlpack_exchange_api")
        if (api != NULL and api.header.version.major == QQ_DLPACK_MAJOR
                and api.dltensor_from_py_object_no_sync != NULL and api.current_work_stream != NULL):
            _torch_xapi = api
    _torch_neg_init(torch)
    _torch_param_type = torch.nn.Parameter
    _torch_tensor_type = torch.Tensor
    return 0


cdef int _torch_neg_init(object torch) except -1:
    """_torch_is_neg_fn and _torch_impl_offset where they give t.is_neg() exactly.

    Why: t.is_neg() is a torch method that releases and retakes the GIL, ~0.5k instructions,
    and every torch tensor read pays it (torch's exchange table does not report the bit,
    and its DLPack export ignores it): a quarter of what a small CPU call spends reading five
    tensors. Read in C it is the tensor's pointer and one bit of its dispatch key set.
    A torch.Tensor object holds its at::Tensor right after the object header (torch 2.13;
    older ones held a MaybeOwned<at::Tensor>: a flag, then the pointer). The offset is the
    one where the pointer equals t._cdata (the TensorImpl's address) for each probe, and the
    function must answer each probe as t.is_neg() does; anything else (another layout, a
    missing symbol, a probe that raises) leaves the Python method in use."""
    global _torch_is_neg_fn, _torch_impl_offset
    import os
    cdef void* fn
    cdef void* impl
    cdef Py_ssize_t off
    try:
        path = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so").encode()
        lib = dlopen(path, RTLD_LAZY | RTLD_NOLOAD)     # loaded already: no new load
        if lib == NULL:
            return 0
        fn = dlsym(lib, b"_ZN2at6native6is_negERKNS_6TensorE")     # at::native::is_neg(const at::Tensor&)
        if fn == NULL:
            return 0
        plain = torch.zeros(4, device="cpu")
        neg = plain._neg_view()
        probes = (plain, neg, neg[1:], neg.detach(), torch.nn.Parameter(neg, requires_grad=False),
                  torch.zeros(2, dtype=torch.complex64, device="cpu").conj().imag,
                  torch.nn.Parameter(torch.ones(3, device="cpu")))
        if not any(t.is_neg() for t in probes) or all(t.is_neg() for t in probes):
            return 0
        for off in (sizeof(PyObject), sizeof(PyObject) + sizeof(void*)):
            for t in probes:
                impl = (<void**>((<char*><PyObject*>t) + off))[0]
                if <intptr_t>impl != <intptr_t>t._cdata or qq_call_is_neg(fn, impl) != (1 if t.is_neg() else 0):
                    break
            else:
                _torch_impl_offset = off
                _torch_is_neg_fn = fn
                return 0
    except Exception:
        pass
    return 0


cdef inline int _torch_neg(object t) except -1:
    """t.is_neg() for a torch.Tensor or nn.Parameter t (exact types: their objects have the
    layout _torch_neg_init checked); in C where that was confirmed."""
    cdef void* impl
    if _torch_is_neg_fn != NULL:
        impl = (<void**>((<char*><PyObject*>t) + _torch_impl_offset))[0]
        return qq_call_is_neg(_torch_is_neg_fn, impl)
    return 1 if t.is_neg() else 0


def _torch_neg_reader(t=None):
    """For tests: whether the negative bit is read in C (t None), or what _torch_neg says of
    the torch.Tensor / nn.Parameter t (0 or 1; -1 where the C call failed)."""
    if _torch_tensor_type is None:
        _torch_types_init()
    if t is None:
        return _torch_is_neg_fn != NULL
    if type(t) is not _torch_tensor_type and type(t) is not _torch_param_type:
        raise TypeError("_torch_neg_reader: t must be a torch.Tensor or nn.Parameter")
    return _torch_neg(t)


cdef inline int _width_index(int bits) noexcept:
    return 0 if bits == 8 else (1 if bits == 16 else (2 if bits == 32 else (3 if bits == 64 else -1)))


cdef bint _torch_xapi_read(object t, DLTensor* d) noexcept:
    """torch tensor t (torch.Tensor or nn.Parameter; _torch_xapi set) described into *d by
    torch's exchange table: one C call; shape and strides point into the tensor. False for
    a tensor the table cannot describe (a meta tensor and the like: the DLPack path says
    what is wrong) or one on a device other than the CPU and CUDA."""
    if _torch_xapi.dltensor_from_py_object_no_sync(<void*>t, d) != 0:
        PyErr_Clear()
        return False
    return d.device.device_type == kDLCPU or d.device.device_type == kDLCUDA


cdef bint _import_torch_c(_View v, object t) except -1:
    """_import_torch through torch's exchange table (_torch_fill); shape and strides are
    copied into the view. False for what the Python attributes path would refuse too (the
    DLPack path then decides)."""
    cdef DLTensor d
    if _torch_neg(t) != 0:  # torch's lazy negative view: its memory holds -t (view() resolves it)
        return False
    if not _torch_xapi_read(t, &d) or d.ndim > _MAX_NDIM or d.ndim < 0:
        return False
    if not _torch_fill(&d, &v.tensor, _view_dims(v, d.ndim)):
        return False
    v.owner = t                         # keeps the tensor alive until the view is released
    v.readonly = False
    return True


cdef bint _torch_fill(const DLTensor* d, DLTensor* t, int64_t* dims) noexcept:
    """*t from the exchange table's description *d of a torch tensor (_torch_xapi_read; d.ndim
    checked by the caller), its shape and strides copied into dims (room for 2 * ndim):
    False for a dtype libqq does not read from torch. For _import_torch_c and the small
    calls' readers (_fast.pxi)."""
    cdef int i
    cdef int nd = d.ndim
    cdef int w = _width_index(d.dtype.bits)
    if d.dtype.lanes != 1 or w < 0 or d.dtype.code >= 64 or not (_torch_code_mask[w] >> d.dtype.code) & 1:
        return False
    cdef int64_t stride = 1
    for i in range(nd - 1, -1, -1):
        dims[i] = d.shape[i]
        dims[nd + i] = d.strides[i] if d.strides != NULL else stride
        stride *= d.shape[i]
    t.data = <char*>d.data + d.byte_offset
    t.device.device_type = d.device.device_type
    t.device.device_id = d.device.device_id if d.device.device_type == kDLCUDA else 0
    t.ndim = nd
    t.dtype = d.dtype
    t.shape = dims
    t.strides = dims + nd
    t.byte_offset = 0
    return True


cdef bint _import_torch(_View v, object t) except -1:
    """Fast path for torch tensors when the call runs on torch's current stream (or on the
    CPU): pointer, shape, strides and dtype read off the tensor, no DLPack capsule - through
    torch's DLPack C exchange table where it has one (torch.Tensor and nn.Parameter: one C
    call, ~0.3 us less a tensor than the Python attributes below on a 2-core CPU host).

    torch's __dlpack__ costs tens of microseconds per tensor on CUDA (stream queries and
    synchronisation bookkeeping); with stream=None that synchronisation is a no-op by the
    DLPack contract (producer and consumer share torch's current stream), so reading the
    tensor directly is equivalent. Returns False (and touches nothing) for anything it does
    not describe exactly (sparse layouts, devices other than CPU and CUDA, unknown dtypes,
    negative views): the DLPack path then handles, resolves or refuses it.
    """
    if _torch_tensor_type is None:
        _torch_types_init()
    if not isinstance(t, _torch_tensor_type):
        return False
    if _torch_xapi != NULL:
        tp = type(t)
        # (nn.Parameter too: the spec asks for the table's own type, and torch's function
        # takes any tensor its pybind11 cast accepts, Parameter included; other subclasses
        # may override what their attributes say and take the path below)
        if tp is _torch_tensor_type or tp is _torch_param_type:
            return _import_torch_c(v, t)
    code_bits = _TORCH_TO_DL.get(t.dtype)
    if code_bits is None:
        return False
    # Real dtypes only from here: torch's conjugate bit exists only on complex tensors, so
    # the negative bit is the one lazy view left to refuse (checked here, not in view()).
    if t.is_neg():
        return False
    cdef int dev_type, dev_id = 0
    if t.is_cuda:
        dev_type = kDLCUDA
        dev_id = t.get_device()
    elif t.is_cpu:
        dev_type = kDLCPU
    else:
        return False
    try:
        strides = t.stride()        # sparse and other non-strided layouts raise here
    except RuntimeError:
        return False
    shape = t.shape
    cdef int nd = len(shape)
    cdef int i
    if nd > _MAX_NDIM:
        return False
    cdef int64_t* dims = _view_dims(v, nd)
    for i in range(nd):
        dims[i] = shape[i]
        dims[nd + i] = strides[i]
    try:
        ptr = t.data_ptr()          # a wrapper subclass without storage raises here
    except RuntimeError:
        return False
    v.owner = t                         # keeps the tensor alive until the view is released
    v.tensor.data = <void*><intptr_t>ptr
    v.tensor.device.device_type = <DLDeviceType>dev_type
    v.tensor.device.device_id = dev_id
    v.tensor.ndim = nd
    v.tensor.dtype.code = <int>code_bits[0]
    v.tensor.dtype.bits = <int>code_bits[1]
    v.tensor.dtype.lanes = 1
    v.tensor.shape = dims
    v.tensor.strides = dims + nd
    v.tensor.byte_offset = 0
    v.readonly = False
    return True


cdef int _consume_capsule(_View v, object capsule, str where) except -1:
    """Take ownership of the managed tensor in a DLPack capsule.

    Protocol (DLPack python_spec): a consumer renames the capsule to "used_dltensor[_versioned]"
    so that the capsule's destructor no longer frees the tensor, and then calls the
    tensor's deleter itself once it is done with the memory.
    """
    cdef DLManagedTensorVersioned* mv
    cdef DLManagedTensor* ml
    if PyCapsule_IsValid(capsule, _CAPSULE_VERSIONED):
        mv = <DLManagedTensorVersioned*>PyCapsule_GetPointer(capsule, _CAPSULE_VERSIONED)
        PyCapsule_SetName(capsule, _CAPSULE_VERSIONED_USED)
        # Ownership moved to us with the rename; record it at once so that every exit from
        # here on (including the version error below) calls the deleter exactly once.
        v.versioned = mv
        if mv.version.major != QQ_DLPACK_MAJOR:
            raise _DLPackError(
                f"{where}: the producer exported a DLPack {mv.version.major}.{mv.version.minor} "
                f"tensor; qq reads DLPack major version {QQ_DLPACK_MAJOR} (it asked for "
                f"max_version=({QQ_DLPACK_MAJOR}, {QQ_DLPACK_MINOR}))")
        v.tensor = mv.dl_tensor
        v.readonly = (mv.flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0
    elif PyCapsule_IsValid(capsule, _CAPSULE):
        ml = <DLManagedTensor*>PyCapsule_GetPointer(capsule, _CAPSULE)
        PyCapsule_SetName(capsule, _CAPSULE_USED)
        v.legacy = ml
        v.tensor = ml.dl_tensor
        v.readonly = False          # pre-1.0 DLPack cannot say; assume writable
    else:
        raise _DLPackError(
            f"{where}: __dlpack__ returned {capsule!r}, which is not an unconsumed DLPack capsule "
            f"(a capsule named 'dltensor_versioned' or 'dltensor'; a capsule can be consumed "
            f"only once)")
    if v.tensor.ndim < 0 or v.tensor.ndim > _MAX_NDIM or (v.tensor.ndim > 0 and v.tensor.shape == NULL):
        raise ValueError(f"{where}: malformed DLPack tensor (ndim={v.tensor.ndim})")
    return 0


class _DLPackError(BufferError, ValueError):
    """A DLPack capsule we cannot read (unknown major version, or already consumed).

    Both a BufferError (what the DLPack spec uses for exchange failures) and a ValueError
    (what docs/api.md promises for bad arguments).
    """


# =========================================================================================
# DLPack export: a _DeviceBuffer is device memory libqq allocated for a result
# =========================================================================================

cdef struct _Export:
    # One allocation per export: the managed tensor handed to the consumer (versioned or
    # legacy, whichever the consumer asked for), what the deleter needs to free the
    # memory, and then shape[ndim] and strides[ndim] right after the struct.
    DLManagedTensorVersioned versioned
    DLManagedTensor legacy
    void* ptr
    int device
    void* stream


cdef void _export_free(_Export* e) noexcept nogil:
    # Stream-ordered free on the stream the buffer was allocated and written on. A DLPack
    # deleter has no way to report an error, so the status is dropped.
    qqDeviceFree(e.device, e.ptr, e.stream)
    free(e)


cdef void _export_deleter_versioned(DLManagedTensorVersioned* m) noexcept nogil:
    _export_free(<_Export*>m.manager_ctx)


cdef void _export_deleter_legacy(DLManagedTensor* m) noexcept nogil:
    _export_free(<_Export*>m.manager_ctx)


cdef void _export_capsule_destructor(object capsule) noexcept:
    # A capsule still carrying its original name was never consumed: it still owns the
    # tensor. A "used_*" capsule was consumed and the consumer calls the deleter.
    cdef DLManagedTensorVersioned* mv
    cdef DLManagedTensor* ml
    if PyCapsule_IsValid(capsule, _CAPSULE_VERSIONED):
        mv = <DLManagedTensorVersioned*>PyCapsule_GetPointer(capsule, _CAPSULE_VERSIONED)
        mv.deleter(mv)
    elif PyCapsule_IsValid(capsule, _CAPSULE):
        ml = <DLManagedTensor*>PyCapsule_GetPointer(capsule, _CAPSULE)
        ml.deleter(ml)


cdef class _DeviceBuffer:
    """A compact row-major CUDA allocation made by libqq (qqDeviceAlloc), handed to the
    caller's framework through DLPack. It is the result type for JAX on CUDA (JAX arrays
    are immutable, so libqq cannot write into one) and for CUDA producers qq does not know.

    It can be exported once: __dlpack__ moves the memory into the capsule, whose deleter
    frees it (qqDeviceFree on the stream it was allocated on). Until then, or if it is
    never exported, dropping the object frees the memory the same way.
    """
    cdef void* ptr
    cdef int device
    cdef intptr_t stream
    cdef int ndim
    cdef int64_t* dims          # shape[ndim], then strides[ndim] (elements)
    cdef DLDataType dl_dtype
    cdef bint synced            # the host has waited for `stream` since the last write
    cdef readonly tuple shape
    cdef readonly str dtype         # 'float32', 'float16', 'bfloat16' or 'uint8'

    def __dealloc__(self):
        if self.ptr != NULL:
            qqDeviceFree(self.device, self.ptr, <void*>self.stream)
            self.ptr = NULL
        if self.dims != NULL:
            PyMem_Free(self.dims)
            self.dims = NULL

    def __repr__(self):
        state = "exported" if self.ptr == NULL else "live"
        return (f"<qq device buffer {self.dtype} {self.shape} on cuda:{self.device}, "
                f"{state}; consume it with from_dlpack>")

    def __dlpack_device__(self):
        return (<int>kDLCUDA, self.device)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if self.ptr == NULL:
            raise BufferError("this qq device buffer was already exported through DLPack; "
                              "it can be consumed only once")
        if dl_device is not None and (int(dl_device[0]), int(dl_device[1])) != (<int>kDLCUDA, self.device):
            raise BufferError(f"dl_device={tuple(dl_device)!r}: this buffer lives on "
                              f"({<int>kDLCUDA}, {self.device}) (cuda:{self.device}) and qq does "
                              f"not copy across devices")
        if copy:
            raise BufferError("copy=True: qq does not copy its results on export; "
                              "copy after importing")
        self._ready_for(stream)

        cdef bint versioned = max_version is not None and int(max_version[0]) >= QQ_DLPACK_MAJOR
        cdef int nd = self.ndim
        cdef _Export* e = <_Export*>malloc(sizeof(_Export) + 2 * nd * sizeof(int64_t))
        if e == NULL:
            raise MemoryError()
        # This block must never raise: it initializes everything the deleters and the
        # capsule destructor use, before the capsule exists.
        cdef int64_t* dims = <int64_t*>(<char*>e + sizeof(_Export))
        cdef DLTensor* t
        cdef void* payload
        cdef const char* name
        memset(e, 0, sizeof(_Export))
        e.ptr = self.ptr
        e.device = self.device
        e.stream = <void*>self.stream
        memcpy(dims, self.dims, 2 * nd * sizeof(int64_t))
        if versioned:
            e.versioned.version.major = QQ_DLPACK_MAJOR
            e.versioned.version.minor = 0       # nothing we export needs more than 1.0
            e.versioned.manager_ctx = e
            e.versioned.deleter = _export_deleter_versioned
            e.versioned.flags = 0               # writable, not a copy
            t = &e.versioned.dl_tensor
            payload = &e.versioned
            name = _CAPSULE_VERSIONED
        else:
            e.legacy.manager_ctx = e
            e.legacy.deleter = _export_deleter_legacy
            t = &e.legacy.dl_tensor
            payload = &e.legacy
            name = _CAPSULE
        t.data = self.ptr
        t.device.device_type = kDLCUDA
        t.device.device_id = self.device
        t.ndim = nd
        t.dtype = self.dl_dtype
        t.shape = dims
        t.strides = dims + nd
        t.byte_offset = 0

        try:
            capsule = PyCapsule_New(payload, name, _export_capsule_destructor)
        except BaseException:
            free(e)
            raise
        # The capsule owns e, and through it the device memory: we must not free it now.
        self.ptr = NULL
        return capsule

    cdef _ready_for(self, consumer_stream):
        """Honour the consumer's stream (DLPack: the producer makes the data safe to use on
        the stream the consumer names; None = the legacy default stream for CUDA, -1 = no
        synchronization wanted)."""
        if self.synced or consumer_stream == -1:
            return
        consumer = 0 if consumer_stream is None else int(consumer_stream)
        if consumer == 1:
            consumer = 0        # 1 is cudaStreamLegacy; 0 (ambiguous in DLPack) read alike
        producer = 0 if self.stream == 1 else self.stream
        if consumer == producer:
            return              # same stream: ordered already
        # Different streams: libqq's C ABI has no event API (qqStreamSynchronize only),
        # so wait on the host for our stream, which is always safe.
        _stream_synchronize(self.device, self.stream)
        self.synced = True


cdef _DeviceBuffer _device_buffer(tuple shape, str dtype, int device, intptr_t stream):
    cdef _DeviceBuffer b = _DeviceBuffer.__new__(_DeviceBuffer)
    cdef int nd = len(shape)
    cdef int i
    cdef qqStatus_t st
    cdef void* ptr = NULL
    cdef size_t nbytes
    if nd > _MAX_NDIM:
        raise ValueError(f"{nd} dimensions; at most {_MAX_NDIM} are supported")
    code, bits = _DL_TO_NAME_CODES[dtype]
    b.device = device
    b.stream = stream
    b.ndim = nd
    b.shape = shape
    b.dtype = dtype
    b.dl_dtype.code = <int>code
    b.dl_dtype.bits = <int>bits
    b.dl_dtype.lanes = 1
    b.dims = <int64_t*>PyMem_Malloc((2 * nd + 1) * sizeof(int64_t))
    if b.dims == NULL:
        raise MemoryError()
    count = 1
    for i in range(nd - 1, -1, -1):          # compact row-major strides, in elements
        b.dims[i] = shape[i]
        b.dims[nd + i] = count
        count *= shape[i]
    total = count * _ITEMSIZE[dtype]
    # At least one byte: consumers may treat a NULL data pointer as an error.
    nbytes = max(total, 1)
    with nogil:
        st = qqDeviceAlloc(device, nbytes, &ptr, <void*>stream)
    _check(st)
    b.ptr = ptr
    return b


def _device_empty(shape, dtype="float32", int device=0):
    """An uninitialized libqq device buffer (used by `python -m qq` to probe the GPU paths
    without a CUDA framework)."""
    return _device_buffer(tuple(int(d) for d in shape), dtype, device, 0)


def _stream_synchronize(int device, intptr_t stream):
    """Block the host until all work queued on `stream` of `device` has finished."""
    cdef qqStatus_t st
    with nogil:
        st = qqStreamSynchronize(device, <void*>stream)
    _check(st)
