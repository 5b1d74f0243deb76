#!/bin/bash
# A training lever against a quickstart's own head at the quickstart's own minutes: the quickstart's training run
# again on its cached features with one arm's overrides, then both heads served beside none, ngram and suffix in one
# vLLM run per workload (64 held-out chat prompts, MT-Bench's first 40: bench/quickstart_reserve.sh's counts).
#
#   bash bench/quickstart_lever.sh QUICKSTART_OUT OUT [ARM]      (ARM: b1024, the default)
#
# Run it as the quickstart ran (DRAFTSMITH_CACHE, bench/slow_machine.sh's cap), so the arm trains at its speed. Each
# run is `train/run.py conf=eagle3_smollm2` with these overrides, and only these:
#   data.num_conversations=N data.heldout=64 data.also=[]   the quickstart's data (N and the minutes from its
#   data.features_backend=vllm                              plan.json; without one, the 2026-12-01 slow record's
#   optim.max_minutes=MINUTES                               778 turns and 16.2 minutes); features from the cache
#   plus the arm: b1024: data.max_tokens_per_batch=1024 optim.lr=3e-3 (twice the optimizer steps in a clock that
#   allows ~230 at the preset's 2,048; 3e-3 was the best of the 1,024-token lr sweep, docs/recipe.md)
# Served: greedy, k=3, 128 tokens, batch 8, the quickstart's head as `eagle3` and the arm's under its name.
# DRY=1 prints the commands ("+ ...") and runs none (tests/test_bench_scripts.py checks them).
set -euo pipefail
QS=${1:?usage: bench/quickstart_lever.sh QUICKSTART_OUT OUT [ARM]}
OUT=${2:?usage: bench/quickstart_lever.sh QUICKSTART_OUT OUT [ARM]}
ARM=${3:-b1024}
. "$(dirname "$0")/mlp_arms.sh"  # run, arm (DRY=1 prints the commands)
declare -A ARMS=([b1024]="data.max_tokens_per_batch=1024 optim.lr=3e-3")
[ -n "${ARMS[$ARM]+x}" ] || { echo "quickstart_lever.sh: unknown arm $ARM (known: ${!ARMS[*]})" >&2; exit 2; }
read -r turns minutes < <(python -c "import json, sys
try:
    p = json.load(open(sys.argv[1]))['plan']
    print(p['conversations'], (p.get('replanned') or {}).get('train_minutes', p['train_minutes']))
except FileNotFoundError:
    print(778, 16.2)" "$QS/plan.json")
COMMON=(conf=eagle3_smollm2 "data.num_conversations=$turns" data.heldout=64 "data.also=[]" data.features_backend=vllm
  "optim.max_minutes=$minutes")
[ "$DRY" = 1 ] || mkdir -p "$OUT"
# shellcheck disable=SC2086 # the arm's overrides are words
arm "$ARM" ${ARMS[$ARM]}
mt=$(python -c "from draftsmith.eval.prompts import mtbench_file; print(mtbench_file())")
for w in chat mtbench; do
  prompts=$QS/heldout_prompts.jsonl n=64
  [ "$w" = mtbench ] && prompts=$mt n=40
  [ -f "$OUT/served_$w/acceptance.json" ] && continue
  run draftsmith eval acceptance --target smollm2 --head "eagle3=$QS/exported" "${HEADS[@]}" \
    --methods none,ngram,suffix --prompts "$prompts" --num-prompts "$n" --k 3 --max-tokens 128 --batch-size 8 \
    --out "$OUT/served_$w"
done
