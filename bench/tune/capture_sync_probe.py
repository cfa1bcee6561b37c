"""Queued (session ay), not run: may a stream that is not being captured be synchronized
while another stream is captured in global mode? qqStreamSynchronize (behind a libqq buffer's
DLPack export to another stream) refuses only when its own stream is captured; if CUDA
refuses the sync of the other stream too (and invalidates the capture), the fix is a
relaxed-mode sync, as qqDeviceFree frees. One process per case:
    qq_other      qq._qq._stream_synchronize of another (idle) torch stream inside the capture
    rt_other      cudaStreamSynchronize of that stream through ctypes (CUDA's rule, without qq)
    rt_relaxed    the same, the thread's capture mode exchanged to relaxed around it
    CUDA_LOG_FILE=stdout python3 bench/tune/capture_sync_probe.py
"""
import ctypes

from capture_free_probe import cudart
from capture_gc_probe import each_case

CASES = ["qq_other", "rt_other", "rt_relaxed"]


def run(case):
    import torch
    if case == "qq_other":
        import qq  # (not inside the capture)
    rt = cudart()
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
                elif case == "rt_other":
                    note = f"cudaStreamSynchronize returned {rt.cudaStreamSynchronize(ctypes.c_void_p(other.cuda_stream))}"
                else:
                    mode = ctypes.c_int(2)  # cudaStreamCaptureModeRelaxed
                    assert rt.cudaThreadExchangeStreamCaptureMode(ctypes.byref(mode)) == 0
                    e = rt.cudaStreamSynchronize(ctypes.c_void_p(other.cuda_stream))
                    assert rt.cudaThreadExchangeStreamCaptureMode(ctypes.byref(mode)) == 0
                    note = f"relaxed cudaStreamSynchronize returned {e}"
                note = note or "sync returned"
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
