#!/bin/bash
# A quickstart's head served again on more prompts than its own table: on a slow machine the quickstart serves only
# 16-19 prompts per workload to keep its budget, too few to tell a head from suffix decoding on chat (suffix's tokens
# per step moved 1.59-1.80 between prompt subsets of one held-out set). This serves the exported head beside none,
# ngram and suffix (and its hybrid, where the quickstart fitted one: its default) on 64 of the run's held-out chat prompts
# and MT-Bench's first 40, the counts of the hour records (a count of 0 leaves that workload out).
#
#   bash bench/quickstart_reserve.sh QUICKSTART_OUT OUT [CHAT_PROMPTS] [MTBENCH_PROMPTS]
#
# Knobs (environment): CODE=N also serves HumanEval's first N problems (OUT/code); SPEC_BENCH=N also serves N prompts
# of each of Spec-Bench's five task categories, translation, summarization, qa, math_reasoning and rag (OUT/specbench_
# CATEGORY, `eval acceptance --category`), from SPEC_BENCH_FILE (default: the shared data's
# spec_bench_questions.jsonl beside this checkout). bench/reserve_report.py then writes OUT/reserve.{json,md}: every
# workload's head, hybrid, ngram and suffix in one table.
#
# The served settings are the quickstart's (greedy, k=3, 128 tokens, batch 8; the head's name and the target's
# dtype from the quickstart's own acceptance.json); nothing is trained. Run it in the quickstart's environment
# (DRAFTSMITH_CACHE, any ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA cap): the target and kernels the head trained on.
# DRY=1 prints the commands ("+ ...") and runs none (tests/test_bench_scripts.py parses them).
set -euo pipefail
QS=${1:?usage: bench/quickstart_reserve.sh QUICKSTART_OUT OUT [CHAT_PROMPTS] [MTBENCH_PROMPTS]}
OUT=${2:?usage: bench/quickstart_reserve.sh QUICKSTART_OUT OUT [CHAT_PROMPTS] [MTBENCH_PROMPTS]}
CHAT=${3:-64}
MT=${4:-40}
. "$(dirname "$0")/mlp_arms.sh"  # run (DRY=1 prints the commands)
# the quickstart's own served run names the head (eagle3, peagle or mlp: --family) and the target's dtype
dtype=float32 head=eagle3
if [ -f "$QS/acceptance/chat/acceptance.json" ]; then
  read -r head dtype < <(python -c "import json, sys; d = json.load(open(sys.argv[1]))
print(next(m for m in d['methods'] if m not in ('none', 'ngram', 'suffix') and not m.startswith('hybrid(')),
      d['engine']['dtype'])" \
    "$QS/acceptance/chat/acceptance.json")
fi
# a quickstart (without --no-hybrid) fitted the head's policy into exported/hybrid.json: hybrid(HEAD) is served beside it
hybrid=()
[ -f "$QS/exported/hybrid.json" ] && hybrid=(--hybrid "$head")
CODE=${CODE:-0}
SPEC_BENCH=${SPEC_BENCH:-0}
SPEC_BENCH_FILE=${SPEC_BENCH_FILE:-$(cd "$(dirname "$0")/../.." && pwd)/shared/data/spec_bench_questions.jsonl}
mt=$(python -c "from draftsmith.eval.prompts import mtbench_file; print(mtbench_file())")
[ "$DRY" = 1 ] || mkdir -p "$OUT"
# workload name, prompt file (or HumanEval's `code`), prompts, and a Spec-Bench category (or -)
workloads=("chat $QS/heldout_prompts.jsonl $CHAT -" "mtbench $mt $MT -" "code code $CODE -")
for c in translation summarization qa math_reasoning rag; do
  workloads+=("specbench_$c $SPEC_BENCH_FILE $SPEC_BENCH $c")
done
for w in "${workloads[@]}"; do
  read -r name prompts n category <<<"$w"
  [ "$n" = 0 ] && continue
  [ -f "$OUT/$name/acceptance.json" ] && continue
  if [ "$prompts" = code ]; then
    prompts=$OUT/humaneval_prompts.jsonl
    [ "$DRY" = 1 ] || python -c "import sys; from draftsmith.eval.prompts import write_humaneval_prompts
write_humaneval_prompts(sys.argv[1])" "$prompts"
  fi
  only=()
  [ "$category" = - ] || only=(--category "$category")
  run draftsmith eval acceptance --target smollm2 --head "$head=$QS/exported" --methods none,ngram,suffix \
    "${hybrid[@]}" --prompts "$prompts" "${only[@]}" --num-prompts "$n" --k 3 --max-tokens 128 --batch-size 8 \
    --dtype "$dtype" --out "$OUT/$name"
done
[ "$DRY" = 1 ] || python "$(dirname "$0")/reserve_report.py" "$OUT"  # OUT/reserve.{json,md}: one table
