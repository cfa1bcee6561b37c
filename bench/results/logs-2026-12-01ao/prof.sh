#!/usr/bin/env bash
# Session ao: where the decode kernel's time goes at the shapes that run 2-4 CTAs an SM
# (16384^2: two, 28672 x 4096: four), which top out near 3 TB/s on an H200 at M = 1 while
# the 4096-row shapes (one CTA an SM) were profiled by session aj. ncu's Source page
# (gpu_session.sh ncusrc) plus its SpeedOfLight / memory / occupancy sections, and the
# graph times of the same calls.
#   OUT=$OUT bash bench/results/logs-2026-12-01ao/prof.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
CASES=${CASES:-"16384x16384:nvfp4:1 28672x4096:nvfp4:1 16384x16384:mxfp8:1"}
QUICK=1 OUT="$OUT/p" bash scripts/gpu_session.sh build > "$OUT/build.txt" 2>&1 || { tail -20 "$OUT/build.txt"; exit 1; }
NCU_CASES="$CASES" OUT="$OUT/p" bash scripts/gpu_session.sh ncusrc 2>&1 | tail -5
for c in $CASES; do
  IFS=: read -r shp md mm <<< "$c"
  SHAPE=$shp MODE=$md M=$mm timeout 150 ncu --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats \
    --launch-skip 3 --launch-count 1 -k regex:qmmp python3 bench/tune/ncu_dec.py > "$OUT/p/logs/ncu_sol-$shp-$md-m$mm.txt" 2>&1
  grep -E "Duration|DRAM Throughput|Memory Throughput|L2 Cache Throughput|Achieved Occupancy|Issue Slots Busy|Registers Per|Shared Memory Config|Block Limit|Waves Per SM" "$OUT/p/logs/ncu_sol-$shp-$md-m$mm.txt" | tr -s ' ' | head -20
done
for f in "$OUT"/p/logs/ncu_src-*-sass.csv; do python3 bench/tune/ncu_source_summary.py "$f"; echo; done > "$OUT/p/logs/ncu_src-summary.txt" 2>&1
gzip -f "$OUT"/p/logs/*-sass.csv; rm -f "$OUT"/p/logs/*.ncu-rep
LAYOUTS=decode MS=1,16 SHAPES=16384x16384,28672x4096 MODES=nvfp4,mxfp8 timeout 120 python3 bench/tune/decode_graph.py > "$OUT/p/logs/decode_graph.txt" 2>&1; tail -12 "$OUT/p/logs/decode_graph.txt"
tar czf "$OUT/prof.tgz" -C "$OUT" p && rm -rf "$OUT/p"
