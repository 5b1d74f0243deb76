#!/bin/bash
set -e
cd . && . .venv/bin/activate
O=<tmp>/pe
mkdir -p $O
python train/run.py conf=peagle_smollm2 output_dir=$O/peagle optim.max_minutes=12 data.also=[] data.num_conversations=500 data.features_backend=vllm wandb.mode=disabled > $O/train.log 2>&1
draftsmith export --format vllm $O/peagle $O/peagle_k3 --k 3 --force > $O/export.log 2>&1
P=(--prompts <tmp>/dfb/dflash/heldout_prompts.jsonl --num-prompts 24 --max-tokens 128)
H=(--head eagle3=<tmp>/dfb/eagle3_k3 --head peagle=$O/peagle_k3)
draftsmith eval acceptance --target smollm2 "${H[@]}" --methods none "${P[@]}" --batch-size 1 --k 3 --out $O/batch1_k3 > $O/b1.log 2>&1
draftsmith eval acceptance --target smollm2 "${H[@]}" --methods none "${P[@]}" --batch-size 8 --k 3 --out $O/batch8_k3 > $O/b8.log 2>&1
python bench/step_breakdown.py --eval $O/batch1_k3 --eval $O/batch8_k3 --out $O/step_breakdown > $O/sb.log 2>&1
echo DONE $(date)
