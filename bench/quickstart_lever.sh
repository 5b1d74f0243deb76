#!/bin/bash
# A training lever against a quickstart's own head at the quickstart's own minutes: the quickstart's training run
# again on its cached features with one arm's overrides, then both heads served beside none, ngram and suffix in one
# vLLM run per workload.
#
#   bash bench/quickstart_lever.sh QUICKSTART_OUT OUT [ARM...]
#
# ARM: b1024 (the default), acceptance, output, out3, doc, out3doc, lr8e-3, layers2, b4l2acc, b4l1acc, b4l2decay,
# b4l3acc, anchors128, eagle3 or peagle; several arms train one after another and are served together.
#
# Run it as the quickstart ran (DRAFTSMITH_CACHE, bench/slow_machine.sh's cap), so the arm trains at its speed. The
# arm's run is the quickstart's own training command, rebuilt from its plan.json (draftsmith.quickstart.plan's
# Plan.overrides: `train/run.py conf=PRESET` of its --family with these overrides, and only these):
#   data.num_conversations=N data.heldout=H     the quickstart's turns and held-out set
#   data.also=[...]                             its code share (the first C stdlib code answers), or [] without one
#   data.features_backend=vllm                  features from the cache the quickstart filled
#   optim.max_minutes=MINUTES                   its re-planned training minutes
#   and the quickstart's own extra overrides (none for a bare `draftsmith quickstart`), then the arm's:
#     b1024: data.max_tokens_per_batch=1024 optim.lr=3e-3 (twice the optimizer steps in the same clock)
#     acceptance: head.slot_weights=acceptance (a DFlash head's slots weighted by their share of the expected accepted
#       length, train/block_loss.py)
#     output: head.init=output (the target's final norm and lm_head rows of the draft vocab)
#     out3: head.init=output head.freeze_lm_head=true head.feature_loss=3.0 (an EAGLE-3 head's output side kept the
#       target's, each step's output also regressed onto the target's final state; docs/recipe.md, peer_output_side)
#     lr8e-3: optim.lr=8e-3
#     layers2: head.num_layers=2
#     b4l2acc: head.block_size=4 head.num_layers=2 head.slot_weights=acceptance (a DFlash block the size k=3 serves,
#       its rows' saving spent on a second layer); b4l1acc, b4l2decay and b4l3acc take it apart (one layer; decay
#       weights) and further (three layers)
#     anchors128: head.anchors=128 (a DFlash head's blocks per sequence per step, twice the preset's)
#     doc: plan.doc_prompts=DOC (default 200): the quickstart's data plus DOC long-document prompts answered by the
#       target (half "Summarize: TEXT", half a question answered from a text: train/data/doc_tasks.py), generated and
#       extracted before the clock starts; out3doc: out3's overrides and doc's data
#     eagle3, peagle: the same plan under another family's preset (conf=eagle3_smollm2 / peagle_smollm2 in place of
#       the quickstart's): what that family's quickstart would have trained on this data in these minutes
# Without a plan.json: the 2026-12-01 slow record's plan (778 turns, 64 held out, no code, 16.2 minutes, EAGLE-3).
# Served: greedy, k=3, 128 tokens, batch 8, the quickstart's head under its family's name and the arm's under its
# own, on CHAT (default 64) held-out chat prompts, MT (40) MT-Bench and CODE (0) HumanEval prompts (a count of 0
# leaves a workload out), and SPEC_BENCH (0) prompts of each of SPEC_BENCH_CATEGORIES (default all five task
# categories) from SPEC_BENCH_FILE (the shared data's Spec-Bench), beside METHODS (default none,ngram,suffix).
# DRY=1 prints the commands ("+ ...") and runs none (tests/test_bench_scripts.py checks them).
set -euo pipefail
QS=${1:?usage: bench/quickstart_lever.sh QUICKSTART_OUT OUT [ARM...]}
OUT=${2:?usage: bench/quickstart_lever.sh QUICKSTART_OUT OUT [ARM...]}
shift 2
ARMS_ASKED=("${@:-b1024}")
CHAT=${CHAT:-64}
MT=${MT:-40}
CODE=${CODE:-0}
METHODS=${METHODS:-none,ngram,suffix}
SPEC_BENCH=${SPEC_BENCH:-0}
SPEC_BENCH_CATEGORIES=${SPEC_BENCH_CATEGORIES:-translation summarization qa math_reasoning rag}
SPEC_BENCH_FILE=${SPEC_BENCH_FILE:-$(cd "$(dirname "$0")/../.." && pwd)/shared/data/spec_bench_questions.jsonl}
DOC=${DOC:-200}
. "$(dirname "$0")/mlp_arms.sh"  # run, arm, workload_prompts (DRY=1 prints the commands)
declare -A ARMS=([b1024]="data.max_tokens_per_batch=1024 optim.lr=3e-3" [acceptance]="head.slot_weights=acceptance"
  [output]="head.init=output" [out3]="head.init=output head.freeze_lm_head=true head.feature_loss=3.0"
  [lr8e-3]="optim.lr=8e-3" [layers2]="head.num_layers=2"
  [b4l2acc]="head.block_size=4 head.num_layers=2 head.slot_weights=acceptance"
  [b4l1acc]="head.block_size=4 head.num_layers=1 head.slot_weights=acceptance"
  [b4l2decay]="head.block_size=4 head.num_layers=2 head.slot_weights=decay"
  [b4l3acc]="head.block_size=4 head.num_layers=3 head.slot_weights=acceptance"
  [anchors128]="head.anchors=128" [eagle3]="family=eagle3" [peagle]="family=peagle"
  [out3doc]="head.init=output head.freeze_lm_head=true head.feature_loss=3.0 plan.doc_prompts=$DOC"
  [doc]="plan.doc_prompts=$DOC")
