"""Which stream-ordered free, made by this thread while torch captures a CUDA graph on its own
(non-blocking) stream in the default global capture mode, leaves that capture valid? The CUDA
runtime through ctypes (torch's libcudart), one process per case:
    python3 bench/tune/capture_free_probe.py
Cases: cudaFreeAsync of a buffer allocated on the legacy default stream, on a stream of our
own, on the per-thread default stream; each as is and inside
cudaThreadExchangeStreamCaptureMode(relaxed); and a synchronous cudaFree under relaxed mode.
"""
import ctypes
import glob
import os

from capture_gc_probe import each_case

CASES = ["legacy", "legacy_relaxed", "own_stream", "own_stream_relaxed", "per_thread", "per_thread_relaxed",
         "cudafree_relaxed"]


def cudart():
    import torch
    root = os.path.dirname(os.path.dirname(torch.__file__))
    for pat in ("nvidia/cuda_runtime/lib/libcudart.so*", "nvidia/cu*/lib/libcudart.so*", "torch/lib/libcudart*.so*"):
        hits = sorted(glob.glob(os.path.join(root, pat)))
        if hits:
            return ctypes.CDLL(hits[0])
    return ctypes.CDLL("libcudart.so")


def run(case):
    import torch
    rt = cudart()
    torch.cuda.init()
    x = torch.ones(1024, device="cuda")
    p = ctypes.c_void_p()
    own = ctypes.c_void_p()
    if case.startswith("own_stream"):
        assert rt.cudaStreamCreateWithFlags(ctypes.byref(own), 1) == 0  # cudaStreamNonBlocking
        st = own
    elif case.startswith("per_thread"):
        st = ctypes.c_void_p(2)  # cudaStreamPerThread
    else:
        st = ctypes.c_void_p(0)
    if case == "cudafree_relaxed":
        assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(1 << 20)) == 0
    else:
        assert rt.cudaMallocAsync(ctypes.byref(p), ctypes.c_size_t(1 << 20), st) == 0
    assert rt.cudaDeviceSynchronize() == 0
    g = torch.cuda.CUDAGraph()
    err = None
    try:
        with torch.cuda.graph(g):
            y = x * 2
            mode = ctypes.c_int(2)  # cudaStreamCaptureModeRelaxed
            relaxed = case.endswith("relaxed")
            if relaxed:
                rt.cudaThreadExchangeStreamCaptureMode(ctypes.byref(mode))
            if case == "cudafree_relaxed":
                err = rt.cudaFree(p)
            else:
                err = rt.cudaFreeAsync(p, st)
            if relaxed:
                rt.cudaThreadExchangeStreamCaptureMode(ctypes.byref(mode))
            y = y + 1
        g.replay()
        torch.cuda.synchronize()
        print(f"{case:20s} capture ok (free returned {err})")
    except Exception as e:
        print(f"{case:20s} capture FAILED (free returned {err}): {str(e).splitlines()[0][:120]}")


if __name__ == "__main__":
    each_case(__file__, CASES, run, 60)
