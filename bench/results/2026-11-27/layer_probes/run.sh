#!/usr/bin/env bash
# Layer probes, not conclusions: which target layers feed the head's fc, screened at equal tokens on features
# extracted once with ten aux layers (the reader takes each run's columns; tests/test_extract.py checks that equals an
# extraction of exactly those layers). Each probe is the preset with other aux ids, trained on a fixed budget of
# 900k supervised tokens (the lr cosine follows the tokens, not the clock, so probes run in different pairs, or
# beside other jobs, stay comparable), two at a time side by side on one torch thread each, evaluated every 400 steps
# on the same held-out split; never served. A probe that leads goes to a served 60-minute A/B against the preset.
#   bash run.sh 'preset+offline+ids2-15-24,preset+offline+ids2-9-15-24'
set -euo pipefail
cd "$(dirname "$0")/../../../.."  # the repo root
W=out/features_wide  # ~14 GB of bf16 states for 1.13M tokens, outside the repo
.venv/bin/draftsmith extract --out $W --dtype bf16 conf=eagle3_smollm2 'target.aux_layer_ids=[1,2,4,6,9,12,15,18,21,24]'
.venv/bin/python bench/acceptance_per_minute.py --out bench/results/2026-11-27/layer_probes --tokens 900000 \
  --features-dir $W --levers "$1" --side-by-side --curve "$1" --curve-every 400 --curve-sim-only --train-only
