#!/usr/bin/env bash
# Session 15: Nsight Compute on forward variants, one process each (scripts/ncu_fwd.py). Writes $OUT/ncu/*.txt.
# Usage (device): bash scripts/ncu_fwd.sh D ROWS 'name=json' ...
set -u
d=$1; rows=$2; shift 2
mkdir -p "$OUT/ncu"
stalls=""
for r in barrier branch_resolving dispatch_stall drain imc_miss lg_throttle long_scoreboard math_pipe_throttle \
  membar mio_throttle misc no_instruction not_selected selected short_scoreboard sleeping tex_throttle wait; do
  stalls="$stalls,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
done
stalls=${stalls#,}
ncu --version | tail -1
for spec in "$@"; do
  name=${spec%%=*}; var=${spec#*=}
  timeout 150 ncu --clock-control none --nvtx --nvtx-include "prof/" --set full \
    --metrics "$stalls" python3 scripts/ncu_fwd.py "$var" "$d" "$rows" > "$OUT/ncu/$name.txt" 2>&1
  echo "== $name rc=$?"
  grep -E "^    (Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per Thread|Executed Ipc Active|Issue Slots Busy|No Eligible|Active Warps Per Scheduler|Eligible Warps Per Scheduler|Warp Cycles Per Issued Instruction|Block Limit Registers|Block Limit Shared Mem|Dynamic Shared Memory Per Block|L1/TEX Hit Rate|L2 Hit Rate|Waves Per SM)" "$OUT/ncu/$name.txt"
  grep -E "issue_stalled" "$OUT/ncu/$name.txt" | awk '$NF+0 > 0.05' | sed 's/smsp__average_warps_issue_stalled_//'
  grep -iE "est. speedup" "$OUT/ncu/$name.txt" | head -6
done
