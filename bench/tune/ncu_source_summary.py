"""Summary of ncu's Source page as CSV (scripts/gpu_session.sh step ncusrc writes it): the
kernel, its warp-stall samples by reason, executed warp instructions and samples by opcode,
and the 25 SASS instructions with the most samples (their top three stall reasons).

    python bench/tune/ncu_source_summary.py ncu_src-4096x14336-nvfp4-m1-sass.csv
"""
import csv, sys, collections
f = sys.argv[1]
rows = list(csv.reader(open(f)))
hdr = rows[1]; data = rows[2:]
ix = {h: i for i, h in enumerate(hdr)}
def num(r, k):
    try: return float(r[ix[k]])
    except: return 0.0
tot = sum(num(r, "Warp Stall Sampling (All Samples)") for r in data)
ex = sum(num(r, "Instructions Executed") for r in data)
print(rows[0][1][:110]); print("samples", tot, "warp instr executed", ex)
reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
rt = {h: sum(num(r, h) for r in data) for h in reasons}
print("stall reasons (share of samples):", ", ".join(f"{k[6:]} {v/tot:.3f}" for k, v in sorted(rt.items(), key=lambda x: -x[1]) if v / tot > 0.005))
# opcode classes weighted by executed count
ops = collections.Counter(); samp = collections.Counter()
for r in data:
    src = r[ix["Source"]].strip()
    op = src.split()[0] if src else "?"
    if op.startswith("@"): op = src.split()[1]
    op = op.split(".")[0]
    ops[op] += num(r, "Instructions Executed"); samp[op] += num(r, "Warp Stall Sampling (All Samples)")
print("executed by opcode:", ", ".join(f"{k} {v/ex:.3f}" for k, v in ops.most_common(18)))
print("samples by opcode:", ", ".join(f"{k} {v/tot:.3f}" for k, v in samp.most_common(14)))
top = sorted(data, key=lambda r: -num(r, "Warp Stall Sampling (All Samples)"))[:25]
for r in top:
    s = num(r, "Warp Stall Sampling (All Samples)")
    det = sorted(((num(r, h), h[6:]) for h in reasons), reverse=True)[:3]
    print(f"{r[ix['Address']][-5:]} {s/tot:6.3f} ex={int(num(r,'Instructions Executed')):8d} {r[ix['Source']].strip()[:60]:60s} " + " ".join(f"{n}:{int(v)}" for v, n in det if v))
