# _call.pxi - included by _qq.pyx (one extension module, one file per job).
# Per-call state (_Call): the caller's framework, device and stream; views; results.

# =========================================================================================
# Per-call state: the caller's framework, device and stream; views; result allocation
# =========================================================================================

cdef str _framework_of(obj):
    """'numpy', 'torch', 'cupy', 'jax' or 'other', from the type's module, importing
    nothing (a framework that made `obj` is imported already). A torch.Tensor subclass
    defined elsewhere (a user's, a library's) is torch's too: its results are torch tensors."""
    if isinstance(obj, np.ndarray):
        return "numpy"
    root = (type(obj).__module__ or "").partition(".")[0]
    if root == "torch" or root == "cupy":
        return root
    if root == "jax" or root == "jaxlib":
        return "jax"
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return "torch"
    return "other"


cdef enum:
    _HOLD_GIL_ELEMS = 4096     # _Call.release_gil
    _HOLD_GIL_MACS = 65536     # a matmul's work kept under the GIL: [16, 64] x [64, 64], ~18 us
    _MAX_GROUP = 8             # results of one call that may share a storage (quantize: 2 or 3)
    _GROUP_ALIGN = 256         # each one's byte offset in it (cuBLASLt wants 16-byte scale pointers)


cdef inline void _relock(PyThreadState* ts) noexcept:
    """Take back the GIL that _Call.unlock released (NULL: it was kept)."""
    if ts != NULL:
        PyEval_RestoreThread(ts)


