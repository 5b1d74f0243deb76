#!/usr/bin/env bash
# MLP speculator stage 1, 8 minutes each, side by side on one thread each: AdamW 1e-3 (the preset) vs Muon 3e-3.
set -euo pipefail
cd "$(dirname "$0")/../../../.."  # the repo root
out=bench/results/2026-11-26/mlp_muon_ab
mkdir -p $out/runs
for L in adamw muon; do
  if [ $L = adamw ]; then o="optim.name=adamw optim.lr=1e-3"; else o="optim.name=muon optim.lr=3e-3"; fi
  OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 .venv/bin/python train/run.py conf=mlp_smollm2 output_dir=$out/runs/$L run_name=mlp_$L \
    wandb.mode=disabled eval_every=0 save_every=100000 $o > $out/runs/$L.log 2>&1 &
done
wait
for L in adamw muon; do .venv/bin/draftsmith export --format vllm $out/runs/$L $out/exported/$L > $out/runs/export_$L.log 2>&1; done
.venv/bin/python - <<'PY'
import json
from draftsmith.eval.acceptance import run_acceptance
out = "bench/results/2026-11-26/mlp_muon_ab"
r = run_acceptance("smollm2", f"{out}/runs/adamw/heldout_prompts.jsonl", ["ngram", "suffix"],
                   {"mlp_adamw": f"{out}/exported/adamw", "mlp_muon": f"{out}/exported/muon"},
                   k=3, max_tokens=128, num_prompts=32, out_dir=f"{out}/acceptance", batch_size=8)
for m, row in r["methods"].items():
    print(m, row.get("tokens_per_target_step"), row.get("mean_acceptance_length"), row.get("per_position_acceptance"), row.get("match_vs_none"), flush=True)
PY
