import numpy as np, torch, qq, sys
sys.path.insert(0, "tests")
torch.manual_seed(0)
e, n, k = 8, 128, 256
w = torch.randn(e, n, k, dtype=torch.bfloat16, device="cuda")
qa = qq.quantize(w, mode="nvfp4", torch_dtypes=False)
dw = qq.prepare_decode(qa)
x = torch.randn(4, 1, 1, k, dtype=torch.bfloat16, device="cuda")
for idx in ([[1, 9], [3, -1]], [[1, 1], [1, 1]], [[2, 3], [2, 3]], [[0, 1], [2, 3]]):
    i = torch.tensor(idx * 2, dtype=torch.int32, device="cuda")[: x.shape[0]]
    for rep in range(3):
        got = qq.gather_qmm(x, dw, rhs_indices=i, dtype="float32")
        r = qq.last_route()
        pk = qq.gather_qmm(x, qa, rhs_indices=i, dtype="float32")
        g, p = got.cpu().numpy(), pk.cpu().numpy()
        d = np.abs(np.nan_to_num(g - p, nan=1e9)).max(axis=(-1, -2))
        print(idx, r, "max|decode-packed| per entry:", np.round(d, 3).tolist(), "nan rows:", np.isnan(g).all(axis=(-1,-2)).astype(int).tolist(), flush=True)
