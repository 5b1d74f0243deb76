#!/usr/bin/env bash
# #17 with the preset head as make quickstart trains it (../preset_2threads, exported there and copied here):
# fit the hybrid policy the default way (the target's greedy answers to ShareGPT's first turns 4,001-4,064, which the
# head never saw), then serve MT-Bench, the workload where the hybrid stayed under 1.2x the best single method, with
# ../../2026-11-26/hybrid_preset4000/serve.py (the same script, run from there): none, ngram, suffix, the head and hybrid(head), 24
# prompts x 128 tokens, greedy, k=3, batch 1.
set -euo pipefail
cd "$(dirname "$0")/../../../.."  # the repo root
d=bench/results/2026-11-27/hybrid_2threads
[ -d $d/exported/preset ] || { mkdir -p $d/exported && cp -r bench/results/2026-11-27/preset_2threads/exported/preset $d/exported/; }
.venv/bin/draftsmith eval fit-hybrid --target smollm2 --head $d/exported/preset --records $d/exported/records_T0.pt
cp $d/exported/preset/hybrid.json $d/policy_fit_on_unseen_conversations.json
.venv/bin/python bench/results/2026-11-26/hybrid_preset4000/serve.py $d/served_T0 $d/exported/preset bench/results/2026-11-27/preset_2threads/prompts.jsonl mtbench
