#!/bin/bash
# The DFlash block drafter against EAGLE-3 and P-EAGLE at equal data and minutes on this machine, served side by side.
#
#   bash bench/dflash_equal_minutes.sh OUT [MINUTES]
#
# 1. python train/run.py conf=dflash_smollm2, conf=eagle3_smollm2 and conf=peagle_smollm2, each with
#    output_dir=OUT/{dflash,eagle3,peagle},
#    optim.max_minutes=MINUTES (default 12) and the same data: data.also=[] data.num_conversations=500
#    data.features_backend=vllm (one extraction, cached, read by all three: they share EAGLE-3's features), plus
#    wandb.mode=disabled; one run at a time, nothing else on the cores (a run dir with checkpoints is kept, so the
#    harness picks up where an earlier call stopped).
# 2. exported at k=3 (DFlash also at its whole block, block_size - 1, where the preset's block is larger than 4).
# 3. `draftsmith eval acceptance` on 24 of the runs' held-out chat prompts (greedy, 128 tokens), every output compared
#    with no speculation's: at batch 1 and k=3 none, ngram, suffix and the three heads; at batch 1 and that k none and
#    the DFlash head; at batch 8 and k=3 the six again. bench/step_breakdown.py then tabulates where each engine step's
#    time went (timed inside every engine those runs started).
# DRY=1 prints the commands ("+ ...") and runs none (tests/test_bench_scripts.py checks them).
set -euo pipefail
OUT=${1:?usage: bench/dflash_equal_minutes.sh OUT [MINUTES]}
MINUTES=${2:-12}
. "$(dirname "$0")/mlp_arms.sh"  # run (DRY=1 prints the commands)
DATA=(data.also=[] data.num_conversations=500 data.features_backend=vllm)
[ "$DRY" = 1 ] || mkdir -p "$OUT"
for FAMILY in dflash eagle3 peagle; do
  if [ "$DRY" != 1 ] && [ -d "$OUT/$FAMILY/checkpoints" ]; then continue; fi  # trained by an earlier call: kept
  run python train/run.py "conf=${FAMILY}_smollm2" "output_dir=$OUT/$FAMILY" "optim.max_minutes=$MINUTES" \
    "${DATA[@]}" wandb.mode=disabled
done
WHOLE=$(python -c "from draftsmith.train.config import compose_config
print(compose_config(['conf=dflash_smollm2']).head.block_size - 1)")  # the preset's whole block
run draftsmith export --format vllm "$OUT/dflash" "$OUT/dflash_k3" --k 3 --force
[ "$WHOLE" -gt 3 ] && run draftsmith export --format vllm "$OUT/dflash" "$OUT/dflash_k$WHOLE" --k "$WHOLE" --force
run draftsmith export --format vllm "$OUT/eagle3" "$OUT/eagle3_k3" --k 3 --force
run draftsmith export --format vllm "$OUT/peagle" "$OUT/peagle_k3" --k 3 --force
PROMPTS=(--prompts "$OUT/dflash/heldout_prompts.jsonl" --num-prompts 24 --max-tokens 128)
HEADS=(--head "eagle3=$OUT/eagle3_k3" --head "peagle=$OUT/peagle_k3" --head "dflash=$OUT/dflash_k3")
ran() { [ "$DRY" != 1 ] && [ -f "$1/acceptance.json" ]; }  # a run an earlier call finished: kept
ran "$OUT/batch1_k3" || run draftsmith eval acceptance --target smollm2 "${HEADS[@]}" --methods none,ngram,suffix \
  "${PROMPTS[@]}" --batch-size 1 --k 3 --out "$OUT/batch1_k3"
EVALS=(--eval "$OUT/batch1_k3" --eval "$OUT/batch8_k3")
if [ "$WHOLE" -gt 3 ]; then
  ran "$OUT/batch1_k$WHOLE" || run draftsmith eval acceptance --target smollm2 --head "dflash_k$WHOLE=$OUT/dflash_k$WHOLE" \
    --methods none "${PROMPTS[@]}" --batch-size 1 --k "$WHOLE" --out "$OUT/batch1_k$WHOLE"
  EVALS+=(--eval "$OUT/batch1_k$WHOLE")
fi
ran "$OUT/batch8_k3" || run draftsmith eval acceptance --target smollm2 "${HEADS[@]}" --methods none,ngram,suffix \
  "${PROMPTS[@]}" --batch-size 8 --k 3 --out "$OUT/batch8_k3"
run python bench/step_breakdown.py "${EVALS[@]}" --out "$OUT/step_breakdown"
