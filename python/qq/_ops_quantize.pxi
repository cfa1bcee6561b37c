# _ops_quantize.pxi - included by _qq.pyx (one extension module, one file per job).
# Operations: quantize, quantize_colwise, quantize_moe, quantize_dequantize(_moe), dequantize.

# =========================================================================================
# Operations
# =========================================================================================

def quantize(x, group_size=None, bits=None, mode="affine", *, global_scale=None,
             rounding="ceil", scale_layout="linear", fp8_format="e4m3", torch_dtypes=True,
             stream=None):
    """Quantize x [..., K] along its last axis; returns a QuantizedArray.

    mode: "affine" (default; group_size 64, bits 4), "nvfp4", "mxfp4" or "mxfp8".
    global_scale (nvfp4 only): a float32 array of one element (conventionally qq.amax(x))
    or a Python float. rounding ("ceil" | "floor"): UE8M0 scales of mxfp4/mxfp8.
    scale_layout ("linear" | "blocked"; blocked for fp modes only). fp8_format ("e4m3" |
    "e5m2"): mxfp8 elements. torch_dtypes (torch callers; True | False | "float4"): fp
    scales as torch.float8_e4m3fn / float8_e8m0fnu and mxfp8 data as float8_e4m3fn /
    float8_e5m2 (True), packed fp4 as float4_e2m1fn_x2 too ("float4"), or uint8 (False).
    See docs/api.md.
    """
    if _fast_on and global_scale is None and stream is None and torch_dtypes is True:
        try:
            r = _quantize_fast(x, group_size, bits, mode, rounding, scale_layout, fp8_format)
        except Exception:   # (the general path raises it, in its own words and order)
            r = None
        if r is not None:
            return r
    return _quantize(x, group_size, bits, mode, global_scale, rounding, scale_layout, fp8_format,
                     torch_dtypes, stream, True)


def _quantize_apart(x, group_size, bits, mode, global_scale, rounding, scale_layout, fp8_format,
                    torch_dtypes):
    """quantize with each torch result in a storage of its own: for the qq::quantize custom op
    (qq/_torch_ops.py), whose outputs torch.library requires not to alias one another."""
    return _quantize(x, group_size, bits, mode, global_scale, rounding, scale_layout, fp8_format,
                     torch_dtypes, None, False)


cdef object _quantize(x, group_size, bits, mode, global_scale, rounding, scale_layout, fp8_format,
                      torch_dtypes, stream, bint one_block):
    """quantize; one_block: a torch caller's results in one storage (_Call.empties)."""
    cdef str func = "quantize"
    cdef _View vx, vg, vd, vs, vb
    cdef qqQuantParams_t p
    cdef qqStatus_t st
    cdef DLTensor *tx
    cdef DLTensor *tg
    cdef DLTensor *td
    cdef DLTensor *ts
    cdef DLTensor *tb
    cdef void* s
    _quant_params(func, &p, mode, group_size, bits, rounding, scale_layout, fp8_format)
    cdef _Call call = _new_call(func, x, "x", stream)
    biases = None
    try:
        vx = call.view(x, "x")
        global_scale = call.scalar(global_scale, "global_scale")
        vg = call.view(global_scale, "global_scale")
        x_shape = vx.pyshape()
        data_shape, scales_shape = _quantized_shapes(func, &p, x_shape)
        # fp scales are E4M3 / UE8M0 bytes; affine scales and biases have x's dtype.
        data_dtype, scale_dtype = call.byte_dtypes(func, &p, torch_dtypes)
        if p.mode == QQ_MODE_AFFINE:
            scale_dtype = vx.float_dtype()
        vb = None
        # A torch caller's fp results share one storage (_Call.empties); affine's do not:
        # torch.save refuses tensors that view one storage as dtypes of different sizes (its
        # float scales and biases beside uint8 data), and torch.compile refuses in-place
        # changes to such views inside a compiled function. NumPy callers: one empty a result
        # (empties' tuples cost them ~0.1 us).
        if one_block and call.fw == "torch" and p.mode != QQ_MODE_AFFINE:
            (data, vd), (scales, vs) = call.empties(((data_shape, data_dtype, "data"),
                                                     (scales_shape, scale_dtype, "scales")))
        else:
            data, vd = call.empty(data_shape, data_dtype, "data")
            scales, vs = call.empty(scales_shape, scale_dtype, "scales")
            if p.mode == QQ_MODE_AFFINE:
                biases, vb = call.empty(scales_shape, scale_dtype, "biases")
        tx, tg, td, ts, tb = _t(vx), _t(vg), _t(vd), _t(vs), _t(vb)
        s = call.cstream()
        _gil = call.unlock()
        st = qqQuantize(NULL, tx, &p, tg, td, ts, tb, s)
        _relock(_gil)
        _check(st)
        call.finish()
    finally:
        call.release()
    return _new_quantized_array(call.result(data), call.result(scales), call.result(biases),
                                mode, &p, global_scale, rounding, scale_layout, fp8_format,
                                x_shape)


