#!/bin/bash
# The MLP speculator's stage-2 A/B: stage 1 only, stage 1 then stage 2, stage 2 only, at equal training minutes, then
# every head served in one vLLM run per workload.
#
#   bash bench/mlp_stage2.sh OUT [MINUTES]        (default 6 minutes of training per arm, split in half for 1+2)
#
# Each run is `train/run.py conf=mlp_smollm2` with these overrides, and only these:
#   data.num_conversations=2394 data.also=[]   the quickstart's data on a 2-core AVX512-BF16 machine (the target's
#                                              answers to ShareGPT first turns), as bench/mlp_levers.sh
#   optim.max_minutes=MINUTES (or MINUTES/2)   the equal clock (the continuations' generation and feature extraction
#                                              run before it, once, and are reported beside it)
#   eval_every / save_every: past the end       one held-out eval and checkpoint, at the end
#   stage2.num_prompts=S2_PROMPTS (default 512) prompts cut from those samples, each continued by the target for the
#                                              preset's 256 greedy tokens (the preset's 256 prompts would be seen ~8
#                                              times in 6 minutes)
#   the arm: s1 (nothing more); s1s2: a MINUTES/2 stage-1 run, then head.stage=2 head.init_from=<it> for MINUTES/2;
#   s2: head.stage=2 head.init_from=scratch (stage 2 from a fresh head)
# Served: 16 held-out chat prompts and 16 MT-Bench prompts, greedy, k=3, 128 tokens, batch 8, against none, ngram
# and suffix (`draftsmith eval acceptance`).
set -euo pipefail
. "$(dirname "$0")/mlp_arms.sh"  # run, arm, serve (DRY=1 prints the commands)
OUT=${1:?usage: bench/mlp_stage2.sh OUT [MINUTES]}
MINUTES=${2:-6}
HALF=$(python -c "print($MINUTES / 2)")
S2_PROMPTS=${S2_PROMPTS:-512}
mkdir -p "$OUT"
COMMON=(conf=mlp_smollm2 data.num_conversations=2394 "data.also=[]"
  eval_every=1000000 save_every=1000000 "stage2.num_prompts=$S2_PROMPTS")
arm s1 "optim.max_minutes=$MINUTES"
arm s1_half "optim.max_minutes=$HALF"
arm s1s2 "optim.max_minutes=$HALF" head.stage=2 "head.init_from=$OUT/s1_half"
arm s2 "optim.max_minutes=$MINUTES" head.stage=2 head.init_from=scratch
HEADS=(--head "s1=$OUT/s1/exported" --head "s1s2=$OUT/s1s2/exported" --head "s2=$OUT/s2/exported")  # not s1_half
serve s1 16
