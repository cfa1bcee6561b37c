"""Index check, no GPU: colaff_kernel's fp32 tile (cuda/colwise.cu, aff_unit32) as the
affine_fp32_one_read patch uses it. Simulates the load stage's stores, the column pass's
reads and affine_tile_rows' reads for one 128 x 64 tile: every value lands where the readers
look, and no 8-lane phase (16-byte accesses) or warp step (4-byte reads) hits a bank twice.
Run: python3 bench/results/logs-2026-11-30am/check_affine_tile_index.py"""
import numpy as np

TM, TK = 128, 64


def unit32(c, mq):
    return c * (TM // 4) + (mq ^ ((c ^ (c >> 2)) & 7))


X = np.arange(TM * TK).reshape(TM, TK)
xt = np.full(TK * TM, -1)
conflicts = {"store": 0, "column reads": 0, "row reads": 0}
for tid in range(256):  # load stage: item (mq, kc), four rows' 4 columns, transposed
    for it in range(2):
        i = tid + it * 256
        mq, kc = i // 16, i % 16
        for j in range(4):
            u = unit32(4 * kc + j, mq)
            xt[u * 4:u * 4 + 4] = X[4 * mq:4 * mq + 4, 4 * kc + j]
assert (xt >= 0).all()
for w in range(8):
    for it in range(2):
        for j in range(4):
            for ph in range(4):
                lanes = range(8 * ph, 8 * ph + 8)
                i = [32 * w + l + it * 256 for l in lanes]
                conflicts["store"] += len({unit32(4 * (q % 16) + j, q // 16) % 8 for q in i}) < 8
    for u in range(8):  # column pass: column 8w + l % 8, rows 32p.., p = l // 8
        for ph in range(4):
            lanes = range(8 * ph, 8 * ph + 8)
            conflicts["column reads"] += len({unit32(8 * w + l % 8, 8 * (l // 8) + u) % 8 for l in lanes}) < 8
        for l in range(32):
            c, p = 8 * w + l % 8, l // 8
            uu = unit32(c, 8 * p + u)
            assert list(xt[uu * 4:uu * 4 + 4]) == list(X[32 * p + 4 * u:32 * p + 4 * u + 4, c])
    for j in range(32):  # affine_tile_rows: row 16w + l % 16, columns 32h + (j ^ 16h)
        banks = set()
        for l in range(32):
            h, mr = l // 16, 16 * w + l % 16
            banks.add((unit32(32 * h + (j ^ (16 * h)), mr // 4) * 4 + mr % 4) % 32)
        conflicts["row reads"] += len(banks) < 32
    for l in range(32):
        h, mr = l // 16, 16 * w + l % 16
        v = [xt[unit32(32 * h + (j ^ (16 * h)), mr // 4) * 4 + mr % 4] for j in range(32)]
        for p in range(4):  # v's chunk p is the row's chunk p ^ 2h
            q = 32 * h + 8 * (p ^ (2 * h))
            assert v[8 * p:8 * p + 8] == list(X[mr, q:q + 8])
print("values in place; bank conflicts:", conflicts)
assert not any(conflicts.values())
