"""Session az: inside torch.cuda.graph, is a side stream entered with `torch.cuda.stream(side)`
itself captured (torch joining it to the capture), or does it stay outside? prepare_decode on
the side stream was refused as "being captured". Prints cudaStreamIsCapturing of the side
stream before, inside the stream context, and after a torch allocation there.
    python3 bench/tune/capture_side_stream_probe.py
"""
import ctypes

import torch

from capture_free_probe import cudart

rt = cudart()


def capturing(s):
    st = ctypes.c_int(-1)
    e = rt.cudaStreamIsCapturing(ctypes.c_void_p(s.cuda_stream), ctypes.byref(st))
    return f"err {e} status {st.value}"


x = torch.randn(64, device="cuda")
side = torch.cuda.Stream()
torch.cuda.synchronize()
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    y = x * 2
    print("before the context:", capturing(side))
    with torch.cuda.stream(side):
        print("inside the context:", capturing(side), "current is side:",
              torch.cuda.current_stream().cuda_stream == side.cuda_stream)
        z = torch.empty(16, device="cuda")
        print("after torch.empty: ", capturing(side))
    print("after the context: ", capturing(side))
print("capture ended fine")
