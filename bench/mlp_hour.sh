#!/usr/bin/env bash
# The MLP speculator's 60-minute preset, as a user runs it, its hybrid fitted, served on the prompts of EAGLE-3's hour
# (bench/results/2026-11-28/bs2048_code_60) against ngram, suffix and no speculation, then per second at batch 1
# beside an EAGLE-3 head.
#
#   bash bench/mlp_hour.sh OUT [EAGLE3_HEAD]
#
# Training is `python train/run.py conf=mlp_smollm2` with one override: data.features_backend=vllm (the quickstart's
# choice where vLLM is installed; it changes how the features are extracted before the clock, not the training).
# The head's hybrid: `draftsmith eval fit-hybrid` as typed (64 ShareGPT first turns after the trained ones, 256
# tokens), the run's held-out prompts excluded. Served, per table one `draftsmith eval acceptance` run with none,
# ngram and suffix beside the head and hybrid(mlp), greedy, k=3, 128 tokens, batch 8 (the hour record's settings):
# chat = the 64 held-out prompts the hour record served (the preset's held-out split, which both families share),
# MT-Bench and HumanEval = the record's 40 of each (stored by hash in bench/results/prompts). Per second: 12 prompts
# per workload at batch 1 (`--batch-sizes 1`, a fresh engine per method), the MLP head and hybrid(mlp) beside
# EAGLE3_HEAD (an exported EAGLE-3 head; none given: the MLP head alone).
# A/B knobs, off unless set: CONVERSATIONS=N adds data.num_conversations=N (the data-size arm: the shipped pool answers
# ShareGPT's first 8,000 first turns, so up to 8,000 costs extraction only); ALSO=LIST adds data.also=LIST (the sets
# trained beside ShareGPT, e.g. ALSO='[regen:pycode:stdlib]'); BATCH1=0 skips the batch-1 stage.
set -euo pipefail
. "$(dirname "$0")/mlp_arms.sh"  # run (DRY=1 prints the commands)
OUT=${1:?usage: bench/mlp_hour.sh OUT [EAGLE3_HEAD]}
EAGLE3=${2:-}
RUN=$OUT/run
P=bench/results/prompts
declare -A PROMPTS=([chat]=$P/45e61292eed99095.jsonl [mtbench]=$P/ff0b10b41f4d00c3.jsonl [code]=$P/96ecb5c011178fdc.jsonl)
declare -A NUM=([chat]=64 [mtbench]=40 [code]=40)
mkdir -p "$OUT"
if [ ! -f "$RUN/exported/config.json" ]; then
  run python train/run.py conf=mlp_smollm2 data.features_backend=vllm \
    ${CONVERSATIONS:+"data.num_conversations=$CONVERSATIONS"} ${ALSO:+"data.also=$ALSO"} "output_dir=$RUN" resume=auto
  run draftsmith export --format vllm --force "$RUN" "$RUN/exported"
fi
if [ ! -f "$RUN/exported/hybrid.json" ]; then
  run draftsmith eval fit-hybrid --target smollm2 --head "$RUN/exported" --exclude "$RUN/heldout_prompts.jsonl" \
    --records "$OUT/hybrid_records.json"
fi
for w in chat mtbench code; do
  [ -f "$OUT/served_$w/acceptance.json" ] && continue
  run draftsmith eval acceptance --target smollm2 --head "mlp=$RUN/exported" --hybrid mlp --methods none,ngram,suffix \
    --prompts "${PROMPTS[$w]}" --num-prompts "${NUM[$w]}" --k 3 --max-tokens 128 --batch-size 8 --out "$OUT/served_$w"
done
[ "${BATCH1:-1}" = 0 ] && exit 0
HEADS=(--head "mlp=$RUN/exported" --hybrid mlp)
[ -n "$EAGLE3" ] && HEADS+=(--head "eagle3=$EAGLE3")
for w in chat mtbench code; do
  [ -f "$OUT/batch1_$w/acceptance.json" ] && continue
  run draftsmith eval acceptance --target smollm2 "${HEADS[@]}" --methods none,ngram,suffix \
    --prompts "${PROMPTS[$w]}" --num-prompts 12 --k 3 --max-tokens 128 --batch-sizes 1 --out "$OUT/batch1_$w"
done
