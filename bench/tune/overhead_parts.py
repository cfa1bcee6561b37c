"""Where bench_overhead's CUDA rows spend their host time: each qq call, and the same call
with one part taken away (the Python dispatch wrapper, the result allocation through out=,
the stream query through stream=), beside torch's own pieces (x + x, torch.empty forms, an
in-place launch). A diagnostic for issue 11, not a benchmark: prints us per call of a loop
of calls followed by one synchronize, median of repeats, all interleaved in one process.

    python bench/tune/overhead_parts.py          (H100: ~40 s)
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from host_timing import interleaved  # noqa: E402

import qq  # noqa: E402
from qq import _qq  # noqa: E402

dev = torch.device("cuda", 0)
x = torch.randn((16, 4096), dtype=torch.bfloat16, device=dev)
y = torch.empty_like(x)
bf, u8 = torch.bfloat16, torch.uint8
s = torch.cuda.current_stream().cuda_stream
raw = torch._C._cuda_getCurrentRawStream
qa = {m: qq.quantize(x, mode=m) for m in ("nvfp4", "mxfp8")}
o_amax = torch.empty((), dtype=torch.float32, device=dev)
o_deq = torch.empty_like(x)
w = torch.randn((4096, 4096), dtype=bf, device=dev)
x1 = torch.randn((1, 4096), dtype=bf, device=dev)
pw = {m: qq.prepare_weight(w, mode=m) for m in ("nvfp4", "mxfp8")}
o_mm = torch.empty((1, 4096), dtype=bf, device=dev)

groups = {
    "torch pieces": {
        "x + x": lambda: x + x,
        "torch.add(x, x, out=y)": lambda: torch.add(x, x, out=y),
        "empty(16, 4096, dtype, device)": lambda: torch.empty(16, 4096, dtype=bf, device=dev),
        "empty((16, 4096), dtype, device)": lambda: torch.empty((16, 4096), dtype=bf, device=dev),
        "empty(16, 4096, dtype, device='cuda')": lambda: torch.empty(16, 4096, dtype=bf, device="cuda"),
        "empty(16, 2048, uint8, device)": lambda: torch.empty(16, 2048, dtype=u8, device=dev),
        "x.new_empty((16, 4096))": lambda: x.new_empty((16, 4096)),
        "empty_like(x)": lambda: torch.empty_like(x),
        "raw stream": lambda: raw(0),
        "x.data_ptr()": lambda: x.data_ptr(),
    },
    "amax": {
        "qq.amax(x)": lambda: qq.amax(x),
        "_qq.amax(x)": lambda: _qq.amax(x),
        "_qq.amax(x, out=o)": lambda: _qq.amax(x, out=o_amax),
        "_qq.amax(x, out=o, stream=s)": lambda: _qq.amax(x, out=o_amax, stream=s),
    },
    "dequantize": {
        "qq.dequantize(qa)": lambda: qq.dequantize(qa["nvfp4"]),
        "_qq.dequantize(qa)": lambda: _qq.dequantize(qa["nvfp4"]),
        "_qq.dequantize(qa, out=o)": lambda: _qq.dequantize(qa["nvfp4"], out=o_deq),
        "_qq.dequantize(qa, out=o, stream=s)": lambda: _qq.dequantize(qa["nvfp4"], out=o_deq, stream=s),
    },
    "quantize": {
        "qq.quantize(x, nvfp4)": lambda: qq.quantize(x, mode="nvfp4"),
        "_qq.quantize(x, nvfp4)": lambda: _qq.quantize(x, mode="nvfp4"),
        "_qq.quantize(x, nvfp4, stream=s)": lambda: _qq.quantize(x, mode="nvfp4", stream=s),
        "_qq.quantize(x, nvfp4, torch_dtypes=False)": lambda: _qq.quantize(x, mode="nvfp4", torch_dtypes=False),
    },
    "qqmm (prepared w), M = 1, 4096^2": {
        "x1 @ w.T": lambda: x1 @ w.T,
        "qq.qqmm nvfp4": lambda: qq.qqmm(x1, pw["nvfp4"]),
        "_qq.qqmm nvfp4, out=o, stream=s": lambda: _qq.qqmm(x1, pw["nvfp4"], out=o_mm, stream=s),
        "qq.qqmm mxfp8": lambda: qq.qqmm(x1, pw["mxfp8"]),
        "_qq.qqmm mxfp8, out=o, stream=s": lambda: _qq.qqmm(x1, pw["mxfp8"], out=o_mm, stream=s),
    },
}

sync = torch.cuda.synchronize
for title, fns in groups.items():
    r = interleaved(fns, n=1000, reps=7, sync=sync)
    print(f"== {title}", flush=True)
    for k, v in r.items():
        print(f"  {k:45s} {v:7.2f} us", flush=True)
# what qqmm launches at M = 1 (route and kernels): one call under the profiler
from torch.profiler import ProfilerActivity, profile  # noqa: E402
for m in ("nvfp4", "mxfp8"):
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        qq.qqmm(x1, pw[m])
        sync()
    names = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    print(f"qqmm {m} M = 1 route {qq.last_route()}: {len(names)} kernels: {names}", flush=True)
