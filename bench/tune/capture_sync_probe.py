"""Queued (session ay), not run: may a stream that is not being captured be synchronized
while another stream is captured in global mode? qqStreamSynchronize (behind a libqq buffer's
DLPack export to another stream) refuses only when its own stream is captured; if CUDA
refuses the sync of the other stream too (and invalidates the capture), the fix is a
relaxed-mode sync, as qqDeviceFree frees. One process per case:
    qq_other      qq._qq._stream_synchronize of another (idle) torch stream inside the capture
    cupy_other    the same through CuPy's cudaStreamSynchronize (CUDA's rule, without qq)
    cupy_relaxed  CuPy's, with the thread's capture mode exchanged to relaxed around it
    CUDA_LOG_FILE=stdout python3 bench/tune/capture_sync_probe.py
"""
from capture_gc_probe import each_case

CASES = ["qq_other", "cupy_other", "cupy_relaxed"]


def run(case):
    import cupy
    import torch
    import qq
    rt = cupy.cuda.runtime
    x = torch.randn(64, 256, device="cuda")
    other = torch.cuda.Stream()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    note = ""
    try:
        with torch.cuda.graph(g):
            y = x * 2
            try:
                if case == "qq_other":
                    qq._qq._stream_synchronize(torch.cuda.current_device(), other.cuda_stream)
                elif case == "cupy_other":
                    rt.streamSynchronize(other.cuda_stream)
                else:
                    old = rt.cudaStreamCaptureModeRelaxed if hasattr(rt, "cudaStreamCaptureModeRelaxed") else 2
                    prev = rt.threadExchangeStreamCaptureMode(old)
                    try:
                        rt.streamSynchronize(other.cuda_stream)
                    finally:
                        rt.threadExchangeStreamCaptureMode(prev)
                note = "sync returned"
            except Exception as e:  # the sync's own error, inside the capture
                note = f"sync raised {type(e).__name__}: {str(e).splitlines()[0][:100]}"
        x.fill_(1.5)
        g.replay()
        torch.cuda.synchronize()
        ok = torch.equal(y, torch.full_like(y, 3.0))
        print(f"{case:14s} {note}; capture valid, replay {'equals' if ok else 'DIFFERS'}")
    except Exception as e:
        print(f"{case:14s} {note}; capture FAILED: {type(e).__name__}: {str(e).splitlines()[0][:120]}")


if __name__ == "__main__":
    each_case(__file__, CASES, run, 120)
