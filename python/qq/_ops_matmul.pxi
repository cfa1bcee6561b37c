# _ops_matmul.pxi - included by _qq.pyx (one extension module, one file per job).
# Operations: qqmm, grouped_qqmm, grouped_qqmm_wgrad, quantized_matmul.

def qqmm(x, w, scales=None, group_size=None, bits=None, mode="nvfp4", *,
         global_scale_x=None, global_scale_w=None, x_scales=None, bias=None, c=None, beta=1.0,
         rounding="ceil", scale_layout="linear", fp8_format="e4m3", dtype=None, out=None,
         stream=None, route="auto", x_prepared=False, w_prepared=False):
    """y = alpha * q(x) @ q(w).T (+ bias) (+ beta * c), both operands quantized (nvfp4,
    mxfp4, mxfp8). c: an array of y's shape (float, on x's device; may be `out` itself, to
    accumulate in place); the product is formed in fp32 and y = product + beta * c rounded
    once to y's dtype (torch.addmm's beta; cuBLASLt's C).

    x: float [..., M, K] (quantized on the fly with `rounding`), a QuantizedArray, or
    packed uint8 with x_scales (in scale_layout). w: float [N, K], a QuantizedArray, or
    packed [N, K*bits/8] with scales in scale_layout. nvfp4 global scales give
    alpha = global_scale_x * global_scale_w / 2688**2. dtype default: x's dtype for a
    float x, else bfloat16. Affine mode: use quantized_matmul.

    x_prepared / w_prepared: x / w already holds q's values (float, without nvfp4's global
    scale: qq.quantize_dequantize's form), used as is - the exact route, one bf16 GEMM.
    A prepared operand may be a transposed 2-D view (t.T): the GEMM reads it transposed.

    route: "auto" (libqq picks, falling back where a faster path refuses), or one of
    "cpu", "exact", "blockscaled", "qmma", "qmv" to insist on that route: a call it does
    not cover raises NotSupportedError saying why (docs/api.md, "Dispatch"). The route a
    call took: qq.last_route().
    """
    if (_fast_on and scales is None and group_size is None and bits is None and mode == "nvfp4"
            and global_scale_x is None and global_scale_w is None and x_scales is None and bias is None
            and c is None and rounding == "ceil" and scale_layout == "linear" and fp8_format == "e4m3"
            and dtype is None and out is None and stream is None and route == "auto"
            and x_prepared is False and w_prepared is False):
        try:
            r = _matmul_fast("qqmm", x, w, True)
        except Exception:   # (the general path raises it, in its own words and order)
            r = None
        if r is not None:
            return r
    _route_pending()
    cdef str func = "qqmm"
    cdef _View vx, vxs, vw, vws, vgx, vgw, vbias, vo, vc
    cdef qqQqmmParams_t qp
    cdef qqStatus_t st
    cdef DLTensor *tx
    cdef DLTensor *txs
    cdef DLTensor *tw
    cdef DLTensor *tws
    cdef DLTensor *tgx
    cdef DLTensor *tgw
    cdef DLTensor *tbias
    cdef DLTensor *to
    cdef void* s
    cdef _View vwv
    if w is None:
        raise TypeError(f"{func}: w: expected a float array, a QuantizedArray, a PreparedWeight "
                        f"or packed uint8 data; got None")
    _enum(func, "scale_layout", scale_layout, _LAYOUTS)     # checked even where a QuantizedArray decides
    w_values = None
    if isinstance(w, PreparedWeight):
        # Both forms go to libqq, which picks per call (the packed w for the weight-only
        # routes at small M, the values for the GEMM: qqQqmmParams_t.w_values).
        w_values = w.values if len(w.shape) == 2 else None     # [E, N, K]: grouped_qqmm's
        w = w.quantized
    x_layout = scale_layout
    w_layout = scale_layout
    x_is_q = isinstance(x, QuantizedArray)
    w_is_q = isinstance(w, QuantizedArray)
    if x_is_q and w_is_q:
        for field in ("mode", "group_size", "bits", "fp8_format"):
            if getattr(x, field) != getattr(w, field):
                raise ValueError(f"{func}: x.{field}={getattr(x, field)!r} and "
                                 f"w.{field}={getattr(w, field)!r} differ; both operands "
                                 f"must be quantized alike")
    if w_is_q:
        qa = w
        scales = _take_array(func, "scales", scales, qa.scales, "w", "scales")
        global_scale_w = _take_array(func, "global_scale_w", global_scale_w, qa.global_scale,
                                     "w", "global_scale")
        mode_ = _take(func, "mode", mode, "nvfp4", qa.mode, "w")
        group_size_ = _take(func, "group_size", group_size, None, qa.group_size, "w")
        bits_ = _take(func, "bits", bits, None, qa.bits, "w")
        fp8_format_ = _take(func, "fp8_format", fp8_format, "e4m3", qa.fp8_format, "w")
        w_layout = _take(func, "scale_layout", scale_layout, "linear", qa.scale_layout, "w")
        w = qa.data
    if x_is_q:
        qa = x
        x_scales = _take_array(func, "x_scales", x_scales, qa.scales, "x", "scales")
        global_scale_x = _take_array(func, "global_scale_x", global_scale_x, qa.global_scale,
                                     "x", "global_scale")
        mode_ = _take(func, "mode", mode, "nvfp4", qa.mode, "x")
        group_size_ = _take(func, "group_size", group_size, None, qa.group_size, "x")
        bits_ = _take(func, "bits", bits, None, qa.bits, "x")
        fp8_format_ = _take(func, "fp8_format", fp8_format, "e4m3", qa.fp8_format, "x")
        x_layout = qa.scale_layout      # x's own; scale_layout describes w's scales
        x = qa.data
    if x_is_q or w_is_q:
        mode, group_size, bits, fp8_format = mode_, group_size_, bits_, fp8_format_
    if mode == "affine":
        raise ValueError(f"{func}: mode 'affine' has no quantized-activation GEMM; use "
                         f"qq.quantized_matmul (weight-only) for affine weights")
    cdef qqMode_t cmode = <qqMode_t>_enum(func, "mode", mode, _MODES)
    st = qqQqmmParamsInit(&qp, cmode)
    _check(st)
    _quant_params(func, &qp.quant, mode, group_size, bits, rounding, "linear", fp8_format)
    qp.x_scale_layout = <qqScaleLayout_t>_enum(func, "scale_layout", x_layout, _LAYOUTS)
    qp.w_scale_layout = <qqScaleLayout_t>_enum(func, "scale_layout", w_layout, _LAYOUTS)
    qp.route = <qqRoute_t>_enum(func, "route", route, _ROUTES)
    qp.x_prepared = 1 if x_prepared else 0
    if w_prepared:
        if w_is_q or w_values is not None:
            raise ValueError(f"{func}: w_prepared=True takes a float w of q(w)'s values; got a "
                             f"{'PreparedWeight' if w_values is not None else 'QuantizedArray'}, "
                             f"which qqmm reads as it is: drop w_prepared")
        qp.w_prepared = 1
    out_dtype = _dtype_arg(func, dtype)
    cdef _Call call = _new_call(func, x, "x", stream)
    result = None
    try:
        vx = call.view(x, "x")
        vxs = call.view(x_scales, "x_scales")
        vw = call.need(w, "w")
        vws = call.view(scales, "scales")
        vgx = call.view(call.scalar(global_scale_x, "global_scale_x"), "global_scale_x")
        vgw = call.view(call.scalar(global_scale_w, "global_scale_w"), "global_scale_w")
        vbias = call.view(bias, "bias")
        vc = call.view(c, "c")
        qp.c = _t(vc)
        vwv = call.view(w_values, "w_values")
        qp.w_values = _t(vwv)
        try:
            if isinstance(beta, (str, bytes, bytearray)):    # float() would parse "2"
                raise TypeError
            qp.beta = float(beta) if c is not None else 0.0
        except (TypeError, ValueError):
            raise TypeError(f"{func}: beta: expected a real number, got "
                            f"{type(beta).__name__} {beta!r}") from None
        if out is None:
            if out_dtype is None:
                x_dt = vx.dtype_name()
                out_dtype = x_dt if (not x_is_q and x_dt in _FLOAT_DTYPES) else "bfloat16"
            w_shape = vw.pyshape()
            n = w_shape[-2] if len(w_shape) >= 2 else 0
            result, vo = call.empty(_matmul_shape(func, vx.pyshape(), w_shape, n), out_dtype, "out")
        else:
            vo = _out_view(call, out, out_dtype)
        tx, txs, tw, tws = _t(vx), _t(vxs), _t(vw), _t(vws)
        tgx, tgw, tbias, to = _t(vgx), _t(vgw), _t(vbias), _t(vo)
        s = call.cstream()
        call.matmul_work(vx, vo)
        _gil = call.unlock()
        st = qqQqmm(NULL, tx, txs, tw, tws, &qp, tgx, tgw, tbias, to, s)
        _relock(_gil)
        _route_recorded()
        _check(st)
        call.finish()
    finally:
        call.release()
    return out if out is not None else call.result(result)


