"""Where does a first qq call invalidate a torch capture (capture_first_call_probe.py's
first_qqmm_shape and first_packed)? One process per case; each case runs the call inside
torch.cuda.graph in one capture mode, with a profile hook that reads the capture status
(CuPy's cudaStreamIsCapturing, itself capture-safe) after every Python-visible call and
return, and prints the first function after which the capture is invalidated. The
driver's own error log (CUDA_LOG_FILE=stdout, CUDA 12.9+) names the failing driver call.
    CUDA_LOG_FILE=stdout python3 bench/tune/capture_first_call_where.py
Run in session ay (logs-2026-12-02ay/capture_first_call_where.txt): the hook saw nothing
(the qq calls are compiled Cython, with no profile events inside), the driver's log named
cuMemPoolCreate, refused in the global and thread-local modes: the default handle was made
inside the capture. Fixed in runtime.cu (the handle made in relaxed mode).
"""
import sys

from capture_gc_probe import each_case

CASES = [f"{c}:{m}" for c in ("first_qqmm_shape", "first_packed", "second_qqmm_shape")
         for m in ("global", "thread_local", "relaxed")]


def run(case):
    import cupy
    import torch
    import qq
    name, mode = case.split(":")
    x = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    if name == "first_qqmm_shape":
        qq.quantize(x, mode="mxfp8")
        fn = lambda: qq.qqmm(x, w, mode="mxfp8")  # noqa: E731
    elif name == "second_qqmm_shape":  # cuBLASLt used once before, for another shape
        qq.qqmm(x[:128], w, mode="mxfp8")
        fn = lambda: qq.qqmm(x, w, mode="mxfp8")  # noqa: E731
    else:
        wq = qq.quantize(w, mode="nvfp4")
        xd = x[:4].contiguous()
        fn = lambda: qq.quantized_matmul(xd, wq)  # noqa: E731
    torch.cuda.synchronize()
    first = []

    def hook(frame, event, arg):
        if first or event not in ("return", "c_return"):
            return
        st = torch.cuda.current_stream().cuda_stream
        if cupy.cuda.runtime.streamIsCapturing(st) == 2:  # cudaStreamCaptureStatusInvalidated
            what = getattr(arg, "__qualname__", repr(arg)) if event == "c_return" else frame.f_code.co_name
            first.append(f"{event} {what} ({frame.f_code.co_filename.split('/')[-1]}:{frame.f_lineno})")

    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g, capture_error_mode=mode):
            sys.setprofile(hook)
            try:
                y = fn()
            finally:
                sys.setprofile(None)
        g.replay()
        torch.cuda.synchronize()
        same = torch.equal(y.view(torch.uint8), fn().view(torch.uint8))
        print(f"{case:30s} capture ok, replay {'equals' if same else 'DIFFERS FROM'} eager, route {qq.last_route()}")
    except Exception as e:
        print(f"{case:30s} FAILED: {type(e).__name__}: {str(e).splitlines()[0][:140]}")
    print(f"{'':30s} first invalidated after: {first[0] if first else '-'}")


if __name__ == "__main__":
    each_case(__file__, CASES, run, 120)
