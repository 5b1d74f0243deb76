#!/usr/bin/env bash
# Issue 16's open bar: the preset head on code (HumanEval) tied suffix (1.96 tokens per target step each,
# ../../2026-11-27/preset_2threads), and the preset's data holds no code-completion request. This run trains the
# preset as a user runs it (one process on both cores, 60 minutes and the 4M-token cap, whichever first; features
# extracted before the clock) on its 4,000 ShareGPT first turns plus the target's greedy answers to 1,059
# code-completion prompts made from the installed Python standard library (make_code_prompts.py: a public function
# or method's signature and docstring, asked in the code workload's words; no HumanEval problem), through data.also.
# Served in one run per workload with no speculation, ngram and suffix on the same prompts as preset_2threads
# (prompts.jsonl copied from there: its 64 held-out chat prompts; the first 40 MT-Bench and 40 HumanEval); batch 8,
# greedy, k=3. The preset arm is preset_2threads's committed figures (its counters reproduced exactly in every
# later served run that included it).
set -euo pipefail
cd "$(dirname "$0")/../../../.."  # the repo root
O=bench/results/2026-11-28/preset_code
. .venv/bin/activate
mkdir -p $O/data
[ -f $O/data/stdlib_prompts.jsonl ] || python $O/make_code_prompts.py $O/data/stdlib_prompts.jsonl
draftsmith regenerate --target smollm2 --data $O/data/stdlib_prompts.jsonl --out $O/data/stdlib.jsonl --max-tokens 256
python bench/acceptance_per_minute.py --out $O --minutes 60 --tokens 4000000 \
  --levers preset+alsostdlib --curve preset+alsostdlib --curve-every 400 --curve-sim-only \
  --num-prompts 64 --workloads mtbench,code
echo done
