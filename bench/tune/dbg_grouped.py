import os, numpy as np, torch, qq
torch.manual_seed(0)
e, n, k = 8, 128, 256
w = torch.randn(e, n, k, dtype=torch.bfloat16, device="cuda")
qa = qq.quantize(w, mode="nvfp4", torch_dtypes=False)
dw = qq.prepare_decode(qa)
for T, idx in ((4, [[1, 1]]), (4, [[1, 6], [3, 5]] * 2), (2, [[1, 9], [3, -1]]), (8, [[2, 3]])):
    x = torch.randn(T, 1, 1, k, dtype=torch.bfloat16, device="cuda")
    i = torch.tensor(idx, dtype=torch.int32, device="cuda")
    i = i.expand(T, 2).contiguous() if i.shape[0] == 1 else i
    out = torch.full((T, 2, 1, n), 7777.0, dtype=torch.float32, device="cuda")
    qq.gather_qmm(x, dw, rhs_indices=i, dtype="float32", out=out)
    r = qq.last_route()
    pk = qq.gather_qmm(x, qa, rhs_indices=i, dtype="float32").cpu().numpy()
    g = out.cpu().numpy()
    unw = (g == 7777.0).all(axis=(-1, -2)).astype(int)
    ok = (np.abs(np.nan_to_num(g - pk, nan=0.0)) < 1e-2).all(axis=(-1, -2)).astype(int)
    print(T, idx[:2], r, "unwritten:", unw.tolist(), "ok:", ok.tolist(), flush=True)
