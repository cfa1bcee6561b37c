export OUT; QUICK=1 bash scripts/gpu_session.sh build > $OUT/build.txt 2>&1; tail -1 $OUT/build.txt
F=build/cp312-cp312-linux_x86_64/libqq.so
cuobjdump -sass $F > /tmp/sass.txt 2>&1
python3 - <<'PY' > $OUT/sass_hist.txt
import re,collections
txt=open('/tmp/sass.txt').read()
for fn in re.split(r'\n\s+Function : ', txt)[1:]:
    name=fn.split('\n',1)[0]
    if not re.search(r'qm(md|ma)_kernelILi0ELi8E', name): continue
    ops=collections.Counter(re.findall(r'/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)', fn))
    print(name[60:110], sum(ops.values())); print(ops.most_common(50))
PY
cat $OUT/sass_hist.txt | cut -c1-1500
M="smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio,smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio,smsp__average_warps_issue_stalled_drain_per_issue_active.ratio,smsp__average_warps_issue_stalled_imc_miss_per_issue_active.ratio,smsp__average_warps_issue_stalled_tex_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_membar_per_issue_active.ratio,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_uniform.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_adu.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active"
for v in off on; do if [ $v = off ]; then export QQ_QMMD_OFF=1; else unset QQ_QMMD_OFF; export QQ_QMMD_CS=2; fi
  timeout 120 ncu --kernel-name regex:qmm --launch-skip 2 --launch-count 1 --metrics $M python3 bench/tune/profile_qmmd.py > $OUT/ncu_m_$v.txt 2>&1
  echo "== $v"; grep -E "stalled|pipe|issue_active|dram|duration|inst_executed.sum|warps_active" $OUT/ncu_m_$v.txt | awk '{print $1, $NF}' | sed 's/smsp__average_warps_issue_stalled_//;s/_per_issue_active.ratio//'
done
