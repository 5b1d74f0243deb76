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
#   the base the record measured, set in every arm (the preset before it took Muon and tied stages), so a re-run
#   compares the same arms: optim.name=adamw optim.lr=1e-3, head.tie_weights=false
#   plus the lever: head.draft_vocab_size=0 (the target's 49,152 rows), optim.name=muon optim.lr=4e-3,
#   head.tie_weights=true, and the last two together (v4096_muon_tied: what conf=mlp_smollm2 sets today)
# Served: 16 held-out chat prompts and 16 MT-Bench prompts, greedy, k=3, 128 tokens, batch 8, against none, ngram
# and suffix (`draftsmith eval acceptance`).
set -euo pipefail
. "$(dirname "$0")/mlp_arms.sh"  # run, arm, serve (DRY=1 prints the commands)
OUT=${1:?usage: bench/mlp_levers.sh OUT [MINUTES]}
MINUTES=${2:-6}
mkdir -p "$OUT"
COMMON=(conf=mlp_smollm2 data.num_conversations=2394 "data.also=[]" "optim.max_minutes=$MINUTES"
  eval_every=1000000 save_every=1000000)
ADAMW="optim.name=adamw optim.lr=1e-3"  # the record's base (the preset's before Muon and tied stages)
MUON="optim.name=muon optim.lr=4e-3"
declare -A LEVERS=(
  [full_adamw]="$ADAMW head.tie_weights=false head.draft_vocab_size=0"
  [v4096_adamw]="$ADAMW head.tie_weights=false"
  [v4096_muon]="$MUON head.tie_weights=false"
  [v4096_adamw_tied]="$ADAMW head.tie_weights=true"
  [v4096_muon_tied]="$MUON head.tie_weights=true"
)
ORDER=(full_adamw v4096_adamw v4096_muon v4096_adamw_tied v4096_muon_tied)
for name in "${ORDER[@]}"; do
  # shellcheck disable=SC2086
  arm "$name" ${LEVERS[$name]}
done
serve full_adamw 16