# One per public call; never in a reference cycle (see _View).
@cython.freelist(4)
@cython.no_gc
cdef class _Call:
    """Everything one public call needs between parsing its arguments and returning.

    Outputs come back in the framework of the call's first array argument (the *anchor*)
    and on its device; CUDA work runs on `stream`:
      - torch / CuPy: stream=None -> the framework's current stream on the anchor's device.
      - JAX: stream=None -> we ask JAX for its arrays with __dlpack__(stream=None), which
        makes JAX wait on the host until they are ready, run on the legacy default stream
        (0), and wait on the host for that stream before returning. JAX on CUDA is thus
        synchronous: its streams are private to XLA, and an input JAX may free as soon as
        we release it must not still be read by queued work.
      - other producers: the legacy default stream.
    An explicit stream is used as is (also with JAX, which then waits on it for its
    inputs).
    """
    cdef str func
    cdef str fw
    cdef object anchor
    cdef int dev_type
    cdef bint on_gpu            # results go to device memory (kDLCUDA, kDLCUDAManaged)
    cdef int dev_id
    cdef intptr_t stream        # what libqq runs on (ignored for CPU tensors)
    cdef object dl_stream       # what CUDA producers get as __dlpack__(stream=...)
    cdef _View views            # the views opened in this call, a chain through _View.next
    cdef list buffers           # _DeviceBuffers allocated for results (None until the first)
    cdef bint torch_current     # torch tensors, work on torch's current stream (stream=None or that stream)
    cdef list torch_outs        # torch tensors passed as out= (None until the first): versions bumped in finish()
    cdef int64_t macs           # a matmul's multiply-adds (out elements x K), set by its wrapper: release_gil

    cdef int init(self, str func, anchor, str anchor_name, stream) except -1:
        """Called once, by _new_call."""
        self.func = func
        if isinstance(anchor, QuantizedArray):
            anchor = anchor.data
        self.anchor = anchor
        if isinstance(anchor, cnp.ndarray):     # the hot cases first, without tuples
            self.fw = "numpy"
            self.dev_type = kDLCPU
            self.dev_id = 0
            self.on_gpu = False
            self._resolve_stream(stream)
            return 0
        cdef DLTensor d
        if _torch_xapi != NULL:
            tp = type(anchor)
            # the device through torch's exchange table (one C call; view() reads the anchor
            # again when it comes to it: the description is valid only while no other code
            # runs, and allocations in between release the GIL; meta tensors and the like
            # fail it and go on below)
            if (tp is _torch_tensor_type or tp is _torch_param_type) and _torch_xapi_read(anchor, &d):
                self.fw = "torch"
                self.on_gpu = d.device.device_type == kDLCUDA
                self.dev_type = kDLCUDA if self.on_gpu else kDLCPU
                self.dev_id = d.device.device_id if self.on_gpu else 0
                self._resolve_stream(stream)
                return 0
        self.fw = _framework_of(anchor)
        if self.fw == "torch" and _torch_tensor_type is not None and isinstance(anchor, _torch_tensor_type):
            # (torch's __dlpack_device__ asks is_pinned(), a call into the allocator; pinned
            # host memory runs on the CPU backend like any CPU tensor)
            if anchor.is_cuda:
                self.dev_type = kDLCUDA
                self.dev_id = anchor.get_device()
                self.on_gpu = True
            else:
                self.dev_type = kDLCPU
                self.dev_id = 0
                self.on_gpu = False
            self._resolve_stream(stream)
            return 0
        if self.fw == "torch" and isinstance(anchor, sys.modules["torch"].Tensor):
            dev = (kDLCUDA, anchor.get_device()) if anchor.is_cuda else (kDLCPU, 0)
        elif isinstance(anchor, _DeviceBuffer):
            dev = (kDLCUDA, (<_DeviceBuffer>anchor).device)
        elif hasattr(anchor, "__dlpack_device__"):
            try:
                dev = anchor.__dlpack_device__()
            except Exception as e:
                raise _producer_error(f"{func}: {anchor_name}", "__dlpack_device__()", e) from e
        else:
            raise TypeError(_not_an_array(func, anchor_name, anchor))
        self.dev_type = int(dev[0])
        self.dev_id = int(dev[1])
        # As libqq dispatches: pinned host memory runs on the CPU backend, managed memory
        # on the GPU backend.
        if self.dev_type == kDLCPU or self.dev_type == kDLCUDAHost:
            self.on_gpu = False
        elif self.dev_type == kDLCUDA or self.dev_type == kDLCUDAManaged:
            self.on_gpu = True
        else:
            raise NotSupportedError(
                f"{func}: {anchor_name}: arrays on DLPack device type {self.dev_type} are not "
                f"supported (qq runs on kDLCPU = {<int>kDLCPU}, kDLCUDA = {<int>kDLCUDA}, "
                f"kDLCUDAHost = {<int>kDLCUDAHost} and kDLCUDAManaged = {<int>kDLCUDAManaged})")
        self._resolve_stream(stream)
        return 0

    cdef _resolve_stream(self, stream):
        cdef intptr_t s
        if stream is not None:
            s = _stream_arg(self.func, stream)      # validated even where it is ignored
            if self.on_gpu:
                self.stream = s
                # DLPack reserves 0 (ambiguous); 1 names the legacy default stream.
                self.dl_stream = s if s != 0 else 1
                # torch's current stream given explicitly (stream=torch.cuda.current_stream()
                # and the like): torch tensors are read directly, as with stream=None. Their
                # __dlpack__(stream) would only confirm that no synchronisation is needed, at
                # ~10 us of Python per tensor (measured: amax 10 -> 53 us a call on an H100).
                self.torch_current = (self.fw == "torch"
                                      and s == _torch_current_stream(self.dev_id))
            else:
                self.torch_current = self.fw == "torch"     # CPU tensors: the stream is unused
            return
        if not self.on_gpu:
            self.stream = 0
            self.dl_stream = None
            self.torch_current = self.fw == "torch"
            return
        if self.fw == "torch":
            s = _torch_current_stream(self.dev_id)
            self.torch_current = True
        elif self.fw == "cupy":
            cupy = sys.modules["cupy"]
            with cupy.cuda.Device(self.dev_id):
                s = cupy.cuda.get_current_stream().ptr
        elif self.fw == "jax":
            self.stream = 0
            self.dl_stream = None       # producer-synchronised: JAX waits on the host
            return
        else:
            s = 0
        self.stream = s
        self.dl_stream = s if s != 0 else 1

    # --- views ---------------------------------------------------------------------------

    cdef _View view(self, obj, str name, bint writable=False):
        """A view of argument `obj` (None -> None), released with the call. The hot paths
        (NumPy arrays, torch tensors on the current stream) build no strings and no
        capsules; the "func: name" prefix of a message is made only when one is raised."""
        if obj is None:
            return None
        cdef _View v = self._new_view(name)     # first: whatever the import acquires is released with us
        if isinstance(obj, cnp.ndarray):
            _import_numpy(v, obj, self.func, name)
        elif isinstance(obj, _DeviceBuffer):
            _import_device_buffer(v, <_DeviceBuffer>obj, f"{self.func}: {name}")
        elif self.torch_current and _torch_tensor_type is not None and _import_torch(v, obj):
            pass                    # a real-dtype, strided torch tensor on CPU or CUDA
        else:
            fw = _framework_of(obj)
            if fw == "torch" and obj.is_meta:
                # torch's DLPack export would say only "Unknown device type meta for Dlpack"
                raise ValueError(f"{self.func}: {name}: the tensor is on torch's meta device (shapes "
                                 f"only, no data for libqq to read); pass a CPU or CUDA tensor")
            if fw == "torch" and (obj.is_conj() or obj.is_neg()):
                # torch's lazy conjugate / negative views (t.conj().imag, t._neg_view())
                # share memory holding the un-negated values: read as is they come out as +t.
                if writable:
                    raise ValueError(f"{self.func}: {name}: the tensor has torch's conjugate or "
                                     f"negative bit set (a lazy view); results written into it "
                                     f"would read back negated. Pass a plain tensor (e.g. "
                                     f"out.resolve_neg())")
                obj = obj.resolve_conj().resolve_neg()
            if fw == "torch" and self.torch_current and _import_torch(v, obj):
                pass
            elif hasattr(obj, "__dlpack__"):
                if writable and fw == "jax":
                    raise ValueError(f"{self.func}: {name}: JAX arrays are immutable and cannot be "
                                     f"written into; leave out=None to get a new array")
                if not writable and fw == "torch" and obj.requires_grad:
                    obj = obj.detach()      # torch refuses to export tensors that require grad
                _import_dlpack(v, obj, self.dl_stream, f"{self.func}: {name}")
            else:
                raise TypeError(_not_an_array(self.func, name, obj))
        if writable and v.readonly:
            raise ValueError(f"{self.func}: {name}: the array is read-only; out= must be a "
                             f"writable array")
        return v

    cdef _View need(self, obj, str name):
        """view() of an argument the operation cannot do without: None is a TypeError naming
        it (a None view would be dereferenced below: a segfault)."""
        if obj is None:
            raise TypeError(_not_an_array(self.func, name, obj))
        return self.view(obj, name)

    cdef _View out_view(self, obj, str name):
        """A caller's out= array. Like torch's own out= ops: a tensor that requires grad is
        refused while grad mode is on, and the version counter of a written tensor is bumped
        (in finish()) so that autograd notices the overwrite instead of using stale values."""
        if _framework_of(obj) == "torch":
            torch = sys.modules["torch"]
            if obj.requires_grad and torch.is_grad_enabled():
                raise ValueError(f"{self.func}: {name}: out= tensors that require grad are not "
                                 f"supported (qq's ops are not differentiable through out=, as "
                                 f"torch's out= ops are not); pass a tensor without requires_grad "
                                 f"or leave {name}=None")
            if obj.is_inference() and not torch.is_inference_mode_enabled():
                # torch's own rule for in-place writes (torch.add(..., out=t) raises the
                # same): an inference tensor has no version counter, so autograd could not
                # tell that it changed
                raise ValueError(f"{self.func}: {name}: the tensor was made under "
                                 f"torch.inference_mode and cannot be written outside it (torch "
                                 f"refuses in-place updates of inference tensors there too); call "
                                 f"inside torch.inference_mode(), pass {name}.clone(), or leave "
                                 f"{name}=None")
            if self.torch_outs is None:
                self.torch_outs = []
            self.torch_outs.append(obj)
        return self.view(obj, name, True)

    cdef object scalar(self, value, str name):
        """A global scale: arrays pass through; a Python / NumPy real number becomes a
        float32 array of shape () on the anchor's device (NumPy for CPU callers, the
        caller's framework on CUDA)."""
        if value is None or not isinstance(value, numbers.Real) or isinstance(value, bool):
            return value
        try:
            v = float(value)
            big = math.isfinite(v) and not -3.4028235677973366e38 < v < 3.4028235677973366e38
        except OverflowError:               # an int beyond float64's range
            big = True
        if big:     # finite but beyond float32 (inf and NaN go on, to be refused as such)
            text = repr(value)
            raise ValueError(f"{self.func}: argument '{name}' is {text if len(text) < 24 else text[:8] + '...'}, "
                             f"beyond float32's range; a global scale must be a positive finite number "
                             f"of at least 1e-30 (the tensor's amax, e.g. qq.amax(x)), or 0 / None for none")
        if not self.on_gpu:
            return np.array(v, dtype=np.float32)
        if self.fw == "torch":
            torch = sys.modules["torch"]
            # a fill kernel with v as its argument: no host-to-device copy, so this also
            # works inside a CUDA graph capture
            return torch.full(size=(), fill_value=v, dtype=torch.float32, device=_torch_device(self.dev_id))
        if self.fw == "cupy":
            cupy = sys.modules["cupy"]
            with cupy.cuda.Device(self.dev_id):
                return cupy.full((), v, dtype=cupy.float32)
        if self.fw == "jax":
            return _jax_put(np.array(v, dtype=np.float32), self.anchor)
        raise TypeError(f"{self.func}: {name}: a Python number can only be placed on the GPU "
                        f"for torch, CuPy or JAX callers; pass a float32 device array of one "
                        f"element instead")

    # --- results -------------------------------------------------------------------------

    cdef tuple empty(self, tuple shape, str dtype, str name):
        """(result, view): a new compact array in the caller's framework and a writable
        view of it. `result` goes through self.result() before it is returned."""
        try:
            return self._empty(shape, dtype, name)
        except (MemoryError, ValueError, OverflowError, TypeError, RuntimeError) as e:
            # NumPy's "array is too big" (or a MemoryError for 2^58 elements it can count), a
            # C long overflow, torch's "Storage size calculation overflowed": a shape no array
            # can have (a huge broadcast batch of stride-0 views, a huge `shape` argument),
            # said as this operation's error
            if _beyond_limits(shape):
                raise ValueError(f"{self.func}: the result '{name}' would have shape {shape}: more "
                                 f"than 2^56 elements, beyond what libqq addresses; check the "
                                 f"arguments' shapes (broadcast batch axes multiply)") from None
            if isinstance(e, MemoryError):
                raise MemoryError(f"{self.func}: cannot allocate the result '{name}' of shape {shape} "
                                  f"({dtype}): {e}") from None
            if isinstance(e, RuntimeError) and "out of memory" in str(e).lower():
                # torch.OutOfMemoryError and friends
                raise MemoryError(f"{self.func}: cannot allocate the result '{name}' of shape "
                                  f"{shape} ({dtype}) on the GPU: {e}") from None
            raise

    cdef tuple _empty(self, tuple shape, str dtype, str name):
        cdef _DeviceBuffer b
        cdef void* data = NULL
        if not self.on_gpu:
            if self.fw == "torch":
                r = _torch_empty(shape, dtype, -1, &data)
                return r, self._result_view(r, data, shape, dtype, name)
            else:
                # NumPy, and JAX and unknown CPU producers: computed into NumPy (JAX arrays
                # are immutable), converted by self.result().
                r = _numpy_empty(shape, dtype)
                return r, self._result_view(r, cnp.PyArray_DATA(<cnp.ndarray>r), shape, dtype, name)
        elif self.fw == "torch":
            r = _torch_empty(shape, dtype, self.dev_id, &data)
            return r, self._result_view(r, data, shape, dtype, name)
        elif self.fw == "cupy":
            r = _cupy_empty(self.func, shape, dtype, self.dev_id)
        else:
            b = _device_buffer(shape, dtype, self.dev_id, self.stream)
            if self.buffers is None:
                self.buffers = []
            self.buffers.append(b)
            r = b
        return r, self.view(r, name, True)

    cdef list empties(self, tuple specs):
        """[(result, view)] of each (shape, dtype, name) of specs, as empty() makes them, but
        for torch callers all in one storage (_torch_empty_group): one allocation a call
        instead of one a result (a CUDA allocation through torch cost ~1.5-1.9 us of host
        time on an H200 host, bench/results/overhead-h100-notes.md, session y)."""
        cdef void* ptrs[_MAX_GROUP]
        cdef int i
        if self.fw == "torch":
            rs = _torch_empty_group(specs, self.dev_id if self.on_gpu else -1, ptrs)
            if rs is not None:
                return [(rs[i], self._result_view(rs[i], ptrs[i], (<tuple>specs[i])[0], (<tuple>specs[i])[1],
                                                  (<tuple>specs[i])[2]))
                        for i in range(len(specs))]
        return [self.empty(<tuple>spec[0], <str>spec[1], <str>spec[2]) for spec in specs]

    cdef tuple empty_bf16(self, tuple shape, str name, str centry):
        """empty() of a bfloat16 result, whose framework may have no bfloat16 (CuPy): then a
        TypeError that says so and names the C entry `centry` as the way around."""
        try:
            return self.empty(shape, "bfloat16", name)
        except TypeError as e:
            raise TypeError(f"{self.func}: its results are bfloat16, which this framework cannot "
                            f"hold ({e}); pass torch tensors, or call {centry} from C") from None

    cdef _View _result_view(self, r, void* data, tuple shape, str dtype, str name):
        """The view of a NumPy array or torch tensor that _empty just made (at `data`):
        compact, of a known shape and dtype, on the call's device."""
        cdef _View v = self._new_view(name)
        cdef int nd = len(shape)
        cdef int i
        if nd > _MAX_NDIM:
            raise ValueError(f"{self.func}: {nd} dimensions; at most {_MAX_NDIM} are supported")
        cdef int64_t* dims = _view_dims(v, nd)
        for i in range(nd):
            dims[i] = shape[i]
        _compact_strides(nd, dims)
        v.owner = r
        v.tensor.data = data
        v.tensor.device.device_type = kDLCUDA if self.on_gpu else kDLCPU
        v.tensor.device.device_id = self.dev_id if self.on_gpu else 0
        v.tensor.ndim = nd
        v.tensor.dtype = _dl_type_of(dtype)     # (a torch-typed byte result too)
        v.tensor.shape = dims
        v.tensor.strides = dims + nd
        v.tensor.byte_offset = 0
        v.readonly = False
        return v

    cdef tuple byte_dtypes(self, str func, const qqQuantParams_t* p, torch_dtypes):
        """(data, scales) dtype names of a quantize result: typed for torch callers
        (torch_dtypes=, _params.pxi), uint8 for everyone else."""
        if self.fw == "torch":
            return _torch_typed(func, p.mode, p.fp8_format, torch_dtypes)
        _check_torch_dtypes(func, torch_dtypes)   # checked for every caller, used by torch's
        return ("uint8", "uint8")

    cdef str like_bytes(self, _View v):
        """The dtype name of a byte result that copies v's bytes (swizzle / unswizzle): v's
        own torch dtype for a torch caller when it is a typed byte dtype, else uint8."""
        if self.fw == "torch" and v.tensor.dtype.bits == 8 and v.tensor.dtype.lanes == 1:
            for name, cbl in _TORCH_BYTE_DTYPES.items():
                if cbl[0] == v.tensor.dtype.code and cbl[1] == 8:
                    return name
        return "uint8"

    cdef object result(self, obj):
        """Hand a result made by empty() to the caller's framework."""
        if obj is None or self.fw != "jax":
            return obj
        if isinstance(obj, np.ndarray):
            return _jax_put(obj, self.anchor)
        jnp = sys.modules["jax"].numpy
        if hasattr(jnp, "from_dlpack"):
            return jnp.from_dlpack(obj)
        return sys.modules["jax"].dlpack.from_dlpack(obj.__dlpack__())

    cdef void* cstream(self):
        return <void*>self.stream

    cdef void matmul_work(self, _View x, _View out) noexcept:
        """A matmul's work for release_gil: out's elements times x's K. Its arrays alone can
        hold few elements while the work is large (gather_qmm's x broadcast against many
        indices: 1724 rows of K = 512 from 4096 elements of arrays, ~0.2 ms)."""
        cdef int64_t n = 1
        cdef int i
        if x is None or out is None or x.tensor.ndim == 0:
            return
        for i in range(out.tensor.ndim):
            n *= out.tensor.shape[i]
        self.macs = n * x.tensor.shape[x.tensor.ndim - 1]

    cdef PyThreadState* unlock(self) noexcept:
        """Around the one C call of an op: `_gil = call.unlock()`, the call (C only: nothing
        in between may touch a Python object), `_relock(_gil)`. Releases the GIL where
        release_gil() says so (NULL: kept)."""
        return PyEval_SaveThread() if self.release_gil() else NULL

    cdef bint release_gil(self) noexcept:
        """Whether the C call runs without the GIL: always on a GPU (a launch may block on
        a full launch queue), and on the CPU unless the call's arrays hold at most
        _HOLD_GIL_ELEMS elements together (releasing and taking back the GIL, ~0.07 us, was
        5 % of a NumPy quantize of [1, 32]; NumPy keeps the GIL below 500 elements for the
        same reason). The work kept under the GIL is ~20 us at most (a matmul of [16, 64] x
        [64, 64]; docs/api.md, "The GIL")."""
        if self.on_gpu or self.macs > _HOLD_GIL_MACS:
            return True
        cdef int64_t n = 0
        cdef _View v = self.views
        cdef int i
        cdef int64_t e
        while v is not None:
            e = 1
            for i in range(v.tensor.ndim):
                e *= v.tensor.shape[i]
                if e > _HOLD_GIL_ELEMS:
                    return True
            n += e
            if n > _HOLD_GIL_ELEMS:
                return True
            v = v.next
        return False

    cdef finish(self):
        """After the C call succeeded, before the views are released."""
        if self.torch_outs:
            bump = sys.modules["torch"].autograd.graph.increment_version
            for t in self.torch_outs:
                bump(t)
        if self.fw == "jax" and self.on_gpu:
            _stream_synchronize(self.dev_id, self.stream)
            if self.buffers is not None:
                for b in self.buffers:
                    (<_DeviceBuffer>b).synced = True

    cdef _View _new_view(self, str name):
        """A new empty view, chained to this call so that release() gives it back."""
        cdef _View v = _View.__new__(_View)
        v.name = name
        v.next = self.views
        self.views = v
        return v

    cdef void release(self) noexcept:
        cdef _View v = self.views
        self.views = None
        cdef _View nxt
        while v is not None:
            _release_view(v)
            nxt = v.next
            v.next = None
            v = nxt


