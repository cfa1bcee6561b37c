#!/usr/bin/env bash
# Session bc, device call 2 (same machine, library built by nt2_ab.sh): the A/B again with the
# knob unset for the NT = 2 runs (call 1 set QQ_DECODE_NT1 to the empty string, which getenv
# sees: both arms were NT = 1), then memcheck / racecheck of the NT = 2 SwiGLU case alone.
set -uo pipefail
O=$OUT/g; mkdir -p $O
run() { LAYOUTS=decode MS=33,48,64 SHAPES=16384x16384,28672x4096 MODES=nvfp4,mxfp4,mxfp8 timeout 120 python3 bench/tune/decode_graph.py 2>&1 | grep -v "^$"; }
for r in 1 2; do
  echo "== round $r NT2"; env -u QQ_DECODE_NT1 bash -c "$(declare -f run); run"
  echo "== round $r NT1"; QQ_DECODE_NT1=1 bash -c "$(declare -f run); run"
done > $O/ab.txt 2>&1
cat $O/ab.txt | grep -E "==|M=64|M=33"
cat > $O/san.py <<'PY'
import numpy as np, cupy as cp, qq
rng = np.random.default_rng(7)
bad = 0
for mode in ("nvfp4", "mxfp8"):
    w = (rng.standard_normal((17408, 4096)) * 0.05).astype(np.float32)
    q = qq.quantize(cp.asarray(w), mode=mode)
    dw, dg = qq.prepare_decode(q), qq.prepare_decode(q, gated=True)
    for m in (20, 32):
        x = cp.asarray(rng.standard_normal((m, 4096)).astype(np.float16))
        got = qq.quantized_matmul_swiglu(x, dg).get(); r = qq.last_route()
        want = qq.swiglu(qq.quantized_matmul(x, dw)).get()
        ok = np.array_equal(got.view(np.uint16), want.view(np.uint16)); bad += not ok
        print(mode, m, r, "ok" if ok else "MISMATCH")
raise SystemExit(bad)
PY
for tool in memcheck racecheck; do
  timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 --print-limit 10 python3 $O/san.py > $O/san_$tool.txt 2>&1
  echo "$tool rc=$?"; tail -4 $O/san_$tool.txt
done
cd $O && tar czf $OUT/nt2b.tgz *.txt
