"""A few small calls of every libqq kernel that uses shared memory (qmma's k-split
reduction, qmv, the quantize tile kernel of quantize_colwise / quantize_moe with affine's
staged x^T codes, colaff_kernel's transposed tile (16-bit and fp32 x), moe_t_kernel, colq_kernel's nvfp4 factor table,
amax, the row-wise quantize kernel's staged blocked scales), and of
the newest kernels (dequantize's block shapes and compile-time affine widths, amax's vector kernel, swiglu,
the decode kernel's gated SwiGLU epilogue, grouped_qqmm_wgrad's token quantization for one and
for several experts, the exact GEMM with a bias), for compute-sanitizer's racecheck,
initcheck and memcheck:

    compute-sanitizer --tool racecheck python3 scripts/sanitize_kernels.py

It imports CuPy (not torch, whose thousands of kernels make racecheck's start-up take
minutes) and checks each result against the CPU backend, so a race that changes a value
also fails here. Exit code 0 = every call matched.
"""

import sys

import numpy as np

import qq

try:
    import cupy as cp
except ImportError:
    sys.exit("needs CuPy")

rng = np.random.default_rng(0)
bad = 0


def dev(a):
    return cp.asarray(a)


def same(name, got, want):
    global bad
    got = np.asarray(got.get() if hasattr(got, "get") else got)
    want = np.asarray(want)
    ok = got.shape == want.shape and np.array_equal(got.reshape(-1).view(np.uint8), want.reshape(-1).view(np.uint8))
    if not ok:
        close = np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-2, atol=1e-2)
        ok = close and name.startswith("mm")   # matmuls: CPU and GPU sum in another order
    print(f"{name:40s} {'ok' if ok else 'MISMATCH'}")
    bad += not ok


# (1216, 96): 9.5 tiles of 128 rows, so colq_kernel / colaff_kernel's second band of 8 tiles
# along M is mostly past M
for shape in [(64, 256), (160, 96), (1216, 96)]:
    x = rng.standard_normal(shape).astype(np.float32)
    same(f"amax {shape}", qq.amax(dev(x)), qq.amax(x))
    for mode in ["nvfp4", "mxfp8", "affine"]:
        if shape[0] % 64 and mode == "affine":  # (affine groups of 32 rows still need M % 32)
            continue
        kw = {"mode": mode} if mode != "affine" else {"group_size": 32, "bits": 4}
        r, c = qq.quantize_colwise(dev(x), rowwise=True, **kw)
        rr, cc = qq.quantize_colwise(x, rowwise=True, **kw)
        same(f"colwise {mode} {shape} data_t", c.data, cc.data)
        same(f"colwise {mode} {shape} scales_t", c.scales, cc.scales)
        same(f"colwise {mode} {shape} row data", r.data, rr.data)