cdef inline _Call _new_call(str func, anchor, str anchor_name, stream):
    """The per-call state of one public call on `anchor` (its first array argument).
    (A cdef factory: constructing a cdef class through its Python constructor parses a
    tuple of arguments; this is a plain C call.)"""
    cdef _Call c = _Call.__new__(_Call)
    c.init(func, anchor, anchor_name, stream)
    return c


cdef bint _beyond_limits(tuple shape):
    """A result shape no allocation can hold: an extent outside [0, 2^63) or more than
    2^56 elements (libqq's bound, qqQuantizedShapes)."""
    n = 1
    for d in shape:
        if not 0 <= d < 2**63:
            return True
        n *= d
    return n > 2**56


cdef str _not_an_array(str func, str name, obj):
    what = "a QuantizedArray" if isinstance(obj, QuantizedArray) else type(obj).__name__
    if hasattr(obj, "__dlpack__") and not hasattr(obj, "__dlpack_device__"):
        return (f"{func}: {name}: {what} has __dlpack__ but no __dlpack_device__; the DLPack "
                f"protocol needs both (pass a NumPy array or a torch, CuPy or JAX array)")
    return (f"{func}: {name}: expected a NumPy array or an array with __dlpack__ (torch, CuPy, "
            f"JAX), got {what}")


