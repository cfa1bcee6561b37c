"""Host time per call of qq calls at a small and a training-size shape, with the GPU idle
(each call waits for the previous: host + launch) and with the GPU busy (calls queue
behind a torch.cuda._sleep: host time alone). A tuning aid for issue 11's host cost at
the shapes of a training step.

    python bench/tune/host_calls_big.py
"""
import time

import torch

import qq


def host_us(fn, n=50, busy=True):
    fn()
    torch.cuda.synchronize()
    if busy:
        torch.cuda._sleep(200_000_000)     # ~100 ms of GPU work ahead of the calls
        t = time.perf_counter()
        for _ in range(n):
            fn()
        h = (time.perf_counter() - t) / n * 1e6
        torch.cuda.synchronize()
        return h
    best = 1e9
    for _ in range(n):
        t = time.perf_counter()
        fn()
        h = time.perf_counter() - t
        torch.cuda.synchronize()
        best = min(best, h)
    return best * 1e6


def main():
    for shape in ((16, 4096), (16384, 4096)):
        x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        q8 = qq.quantize(x, mode="mxfp8")
        pw = qq.prepare_weight(w, mode="mxfp8")
        ends = torch.full((1,), shape[0], dtype=torch.int32, device="cuda")
        rows = [
            ("x + x", lambda: x + x),
            ("torch.empty_like", lambda: torch.empty_like(x)),
            ("qq.amax", lambda: qq.amax(x)),
            ("qq.quantize mxfp8", lambda: qq.quantize(x, mode="mxfp8")),
            ("qq.dequantize mxfp8", lambda: qq.dequantize(q8)),
            ("qq.qqmm mxfp8 prepared", lambda: qq.qqmm(x, pw)),
            ("qq.qqmm mxfp8 float w", lambda: qq.qqmm(x, w, mode="mxfp8")),
            ("qq.grouped_qqmm_wgrad E=1", lambda: qq.grouped_qqmm_wgrad(x, x, ends, mode="mxfp8", dtype="bfloat16")),
            ("x @ w.T", lambda: x @ w.T),
        ]
        for name, fn in rows:
            print(f"{str(shape):14s} {name:28s} busy {host_us(fn):8.1f} us   idle {host_us(fn, busy=False):8.1f} us")


if __name__ == "__main__":
    main()
