#!/usr/bin/env bash
# the head for the HTTP record: the preset with these overrides (data.also=[] data.num_conversations=500
# data.features_backend=vllm optim.max_minutes=12), exported at k=3, its hybrid fitted with fit-hybrid's defaults
set -euo pipefail
cd .; . .venv/bin/activate
OUT=${1:-<tmp>/bench/record}
mkdir -p $OUT
draftsmith export --format vllm <tmp>/bench/run <tmp>/bench/exported --k 3 --force
draftsmith eval fit-hybrid --target smollm2 --head <tmp>/bench/exported 2>&1 | tail -5
python bench/serve_http.py --head <tmp>/bench/exported --prompts <tmp>/bench/run/heldout_prompts.jsonl \
    --num-prompts 16 --max-tokens 128 --levels 1,8 --out $OUT