def quantize_colwise(x, group_size=None, bits=None, mode="affine", *, global_scale=None,
                     rounding="ceil", scale_layout="linear", fp8_format="e4m3", rowwise=False,
                     torch_dtypes=True, stream=None):
    """Quantize x [..., M, K] along its second-to-last axis (groups of rows of each column:
    the operand of a backward-pass GEMM) without materializing x^T.

    Returns the QuantizedArray of x^T [..., K, M] (exactly what quantize(x^T) gives).
    rowwise=True also quantizes x along its last axis in the same call and returns the
    pair (quantize(x), quantize_colwise(x)); docs/api.md says which GPU cases read x once.
    Parameters as in quantize().
    """
    cdef str func = "quantize_colwise"
    cdef _View vx, vg, vd, vs, vb, vrd, vrs, vrb
    cdef qqQuantParams_t p
    cdef qqStatus_t st
    cdef DLTensor *tx
    cdef DLTensor *tg
    cdef DLTensor *td
    cdef DLTensor *ts
    cdef DLTensor *tb
    cdef DLTensor *trd
    cdef DLTensor *trs
    cdef DLTensor *trb
    cdef void* s
    _quant_params(func, &p, mode, group_size, bits, rounding, scale_layout, fp8_format)
    rowwise = _flag(func, "rowwise", rowwise)
    cdef _Call call = _new_call(func, x, "x", stream)
    biases = rdata = rscales = rbiases = None
    try:
        vx = call.view(x, "x")
        global_scale = call.scalar(global_scale, "global_scale")
        vg = call.view(global_scale, "global_scale")
        xs = vx.pyshape()
        if len(xs) < 2:
            raise ValueError(f"{func}: argument 'x' has shape {xs}; expected [..., M, K]")
        t_shape = xs[:-2] + (xs[-1], xs[-2])
        data_shape, scales_shape = _quantized_shapes(func, &p, t_shape, "M")
        data_dtype, scale_dtype = call.byte_dtypes(func, &p, torch_dtypes)
        if p.mode == QQ_MODE_AFFINE:
            scale_dtype = vx.float_dtype()
        data, vd = call.empty(data_shape, data_dtype, "data_t")
        scales, vs = call.empty(scales_shape, scale_dtype, "scales_t")
        vb = vrd = vrs = vrb = None
        if p.mode == QQ_MODE_AFFINE:
            biases, vb = call.empty(scales_shape, scale_dtype, "biases_t")
        if rowwise:
            rdata_shape, rscales_shape = _quantized_shapes(func, &p, xs)
            rdata, vrd = call.empty(rdata_shape, data_dtype, "data")
            rscales, vrs = call.empty(rscales_shape, scale_dtype, "scales")
            if p.mode == QQ_MODE_AFFINE:
                rbiases, vrb = call.empty(rscales_shape, scale_dtype, "biases")
        tx, tg, td, ts, tb = _t(vx), _t(vg), _t(vd), _t(vs), _t(vb)
        trd, trs, trb = _t(vrd), _t(vrs), _t(vrb)
        s = call.cstream()
        _gil = call.unlock()
        st = qqQuantizeColwise(NULL, tx, &p, tg, td, ts, tb, trd, trs, trb, s)
        _relock(_gil)
        _check(st)
        call.finish()
    finally:
        call.release()
    col = _new_quantized_array(call.result(data), call.result(scales), call.result(biases),
                               mode, &p, global_scale, rounding, scale_layout, fp8_format,
                               t_shape)
    if not rowwise:
        return col
    row = _new_quantized_array(call.result(rdata), call.result(rscales), call.result(rbiases),
                               mode, &p, global_scale, rounding, scale_layout, fp8_format, xs)
    return row, col


