#!/bin/bash
# A SmolLM2 head brought in from another project's layout, fine-tuned with our recipe, served before and after.
#
#   bash bench/convert_finetune.sh RUN OUT [MINUTES]
#
# RUN: a draftsmith run of the eagle3_smollm2 preset (its held-out prompts are the served ones). No hub here, so the
# foreign head is made from it: `draftsmith convert RUN OUT/specforge --to specforge` writes SpecForge's layout
# (midlayer.*, its own embed_tokens copy, aux ids in SpecForge's numbering). From there on everything is what a user
# holding a SpecForge head types:
#   1. draftsmith convert OUT/specforge OUT/converted --from specforge --target smollm2
#   2. python train/run.py conf=eagle3_smollm2 output_dir=OUT/tuned optim.max_minutes=MINUTES + the overrides convert
#      printed (head.init_from=OUT/converted and the head's shape: head.family, target.aux_layer_ids,
#      head.draft_vocab_size, head.intermediate_size, head.num_layers, head.norm_before_residual, head.norm_before_fc,
#      head.fc_norm) + RUN's data at RUN's size (data.also=[] data.num_conversations=500 data.features_backend=vllm: the
#      features RUN's extraction cached are read, not extracted again) + eval_every=0 wandb.mode=disabled
#   3. both exported at k=3, served in vLLM by `draftsmith eval acceptance` on RUN's 128 held-out chat prompts
#      (greedy, 128 tokens, batch 8) beside no speculation.
# DRY=1 prints the commands ("+ ...") and runs none (tests/test_bench_scripts.py checks them).
set -euo pipefail
RUN=${1:?usage: bench/convert_finetune.sh RUN OUT [MINUTES]}
OUT=${2:?usage: bench/convert_finetune.sh RUN OUT [MINUTES]}
MINUTES=${3:-10}
. "$(dirname "$0")/mlp_arms.sh"  # run (DRY=1 prints the commands)
DATA=(data.also=[] data.num_conversations=500 data.features_backend=vllm)
[ "$DRY" = 1 ] || mkdir -p "$OUT"
run draftsmith convert "$RUN" "$OUT/specforge" --to specforge --force
run draftsmith convert "$OUT/specforge" "$OUT/converted" --from specforge --target smollm2 --force
INIT=("head.init_from=$OUT/converted")
if [ "$DRY" != 1 ]; then  # the overrides convert printed (its output again: it is deterministic)
  draftsmith convert "$OUT/specforge" "$OUT/converted" --from specforge --target smollm2 --force > "$OUT/convert.log"
  read -r -a INIT <<< "$(grep -o 'head.init_from=.*' "$OUT/convert.log")"
fi
run python train/run.py conf=eagle3_smollm2 "output_dir=$OUT/tuned" "optim.max_minutes=$MINUTES" "${INIT[@]}" \
  "${DATA[@]}" eval_every=0 wandb.mode=disabled
run draftsmith export --format vllm "$OUT/converted" "$OUT/start" --k 3 --force
run draftsmith export --format vllm "$OUT/tuned" "$OUT/tuned_export" --k 3 --force
run draftsmith eval acceptance --target smollm2 --head "converted=$OUT/start" --head "tuned=$OUT/tuned_export" \
  --methods none --prompts "$RUN/heldout_prompts.jsonl" --num-prompts 128 --max-tokens 128 --k 3 --batch-size 8 \
  --out "$OUT/acceptance"