# affine columns at 4 and 8 bits: for rows that are not 16-byte aligned (a column slice, loaded
# element by element) the tile kernel, its x^T codes staged in shared memory (groups of 64 /
# 128 rows); for aligned rows colaff_kernel (the tile transposed in shared memory); ragged K,
# a partial last 128-row tile at M = 320
x = rng.standard_normal((320, 73)).astype(np.float32)
for group, bits in [(32, 4), (64, 4), (64, 8), (128, 4)]:
    xg = x if 320 % group == 0 else x[:256]
    for name, xd, xh in [("aligned", dev(np.ascontiguousarray(xg[:, :72])), xg[:, :72]),
                         ("unaligned", dev(xg)[:, 1:], xg[:, 1:])]:
        c = qq.quantize_colwise(xd, group_size=group, bits=bits)
        cc = qq.quantize_colwise(np.ascontiguousarray(xh), group_size=group, bits=bits)
        same(f"colwise affine{bits} g{group} {name} data_t", c.data, cc.data)
        same(f"colwise affine{bits} g{group} {name} scales_t", c.scales, cc.scales)
    # float16 and fp32, 16-byte aligned rows, 75 of 80 columns: the last 8- / 4-column loads
    # partly past K
    xp = np.ascontiguousarray(np.pad(xg, ((0, 0), (0, 7))))
    for name, xk, k in [("f16", xp.astype(np.float16), 80), ("f16 K75", xp.astype(np.float16), 75),
                        ("f32 K75", xp, 75)]:
        c = qq.quantize_colwise(dev(xk)[:, :k], group_size=group, bits=bits)
        cc = qq.quantize_colwise(np.ascontiguousarray(xk[:, :k]), group_size=group, bits=bits)
        same(f"colwise affine{bits} g{group} {name} data_t", c.data, cc.data)
        same(f"colwise affine{bits} g{group} {name} scales_t", c.scales, cc.scales)
    # both orientations from fp32 x in groups of 32 / 64 (K a multiple of the group: the
    # row-wise half's rule); K = 32 with groups of 32: the column-wise tile's second half past K
    for kk in {32: [32, 64], 64: [64]}.get(group, []):
        xf = np.ascontiguousarray(xp[:, :kk])
        r, c = qq.quantize_colwise(dev(xf), group_size=group, bits=bits, rowwise=True)
        rr, cc = qq.quantize_colwise(xf, group_size=group, bits=bits, rowwise=True)
        for what, got, want in [("data", r.data, rr.data), ("scales", r.scales, rr.scales),
                                ("biases", r.biases, rr.biases), ("data_t", c.data, cc.data),
                                ("scales_t", c.scales, cc.scales)]:
            same(f"both affine{bits} g{group} f32 K{kk} {what}", got, want)

w3 = rng.standard_normal((2, 64, 96)).astype(np.float32)
for scaling in ["32x1", "32x32"]:
    d, s = qq.quantize_moe(dev(w3), scaling)
    dd, ss = qq.quantize_moe(w3, scaling)
    same(f"moe {scaling} data", d, dd)
    same(f"moe {scaling} scales", s, ss)
# the transposed view of [E, D2, D1] (moe_t_kernel): 5 groups along D1 (a group pair past the
# row's end), 3 blocks of 32 rows along D2
w3v = rng.standard_normal((2, 160, 96)).astype(np.float32)
for scaling in ["32x1", "32x32"]:
    d, s = qq.quantize_moe(dev(np.ascontiguousarray(np.swapaxes(w3v, 1, 2))).transpose(0, 2, 1), scaling)
    dd, ss = qq.quantize_moe(w3v, scaling)
    same(f"moe tview {scaling} data", d, dd)
    same(f"moe tview {scaling} scales", s, ss)

# the row-wise kernel's blocked scales (kStaged: a block of 8 rows that share the layout's
# sectors, their scale bytes staged in shared memory) and fp32 x's loads through shared memory
# (kStagedX, either layout): rows past a 128-row tile, a last column block part live (33
# units), an odd nvfp4 group count (3), fp32 and fp16 x
for shape in [(130, 1056), (3, 160), (5, 48)]:
    for dt in (np.float32, np.float16):
        x = rng.standard_normal(shape).astype(dt)
        for mode in ["nvfp4", "mxfp4", "mxfp8"]:
            if shape[1] % 32 and mode != "nvfp4":
                continue
            for layout in ("blocked", "linear"):
                q = qq.quantize(dev(x), mode=mode, scale_layout=layout)
                qc = qq.quantize(x, mode=mode, scale_layout=layout)
                same(f"quantize {layout} {mode} {np.dtype(dt).name} {shape} data", q.data, qc.data)
                same(f"quantize {layout} {mode} {np.dtype(dt).name} {shape} scales", q.scales, qc.scales)

W = rng.standard_normal((256, 512)).astype(np.float32)
for mode in ["nvfp4", "mxfp4", "mxfp8", "affine"]:
    kw = {"mode": mode} if mode != "affine" else {"group_size": 64, "bits": 4}
    wq = qq.quantize(W, **kw)
    wq_d = qq.quantize(dev(W), **kw)
    for m in [1, 3, 16, 64]:
        x = rng.standard_normal((m, 512)).astype(np.float32)
        xb = x.astype(np.float32)
        if m <= 4:   # float32 x: the CUDA-core qmv kernel
            got = qq.quantized_matmul(dev(xb), wq_d)
            route = qq.last_route()
            same(f"mm quantized_matmul {mode} M={m} ({route})", got, qq.quantized_matmul(xb, wq))
        if mode != "affine":   # qqmm on a packed w: qmma on q(x) in bf16 (M <= 64)
            got = qq.qqmm(dev(xb), wq_d)
            route = qq.last_route()
            same(f"mm qqmm {mode} M={m} ({route})", got, qq.qqmm(xb, wq))