def _swap_last_two(a):
    """A view of `a` with its last two axes swapped, in a's own framework."""
    if hasattr(a, "transpose") and type(a).__module__.split(".")[0] in ("numpy", "cupy"):
        return a.transpose(tuple(range(a.ndim - 2)) + (a.ndim - 1, a.ndim - 2))
    if type(a).__module__.split(".")[0] == "torch":
        return a.transpose(-2, -1)
    jnp = sys.modules.get("jax.numpy")
    if jnp is not None:
        return jnp.swapaxes(a, -2, -1)
    return a


def quantize_moe(w, scaling="32x1", *, rounding="ceil", scale_layout="linear", fp8_format="e4m3",
                 torch_dtypes=True, stream=None):
    """MXFP8 quantization of MoE expert weights w [E, D1, D2] along D1 (docs/api.md, quantize_moe).

    scaling "32x1": one scale per 32 consecutive D1 elements at each D2 index; "32x32": one
    per 32x32 tile, so one quantization serves the forward GEMM and the transposed backward
    GEMM. w may be row-major or the transposed view of an [E, D2, D1] tensor (stride 1 on
    dim 1). Returns (data, scales): data uint8 [E, D1, D2], column-major per expert (strides
    (D1*D2, 1, D1)); scales linear [E, D1/32, D2] (32x1) or [E, D1/32, D2/32] (32x32), or
    blocked [E, roundup(D2,128), roundup(D1/32,4)] (the 32x32 scale replicated on its rows).
    rounding "ceil" (default) or "floor"; fp8_format "e4m3" or "e5m2".
    """
    cdef str func = "quantize_moe"
    cdef _View vx, vd, vs
    cdef qqQuantParams_t p
    cdef qqStatus_t st
    cdef DLTensor *tx
    cdef DLTensor td
    cdef DLTensor *ts
    cdef int64_t dshape[3]
    cdef int64_t dstrides[3]
    cdef int64_t wshape[3]
    cdef int64_t sshape[3]
    cdef void* s
    cdef qqMoeScaling_t sc
    if scaling == "32x1":
        sc = QQ_MOE_32X1
    elif scaling == "32x32":
        sc = QQ_MOE_32X32
    else:
        raise ValueError(f"{func}: scaling={scaling!r} is not supported; expected '32x1' or '32x32'")
    _quant_params(func, &p, "mxfp8", None, None, rounding, scale_layout, fp8_format)
    cdef _Call call = _new_call(func, w, "w", stream)
    try:
        vx = call.view(w, "w")
        ws = vx.pyshape()
        if len(ws) != 3:
            raise ValueError(f"{func}: argument 'w' has shape {ws}; expected [E, D1, D2]")
        E, D1, D2 = ws
        wshape[0], wshape[1], wshape[2] = E, D1, D2
        _check(qqQuantizeMoeShapes(&p, sc, wshape, sshape))     # checks D1, D2 too
        # data is written column-major per expert: allocate [E, D2, D1] and hand libqq
        # the [E, D1, D2] view of it with strides (D1*D2, 1, D1).
        data_dtype, scale_dtype = call.byte_dtypes(func, &p, torch_dtypes)
        data_t, vd = call.empty((E, D2, D1), data_dtype, "data")
        scales, vs = call.empty((sshape[0], sshape[1], sshape[2]), scale_dtype, "scales")
        td = vd.tensor
        dshape[0], dshape[1], dshape[2] = E, D1, D2
        dstrides[0], dstrides[1], dstrides[2] = D1 * D2, 1, D1
        td.shape = dshape
        td.strides = dstrides
        tx, ts = _t(vx), _t(vs)
        s = call.cstream()
        _gil = call.unlock()
        st = qqQuantizeMoe(NULL, tx, &p, sc, &td, ts, s)
        _relock(_gil)
        _check(st)
        call.finish()
    finally:
        call.release()
    return _swap_last_two(call.result(data_t)), call.result(scales)