def grouped_qqmm(x, w, offsets, scales=None, group_size=None, bits=None, mode="mxfp8", *,
                 global_scale_x=None, global_scale_w=None, x_scales=None, rounding="ceil",
                 scale_layout="linear", fp8_format="e4m3", moe_scaling=None, dtype=None, out=None,
                 stream=None, w_prepared=False):
    """Grouped qqmm for mixture-of-experts layers: tokens x [T, K] sorted by expert,
    offsets int32 [E] (cumulative group ends, last = T; empty groups are legal), weights
    w [E, N, K] -> y [T, N] with y[rows of e] = alpha_e * q(x rows) @ q(w[e]).T.

    w: float [E, N, K] (quantized on the fly), a QuantizedArray of [E, N, K] (qq.quantize,
    linear or blocked scales), packed [E, N, K*bits/8] with `scales`, or - with
    moe_scaling="32x1" / "32x32" - the (data, scales) of qq.quantize_moe on the [E, K, N]
    weight (D1 = K, the contracted axis; scale_layout="blocked" required). x: float [T, K], a
    QuantizedArray or packed [T, K*bits/8] with linear x_scales; or a PreparedWeight of
    [E, N, K] (qq.prepare_weight: q(w)'s bf16 values, no dequantization per call). nvfp4:
    global_scale_x is a scalar, global_scale_w float32 [E] (or one for all experts).
    w_prepared=True: a float w [E, N, K] of q(w)'s values (qq.quantize_dequantize_moe), used as
    it is.

    On Hopper (built with CUTLASS's headers), and on Blackwell for nvfp4 / mxfp8 where
    cuBLASLt's grouped block-scaled GEMM takes the call, every expert runs in one grouped GEMM
    whose group sizes are read on the device: no host synchronization, capturable in a CUDA
    graph; offsets that are not non-decreasing ends within [0, T] ending at T give a
    result of NaN there. Elsewhere the offsets are read on the host (one wait on the
    stream, a ValueError for bad ones) and each expert runs as a qqmm (docs/api.md).
    """
    _route_pending()
    cdef str func = "grouped_qqmm"
    cdef _View vx, vxs, voff, vw, vws, vgx, vgw, vo
    cdef qqQqmmParams_t qp
    cdef qqStatus_t st
    cdef DLTensor *tx
    cdef DLTensor *txs
    cdef DLTensor *toff
    cdef DLTensor *tw
    cdef DLTensor *tws
    cdef DLTensor *tgx
    cdef DLTensor *tgw
    cdef DLTensor *to
    cdef void* s
    x_layout = "linear"
    w_layout = scale_layout
    cdef bint w_values = bool(w_prepared)
    if w_values and (isinstance(w, (PreparedWeight, QuantizedArray, tuple)) or moe_scaling is not None):
        raise ValueError(f"{func}: w_prepared=True takes a float w [E, N, K] of q(w)'s values; got "
                         f"{type(w).__name__}{' with moe_scaling' if moe_scaling is not None else ''}: "
                         f"drop w_prepared")
    if isinstance(w, PreparedWeight):
        # q(w)'s bf16 values where the device multiplies them (no dequantization per call),
        # else the QuantizedArray (Blackwell's block-scaled GEMMs take the packed form).
        pw = w
        if pw.values is not None:
            mode = _take(func, "mode", mode, "mxfp8", pw.mode, "w")
            if pw.quantized is not None:    # (None: rebuilt around the values by qq's torch op)
                fp8_format = _take(func, "fp8_format", fp8_format, "e4m3", pw.quantized.fp8_format, "w")
            global_scale_w = _take_array(func, "global_scale_w", global_scale_w, pw.global_scale,
                                         "w", "global_scale")
            w = pw.values
            w_values = True
        else:
            w = pw.quantized
    if moe_scaling is not None:
        if moe_scaling not in ("32x1", "32x32"):
            raise ValueError(f"{func}: moe_scaling must be None, '32x1' or '32x32'; got {moe_scaling!r}")
        if scale_layout != "blocked":
            raise ValueError(f"{func}: scale_layout: quantize_moe weights are taken with their blocked "
                             f"scales (qq.quantize_moe(..., scale_layout='blocked')); got {scale_layout!r}")
        if isinstance(w, tuple):
            w, scales = w
        w = _swap_last_two(w)   # [E, D1=K, D2=N] column-major per expert = [E, N, K] row-major
        mode = _take(func, "mode", mode, "mxfp8", "mxfp8", "w")   # (quantize_moe's codes are mxfp8)
    if isinstance(w, QuantizedArray):
        qa = w
        scales = _take_array(func, "scales", scales, qa.scales, "w", "scales")
        global_scale_w = _take_array(func, "global_scale_w", global_scale_w, qa.global_scale,
                                     "w", "global_scale")
        mode = _take(func, "mode", mode, "mxfp8", qa.mode, "w")
        group_size = _take(func, "group_size", group_size, None, qa.group_size, "w")
        bits = _take(func, "bits", bits, None, qa.bits, "w")
        fp8_format = _take(func, "fp8_format", fp8_format, "e4m3", qa.fp8_format, "w")
        w_layout = _take(func, "scale_layout", scale_layout, "linear", qa.scale_layout, "w")
        w = qa.data
    x_is_q = isinstance(x, QuantizedArray)
    if x_is_q:
        qa = x
        x_scales = _take_array(func, "x_scales", x_scales, qa.scales, "x", "scales")
        global_scale_x = _take_array(func, "global_scale_x", global_scale_x, qa.global_scale,
                                     "x", "global_scale")
        x_layout = qa.scale_layout
        x = qa.data
    if mode == "affine":
        raise ValueError(f"{func}: mode 'affine' has no quantized-activation GEMM; use nvfp4, "
                         f"mxfp4 or mxfp8")
    cdef qqMode_t cmode = <qqMode_t>_enum(func, "mode", mode, _MODES)
    st = qqQqmmParamsInit(&qp, cmode)
    _check(st)
    _quant_params(func, &qp.quant, mode, group_size, bits, rounding, "linear", fp8_format)
    qp.x_scale_layout = <qqScaleLayout_t>_enum(func, "scale_layout", x_layout, _LAYOUTS)
    qp.w_scale_layout = <qqScaleLayout_t>_enum(func, "scale_layout", w_layout, _LAYOUTS)
    qp.w_prepared = 1 if w_values else 0
    out_dtype = _dtype_arg(func, dtype)
    cdef _Call call = _new_call(func, x, "x", stream)
    result = None
    try:
        vx = call.view(x, "x")
        vxs = call.view(x_scales, "x_scales")
        voff = call.need(offsets, "offsets")
        vw = call.need(w, "w")
        vws = call.view(scales, "scales")
        vgx = call.view(call.scalar(global_scale_x, "global_scale_x"), "global_scale_x")
        vgw = call.view(call.scalar(global_scale_w, "global_scale_w"), "global_scale_w")
        if out is None:
            if out_dtype is None:
                x_dt = vx.dtype_name()
                out_dtype = x_dt if (not x_is_q and x_dt in _FLOAT_DTYPES) else "bfloat16"
            x_shape, w_shape = vx.pyshape(), vw.pyshape()
            if len(x_shape) != 2 or len(w_shape) != 3:
                raise ValueError(f"{func}: x must be [T, K] and w [E, N, K]; got x {tuple(x_shape)}, "
                                 f"w {tuple(w_shape)}")
            result, vo = call.empty((x_shape[0], w_shape[1]), out_dtype, "out")
        else:
            vo = _out_view(call, out, out_dtype)
        tx, txs, toff, tw, tws = _t(vx), _t(vxs), _t(voff), _t(vw), _t(vws)
        tgx, tgw, to = _t(vgx), _t(vgw), _t(vo)
        s = call.cstream()
        call.matmul_work(vx, vo)
        _gil = call.unlock()
        st = qqGroupedQqmm(NULL, tx, txs, toff, tw, tws, &qp, tgx, tgw, to, s)
        _relock(_gil)
        _route_recorded()
        _check(st)
        call.finish()
    finally:
        call.release()
    return out if out is not None else call.result(result)


