#!/usr/bin/env bash
# Per second, not per step: a P-EAGLE head against the EAGLE-3 head of the quickstart, served in vLLM at 1, 4, 8 and
# 16 concurrent requests next to ngram, suffix and no speculation, then each head's k schedule from the sweep and
# the heads served again with it.
#
#   bash bench/per_second.sh EAGLE3_RUN OUT
#
# EAGLE3_RUN is a `draftsmith quickstart` output dir (its exported head, held-out prompts and plan.json). The P-EAGLE
# head is trained with that plan's overrides and nothing else: the quickstart's own command with conf=peagle_smollm2
# (the same turns, training minutes and features, which the two families share). Overrides this harness adds to
# `eval acceptance`: --num-prompts (NUM_PROMPTS, default 12) and --batch-sizes 1,4,8,16; everything else is the
# command's default (k=3, 128 tokens, greedy). The runs served with the schedule add --repeats (REPEATS, default 3:
# each cell's ratio to no speculation is the median of three paired rounds) at SCHED_SIZES (default 4,8,16: at batch
# 1 the schedule's k is 3, the sweep's own setting). T1_SIZES (default 1,8) sweeps chat once more at temperature 1.
set -euo pipefail
RUN=$(realpath "$1")
OUT=$2
NUM_PROMPTS=${NUM_PROMPTS:-12}
SIZES=${SIZES:-1,4,8,16}
SCHED_SIZES=${SCHED_SIZES:-4,8,16}
REPEATS=${REPEATS:-3}
T1_SIZES=${T1_SIZES:-1,8}
WORKLOADS=${WORKLOADS:-chat mtbench code}
mkdir -p "$OUT"
. "$(dirname "$0")/mlp_arms.sh"  # workload_prompts

plan() { python -c "import json,sys; p=json.load(open('$RUN/plan.json'))['plan']; print(p[sys.argv[1]])" "$1"; }
PEAGLE=$OUT/peagle_run
if [ ! -d "$PEAGLE/exported" ]; then
  python -m draftsmith.train.run conf=peagle_smollm2 output_dir="$PEAGLE" \
    data.num_conversations="$(plan conversations)" data.also=[] optim.max_minutes="$(plan train_minutes)" resume=auto
  draftsmith export --format vllm "$PEAGLE" "$PEAGLE/exported"
fi

for w in $WORKLOADS; do
  [ -f "$OUT/sweep_$w/acceptance.json" ] && continue
  draftsmith eval acceptance --target smollm2 --head eagle3="$RUN/exported" --head peagle="$PEAGLE/exported" \
    --methods none,ngram,suffix --prompts "$(workload_prompts "$RUN" "$w")" --num-prompts "$NUM_PROMPTS" \
    --batch-sizes "$SIZES" --out "$OUT/sweep_$w"
done

for head in eagle3 peagle; do
  runs=()
  for w in $WORKLOADS; do runs+=("$OUT/sweep_$w"); done
  draftsmith eval schedule --head "$head" "${runs[@]}" --out "$OUT/schedule_$head.json"
done

for w in $WORKLOADS; do
  [ -f "$OUT/scheduled_$w/acceptance.json" ] && continue
  draftsmith eval acceptance --target smollm2 --head eagle3="$RUN/exported" --head peagle="$PEAGLE/exported" \
    --methods none --prompts "$(workload_prompts "$RUN" "$w")" --num-prompts "$NUM_PROMPTS" \
    --batch-sizes "$SCHED_SIZES" \
    --repeats "$REPEATS" --k-schedule eagle3="$OUT/schedule_eagle3.json" --k-schedule peagle="$OUT/schedule_peagle.json" \
    --out "$OUT/scheduled_$w"
done

if [ -n "$T1_SIZES" ] && [ ! -f "$OUT/t1_chat/acceptance.json" ]; then
  draftsmith eval acceptance --target smollm2 --head eagle3="$RUN/exported" --head peagle="$PEAGLE/exported" \
    --methods none,ngram,suffix --prompts "$(workload_prompts "$RUN" chat)" --num-prompts "$NUM_PROMPTS" \
    --batch-sizes "$T1_SIZES" --temperature 1 --out "$OUT/t1_chat"
fi