cpdef tuple _unpack_weight(func, w, scales, biases, global_scale, mode, group_size, bits,
                          scale_layout, fp8_format):
    """The packed weight `w` of dequantize / quantized_matmul and its parameters, taken
    from a QuantizedArray when `w` is one (explicit arguments must agree with it), else as
    given. Returns (w, scales, biases, global_scale, mode, group_size, bits, scale_layout,
    fp8_format, logical_shape or None). cpdef: a C call from the ops here (a Python call
    cost dequantize and quantized_matmul ~0.1 us each), a Python one for qq._jax_ffi."""
    if not isinstance(w, QuantizedArray):
        return (w, scales, biases, global_scale, mode, group_size, bits, scale_layout,
                fp8_format, None)
    qa = w
    if _qa_slots_known and type(qa) is QuantizedArray:
        # the slots read directly (ten getattr calls were ~10 % of a small dequantize)
        data, qs, qb, qg = _qa_get(qa, 0), _qa_get(qa, 1), _qa_get(qa, 2), _qa_get(qa, 6)
        qm, qgs, qbits = _qa_get(qa, 3), _qa_get(qa, 4), _qa_get(qa, 5)
        qsl, qf, qshape = _qa_get(qa, 8), _qa_get(qa, 9), _qa_get(qa, 10)
    else:
        data, qs, qb, qg = qa.data, qa.scales, qa.biases, qa.global_scale
        qm, qgs, qbits = qa.mode, qa.group_size, qa.bits
        qsl, qf, qshape = qa.scale_layout, qa.fp8_format, qa.shape
    return (data,
            _take_array(func, "scales", scales, qs, "w", "scales"),
            _take_array(func, "biases", biases, qb, "w", "biases"),
            _take_array(func, "global_scale", global_scale, qg, "w", "global_scale"),
            _take(func, "mode", mode, "affine", qm, "w"),
            _take(func, "group_size", group_size, None, qgs, "w"),
            _take(func, "bits", bits, None, qbits, "w"),
            _take(func, "scale_layout", scale_layout, "linear", qsl, "w"),
            _take(func, "fp8_format", fp8_format, "e4m3", qf, "w"),
            qshape)


def quantize_dequantize(x, mode="mxfp8", *, global_scale=None, rowwise=True, colwise=False,
                        rounding="ceil", fp8_format="e4m3", stream=None):
    """q(x)'s values in bfloat16 from one pass over x [M, K] (fp modes): what the exact
    path's GEMM reads, and the prepared operands of qqmm(x_prepared=True, w_prepared=True).

    rowwise: x quantized along K (quantize's blocks); colwise: along M (quantize_colwise's
    blocks, a ragged last block counting its missing rows as zeros), returned in x's own
    orientation [M, K]. Both: the pair (rowwise, colwise), from one read of x on the GPU.
    The values leave out nvfp4's global scale (global_scale still sets the scales), as
    prepared operands do: qqmm applies it as alpha. See docs/api.md.
    """
    cdef str func = "quantize_dequantize"
    cdef _View vx, vg, vr, vc
    cdef qqQuantParams_t p
    cdef qqStatus_t st
    cdef DLTensor *tx
    cdef DLTensor *tg
    cdef DLTensor *tr
    cdef DLTensor *tc
    cdef void* s
    rowwise, colwise = _flag(func, "rowwise", rowwise), _flag(func, "colwise", colwise)
    if not rowwise and not colwise:
        raise ValueError(f"{func}: rowwise and colwise are both False; ask for at least one")
    if mode == "affine":
        raise ValueError(f"{func}: mode 'affine' is not supported; it takes the fp modes "
                         f"nvfp4, mxfp4 and mxfp8 (qqmm's operands)")
    _quant_params(func, &p, mode, None, None, rounding, "linear", fp8_format)
    cdef _Call call = _new_call(func, x, "x", stream)
    rows = cols = None
    try:
        vx = call.view(x, "x")
        global_scale = call.scalar(global_scale, "global_scale")
        vg = call.view(global_scale, "global_scale")
        xs = vx.pyshape()
        if len(xs) != 2:
            raise ValueError(f"{func}: argument 'x' has shape {xs}; expected [M, K]")
        vr = vc = None
        if rowwise:
            rows, vr = call.empty_bf16(xs, "rows", "qqQuantizeDequantize")
        if colwise:
            cols, vc = call.empty_bf16(xs, "cols", "qqQuantizeDequantize")
        tx, tg, tr, tc = _t(vx), _t(vg), _t(vr), _t(vc)
        s = call.cstream()
        _gil = call.unlock()
        st = qqQuantizeDequantize(NULL, tx, &p, tg, tr, tc, s)
        _relock(_gil)
        _check(st)
        call.finish()
    finally:
        call.release()
    if rowwise and colwise:
        return call.result(rows), call.result(cols)
    return call.result(rows if rowwise else cols)