def grouped_qqmm_wgrad(x, dy, offsets, mode="mxfp8", *, global_scale_x=None, global_scale_dy=None,
                       rounding="ceil", fp8_format="e4m3", dtype="float32", stream=None):
    """Weight gradient of grouped_qqmm: tokens x [T, K] and output gradients dy [T, N], both
    sorted by expert, int32 offsets [E] (cumulative group ends, last = T; empty groups
    legal) -> dw [E, K, N] with dw[e] = q(x[rows of e])^T @ q(dy[rows of e]), fp32
    accumulation, both quantized along T in blocks that start at each expert's first token
    (mxfp8 / mxfp4 blocks of 32, nvfp4 of 16 with the per-tensor global scales given; the
    last block of a ragged group zero-padded, which is exact). An empty group gives
    dw[e] = 0. dtype: "float32" (default), "bfloat16" or "float16".

    The offsets are read as grouped_qqmm reads them: on the device on Hopper and, for nvfp4 /
    mxfp8 where cuBLASLt's grouped block-scaled GEMM takes the call, on Blackwell (one grouped
    GEMM; capturable; bad offsets give NaN), on the host elsewhere (ValueError for bad
    ones). One expert reads its end on the device on every GPU. C: qqGroupedQqmmWgrad.
    """
    _route_pending()
    cdef str func = "grouped_qqmm_wgrad"
    cdef _View vx, vdy, voff, vgx, vgd, vo
    cdef qqQuantParams_t p
    cdef qqStatus_t st
    cdef DLTensor *tx
    cdef DLTensor *tdy
    cdef DLTensor *toff
    cdef DLTensor *tgx
    cdef DLTensor *tgd
    cdef DLTensor *to
    cdef void* s
    if mode == "affine":
        raise ValueError(f"{func}: mode 'affine' has no quantized-activation GEMM; use nvfp4, "
                         f"mxfp4 or mxfp8")
    _quant_params(func, &p, mode, None, None, rounding, "linear", fp8_format)
    # (the same rule, and TypeError, as every other dtype= and this op's torch.compile form)
    dtype = _dtype_arg(func, dtype) or "float32"
    cdef _Call call = _new_call(func, x, "x", stream)
    result = None
    try:
        vx = call.view(x, "x")
        vdy = call.need(dy, "dy")
        voff = call.need(offsets, "offsets")
        vgx = call.view(call.scalar(global_scale_x, "global_scale_x"), "global_scale_x")
        vgd = call.view(call.scalar(global_scale_dy, "global_scale_dy"), "global_scale_dy")
        xs, ds, os_ = vx.pyshape(), vdy.pyshape(), voff.pyshape()
        if len(xs) != 2 or len(ds) != 2 or len(os_) != 1:
            raise ValueError(f"{func}: x must be [T, K], dy [T, N] and offsets [E]; got x {tuple(xs)}, "
                             f"dy {tuple(ds)}, offsets {tuple(os_)}")
        result, vo = call.empty((os_[0], xs[1], ds[1]), dtype, "out")
        tx, tdy, toff, tgx, tgd, to = _t(vx), _t(vdy), _t(voff), _t(vgx), _t(vgd), _t(vo)
        s = call.cstream()
        call.matmul_work(vdy, vo)    # (an overestimate: out [E, K, N] times N)
        _gil = call.unlock()
        st = qqGroupedQqmmWgrad(NULL, tx, tdy, toff, &p, tgx, tgd, to, s)
        _relock(_gil)
        _route_recorded()
        _check(st)
        call.finish()
    finally:
        call.release()
    return call.result(result)


