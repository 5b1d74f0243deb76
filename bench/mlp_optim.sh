#!/bin/bash
# The MLP speculator's optimizer levers not yet measured (weight decay, lr, batch tokens) at equal minutes, against
# the preset re-run in the same session, then every head served in one vLLM run per workload.
#
#   bash bench/mlp_optim.sh OUT [MINUTES]        (default 6 minutes of training per arm; ORDER="preset wd02" picks arms)
#
# The 60-minute preset runs ~4.6 passes over its data and ends far above its held-out accuracy (train 0.57 against
# held-out 0.44 on head 0): arms long enough for several passes over the quickstart's data show whether decay helps.
#
# Each run is `train/run.py conf=mlp_smollm2` with these overrides, and only these:
#   data.num_conversations=2394 data.also=[]   the quickstart's data on a 2-core AVX512-BF16 machine, as
#                                              bench/mlp_levers.sh and bench/mlp_stage2.sh (features from the cache)
#   optim.max_minutes=MINUTES                  the equal clock
#   eval_every / save_every: past the end       one held-out eval and checkpoint, at the end
#   plus the arm: preset (nothing more); wd02: optim.weight_decay=0.2 (eagle3_smollm2's); lr8e3: optim.lr=8e-3;
#   bs4096: data.max_tokens_per_batch=4096 data.max_batch_size=32 optim.lr=5.7e-3 (lr by the square root of the batch)
# Served: NUM_PROMPTS (default 16) held-out chat prompts and as many MT-Bench prompts, greedy, k=3, 128 tokens,
# batch 8, against none, ngram and suffix (`draftsmith eval acceptance`).
set -euo pipefail
. "$(dirname "$0")/mlp_arms.sh"  # run, arm, serve (DRY=1 prints the commands)
OUT=${1:?usage: bench/mlp_optim.sh OUT [MINUTES]}
MINUTES=${2:-6}
NUM_PROMPTS=${NUM_PROMPTS:-16}
mkdir -p "$OUT"
COMMON=(conf=mlp_smollm2 data.num_conversations=2394 "data.also=[]" "optim.max_minutes=$MINUTES"
  eval_every=1000000 save_every=1000000)
declare -A ARMS=(
  [preset]=""
  [wd02]="optim.weight_decay=0.2"
  [lr8e3]="optim.lr=8e-3"
  [bs4096]="data.max_tokens_per_batch=4096 data.max_batch_size=32 optim.lr=5.7e-3"
)
ORDER=(${ORDER:-preset wd02 bs4096 lr8e3})
for name in "${ORDER[@]}"; do
  # shellcheck disable=SC2086
  arm "$name" ${ARMS[$name]}
done
serve preset "$NUM_PROMPTS"
