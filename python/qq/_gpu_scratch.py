# TEMPORARY scratch test for the device machine; deleted before handing back.
import gc
import numpy as np, ml_dtypes
import qq
def step(name, fn):
    try: print(f"[ok] {name}: {fn()}")
    except Exception as e: print(f"[{type(e).__name__}] {name}: {e}")
def desc(a): return f"{type(a).__module__}.{type(a).__name__} {getattr(a,'dtype','')} {tuple(getattr(a,'shape',()))} {getattr(a,'device','')}"
import torch, cupy, jax, jax.numpy as jnp
rng = np.random.default_rng(0)
w_np = rng.standard_normal((256, 512)).astype(np.float32)
ref = qq.quantize(w_np, mode="mxfp8"); dref = qq.dequantize(ref)
wc = cupy.asarray(w_np)
q = qq.quantize(wc, mode="mxfp8")
step("cupy dequantize default bf16", lambda: desc(qq.dequantize(q)))
step("cupy dequantize f16", lambda: desc(qq.dequantize(q, dtype=cupy.float16)))
wt = torch.from_numpy(w_np).cuda(); qt = qq.quantize(wt, mode="mxfp8")
o = torch.empty((256, 512), dtype=torch.bfloat16, device="cuda")
step("torch out=", lambda: (qq.dequantize(qt, out=o) is o, np.array_equal(o.view(torch.int16).cpu().numpy(), dref.view(np.int16))))
step("torch out wrong dtype", lambda: qq.dequantize(qt, out=o, dtype=torch.float32))
step("torch dtype obj", lambda: desc(qq.dequantize(qt, dtype=torch.float16)))
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    step("torch current side stream", lambda: desc(qq.quantize(wt, mode="nvfp4").data))
wj = jnp.asarray(w_np).astype(jnp.bfloat16)
qj = qq.quantize(wj, mode="mxfp8")
step("jax bf16 quantize", lambda: desc(qj.data))
step("jax dequantize", lambda: (desc(qq.dequantize(qj)), desc(qq.dequantize(qj, dtype=jnp.float32))))
step("jax out refused", lambda: qq.dequantize(qj, out=jnp.zeros((256, 512), jnp.bfloat16)))
step("jax qqmm NotSupported", lambda: qq.qqmm(wj, qj))
step("torch qmm NotSupported", lambda: qq.quantized_matmul(wt, qt))
step("jax stream int", lambda: desc(qq.amax(wj, stream=0)))
for i in range(200):
    qq.quantize(jnp.asarray(w_np), mode="nvfp4"); qq.quantize(wt, mode="nvfp4"); qq.quantize(wc, mode="nvfp4")
gc.collect(); torch.cuda.synchronize()
print("mem torch", torch.cuda.memory_allocated())
print("done")
