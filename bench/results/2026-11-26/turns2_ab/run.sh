#!/usr/bin/env bash
# 40-minute A/B, side by side, one torch thread each: the preset's data plus each conversation's second user turn,
# asked after the target's own first answer (data.regen_turns=2; 2,809 of the 3,738 conversations have one), against
# the preset (first turns only). Both data sets prepared before the clock (regenerating the second turns took 61 min,
# extracting the turns-2 features 37 min: data preparation, not training minutes; 40 rather than the preset's 60
# training minutes is what the rest of the session held). Both checkpointed and evaluated every 400 steps on their
# own held-out split (the same 128 conversations, but turns2's held-out samples hold the second turn too, so the
# by-step simulated τ of the two levers is measured on different tokens; the served figures are the comparison);
# then with both cores free, served: the 64 held-out chat prompts of ../wd_ab (prompts.jsonl copied from there), the
# first 40 MT-Bench and 40 HumanEval prompts; batch 8, greedy, k=3.
set -euo pipefail
cd "$(dirname "$0")/../../../.."  # the repo root
out=bench/results/2026-11-26/turns2_ab
.venv/bin/python bench/acceptance_per_minute.py --out $out --minutes 40 --tokens 4000000 \
  --levers preset,preset+turns2 --side-by-side --curve preset,preset+turns2 --curve-every 400 --curve-sim-only \
  --num-prompts 64 --workloads mtbench,code
echo done
