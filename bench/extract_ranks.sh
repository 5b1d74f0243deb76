#!/usr/bin/env bash
# Extraction on 2 CPU cores: one process with 2 torch threads against 2 gloo ranks with 1 thread each, on the same
# samples, one after the other. Prints each run's own summary line (tokens, seconds, tok/s, processes).
#   bash bench/extract_ranks.sh OUT_DIR [training overrides...]
set -euo pipefail
out=${1:?usage: bench/extract_ranks.sh OUT_DIR [overrides...]}; shift
rm -rf "$out/one" "$out/two"
echo "== 1 process x 2 threads"
OMP_NUM_THREADS=2 draftsmith extract --out "$out/one" --dtype bf16 "$@" 2>&1 | grep -E "^extract:"
echo "== 2 ranks x 1 thread (torchrun, gloo)"
ACCELERATE_USE_CPU=1 OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node 2 -m draftsmith.cli extract \
    --out "$out/two" --dtype bf16 "$@" 2>&1 | grep -E "^extract:|^rank"
