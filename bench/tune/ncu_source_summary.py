"""Summary of ncu's Source page as CSV (scripts/gpu_session.sh step ncusrc writes it): the
kernel, its warp-stall samples by reason, executed warp instructions and samples by opcode,
and the 25 SASS instructions with the most samples (their top three stall reasons).

    python bench/tune/ncu_source_summary.py ncu_src-4096x14336-nvfp4-m1-sass.csv
"""
import collections
import csv
import sys

SAMPLES, EXECUTED = "Warp Stall Sampling (All Samples)", "Instructions Executed"


def main(path: str) -> None:
    with open(path) as f:
        rows = list(csv.reader(f))
    kernel, hdr, data = rows[0][1], rows[1], rows[2:]
    col = {h: i for i, h in enumerate(hdr)}

    def num(r, name):  # the page leaves "-" or "" where a counter does not apply
        try:
            return float(r[col[name]])
        except ValueError:
            return 0.0

    tot = sum(num(r, SAMPLES) for r in data)
    ex = sum(num(r, EXECUTED) for r in data)
    print(kernel[:110])
    print("samples", tot, "warp instr executed", ex)
    reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    by_reason = sorted(((sum(num(r, h) for r in data), h[6:]) for h in reasons), reverse=True)
    print("stall reasons (share of samples):", ", ".join(f"{n} {v / tot:.3f}" for v, n in by_reason if v / tot > 0.005))
    ops, samp = collections.Counter(), collections.Counter()
    for r in data:
        words = r[col["Source"]].split()
        op = (words[1] if words and words[0].startswith("@") else words[0] if words else "?").split(".")[0]
        ops[op] += num(r, EXECUTED)
        samp[op] += num(r, SAMPLES)
    print("executed by opcode:", ", ".join(f"{k} {v / ex:.3f}" for k, v in ops.most_common(18)))
    print("samples by opcode:", ", ".join(f"{k} {v / tot:.3f}" for k, v in samp.most_common(14)))
    for r in sorted(data, key=lambda r: -num(r, SAMPLES))[:25]:
        top3 = sorted(((num(r, h), h[6:]) for h in reasons), reverse=True)[:3]
        print(f"{r[col['Address']][-5:]} {num(r, SAMPLES) / tot:6.3f} ex={int(num(r, EXECUTED)):8d} "
              f"{r[col['Source']].strip()[:60]:60s} " + " ".join(f"{n}:{int(v)}" for v, n in top3 if v))


if __name__ == "__main__":
    main(sys.argv[1])
