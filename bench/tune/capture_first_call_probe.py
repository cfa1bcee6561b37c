"""What happens when qq's first use of something happens inside a torch CUDA graph capture
(docs/api.md asks for a warm-up call first)? Compiled for the next session (ax), not run yet.
One process per case; each captures one call, replays it and compares with an eager call:
    first_op          no qq GPU call before the capture: the default handle (cuBLASLt
                      handle, memory pool) is made and the kernel's module loaded inside it
    first_qqmm_shape  the handle exists (a quantize ran); the first qqmm of its shape inside
                      the capture (the cuBLASLt plan and heuristic query made there)
    first_decode      the handle exists; the first decode-layout matmul inside the capture
                      (the kernel's shared-memory attribute set there)
    first_packed      the handle exists; the first packed-weight (MLX layout) matmul at 4 rows
                      inside the capture (qmv's occupancy query made there)
    python3 bench/tune/capture_first_call_probe.py
"""
from capture_gc_probe import each_case

CASES = ["first_op", "first_qqmm_shape", "first_decode", "first_packed"]


def setup(case):
    """The call `case` captures (also capture_first_call_where.py's cases, with
    second_qqmm_shape: cuBLASLt used once before, for another shape)."""
    import torch
    import qq
    x = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    if case == "first_op":
        return lambda: qq.quantize(x, mode="mxfp8").data
    if case in ("first_qqmm_shape", "second_qqmm_shape"):
        if case == "first_qqmm_shape":
            qq.quantize(x, mode="mxfp8")
        else:
            qq.qqmm(x[:128], w, mode="mxfp8")
        return lambda: qq.qqmm(x, w, mode="mxfp8")
    wq = qq.quantize(w, mode="nvfp4")
    if case == "first_decode":
        wq = qq.prepare_decode(wq)
    xd = x[:4].contiguous()
    return lambda: qq.quantized_matmul(xd, wq)


def capture_check(label, fn, mode="global"):
    """Captures fn() in capture mode `mode`, replays it and prints whether the replay equals
    an eager call (or how the capture failed)."""
    import torch
    import qq
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g, capture_error_mode=mode):
            y = fn()
        y.zero_()
        g.replay()
        torch.cuda.synchronize()
        same = torch.equal(y.view(torch.uint8), fn().view(torch.uint8))
        print(f"{label:30s} capture ok, replay {'equals' if same else 'DIFFERS FROM'} eager, route {qq.last_route()}")
    except Exception as e:
        print(f"{label:30s} FAILED: {type(e).__name__}: {str(e).splitlines()[0][:140]}")


def run(case):
    capture_check(case, setup(case))


if __name__ == "__main__":
    each_case(__file__, CASES, run, 120)