cdef object _producer_error(str where, str what, e):
    """A producer's own exception from its DLPack methods, named as the argument's: the same
    class where it takes a message (else ValueError), raised `from` the original."""
    msg = f"{where}: reading the array failed in its {what} ({type(e).__name__}: {e})"
    try:
        return type(e)(msg)
    except Exception:
        return ValueError(msg)


cdef int _import_dlpack(_View v, obj, dl_stream, str where) except -1:
    if not hasattr(obj, "__dlpack_device__"):
        func, _, name = where.partition(": ")
        raise TypeError(_not_an_array(func, name, obj))
    try:
        dev = obj.__dlpack_device__()
    except Exception as e:
        raise _producer_error(where, "__dlpack_device__()", e) from e
    # Producers on a CUDA device get the consumer's stream; CPU producers must get None.
    stream = dl_stream if _is_cuda_device(int(dev[0])) else None
    try:
        try:
            capsule = obj.__dlpack__(stream=stream, max_version=(QQ_DLPACK_MAJOR, QQ_DLPACK_MINOR))
        except TypeError:
            # A producer from before DLPack 1.0 has no max_version and returns a legacy capsule.
            capsule = obj.__dlpack__(stream=stream)
    except Exception as e:
        raise _producer_error(where, "__dlpack__()", e) from e
    _consume_capsule(v, capsule, where)
    return 0


cdef int _import_device_buffer(_View v, _DeviceBuffer b, str where) except -1:
    # Our own buffers are viewed directly: no capsule, so no one-shot export is used up.
    if b.ptr == NULL:
        raise ValueError(f"{where}: this qq device buffer was already exported through DLPack; "
                         f"use the array it was imported into")
    v.owner = b
    v.tensor.data = b.ptr
    v.tensor.device.device_type = kDLCUDA
    v.tensor.device.device_id = b.device
    v.tensor.ndim = b.ndim
    v.tensor.dtype = b.dl_dtype
    v.tensor.shape = b.dims
    v.tensor.strides = b.dims + b.ndim
    v.tensor.byte_offset = 0
    v.readonly = False
    return 0


cdef object _jax_put(np_array, anchor):
    """A NumPy result as a JAX array on the anchor's device."""
    jax = sys.modules["jax"]
    try:
        device = next(iter(anchor.devices()))
    except Exception:
        return jax.numpy.asarray(np_array)
    return jax.device_put(np_array, device)


cdef object _cupy_empty(str func, tuple shape, str dtype, int dev_id):
    cupy = sys.modules["cupy"]
    dt = _numpy_dtype(dtype)
    with cupy.cuda.Device(dev_id):
        try:
            return cupy.empty(shape, dtype=dt)
        except Exception as e:
            if dtype != "bfloat16":
                raise
            raise TypeError(f"{func}: this CuPy cannot hold bfloat16 results ({e}); pass "
                            f"dtype='float16' or dtype='float32', or an out= array") from None


cdef inline DLTensor* _t(_View v):
    return NULL if v is None else &v.tensor


cdef _View _out_view(_Call call, out, str dtype):
    cdef _View v = call.out_view(out, "out")
    if dtype is not None and v.dtype_name() != dtype:
        raise ValueError(f"{call.func}: out has dtype {v.dtype_name() or getattr(out, 'dtype', 'unsupported')} "
                         f"but dtype={dtype!r} was asked for")
    return v


cdef dict _NP_TYPENUM = {}


