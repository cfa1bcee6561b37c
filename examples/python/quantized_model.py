"""End to end: quantize a small model, save it, load it into a fresh copy, run it.

    python examples/python/quantized_model.py [cpu|cuda]

Needs torch and safetensors (pip install -e ".[test]" has both)."""

import sys
import tempfile

import torch
from torch import nn

import qq.torch as qqt


def build():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256), nn.GELU(), nn.Linear(256, 10))


def main(device: str) -> None:
    model = build().to(device, torch.bfloat16)
    x = torch.randn(4, 256, dtype=torch.bfloat16, device=device)
    ref = model(x)

    report = qqt.quantize_(model, mode="nvfp4")      # nn.Linear -> QuantizedLinear (weight-only)
    print(report)
    y = model(x)
    print(f"max |quantized - bf16| = {(y - ref).abs().max().item():.4f} (outputs up to {ref.abs().max().item():.3f})")

    with tempfile.TemporaryDirectory() as d:
        path = f"{d}/model.safetensors"
        qqt.save_quantized(model, path)               # state dict + what rebuilds the layers
        fresh = build().to(device, torch.bfloat16)   # the architecture, float weights
        qqt.load_quantized(fresh, path)
        # serving on a GPU: weight-only layers may also keep the decode kernel's layout
        # (1.5-2x per token at decode sizes, as much memory again as the packed weights)
        served = build().to(device, torch.bfloat16)
        qqt.load_quantized(served, path, decode_layout=(device == "cuda"))
    y2 = fresh(x)
    assert torch.equal(y2, y), "the loaded model must give the same bits"
    compiled = torch.compile(fresh, fullgraph=True)
    assert torch.equal(compiled(x), y)
    print("saved, loaded and compiled: same outputs")

    if device == "cuda":
        # one token (a row of x) per step, captured once in a CUDA graph and replayed; the
        # warm-up calls (as torch.cuda.graph asks) also build the decode layout
        tok = x[:1].clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                served(tok)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = served(tok)
        tok.copy_(x[1:2])
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, served(x[1:2])), "the replay must give the eager bits"
        print("decode layout, one token per CUDA graph replay: same outputs as eager")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ("cuda" if torch.cuda.is_available() else "cpu"))
