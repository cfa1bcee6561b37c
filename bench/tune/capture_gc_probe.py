"""Which objects, collected by Python's cyclic GC in the middle of a torch CUDA graph capture,
invalidate that capture? (session ax: test_gpu_gather_grouped[nvfp4-gs-4-2-1-False] once failed
with cudaErrorStreamCaptureInvalidated at its capture, 4771 other GPU tests passing.)
Each case in its own process: make the garbage (a reference cycle), then capture a qq
gather_qmm with gc.collect() inside the capture, and report whether the capture survived.
    python3 bench/tune/capture_gc_probe.py            # every case
"""
import gc
import subprocess
import sys


def setup():
    import torch
    import qq
    e, n, k = 8, 192, 512
    w = torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16)
    qa = qq.quantize(w, mode="mxfp4")
    dw = qq.prepare_decode(qa)
    x = torch.randn(4, 1, 1, k, device="cuda", dtype=torch.bfloat16)
    idx = torch.tensor([[0, 1], [2, 3], [1, 5], [7, 0]], dtype=torch.int32, device="cuda")
    return torch, qq, dw, x, idx


def garbage(case, torch, qq, dw, x, idx):
    cyc = []
    cyc.append(cyc)
    if case == "graph_qq":          # a CUDAGraph that captured a qq call (graph-owned scratch)
        g = torch.cuda.CUDAGraph()
        out = torch.empty(4, 2, 1, 192, device="cuda")
        with torch.cuda.graph(g):
            qq.gather_qmm(x, dw, rhs_indices=idx, out=out, dtype="float32")
        cyc.append(g)
    elif case == "graph_torch":     # a CUDAGraph of a torch op
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = x * 2
        cyc.append(g)
        cyc.append(y)
    elif case == "graph_empty_raised":  # a capture refused by qq (test_grouped_qqmm_under_capture_raises)
        xx = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
        ww = torch.randn(2, 128, 256, device="cuda", dtype=torch.bfloat16)
        ends = torch.tensor([30, 64], dtype=torch.int32, device="cuda")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            try:
                qq.grouped_qqmm(xx, ww, ends, mode="mxfp8", dtype="float32")
            except qq.NotSupportedError as err:
                cyc.append(err)
        cyc.append(g)
    elif case == "device_buffer":   # a libqq device buffer (freed by cudaFreeAsync on its stream)
        cyc.append(qq._qq._device_empty((1 << 20,), "float32", 0))
    elif case == "torch_tensor":
        cyc.append(torch.empty(1 << 20, device="cuda"))
    elif case == "decode_weight":   # a DecodeWeight and its packed weight
        w = torch.randn(8, 192, 512, device="cuda", dtype=torch.bfloat16)
        cyc.append(qq.prepare_decode(qq.quantize(w, mode="mxfp4")))
    elif case == "none":
        pass
    torch.cuda.synchronize()
    del cyc


def run(case):
    torch, qq, dw, x, idx = setup()
    out = torch.empty(4, 2, 1, 192, device="cuda")
    qq.gather_qmm(x, dw, rhs_indices=idx, out=out, dtype="float32")
    torch.cuda.synchronize()
    gc.disable()
    garbage(case, torch, qq, dw, x, idx)
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            n = gc.collect()
            qq.gather_qmm(x, dw, rhs_indices=idx, out=out, dtype="float32")
        g.replay()
        torch.cuda.synchronize()
        print(f"{case:20s} ok (collected {n})")
    except Exception as e:
        print(f"{case:20s} FAILED: {type(e).__name__}: {str(e).splitlines()[0][:150]}")


CASES = ["none", "torch_tensor", "graph_torch", "graph_qq", "graph_empty_raised", "device_buffer", "decode_weight"]


def each_case(path, cases, run, timeout):
    """`path CASE` runs one case; `path` alone runs every case of `cases` in its own process
    (an invalidated capture leaves the process's CUDA state unfit for the next case)."""
    if len(sys.argv) > 1:
        run(sys.argv[1])
        return
    for c in cases:
        r = subprocess.run([sys.executable, path, c], capture_output=True, text=True, timeout=timeout)
        print(r.stdout.strip() or f"{c:20s} rc={r.returncode}: {r.stderr.strip().splitlines()[-1:]}", flush=True)


if __name__ == "__main__":
    each_case(__file__, CASES, run, 120)