def quantized_matmul(x, w, scales=None, biases=None, transpose=True, group_size=None,
                     bits=None, mode="affine", *, global_scale=None, bias=None,
                     scale_layout="linear", fp8_format="e4m3", dtype=None, out=None,
                     stream=None):
    """Weight-only matmul: x @ W.T (transpose=True, w packed [..., N, K*bits/8]) or x @ W
    (transpose=False, w packed [..., K, N*bits/8], groups along N as in MLX), with
    W = dequantize(w, ...). x is float [..., M, K]; batch axes broadcast; bias [N] is
    added; fp32 accumulation. dtype default: x's dtype.
    """
    if (_fast_on and scales is None and biases is None and transpose is True and group_size is None
            and bits is None and mode == "affine" and global_scale is None and bias is None
            and scale_layout == "linear" and fp8_format == "e4m3" and dtype is None and out is None
            and stream is None):
        try:
            r = _matmul_fast("quantized_matmul", x, w, False)
        except Exception:   # (the general path raises it, in its own words and order)
            r = None
        if r is not None:
            return r
    _route_pending()
    cdef str func = "quantized_matmul"
    if isinstance(w, DecodeWeight):
        return _decode_matmul(func, x, w, scales, biases, transpose, group_size, bits, mode,
                              global_scale, bias, scale_layout, fp8_format, dtype, out, stream)
    cdef _View vx, vw, vs, vb, vg, vbias, vo
    cdef qqQuantParams_t p
    cdef qqStatus_t st
    cdef DLTensor *tx
    cdef DLTensor *tw
    cdef DLTensor *ts
    cdef DLTensor *tb
    cdef DLTensor *tg
    cdef DLTensor *tbias
    cdef DLTensor *to
    cdef void* s
    cdef int ctranspose = 1 if transpose else 0
    (w, scales, biases, global_scale, mode, group_size, bits, scale_layout, fp8_format,
     w_logical) = _unpack_weight(func, w, scales, biases, global_scale, mode, group_size,
                                bits, scale_layout, fp8_format)
    _quant_params(func, &p, mode, group_size, bits, "ceil", scale_layout, fp8_format)
    out_dtype = _dtype_arg(func, dtype)
    cdef _Call call = _new_call(func, x, "x", stream)
    result = None
    try:
        vx = call.view(x, "x")
        vw = call.need(w, "w")
        vs = call.view(scales, "scales")
        vb = call.view(biases, "biases")
        vg = call.view(call.scalar(global_scale, "global_scale"), "global_scale")
        vbias = call.view(bias, "bias")
        if out is None:
            w_shape = vw.pyshape()
            n = _weight_n(func, &p, ctranspose, w_shape, w_logical)
            result, vo = call.empty(_matmul_shape(func, vx.pyshape(), w_shape, n),
                                    out_dtype or vx.float_dtype(), "out")
        else:
            vo = _out_view(call, out, out_dtype)
        tx, tw, ts, tb = _t(vx), _t(vw), _t(vs), _t(vb)
        tg, tbias, to = _t(vg), _t(vbias), _t(vo)
        s = call.cstream()
        call.matmul_work(vx, vo)
        _gil = call.unlock()
        st = qqQuantizedMatmul(NULL, tx, tw, ts, tb, &p, ctranspose, tg, tbias, to, s)
        _relock(_gil)
        _route_recorded()
        _check(st)
        call.finish()
    finally:
        call.release()
    return out if out is not None else call.result(result)