# qmv at a larger N, where its grid rule takes the threads per row down to a warp (T = 32),
# and its narrow kernel (affine 3-bit: byte-wise chunks, the 4-row tile)
W2 = rng.standard_normal((2048, 1024)).astype(np.float32)
for kw in ({"mode": "mxfp8"}, {"group_size": 32, "bits": 3}):
    wq = qq.quantize(W2, **kw)
    wq_d = qq.quantize(dev(W2), **kw)
    for m in (1, 3):
        x = rng.standard_normal((m, 1024)).astype(np.float32)
        got = qq.quantized_matmul(dev(x), wq_d)
        route = qq.last_route()
        same(f"mm quantized_matmul {kw.get('mode', 'affine3')} 2048x1024 M={m} ({route})", got,
             qq.quantized_matmul(x, wq))

# dequantize: every mode (nvfp4 with and without a global scale); affine 4 / 8 bits (the compile-time-width kernel) and 3 bits (the
# run-time one); rows of 640 chunks (one 160-thread block), 28 (a 32-thread block with
# threads idle), 1288 (two 224-thread blocks of 3 chunks a thread, the row ending inside a
# thread's chunks) and 1028 (three 128-thread blocks of 3); bf16, fp32 and fp16 results
for shape in [(6, 5120), (5, 224), (3, 10304), (3, 8224)]:
    x = rng.standard_normal(shape).astype(np.float32)
    gs = float(np.abs(x).max())
    for kw in ({"mode": "nvfp4"}, {"mode": "nvfp4", "global_scale": gs}, {"mode": "mxfp4"}, {"mode": "mxfp8"},
               {"group_size": 32, "bits": 4},
               {"group_size": 64, "bits": 8} if shape[1] % 64 == 0 else {"group_size": 32, "bits": 8},
               {"group_size": 32, "bits": 3}):
        wq, wq_d = qq.quantize(x, **kw), qq.quantize(dev(x), **kw)
        for dt in ("bfloat16", "float32", "float16"):
            same(f"dequantize {kw} {shape} {dt}", qq.dequantize(wq_d, dtype=dt), qq.dequantize(wq, dtype=dt))

# amax: one block, the vector kernel (tail elements), a misaligned start (element kernel)
for n in (1000, (1 << 18) + 5):
    for dt in (np.float32, np.float16):
        x = rng.standard_normal(n).astype(dt)
        same(f"amax {n} {np.dtype(dt).name}", qq.amax(dev(x)), qq.amax(x))
        same(f"amax {n} {np.dtype(dt).name} [1:]", qq.amax(dev(x)[1:]), qq.amax(x[1:]))

# swiglu: the 16-byte path (F % 8 == 0), per element (F = 1003), a sliced x (rows not 16-byte
# aligned: per element); CPU and GPU exp may differ in the last float32 bit
for shape, sl in (((4, 2048), None), ((3, 2006), None), ((5, 2050), 2048)):
    for dt in (np.float32, np.float16):
        x = rng.standard_normal(shape).astype(dt)
        xs = x[:, :sl] if sl else x
        got = qq.swiglu(dev(x)[:, :sl] if sl else dev(x)).get().astype(np.float64)
        want = qq.swiglu(np.ascontiguousarray(xs)).astype(np.float64)
        ok = np.allclose(got, want, rtol=1e-3, atol=0) and got.shape == want.shape
        print(f"{'swiglu ' + str(shape) + ' ' + np.dtype(dt).name:40s} {'ok' if ok else 'MISMATCH'}")
        bad += not ok