cdef object _numpy_empty(tuple shape, str dtype):
    """np.empty(shape, dtype) through NumPy's C API (the type number cached per name)."""
    cdef int typenum
    t = _NP_TYPENUM.get(dtype)
    if t is None:
        t = _NP_TYPENUM[dtype] = _numpy_dtype(dtype).num
    typenum = t
    cdef int nd = len(shape)
    cdef cnp.npy_intp dims[_MAX_NDIM]
    cdef int i
    cdef cnp.npy_intp bits = 0
    if nd > _MAX_NDIM:
        raise ValueError(f"{nd} dimensions; at most {_MAX_NDIM} are supported")
    for i in range(nd):
        dims[i] = shape[i]
        bits |= dims[i]
    # more than 2^56 elements is refused before NumPy tries (its MemoryError comes after a
    # request that a sanitizer's allocator treats as fatal); _Call.empty says it as a
    # ValueError. Extents below 2^18 in at most 3 dimensions cannot get there: the common
    # case costs an or a dimension (a product on every call cost a NumPy quantize ~2 %).
    if ((bits >> 18) != 0 or nd > 3) and _beyond_limits(shape):
        raise ValueError("array is too big")
    return cnp.PyArray_EMPTY(nd, dims, typenum, 0)


cdef dict _TORCH_DEVICES = {}


cdef object _torch_device(int dev_id):
    """torch.device("cuda", dev_id), made once per device id."""
    dev = _TORCH_DEVICES.get(dev_id)
    if dev is None:
        dev = _TORCH_DEVICES[dev_id] = sys.modules["torch"].device("cuda", dev_id)
    return dev


# torch's C shim (torch/csrc/inductor/aoti_torch/c/shim.h: the stable C ABI of libtorch that
# AOTInductor's generated code and torch's stable-ABI extensions call), looked up in the
# libtorch_cpu already loaded by `import torch`.
ctypedef int _aoti_empty_t(int64_t ndim, const int64_t* sizes, const int64_t* strides, int dtype,
                           int device_type, int device_index, void** ret) noexcept nogil
ctypedef int _aoti_get_i32_t(void* tensor, int* ret) noexcept nogil
ctypedef int _aoti_get_ptr_t(void* tensor, void** ret) noexcept nogil
ctypedef int _aoti_delete_t(void* tensor) noexcept nogil
# a tensor of any dtype, sizes and strides on the storage of `self` from byte offset_bytes on
# (inductor's _alloc_from_pool: its own TensorImpl, not an autograd view)
ctypedef int _aoti_pool_t(void* self, int64_t offset_bytes, int dtype, int64_t ndim, const int64_t* sizes,
                          const int64_t* strides, void** ret) noexcept nogil
# torch's THPVariable_Wrap(const at::TensorBase&) (torch/csrc/autograd/python_variable.h, exported
# by libtorch_python): the function torch._C._aoti.alloc_tensor_by_stealing_from_void_ptr calls
# after pybind11 has parsed its argument. A shim handle is an at::Tensor* (what the shim casts
# it to), so the reference is the handle itself. Returns a new reference, or NULL with a Python
# exception set.
ctypedef PyObject* _thp_wrap_t(void* tensor) noexcept

cdef extern from *:
    """
    PyObject* qq_call_wrap(PyObject* (*fn)(void*), void* arg);  /* python/qq/_cxx_call.cpp */
    PyObject* qq_throwing_for_test(void*);
    """
    # fn(arg) inside a C++ try block: an exception becomes a RuntimeError and NULL
    PyObject* qq_call_wrap(_thp_wrap_t* fn, void* arg) noexcept
    _thp_wrap_t qq_throwing_for_test
    object _qq_call_wrap_raising "qq_call_wrap"(_thp_wrap_t* fn, void* arg)   # NULL: raise it


def _cxx_call_selftest():
    """For tests: qq_call_wrap around a C++ function that throws raises the RuntimeError it
    makes of the exception (the process would end if the exception crossed the extension's
    C frames)."""
    return _qq_call_wrap_raising(qq_throwing_for_test, NULL)


cdef class _TorchKind:
    """What a torch result of one (dtype, device) needs: the template tensor (the fallback's
    new_empty), and for the C path the shim's codes of its dtype and device."""
    cdef object template
    cdef int dtype_code, device_type, device_index
    cdef int64_t esize
    cdef bint c_path, on_cpu
    cdef bint direct            # c_path through _thp_wrap (a C call), not through _aoti_wrap
    cdef int pool               # uint8 kinds: _torch_empty_group usable on this device (1), not (-1), unknown (0)


# dtype name -> [kind of the CPU, of cuda:0, of cuda:1, ...] (None where not made yet)
cdef dict _TORCH_KINDS = {}
cdef _aoti_empty_t* _aoti_empty = NULL
cdef _aoti_get_ptr_t* _aoti_data_ptr = NULL
cdef _aoti_delete_t* _aoti_delete = NULL
cdef _aoti_get_i32_t* _aoti_dtype = NULL
cdef _aoti_get_i32_t* _aoti_device_type = NULL
cdef _aoti_get_i32_t* _aoti_device_index = NULL
cdef _aoti_pool_t* _aoti_pool = NULL   # aoti_torch__alloc_from_pool, where found (else a result each)
cdef object _aoti_wrap = None     # torch._C._aoti.alloc_tensor_by_stealing_from_void_ptr
cdef _thp_wrap_t* _thp_wrap = NULL  # THPVariable_Wrap, where found (else _aoti_wrap)
cdef object _aoti_handle_of = None  # torch._C._aoti.unsafe_alloc_void_ptr_from_tensor
cdef object _torch_dispatch_depth = None
cdef int _aoti_state = 0          # 0: not looked up yet; 1: usable; -1: not (the fallback only)
# Results above this size take torch's Python path: their allocation dwarfs its parsing, and
# an allocation the shim fails (out of memory) is reported by torch's own exception there.
cdef int64_t _AOTI_MAX_BYTES = 1 << 28


cdef int _aoti_lookup(object torch) except -1:
    """Find the shim's entry points and torch's handle <-> tensor functions once; any miss (an
    older or differently built torch, another OS) leaves the Python path alone in use."""
    global _aoti_state, _aoti_empty, _aoti_data_ptr, _aoti_delete, _aoti_wrap, _torch_dispatch_depth
    global _aoti_dtype, _aoti_device_type, _aoti_device_index, _aoti_handle_of, _thp_wrap, _aoti_pool
    # (the state is written once, at the end: another thread that runs meanwhile looks up
    # again rather than caching a kind without the C path)
    import os
    aoti = getattr(torch._C, "_aoti", None)
    wrap = getattr(aoti, "alloc_tensor_by_stealing_from_void_ptr", None)
    handle_of = getattr(aoti, "unsafe_alloc_void_ptr_from_tensor", None)
    depth = getattr(torch._C, "_len_torch_dispatch_stack", None)
    if wrap is None or handle_of is None or depth is None:
        _aoti_state = -1
        return 0
    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so").encode()
    cdef void* lib = dlopen(path, RTLD_LAZY | RTLD_NOLOAD)     # loaded already: no new load
    if lib == NULL:
        _aoti_state = -1
        return 0
    _aoti_empty = <_aoti_empty_t*>dlsym(lib, b"aoti_torch_empty_strided")
    _aoti_data_ptr = <_aoti_get_ptr_t*>dlsym(lib, b"aoti_torch_get_data_ptr")
    _aoti_delete = <_aoti_delete_t*>dlsym(lib, b"aoti_torch_delete_tensor_object")
    _aoti_dtype = <_aoti_get_i32_t*>dlsym(lib, b"aoti_torch_get_dtype")
    _aoti_device_type = <_aoti_get_i32_t*>dlsym(lib, b"aoti_torch_get_device_type")
    _aoti_device_index = <_aoti_get_i32_t*>dlsym(lib, b"aoti_torch_get_device_index")
    _aoti_pool = <_aoti_pool_t*>dlsym(lib, b"aoti_torch__alloc_from_pool")
    if (_aoti_empty == NULL or _aoti_data_ptr == NULL or _aoti_delete == NULL or _aoti_dtype == NULL
            or _aoti_device_type == NULL or _aoti_device_index == NULL):
        _aoti_state = -1
        return 0
    _aoti_wrap, _aoti_handle_of, _torch_dispatch_depth = wrap, handle_of, depth
    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_python.so").encode()
    lib = dlopen(path, RTLD_LAZY | RTLD_NOLOAD)
    if lib != NULL:     # (Itanium C++ ABI name of THPVariable_Wrap(const at::TensorBase&))
        _thp_wrap = <_thp_wrap_t*>dlsym(lib, b"_Z16THPVariable_WrapRKN2at10TensorBaseE")
    _aoti_state = 1
    return 0