def prepare_decode(w, stream=None, *, gated=False):
    """A QuantizedArray [N, K] or experts [E, N, K] (K a multiple of 256) of mode nvfp4,
    mxfp4, mxfp8 (E4M3), affine 4-bit (group_size 64 or 128) or affine 8-bit, rearranged
    into the decode layout (a DecodeWeight): qq.quantized_matmul(x, dw) then reads it at
    close to copy bandwidth for bfloat16 x of at most 64 rows on compute capability 9.0+
    GPUs (gather_qmm: 16 rows per entry), and uses the packed weight it keeps otherwise. Raises NotSupportedError when
    the weight cannot be encoded (a NaN scale or mxfp8 element; an mx scale outside its
    window over non-zero codes: mxfp4 2^-20 .. 2^10, mxfp8 2^-108 .. 2^16; an affine
    scale or bias that is not exactly a bfloat16 value): keep the packed weight then. On
    the GPU this waits for the stream once. See docs/formats.md (Decode layout).

    gated=True: w is a gate/up weight [2F, K] (the gate's F rows, then the up
    projection's; F a multiple of 32), stored so that qq.quantized_matmul_swiglu(x, dw)
    makes silu(gate) * up in the matmul's own kernel (docs/formats.md, "Gated decode
    layout"); qq.quantized_matmul(x, dw) still returns the [..., 2F] product.
    """
    cdef str func = "prepare_decode"
    cdef _View vw, vs, vb, vo
    cdef qqQuantParams_t p
    cdef qqStatus_t st
    cdef DLTensor *tw
    cdef DLTensor *ts
    cdef DLTensor *tb
    cdef DLTensor *to
    cdef void* s
    cdef int64_t nbytes = 0
    if not isinstance(w, QuantizedArray):
        raise TypeError(f"{func}: w: expected a QuantizedArray (qq.quantize(w, mode='nvfp4', "
                        f"'mxfp4', 'mxfp8' or 'affine')); got {type(w).__name__}")
    if len(w.shape) not in (2, 3):
        raise ValueError(f"{func}: w must be a weight [N, K] or experts [E, N, K]; got shape "
                         f"{tuple(w.shape)}")
    n, k = int(w.shape[-2]), int(w.shape[-1])
    cdef bint cgated = _flag(func, "gated", gated)
    _quant_params(func, &p, w.mode, w.group_size, w.bits, "ceil", w.scale_layout, w.fp8_format)
    _check_qa_shape(func, &p, w.shape, w.data.shape)    # (the layout's size comes from w.shape)
    # libqq decides which modes and K the layout holds (ValueError otherwise)
    _check_as(qqDecodeLayoutSize(&p, n, k, &nbytes), "decode_layout_size", func)
    cdef _Call call = _new_call(func, w.data, "w", stream)
    result = None
    try:
        vw = call.view(w.data, "w")
        vs = call.view(w.scales, "scales")
        vb = call.view(w.biases, "biases")
        result, vo = call.empty((nbytes,) if len(w.shape) == 2 else (int(w.shape[0]), nbytes),
                                "uint8", "out")
        tw, ts, tb, to = _t(vw), _t(vs), _t(vb), _t(vo)
        s = call.cstream()
        _gil = call.unlock()
        if cgated:
            st = qqToDecodeLayoutGated(NULL, tw, ts, tb, &p, to, s)
        else:
            st = qqToDecodeLayout(NULL, tw, ts, tb, &p, to, s)
        _relock(_gil)
        _check_as(st, "to_decode_layout_gated" if cgated else "to_decode_layout", func)
        call.finish()
    finally:
        call.release()
    return DecodeWeight(call.result(result), w, gated)


