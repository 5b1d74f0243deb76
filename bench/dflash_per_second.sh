#!/bin/bash
# Per second: a DFlash quickstart's head served at several k and batch sizes beside none, ngram and suffix, its k
# schedule from the sweep, and where each engine step's time went.
#
#   bash bench/dflash_per_second.sh QUICKSTART_OUT OUT
#
# QUICKSTART_OUT is a `draftsmith quickstart --family dflash` output dir (its run, exported head at k=3 and held-out
# prompts). Trains nothing. Per k in K (default "3 7"; each at most the head's block_size - 1) the run is exported
# again at that k (OUT/dflash_kK; the quickstart's own export serves k=3), then per workload in WORKLOADS (default
# "chat code": the quickstart's held-out chat prompts, HumanEval) one `draftsmith eval acceptance` with
# --batch-sizes SIZES (default 1,8) --k K --num-prompts NUM_PROMPTS (default 12), the command's defaults otherwise
# (greedy, 128 tokens, REPEATS rounds, default 1); ngram and suffix are served at the first k only (theirs is the same
# k), none at every k (each speed-up is over no speculation in the same run). OTHERS="NAME=DIR ..." adds exported heads
# of other families (an EAGLE-3, a P-EAGLE head) to the k=3 runs.
# Then `draftsmith eval schedule --head dflash` over every run (OUT/schedule_dflash.json) and bench/step_breakdown.py
# over every run (OUT/step_breakdown/).
# DRY=1 prints the commands ("+ ...") and runs none (tests/test_bench_scripts.py checks them).
set -euo pipefail
QS=${1:?usage: bench/dflash_per_second.sh QUICKSTART_OUT OUT}
OUT=${2:?usage: bench/dflash_per_second.sh QUICKSTART_OUT OUT}
K=${K:-3 7}
SIZES=${SIZES:-1,8}
WORKLOADS=${WORKLOADS:-chat code}
NUM_PROMPTS=${NUM_PROMPTS:-12}
OTHERS=${OTHERS:-}
REPEATS=${REPEATS:-1}
. "$(dirname "$0")/mlp_arms.sh"  # run, workload_prompts (DRY=1 prints the commands)
[ "$DRY" = 1 ] || mkdir -p "$OUT"
runs=()
first=1
for k in $K; do
  [ -f "$OUT/dflash_k$k/config.json" ] && [ "$DRY" != 1 ] || \
    run draftsmith export --format vllm "$QS" "$OUT/dflash_k$k" --k "$k" --force
  methods=none extra=()
  if [ "$first" = 1 ]; then
    methods=none,ngram,suffix
    if [ "$k" = 3 ]; then for h in $OTHERS; do extra+=(--head "$h"); done; fi
  fi
  for w in $WORKLOADS; do
    dir=$OUT/${w}_k$k
    runs+=("$dir")
    [ "$DRY" != 1 ] && [ -f "$dir/acceptance.json" ] && continue  # an earlier call's run: kept
    run draftsmith eval acceptance --target smollm2 --head "dflash=$OUT/dflash_k$k" "${extra[@]}" --methods "$methods" \
      --prompts "$(workload_prompts "$QS" "$w")" --num-prompts "$NUM_PROMPTS" --batch-sizes "$SIZES" --k "$k" --repeats "$REPEATS" --out "$dir"
  done
  first=0
done
run draftsmith eval schedule --head dflash "${runs[@]}" --out "$OUT/schedule_dflash.json"
evals=()
for dir in "${runs[@]}"; do evals+=(--eval "$dir"); done
run python bench/step_breakdown.py "${evals[@]}" --out "$OUT/step_breakdown"