for ARM in "${ARMS_ASKED[@]}"; do
  [ -n "${ARMS[$ARM]+x}" ] || { echo "quickstart_lever.sh: unknown arm $ARM (known: ${!ARMS[*]})" >&2; exit 2; }
done
[ "$DRY" = 1 ] || mkdir -p "$OUT"
for ARM in "${ARMS_ASKED[@]}"; do
  # shellcheck disable=SC2086 # the arm's overrides are words
  mapfile -t LINES < <(python - "$QS/plan.json" "$OUT/$ARM" ${ARMS[$ARM]} <<'EOF'
import json, sys
from dataclasses import replace
from pathlib import Path
from draftsmith.quickstart.plan import PRESETS, Plan
path, out, arm = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
if path.is_file():
    saved = json.loads(path.read_text())
    key, plan = saved["key"], Plan(**saved["plan"])
else:
    key, plan = {}, Plan(None, 778, False, 16.2, 16, ["chat", "mtbench"], heldout=64)
family = key.get("family", "eagle3")
print(family)
# family=F: the arm trains under F's preset; its other words are overrides
preset = PRESETS[next((w.split("=", 1)[1] for w in arm if w.startswith("family=")), family)]
# plan.FIELD=N: the quickstart's plan with FIELD set (plan.doc_prompts: its long-document prompts added to its data)
plan = replace(plan, **{w[5:].split("=")[0]: int(w.split("=")[1]) for w in arm if w.startswith("plan.")})
arm = [w for w in arm if not w.startswith(("family=", "plan."))]
print(*[o for o in plan.overrides(Path(out), [*key.get("overrides", []), *arm], preset)
        if not o.startswith(("output_dir=", "resume="))], sep="\n")
EOF
  )
  [ "${#LINES[@]}" -ge 2 ] || { echo "quickstart_lever.sh: could not read $QS/plan.json (above)" >&2; exit 1; }
  FAMILY=${LINES[0]}
  COMMON=("${LINES[@]:1}")
  arm "$ARM"
done
for w in chat mtbench code; do
  n=$CHAT
  [ "$w" = mtbench ] && n=$MT
  [ "$w" = code ] && n=$CODE
  [ "$n" = 0 ] && continue
  [ -f "$OUT/served_$w/acceptance.json" ] && continue
  run draftsmith eval acceptance --target smollm2 --head "$FAMILY=$QS/exported" "${HEADS[@]}" \
    --methods "$METHODS" --prompts "$(workload_prompts "$QS" "$w")" --num-prompts "$n" --k 3 --max-tokens 128 \
    --batch-size 8 \
    --out "$OUT/served_$w"
done
for c in $SPEC_BENCH_CATEGORIES; do
  [ "$SPEC_BENCH" = 0 ] && break
  [ -f "$OUT/served_specbench_$c/acceptance.json" ] && continue
  run draftsmith eval acceptance --target smollm2 --head "$FAMILY=$QS/exported" "${HEADS[@]}" \
    --methods "$METHODS" --prompts "$SPEC_BENCH_FILE" --category "$c" --num-prompts "$SPEC_BENCH" --k 3 \
    --max-tokens 128 --batch-size 8 --out "$OUT/served_specbench_$c"
done