cdef int _decode_weight_args(str func, dw, str shape_text, scales, biases, transpose, group_size,
                            bits, mode, global_scale, scale_layout, fp8_format) except -1:
    """A DecodeWeight carries its scales, mode and global scale: the weight arguments of
    quantized_matmul / gather_qmm must be left at their defaults (mode may name its own)."""
    if (scales is not None or biases is not None or group_size is not None or bits is not None
            or global_scale is not None or scale_layout != "linear"):
        raise ValueError(f"{func}: w is a DecodeWeight, which carries its scales, mode and global "
                         f"scale; pass none of scales, biases, group_size, bits, global_scale, "
                         f"scale_layout")
    if mode not in ("affine", dw.mode):  # "affine" is the default: not given
        raise ValueError(f"{func}: mode={mode!r} but w is a {dw.mode} DecodeWeight")
    if fp8_format != dw.quantized.fp8_format:  # (the decode layout's mxfp8 is E4M3, the default)
        raise ValueError(f"{func}: fp8_format={fp8_format!r} contradicts the DecodeWeight's "
                         f"{dw.quantized.fp8_format!r}; leave fp8_format out")
    if not transpose:
        raise ValueError(f"{func}: a DecodeWeight is {shape_text} (transpose=True); got "
                         f"transpose=False")
    return 0


cdef int _check_decode_out(str func, out, tuple want) except -1:
    """out= of a DecodeWeight call has the result's exact shape: libqq takes N from out's
    last axis and can check it only against the layout's size, rows rounded up to 64."""
    if out is not None and hasattr(out, "shape") and tuple(out.shape) != want:
        raise ValueError(f"{func}: argument 'out' has shape {tuple(out.shape)}; expected {want}")
    return 0