cdef object _wrap_handle(bint direct, void* h):
    """The torch tensor of shim handle h, a copy of it (h stays the caller's to delete):
    through THPVariable_Wrap (direct) or torch's pybind11 wrapper. None where it failed."""
    cdef PyObject* o
    if not direct:
        return _aoti_wrap(PyCapsule_New(h, NULL, NULL))
    o = qq_call_wrap(_thp_wrap, h)
    if o == NULL:
        PyErr_Clear()
        return None
    t = <object>o       # (a reference of its own: the new one the call returned is dropped)
    Py_DECREF(t)
    return t


cdef bint _aoti_probe(_TorchKind k, object torch) except -1:
    """Whether the shim path gives exactly the template's kind of tensor, and the wrapper
    copies the tensor out of the handle (torch's today: the handle keeps a reference of its
    own, use count 2, which _torch_empty_c then deletes) rather than taking the handle over
    (use count 1: deleting it then would free it twice; the handle is left alone then and
    the C path stays off). THPVariable_Wrap is tried first (k.direct), then torch's pybind11
    wrapper. Also reads the shim's dtype and device codes off the template."""
    cdef void* h = NULL
    cdef void* p = NULL
    cdef int64_t dims[2]
    handle = _aoti_handle_of(k.template)
    h = PyCapsule_GetPointer(handle, PyCapsule_GetName(handle))
    ok = (_aoti_dtype(h, &k.dtype_code) == 0 and _aoti_device_type(h, &k.device_type) == 0
          and _aoti_device_index(h, &k.device_index) == 0)
    _aoti_delete(h)
    if not ok:
        return False
    dims[0] = 1
    dims[1] = 1
    for direct in (True, False):
        if direct and _thp_wrap == NULL:
            continue
        h = NULL
        if _aoti_empty(1, dims, dims + 1, k.dtype_code, k.device_type, k.device_index, &h) != 0 or h == NULL:
            return False
        t = _wrap_handle(direct, h)
        if t is None:
            _aoti_delete(h)
            continue
        if t._use_count() != 2:
            continue        # (the handle is left alone: it may be the only owner)
        ok = (_aoti_data_ptr(h, &p) == 0 and type(t) is torch.Tensor and t.dtype == k.template.dtype
              and t.device == k.template.device and tuple(t.shape) == (1,) and t.data_ptr() == <intptr_t>p)
        _aoti_delete(h)
        if ok and t._use_count() == 1:
            k.direct = direct
            return True
    return False


cdef object _torch_kind_made(str dtype, int dev_id):
    """_torch_kind's cached kind of (dtype, device), or None where none is made yet (making
    one runs Python code; this lookup does not)."""
    kinds = _TORCH_KINDS.get(dtype)
    if kinds is not None and dev_id + 1 < len(<list>kinds):
        return (<list>kinds)[dev_id + 1]
    return None


cdef _TorchKind _torch_kind(str dtype, int dev_id):
    """The kind of torch result of (dtype, device: -1 the CPU, else cuda:dev_id): its
    template and, where the shim is usable, its codes, checked by one allocation through it
    (_aoti_probe). Cached once complete; not inside a dispatch mode (the probe's allocation
    would go through it), where the next call makes it."""
    k0 = _torch_kind_made(dtype, dev_id)
    if k0 is not None:
        return <_TorchKind>k0
    torch = sys.modules["torch"]
    cdef _TorchKind k = _TorchKind()
    dev = torch.device("cpu") if dev_id < 0 else _torch_device(dev_id)
    k.template = torch.empty(0, dtype=getattr(torch, dtype), device=dev)
    k.esize = k.template.element_size()
    k.on_cpu = dev_id < 0
    # kept only when it is a plain tensor made outside a dispatch mode: one made under a
    # mode (FakeTensorMode, ...) would make every later result fake
    if type(k.template) is not torch.Tensor:
        return k
    if _aoti_state == 0:
        _aoti_lookup(torch)
    if _aoti_state == 1:
        if _torch_dispatch_depth() != 0:
            return k
        try:
            k.c_path = _aoti_probe(k, torch)
        except Exception:
            k.c_path = False
    kinds = _TORCH_KINDS.setdefault(dtype, [])
    while len(kinds) < dev_id + 2:
        kinds.append(None)
    kinds[dev_id + 1] = k
    return k


cdef int _shim_empty(_TorchKind k, int nd, const int64_t* sizes, const int64_t* strides, void** h) except -1:
    """The shim's empty_strided of kind k (one C call: torch's allocator, no argument parsing)
    into *h; its return code (0: made)."""
    cdef int rc
    if k.on_cpu:
        # (the GIL held: releasing it cost more than a CPU allocation)
        return _aoti_empty(nd, sizes, strides, k.dtype_code, k.device_type, k.device_index, h)
    # a CUDA allocation may call cudaMalloc or free the cache and retry: without the GIL, as
    # torch's own bindings allocate
    with nogil:
        rc = _aoti_empty(nd, sizes, strides, k.dtype_code, k.device_type, k.device_index, h)
    return rc


cdef object _wrap_and_delete(bint direct, void* h):
    """The torch tensor of shim handle h (whose data pointer its maker read); the handle is
    deleted in every case (the wrapper copies the tensor out of it: a reference of its own,
    checked by _aoti_probe). None where the wrap failed."""
    t = None
    try:
        t = _wrap_handle(direct, h)
    except Exception:
        t = None
    finally:
        _aoti_delete(h)
    return t