# the decode layout's kernel with a gated gate/up weight: SwiGLU in its epilogue (the gate
# rows' warps meet the up rows' in shared memory after a named barrier; 4 warps, 8 at M > 32),
# against the two ops on the GPU (qq.swiglu of the plain layout's product: the same bits);
# N = 256 splits K over a cluster of 2, N = 8192 does not. float16 x (CuPy has no bfloat16)
# runs twice its rows: M = 12 and 20 are the kernel's 24- and 40-row configurations (on
# sm_90a wgmma with one and two warpgroups per fragment-block parity).
# N = 17408 (272 row tiles, past a wave of two CTAs per SM on 132 SMs) takes the four-CTAs-
# per-SM configurations at M <= 8 (4-bit codes 3 stages, 8-bit codes 2; qmmp.cu's dispatch);
# with K = 1024, M = 1 (two kernel rows) the 4-bit codes' 512-k stages of two rows of x (X2);
# (256, 7168), M = 1: K split over 2, seven X2 stages a rank round mxfp8's ring of 3 slots;
# (256, 8192): four 1024-k stages a rank round the 4-bit codes' ring of 2 (M = 1: one row of
# x; M = 3 and 6 in float16, 6 and 12 kernel rows: the 3..8- and 9..16-row forms, there and
# for mxfp8's 512-k stages 3 deep; M = 20, 40 kernel rows: 16 stages a rank, so on sm_90a one
# warpgroup a fragment-block parity, m64n64k16)
# (17408, 4096), M = 20 and 32 (40 and 64 kernel rows, 16 stages, K not split, 272 row tiles):
# on sm_90a two row tiles a CTA (qmmp.cu's NT = 2), each with its own SwiGLU barrier
for (n2, k) in ((256, 512), (8192, 256), (17408, 256), (17408, 1024), (256, 7168), (256, 8192), (17408, 4096)):
    w = (rng.standard_normal((n2, k)) * 0.05).astype(np.float32)
    for mode in ("nvfp4", "mxfp8"):
        q = qq.quantize(dev(w), mode=mode)
        dw, dg = qq.prepare_decode(q), qq.prepare_decode(q, gated=True)
        for m in (1, 3, 6, 20) if (n2, k) == (256, 8192) else (20, 32) if k == 4096 else (1,) if k >= 1024 else (
                1, 8, 12, 20):
            x = dev(rng.standard_normal((m, k)).astype(np.float16))
            got = qq.quantized_matmul_swiglu(x, dg)
            route = qq.last_route()
            same(f"decode gated swiglu {mode} {(n2, k)} M={m} ({route})", got, qq.swiglu(qq.quantized_matmul(x, dw)).get())

# grouped_qqmm_wgrad: one expert (colqdq: 8-byte pieces, element-wise columns, fp16 / fp32)
# and three (seg_qdq)
for t, k, n, dt in ((45, 64, 48, np.float32), (70, 44, 37, np.float16), (64, 136, 40, np.float16)):
    x = rng.standard_normal((t, k)).astype(dt)
    dy = rng.standard_normal((t, n)).astype(dt)
    for mode in ("mxfp8", "nvfp4"):
        for ends in (np.array([t], np.int32), np.array([5, t - 7, t], np.int32)):
            got = qq.grouped_qqmm_wgrad(dev(x), dev(dy), dev(ends), mode)
            same(f"mm wgrad {mode} E={len(ends)} {(t, k, n)}", got, qq.grouped_qqmm_wgrad(x, dy, ends, mode))

# the exact GEMM with a bias of the output's dtype and of another (M above the weight-only kernels)
x = rng.standard_normal((100, 512)).astype(np.float32)
wq = qq.quantize(W, mode="mxfp8")
wq_d = qq.quantize(dev(W), mode="mxfp8")
for bias in (rng.standard_normal(256).astype(np.float32), rng.standard_normal(256).astype(np.float16)):
    got = qq.qqmm(dev(x), wq_d, bias=dev(bias))
    same(f"mm qqmm bias {bias.dtype} ({qq.last_route()})", got, qq.qqmm(x, wq, bias=bias))

print("mismatches:", bad)
sys.exit(1 if bad else 0)
