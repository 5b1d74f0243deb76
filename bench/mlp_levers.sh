#!/bin/bash
# The MLP speculator's levers at equal minutes, then every head served in one vLLM run per workload.
#
#   bash bench/mlp_levers.sh OUT [MINUTES]        (default 6 minutes of training per lever)
#
# Each run is `train/run.py conf=mlp_smollm2` with these overrides, and only these:
#   data.num_conversations=2394 data.also=[]   the quickstart's data on a 2-core AVX512-BF16 machine (the target's
#                                              answers to ShareGPT first turns; its features are the quickstart's,
#                                              read from the cache: an EAGLE-3 extraction of the same samples serves)
#   optim.max_minutes=MINUTES                  the equal clock
#   eval_every / save_every: past the end       one held-out eval and checkpoint, at the end (not on the clock)
#   plus the lever: head.draft_vocab_size=0 (the target's 49,152 rows), optim.name=muon optim.lr=4e-3,
#   head.tie_weights=true, and the last two together
# Served: 16 held-out chat prompts and 16 MT-Bench prompts, greedy, k=3, 128 tokens, batch 8, against none, ngram
# and suffix (`draftsmith eval acceptance`).
set -euo pipefail
DRY=${DRY:-0}  # DRY=1 prints every command ("+ ...") and runs none (tests/test_bench_scripts.py parses them)
run() { echo "+ $*"; [ "$DRY" = 1 ] || "$@"; }
OUT=${1:?usage: bench/mlp_levers.sh OUT [MINUTES]}
MINUTES=${2:-6}
mkdir -p "$OUT"
COMMON=(conf=mlp_smollm2 data.num_conversations=2394 "data.also=[]" "optim.max_minutes=$MINUTES"
  eval_every=1000000 save_every=1000000)
declare -A LEVERS=(
  [full_adamw]="head.draft_vocab_size=0"
  [v4096_adamw]=""
  [v4096_muon]="optim.name=muon optim.lr=4e-3"
  [v4096_adamw_tied]="head.tie_weights=true"
  [v4096_muon_tied]="optim.name=muon optim.lr=4e-3 head.tie_weights=true"
)
ORDER=(full_adamw v4096_adamw v4096_muon v4096_adamw_tied v4096_muon_tied)
HEADS=()
for name in "${ORDER[@]}"; do
  # shellcheck disable=SC2086
  [ -f "$OUT/$name/exported/config.json" ] || {
    run python train/run.py "${COMMON[@]}" ${LEVERS[$name]} "output_dir=$OUT/$name" resume=auto
    run draftsmith export --format vllm --force "$OUT/$name" "$OUT/$name/exported"
  }
  HEADS+=(--head "$name=$OUT/$name/exported")
done
MT=$(python -c "from draftsmith.eval.prompts import mtbench_file; print(mtbench_file())")
for w in chat mtbench; do
  prompts=$OUT/full_adamw/heldout_prompts.jsonl
  [ "$w" = mtbench ] && prompts=$MT
  run draftsmith eval acceptance --target smollm2 "${HEADS[@]}" --methods none,ngram,suffix --prompts "$prompts" \
    --num-prompts 16 --k 3 --max-tokens 128 --batch-size 8 --out "$OUT/served_$w"
done