cdef object _decode_matmul(str func, x, dw, scales, biases, transpose, group_size, bits, mode,
                           global_scale, bias, scale_layout, fp8_format, dtype, out, stream,
                           int swiglu=0):
    """quantized_matmul with a DecodeWeight: the decode layout's kernel where it applies
    (CPU: always; GPU: bfloat16 x of at most 64 rows or float16 of at most 32, compute
    capability 9.0+: libqq says, with NOT_SUPPORTED), else the packed weight it keeps
    (prefill: its GEMM routes). swiglu=1 (quantized_matmul_swiglu, a gated dw): SwiGLU of
    the product from the same kernel, [..., F]; None where libqq's kernel does not apply
    (the caller then runs the two ops)."""
    cdef _View vx, vw, vg, vbias, vo
    cdef qqQuantParams_t p
    cdef qqStatus_t st
    cdef DLTensor *tx
    cdef DLTensor *tw
    cdef DLTensor *tg
    cdef DLTensor *tbias
    cdef DLTensor *to
    cdef void* s
    _decode_weight_args(func, dw, "[N, K]", scales, biases, transpose, group_size, bits, mode,
                        global_scale, scale_layout, fp8_format)
    qa = dw.quantized
    cdef bint gated = dw.gated
    # experts: the batched packed weight; an x without .shape (only __dlpack__, or not an
    # array at all): the packed weight's path too, which reads it or says what it expected
    if len(dw.shape) == 3 or not hasattr(x, "shape"):
        if swiglu:
            return None
        return quantized_matmul(x, qa, bias=bias, dtype=dtype, out=out, stream=stream)
    shape = tuple(x.shape)
    if len(shape) == 0 or int(shape[-1]) != int(dw.shape[1]):
        raise ValueError(f"{func}: x has shape {shape} but the DecodeWeight is {tuple(dw.shape)} "
                         f"(x must be [..., M, K] with K = {dw.shape[1]})")
    want = shape[:-1] + (int(dw.shape[0]) // (2 if swiglu else 1),)
    _check_decode_out(func, out, want)
    _quant_params(func, &p, qa.mode, qa.group_size, qa.bits, "ceil", "linear", qa.fp8_format)
    out_dtype = _dtype_arg(func, dtype)
    cdef _Call call = _new_call(func, x, "x", stream)
    result = None
    try:
        vx = call.view(x, "x")
        vw = call.view(dw.data, "w_decode")
        vg = call.view(call.scalar(dw.global_scale, "global_scale"), "global_scale")
        vbias = call.view(bias, "bias")
        if out is None:
            result, vo = call.empty(want, out_dtype or vx.float_dtype(), "out")
        else:
            vo = _out_view(call, out, out_dtype)
        tx, tw, tg, tbias, to = _t(vx), _t(vw), _t(vg), _t(vbias), _t(vo)
        s = call.cstream()
        call.matmul_work(vx, vo)
        _gil = call.unlock()
        if gated:
            st = qqDecodeGatedMatmul(NULL, tx, tw, &p, tg, tbias, swiglu, to, s)
        else:
            st = qqDecodeMatmul(NULL, tx, tw, &p, tg, tbias, to, s)
        _relock(_gil)
        _route_recorded()
        if st == QQ_STATUS_NOT_SUPPORTED and swiglu:
            return None
        if st == QQ_STATUS_NOT_SUPPORTED:
            # libqq's kernel does not apply (prefill, float32 x, an older GPU, unaligned rows):
            # the packed weight, into the result already made
            quantized_matmul(x, qa, bias=bias, dtype=dtype, out=out if out is not None else result,
                             stream=stream)
            call.finish()
            return out if out is not None else call.result(result)
        _check_as(st, "decode_gated_matmul" if gated else "decode_matmul", func)
        call.finish()
    finally:
        call.release()
    return out if out is not None else call.result(result)


def _decode_swiglu(x, dw, scales, biases, group_size, bits, mode, global_scale, bias,
                   scale_layout, fp8_format, dtype, out, stream):
    """quantized_matmul_swiglu's one-kernel form (qq._dispatch): SwiGLU of x @ W.T from a
    gated DecodeWeight's kernel (qqDecodeGatedMatmul), or None where it does not apply
    (the caller then runs quantized_matmul and swiglu)."""
    _route_pending()
    return _decode_matmul("quantized_matmul_swiglu", x, dw, scales, biases, True, group_size,
                          bits, mode, global_scale, bias, scale_layout, fp8_format, dtype, out,
                          stream, 1)


cdef object _decode_gather(str func, x, dw, rhs_indices, scales, biases, transpose, group_size,
                           bits, mode, global_scale, bias, scale_layout, fp8_format, dtype, out,
                           stream):
    """gather_qmm with experts in the decode layout (a DecodeWeight of [E, N, K]), for bfloat16
    x of at most 16 rows per entry on the GPU (compute capability 9.0+): each batch entry
    reads its expert's layout, or, where the
    entries likely share experts, they are grouped by expert first (qqDecodeGatherQmm decides);
    otherwise the packed experts. The CPU reads the layout."""
    cdef _View vx, vw, vi, vg, vbias, vo
    cdef qqQuantParams_t p
    cdef qqStatus_t st
    cdef DLTensor *tx
    cdef DLTensor *tw
    cdef DLTensor *ti
    cdef DLTensor *tg
    cdef DLTensor *tbias
    cdef DLTensor *to
    cdef void* s
    _decode_weight_args(func, dw, "[E, N, K]", scales, biases, transpose, group_size, bits, mode,
                        global_scale, scale_layout, fp8_format)
    if len(dw.shape) != 3:
        raise ValueError(f"{func}: w must hold experts [E, N, K]; the DecodeWeight is {tuple(dw.shape)}")
    qa = dw.quantized
    # More than 16 rows per entry: the packed experts. Entries that share experts are grouped
    # by expert in C (qqDecodeGatherQmm), which made the decode layout faster than the packed
    # experts at every measured case (bench/results/gather_qmm-h100.md). An x or rhs_indices
    # without .shape (only __dlpack__, or not an array): the packed experts' path too, which
    # reads it or says what it expected.
    # A gated layout (qq.prepare_decode(gated=True)): the packed experts, in the weight's row order.
    if dw.gated or not hasattr(x, "shape") or not hasattr(rhs_indices, "shape") or (
            len(x.shape) >= 2 and int(x.shape[-2]) > 16):
        return gather_qmm(x, qa, rhs_indices=rhs_indices, bias=bias, dtype=dtype, out=out,
                          stream=stream)
    shape = tuple(x.shape)
    if len(shape) < 2 or int(shape[-1]) != int(dw.shape[2]):
        raise ValueError(f"{func}: x has shape {shape} but the experts are {tuple(dw.shape)} (x must "
                         f"be [..., M, K] with K = {dw.shape[2]})")
    ishape = tuple(int(d) for d in rhs_indices.shape)
    try:
        bshape = tuple(np.broadcast_shapes(shape[:-2], ishape))
    except ValueError:
        raise ValueError(f"{func}: the batch axes of x {shape[:-2]} and the shape of rhs_indices "
                         f"{ishape} do not broadcast") from None
    want = bshape + (int(shape[-2]), int(dw.shape[1]))
    _check_decode_out(func, out, want)
    _quant_params(func, &p, qa.mode, qa.group_size, qa.bits, "ceil", "linear", qa.fp8_format)
    out_dtype = _dtype_arg(func, dtype)
    cdef _Call call = _new_call(func, x, "x", stream)
    result = None
    try:
        vx = call.view(x, "x")
        vw = call.view(dw.data, "w_decode")
        vi = call.view(rhs_indices, "rhs_indices")
        vg = call.view(call.scalar(dw.global_scale, "global_scale"), "global_scale")
        vbias = call.view(bias, "bias")
        if out is None:
            result, vo = call.empty(want, out_dtype or vx.float_dtype(), "out")
        else:
            vo = _out_view(call, out, out_dtype)
        tx, tw, ti, tg, tbias, to = _t(vx), _t(vw), _t(vi), _t(vg), _t(vbias), _t(vo)
        s = call.cstream()
        call.matmul_work(vx, vo)
        _gil = call.unlock()
        st = qqDecodeGatherQmm(NULL, tx, tw, ti, &p, tg, tbias, to, s)
        _relock(_gil)
        _route_recorded()
        if st == QQ_STATUS_NOT_SUPPORTED:  # e.g. float x, unaligned rows, an older GPU: the packed experts
            gather_qmm(x, qa, rhs_indices=rhs_indices, bias=bias, dtype=dtype,
                       out=out if out is not None else result, stream=stream)
            call.finish()
            return out if out is not None else call.result(result)
        _check_as(st, "decode_gather_qmm", func)
        call.finish()
    finally:
        call.release()
    return out if out is not None else call.result(result)


def gather_qmm(x, w, scales=None, biases=None, rhs_indices=None, transpose=True,
               group_size=None, bits=None, mode="affine", *, global_scale=None, bias=None,
               scale_layout="linear", fp8_format="e4m3", dtype=None, out=None, stream=None):
    """Weight-only matmul with each batch entry's weight picked by an index (mixture-of-
    experts decode; MLX's mx.gather_qmm with rhs_indices):
    out[i..., :, :] = x[i..., :, :] @ W[rhs_indices[i...]].T, W = dequantize(w).

    w: packed experts [E, N, K*bits/8] (transpose=True) or [E, K, N*bits/8], or a
    QuantizedArray of [E, N, K]; rhs_indices: int32 expert indices on x's device; x
    [..., M, K]. x's batch axes and rhs_indices' shape broadcast together: x [T, 1, 1, K]
    with rhs_indices [T, top_k] gives out [T, top_k, 1, N]. One launch, indices read on
    the GPU (no host synchronization; CUDA-graph capturable). An index outside [0, E)
    raises on the CPU and gives NaN rows on the GPU. Other arguments as in
    quantized_matmul. See docs/api.md ("gather_qmm").
    """
    _route_pending()
    cdef str func = "gather_qmm"
    cdef _View vx, vw, vs, vb, vi, vg, vbias, vo
    cdef qqQuantParams_t p
    cdef qqStatus_t st
    cdef DLTensor *tx
    cdef DLTensor *tw
    cdef DLTensor *ts
    cdef DLTensor *tb
    cdef DLTensor *ti
    cdef DLTensor *tg
    cdef DLTensor *tbias
    cdef DLTensor *to
    cdef void* s
    cdef int ctranspose = 1 if transpose else 0
    if isinstance(w, DecodeWeight) and rhs_indices is not None:
        return _decode_gather(func, x, w, rhs_indices, scales, biases, transpose, group_size, bits,
                              mode, global_scale, bias, scale_layout, fp8_format, dtype, out, stream)
    if rhs_indices is None:
        raise TypeError(f"{func}: argument 'rhs_indices' is required (int32 expert indices); "
                        f"quantized_matmul multiplies without them")
    (w, scales, biases, global_scale, mode, group_size, bits, scale_layout, fp8_format,
     w_logical) = _unpack_weight(func, w, scales, biases, global_scale, mode, group_size,
                                bits, scale_layout, fp8_format)
    _quant_params(func, &p, mode, group_size, bits, "ceil", scale_layout, fp8_format)
    out_dtype = _dtype_arg(func, dtype)
    cdef _Call call = _new_call(func, x, "x", stream)
    result = None
    try:
        vx = call.view(x, "x")
        vw = call.need(w, "w")
        vs = call.view(scales, "scales")
        vb = call.view(biases, "biases")
        vi = call.need(rhs_indices, "rhs_indices")
        vg = call.view(call.scalar(global_scale, "global_scale"), "global_scale")
        vbias = call.view(bias, "bias")
        if out is None:
            w_shape = vw.pyshape()
            shape = _gather_shape(func, vx.pyshape(), w_shape, vi.pyshape(),
                                  _weight_n(func, &p, ctranspose, w_shape, w_logical))
            result, vo = call.empty(shape, out_dtype or vx.float_dtype(), "out")
        else:
            vo = _out_view(call, out, out_dtype)
        tx, tw, ts, tb, ti = _t(vx), _t(vw), _t(vs), _t(vb), _t(vi)
        tg, tbias, to = _t(vg), _t(vbias), _t(vo)
        s = call.cstream()
        call.matmul_work(vx, vo)
        _gil = call.unlock()
        st = qqGatherQmm(NULL, tx, tw, ts, tb, ti, &p, ctranspose, tg, tbias, to, s)
        _relock(_gil)
        _route_recorded()
        _check(st)
        call.finish()
    finally:
        call.release()
    return out if out is not None else call.result(result)