cdef int _torch_empty_handle(_TorchKind k, int nd, const int64_t* shape, void** h, void** data) except -2:
    """A new compact tensor of kind k and shape shape[:nd] through the shim (_shim_empty) as
    a handle in *h (no Python object: C calls only) and its data pointer in *data; 0, or -1
    where it failed or the result is for torch's Python path (_contiguous_dims), no handle
    left then. The caller wraps it (_wrap_and_delete) or deletes it (_aoti_delete)."""
    cdef int64_t dims[2 * _MAX_NDIM]
    cdef int64_t nbytes = 0
    h[0] = NULL
    if _contiguous_dims(nd, shape, k.esize, dims, &nbytes) < 0 or _shim_empty(k, nd, dims, dims + nd, h) != 0 \
            or h[0] == NULL:
        return -1
    if _aoti_data_ptr(h[0], data) != 0:
        _aoti_delete(h[0])
        h[0] = NULL
        return -1
    return 0


cdef object _torch_empty_c(_TorchKind k, int nd, const int64_t* shape, void** data):
    """A new tensor of kind k and shape shape[:nd] through the shim (_torch_empty_handle),
    wrapped as a torch.Tensor; None where it failed or the result is for torch's Python path."""
    cdef void* h = NULL
    if _torch_empty_handle(k, nd, shape, &h, data) != 0:
        return None
    return _wrap_and_delete(k.direct, h)


cdef int _tuple_dims(tuple shape, int64_t* out) except -2:
    """shape's sizes into out (room for _MAX_NDIM); its length, or -1 beyond _MAX_NDIM."""
    cdef int nd = len(shape)
    cdef int i
    if nd > _MAX_NDIM:
        return -1
    for i in range(nd):
        out[i] = shape[i]
    return nd


cdef int _contiguous_dims(int nd, const int64_t* shape, int64_t esize, int64_t* dims, int64_t* nbytes) noexcept:
    """dims[0:nd] = shape[:nd], dims[nd:2nd] = torch's contiguous strides (sizes 0 count as
    1), and the byte size; -1 for what the shim path leaves to torch's Python path: more than
    _MAX_NDIM axes, or more than _AOTI_MAX_BYTES (each factor and the running product stay
    below 2^28 before a multiplication: no overflow)."""
    cdef int i
    cdef int64_t stride = 1, n, nb = esize
    if nd < 0 or nd > _MAX_NDIM:
        return -1
    for i in range(nd - 1, -1, -1):
        n = shape[i]
        if n < 0 or n > _AOTI_MAX_BYTES:
            return -1
        nb *= n
        if nb > _AOTI_MAX_BYTES:
            return -1
        dims[i] = n
        dims[nd + i] = stride
        stride *= n if n > 1 else 1
    nbytes[0] = nb
    return nd


cdef bint _pool_probe(_TorchKind k8, object torch) except -1:
    """Whether a tensor carved out of a shim-made uint8 tensor (_aoti_pool) is what
    _torch_empty_group needs: its own dtype, sizes and device, its data at the storage's
    start plus the offset, the storage kept alive by the tensor alone once the handles are
    deleted."""
    cdef void* h = NULL
    cdef void* hp = NULL
    cdef void* base = NULL
    cdef void* p = NULL
    cdef int64_t dims[2]
    k16 = _torch_kind("bfloat16", -1 if k8.on_cpu else k8.device_index)
    if not k16.c_path:
        return False
    dims[0] = 2 * _GROUP_ALIGN
    dims[1] = 1
    if _aoti_empty(1, dims, dims + 1, k8.dtype_code, k8.device_type, k8.device_index, &h) != 0 or h == NULL:
        return False
    ok = False
    dims[0] = 3
    t = None
    try:
        if (_aoti_data_ptr(h, &base) == 0
                and _aoti_pool(h, _GROUP_ALIGN, (<_TorchKind>k16).dtype_code, 1, dims, dims + 1, &hp) == 0
                and hp != NULL):
            try:
                t = _wrap_handle((<_TorchKind>k16).direct, hp)
                ok = t is not None and _aoti_data_ptr(hp, &p) == 0 and <char*>p == <char*>base + _GROUP_ALIGN
            finally:
                _aoti_delete(hp)
    finally:
        _aoti_delete(h)     # (t, where made, holds the storage now: checked below)
    return ok and (type(t) is torch.Tensor and t.dtype == (<_TorchKind>k16).template.dtype
                   and t.device == (<_TorchKind>k16).template.device and tuple(t.shape) == (3,)
                   and t.stride() == (1,) and t.data_ptr() == <intptr_t>p and t._use_count() == 1
                   and t.untyped_storage().data_ptr() == <intptr_t>base
                   and t.untyped_storage().nbytes() == 2 * _GROUP_ALIGN)


cdef object _torch_empty_group(tuple specs, int dev_id, void** ptrs):
    """The torch tensors of specs ((shape, dtype name, result name), up to _MAX_GROUP) in one
    new uint8 storage of the device (_torch_group), and their data pointers in ptrs. A list,
    or None where this path does not apply (the caller then makes each result alone)."""
    cdef int n = len(specs)
    cdef int i
    cdef int64_t sizes[_MAX_GROUP][_MAX_NDIM]
    cdef const int64_t* shapes[_MAX_GROUP]
    cdef int nds[_MAX_GROUP]
    if n > _MAX_GROUP or n == 0:
        return None
    cdef _TorchKind k8 = _torch_group_base(dev_id)
    if k8 is None:
        return None
    kinds = []
    for i in range(n):
        spec = <tuple>specs[i]
        kinds.append(_torch_kind(<str>spec[1], dev_id))
        nds[i] = _tuple_dims(<tuple>spec[0], sizes[i])
        shapes[i] = sizes[i]
        if nds[i] < 0:
            return None
    return _torch_group(k8, kinds, n, nds, shapes, ptrs)


cdef _TorchKind _cpu_group_base = None     # the CPU's, once usable (it stays so)


cdef _TorchKind _torch_group_base(int dev_id):
    """The uint8 kind whose storage _torch_group carves, where that path applies on the
    device (-1: the CPU) now: the shim and _alloc_from_pool found, outside a dispatch mode,
    the carving checked once (_pool_probe); else None."""
    global _cpu_group_base
    cdef _TorchKind k8 = _cpu_group_base if dev_id < 0 else None
    if k8 is None:
        k8 = _torch_kind("uint8", dev_id)       # (the shim is looked up on the first call)
        if not k8.c_path or _aoti_pool == NULL:
            return None
    if _torch_dispatch_depth() != 0:
        return None
    if k8.pool == 0:
        try:
            k8.pool = 1 if _pool_probe(k8, sys.modules["torch"]) else -1
        except Exception:
            k8.pool = -1
    if k8.pool < 0:
        return None
    if dev_id < 0:
        _cpu_group_base = k8
    return k8


cdef object _torch_group(_TorchKind k8, list kinds, int n, const int* nds, const int64_t** shapes, void** ptrs):
    """The n torch tensors of kinds[i] and shapes[i][:nds[i]] in one new storage of k8
    (from _torch_group_base), each at a multiple of _GROUP_ALIGN bytes, and their data
    pointers in ptrs: one allocation for all of a call's results. A list, or None where a
    kind has no shim path, a result or the block is beyond _AOTI_MAX_BYTES, there is
    nothing to allocate, or something failed.

    The results share the storage: a result's untyped_storage() is the whole block, and it
    stays allocated while any of them lives (docs/api.md, "How torch results are made")."""
    cdef void* hs[_MAX_GROUP]
    if _torch_group_handles(k8, kinds, n, nds, shapes, ptrs, hs) != 0:
        return None
    return _torch_group_wrap(kinds, n, hs)


