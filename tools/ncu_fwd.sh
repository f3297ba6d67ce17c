#!/usr/bin/env bash
# Nsight Compute on forward variants, one process each (tools/ncu_fwd.py): duration, DRAM and memory throughput,
# occupancy, registers, issue slots, instructions and the stall reasons. Writes $OUT/ncu/NAME.txt (OUT defaults to
# outputs) and prints the headline metrics of each.
#   bash tools/ncu_fwd.sh D ROWS NAME=SWITCHES ...
#   e.g. bash tools/ncu_fwd.sh 128 262144 shipped='{}' fast='{"EXACT": 0}' add=add
set -u
usage() { sed -n '2,6s/^# \{0,1\}//p' "$0"; }
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then usage; exit 0; fi
if [ $# -lt 3 ]; then usage >&2; exit 2; fi
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-outputs}
d=$1; rows=$2; shift 2
mkdir -p "$out/ncu"
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
    --metrics "$stalls" python3 "$here/ncu_fwd.py" "$var" "$d" "$rows" > "$out/ncu/$name.txt" 2>&1
  echo "== $name rc=$?"
  grep -E "^    (Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per Thread|Executed Ipc Active|Issue Slots Busy|No Eligible|Active Warps Per Scheduler|Eligible Warps Per Scheduler|Warp Cycles Per Issued Instruction|Block Limit Registers|Block Limit Shared Mem|Dynamic Shared Memory Per Block|L1/TEX Hit Rate|L2 Hit Rate|Waves Per SM)" "$out/ncu/$name.txt"
  grep -E "issue_stalled" "$out/ncu/$name.txt" | awk '$NF+0 > 0.05' | sed 's/smsp__average_warps_issue_stalled_//'
  grep -iE "est. speedup" "$out/ncu/$name.txt" | head -6
done