def quantize_dequantize_moe(w, *, values=True, transposed=False, rounding="ceil",
                            fp8_format="e4m3", stream=None):
    """MXFP8 with one scale per 32x32 tile (quantize_moe's "32x32" rule) of w [E, D1, D2] or
    [D1, D2], returned as q(w)'s bfloat16 values: `values` in w's shape, `transposed`
    [E, D2, D1] - the same values transposed, which the tiles make the other GEMM
    direction's operand. Both: the pair, from one read of w on the GPU. See docs/api.md.
    """
    cdef str func = "quantize_dequantize_moe"
    cdef _View vw, vo, vt
    cdef qqQuantParams_t p
    cdef qqStatus_t st
    cdef DLTensor *tw
    cdef DLTensor *to
    cdef DLTensor *tt
    cdef void* s
    values, transposed = _flag(func, "values", values), _flag(func, "transposed", transposed)
    if not values and not transposed:
        raise ValueError(f"{func}: values and transposed are both False; ask for at least one")
    _quant_params(func, &p, "mxfp8", None, None, rounding, "linear", fp8_format)
    cdef _Call call = _new_call(func, w, "w", stream)
    o = t = None
    try:
        vw = call.view(w, "w")
        ws = vw.pyshape()
        if len(ws) not in (2, 3):
            raise ValueError(f"{func}: argument 'w' has shape {ws}; expected [E, D1, D2] or [D1, D2]")
        vo = vt = None
        if values:
            o, vo = call.empty_bf16(ws, "values", "qqQuantizeDequantizeMoe")
        if transposed:
            t, vt = call.empty_bf16(ws[:-2] + (ws[-1], ws[-2]), "transposed", "qqQuantizeDequantizeMoe")
        tw, to, tt = _t(vw), _t(vo), _t(vt)
        s = call.cstream()
        _gil = call.unlock()
        st = qqQuantizeDequantizeMoe(NULL, tw, &p, to, tt, s)
        _relock(_gil)
        _check(st)
        call.finish()
    finally:
        call.release()
    if values and transposed:
        return call.result(o), call.result(t)
    return call.result(o if values else t)


def dequantize(w, scales=None, biases=None, group_size=None, bits=None, mode="affine", *,
               global_scale=None, scale_layout="linear", fp8_format="e4m3", dtype=None,
               out=None, stream=None):
    """Dequantize packed w [..., K*bits/8] (or a QuantizedArray) to [..., K].

    dtype: "bfloat16" (default), "float16" or "float32", or a NumPy / framework dtype.
    out: a writable, compact array of the result's shape and dtype (returned).
    """
    cdef str func = "dequantize"
    cdef _View vw, vs, vb, vg, vo
    cdef qqQuantParams_t p
    cdef qqStatus_t st
    cdef DLTensor *tw
    cdef DLTensor *ts
    cdef DLTensor *tb
    cdef DLTensor *tg
    cdef DLTensor *to
    cdef void* s
    cdef bint from_qa = isinstance(w, QuantizedArray)
    (w, scales, biases, global_scale, mode, group_size, bits, scale_layout, fp8_format,
     logical_shape) = _unpack_weight(func, w, scales, biases, global_scale, mode, group_size,
                                bits, scale_layout, fp8_format)
    _quant_params(func, &p, mode, group_size, bits, "ceil", scale_layout, fp8_format)
    out_dtype = _dtype_arg(func, dtype)
    cdef _Call call = _new_call(func, w, "w", stream)
    result = None
    try:
        vw = call.view(w, "w")
        vs = call.view(scales, "scales")
        vb = call.view(biases, "biases")
        vg = call.view(call.scalar(global_scale, "global_scale"), "global_scale")
        if out is None:
            if logical_shape is None:
                w_shape = vw.pyshape()
                logical_shape = w_shape[:-1] + (_unpacked_last(func, "w", &p, w_shape),)
            result, vo = call.empty(tuple(logical_shape), out_dtype or "bfloat16", "out")
        else:
            vo = _out_view(call, out, out_dtype)
        tw, ts, tb, tg, to = _t(vw), _t(vs), _t(vb), _t(vg), _t(vo)
        s = call.cstream()
        _gil = call.unlock()
        st = qqDequantize(NULL, tw, ts, tb, &p, tg, to, s)
        _relock(_gil)
        if st != QQ_STATUS_SUCCESS and out is None and from_qa:
            # a QuantizedArray's stale shape (the result was sized from it) said as such;
            # libqq's own message is read first (the shape check calls libqq, which clears it)
            msg = _last_message(st)
            _check_qa_shape(func, &p, logical_shape, vw.pyshape())
            _raise(st, msg)
        _check(st)
        call.finish()
    finally:
        call.release()
    return out if out is not None else call.result(result)