cdef int _torch_group_handles(_TorchKind k8, list kinds, int n, const int* nds, const int64_t** shapes,
                              void** ptrs, void** hs) except -2:
    """_torch_group's tensors as shim handles in hs (no Python object made: C calls only)
    and their data pointers in ptrs; 0, or -1 where _torch_group gives None (no handle is
    left then). The caller wraps them (_torch_group_wrap) or deletes them (_aoti_delete)."""
    cdef int i, j
    cdef int64_t dims[_MAX_GROUP][2 * _MAX_NDIM]
    cdef int64_t off[_MAX_GROUP]
    cdef int64_t total = 0, nbytes = 0, one = 1
    cdef void* h = NULL
    cdef _TorchKind k
    for i in range(n):
        k = <_TorchKind>kinds[i]
        if not k.c_path or _contiguous_dims(nds[i], shapes[i], k.esize, dims[i], &nbytes) < 0:
            return -1
        off[i] = total
        total += (nbytes + _GROUP_ALIGN - 1) // _GROUP_ALIGN * _GROUP_ALIGN
        if total > _AOTI_MAX_BYTES:
            return -1
    if total == 0:
        return -1
    if _shim_empty(k8, 1, &total, &one, &h) != 0 or h == NULL:
        return -1
    for i in range(n):
        k = <_TorchKind>kinds[i]
        hs[i] = NULL
        if (_aoti_pool(h, off[i], k.dtype_code, nds[i], dims[i], &dims[i][nds[i]], &hs[i]) != 0 or hs[i] == NULL
                or _aoti_data_ptr(hs[i], &ptrs[i]) != 0):
            for j in range(i + 1):
                if hs[j] != NULL:
                    _aoti_delete(hs[j])
            _aoti_delete(h)
            return -1
    _aoti_delete(h)     # (each view holds the storage)
    return 0


cdef object _torch_group_wrap(list kinds, int n, void** hs):
    """The torch tensors of _torch_group_handles's handles, each deleted here; a list, or None
    where a wrap failed."""
    cdef int i, j
    out = []
    for i in range(n):
        t = _wrap_and_delete((<_TorchKind>kinds[i]).direct, hs[i])
        hs[i] = NULL
        if t is None:
            for j in range(i + 1, n):
                _aoti_delete(hs[j])
                hs[j] = NULL
            return None
        out.append(t)
    return out


cdef object _torch_empty(tuple shape, str dtype, int dev_id, void** data):
    """A new torch tensor on the CPU (dev_id < 0) or cuda:dev_id, and its data pointer.

    Through torch's C shim where it is usable (one C call to torch's allocator, no Python
    argument parsing: 0.3-0.6 us less a call on a 2-core CPU host, no measurable change on an
    H200 host; bench/results/overhead-h100-notes.md, session w), outside torch's dispatch modes (a FakeTensorMode
    or a tracing mode sees the allocation only on the Python path), for results up to
    _AOTI_MAX_BYTES (a failure there, out of memory, is logged by the shim on stderr and the
    Python path then raises torch's own error). Otherwise new_empty of
    an empty template tensor of that dtype and device, made once: the template carries the
    dtype and the device, so torch parses only the sizes (0.87 against torch.empty's 1.04 us
    on the CPU), and the result lands on the call's device also inside a `with
    torch.device(...)` block, which redirects a torch.empty without device= (a CPU call then
    got meta or CUDA results)."""
    cdef int64_t dims[_MAX_NDIM]
    return _torch_empty_dims(_tuple_dims(shape, dims), dims, dtype, dev_id, data, shape)


cdef object _torch_empty_dims(int nd, const int64_t* dims, str dtype, int dev_id, void** data, tuple shape):
    """_torch_empty of the shape dims[:nd] (nd -1: beyond _MAX_NDIM), given as a tuple too
    (shape) or not (None: made here where torch's Python path needs it)."""
    cdef _TorchKind k = _torch_kind(dtype, dev_id)
    if k.c_path and _torch_dispatch_depth() == 0:
        t = _torch_empty_c(k, nd, dims, data)  # (None: beyond _MAX_NDIM or _AOTI_MAX_BYTES, or failed)
        if t is not None:
            return t
    if shape is None:
        shape = _int_tuple(dims, nd)
    # The sizes as separate ints: torch parses them faster than one tuple argument
    # (~0.5 us a call on the CPU, 1.5 us on an H100 host); a 0-d result as size=(), which
    # torch parses as fast (a positional () takes the slow tuple path).
    t = k.template.new_empty(*shape) if shape else k.template.new_empty(size=())
    data[0] = <void*><intptr_t>t.data_ptr()
    return t


cdef object _torch_raw_stream = None


cdef intptr_t _torch_current_stream(int dev_id) except? -1:
    """torch's current CUDA stream on dev_id as a cudaStream_t value: through torch's DLPack
    exchange table (a C call) where it has one, else torch._C._cuda_getCurrentRawStream (what
    torch's generated code calls; it skips building a torch.cuda.Stream object), else
    torch.cuda.current_stream()."""
    global _torch_raw_stream
    cdef void* s = NULL
    if _torch_tensor_type is None:
        _torch_types_init()
    if _torch_xapi != NULL:
        if _torch_xapi.current_work_stream(kDLCUDA, dev_id, &s) == 0:
            return <intptr_t>s
        PyErr_Clear()       # (an invalid device and the like: the Python path raises it)
    torch = sys.modules["torch"]
    if _torch_raw_stream is None:
        _torch_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", False)
    if _torch_raw_stream is not False:
        return _torch_raw_stream(dev_id)
    return torch.cuda.current_stream(dev_id).cuda_stream


def _torch_fast_paths(device=None):
    """For tests and diagnostics: which of the C paths to torch this process uses -
    exchange (tensors and the current stream read through torch's DLPack exchange table),
    thp_wrap (THPVariable_Wrap found), and per result kind made so far, (dtype, device id
    or -1): (through the shim, wrapped by THPVariable_Wrap); with a CUDA device id, also
    stream: torch's current stream there as qq reads it; pool: per device id (-1 the CPU)
    whether a call's results share one storage there (_torch_empty_group), once probed."""
    if "torch" in sys.modules and _torch_tensor_type is None:
        _torch_types_init()
    kinds = {}
    pool = {}
    for dtype, ks in _TORCH_KINDS.items():
        for i, k in enumerate(ks):
            if k is not None:
                kinds[(dtype, i - 1)] = ((<_TorchKind>k).c_path, (<_TorchKind>k).direct)
                if dtype == "uint8" and (<_TorchKind>k).pool != 0:
                    pool[i - 1] = (<_TorchKind>k).pool > 0
    r = {"exchange": _torch_xapi != NULL, "thp_wrap": _thp_wrap != NULL, "kinds": kinds, "pool": pool}
    if device is not None:
        r["stream"] = _torch_current_stream(device)
    return r
