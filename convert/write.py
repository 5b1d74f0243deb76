"""Write a head read by `layouts.read_any` as a draftsmith run directory, a vLLM export, or another project's layout.

* run          OUT/checkpoints/step_00000000 (head.safetensors, head.json) + OUT/converted.json: what training's
               `head.init_from=OUT`, `draftsmith export` and `draftsmith adapt` read.
* vllm         `draftsmith export`'s output (--dialect speculators | native), contract-checked.
* specforge    SpecForge's checkpoint layout: `LlamaForCausalLMEagle3`, `midlayer.*`, its own copy of the target's
               `embed_tokens.weight`, aux ids in its numbering (vLLM's - 1) under `eagle_config`.
* eagle3       the EAGLE-3 release layout: the same keys without `embed_tokens`, `pytorch_model.bin`, no aux ids
               (only a head on the default layers can be written so).

Every directory is written whole into a temporary sibling and renamed into place (`atomic_dir`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from draftsmith.atomic import atomic_dir
from draftsmith.convert.layouts import ConvertError, ForeignHead, default_ids

TARGETS = ("run", "vllm", "specforge", "eagle3")


def target_embeddings(target: str | Path) -> torch.Tensor:
    """The target's input embedding matrix [V, H], read from its safetensors without loading the model."""
    from safetensors import safe_open

    target = Path(target)
    for f in sorted(target.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for name in st.keys():
                if name.endswith("embed_tokens.weight") and "draft" not in name:
                    return st.get_tensor(name)
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).get_input_embeddings().weight.detach()


def write_run(head: ForeignHead, out: Path, provenance: dict) -> Path:
    from draftsmith.train.checkpoint import save_checkpoint

    meta = {"family": head.family, "config": head.config, "step": 0, "tokens": 0, "metrics": {}, **provenance}
    with atomic_dir(out) as tmp:
        save_checkpoint(tmp, 0, head.state, meta, {"converted": True}, keep=1)
        (tmp / "converted.json").write_text(json.dumps({**provenance, "notes": head.notes}, indent=2) + "\n")
    return out


def _layer_config(cfg, dtype: str) -> dict:
    """The draft layer's config (export/vllm.py's) under their architecture, with the EAGLE-3 fields they read."""
    from draftsmith.export.vllm import NATIVE_ARCH, transformer_layer_config

    return {
        **transformer_layer_config(cfg, dtype),
        "architectures": [NATIVE_ARCH],
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "fc_norm": cfg.fc_norm,
    }


def _eagle_tensors(head: ForeignHead, cfg, dtype: str) -> dict[str, torch.Tensor]:
    from draftsmith.export.vllm import layout_tensors
    from draftsmith.train.heads.eagle3 import fold_fc_input_scale

    return layout_tensors(fold_fc_input_scale(dict(head.state)), cfg, dtype, midlayer=True)


def _refuse_unwritable(cfg, layout: str) -> None:
    reasons = [
        (cfg.parallel_drafting, "a P-EAGLE head (parallel drafting)"),
        (
            cfg.norm_before_residual,
            "norm_before_residual: true (their decoder layer adds the residual before the norm)",
        ),
        (cfg.norm_before_fc, "norm_before_fc: true (their fc reads the aux states as they are)"),
        (cfg.norm_output, "norm_output: true (their next step reads the state before the final norm)"),
    ]
    bad = [why for cond, why in reasons if cond]
    if bad:
        raise ConvertError(f"the {layout} layout cannot hold {'; '.join(bad)}: write --to vllm or --to run instead")


def write_specforge(head: ForeignHead, out: Path, target: str | Path, dtype: str = "float32") -> Path:
    from draftsmith.train.heads.eagle3 import Eagle3Config

    if head.family not in ("eagle3", "peagle"):
        raise ConvertError(f"the specforge layout holds EAGLE-3 heads, not a {head.family} head")
    cfg = Eagle3Config(**head.config)
    _refuse_unwritable(cfg, "specforge")
    config = _layer_config(cfg, dtype)
    config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in cfg.aux_layer_ids]}
    tensors = _eagle_tensors(head, cfg, dtype)
    embed = target_embeddings(target)
    if tuple(embed.shape) != (cfg.vocab_size, cfg.hidden_size):
        raise ConvertError(f"the target's embed_tokens is {tuple(embed.shape)}, the head's vocab x hidden "
                           f"{(cfg.vocab_size, cfg.hidden_size)}")  # fmt: skip
    tensors["embed_tokens.weight"] = embed.to(getattr(torch, dtype)).contiguous()
    from safetensors.torch import save_file

    with atomic_dir(out) as tmp:
        save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def write_eagle3(head: ForeignHead, out: Path, dtype: str = "float32") -> Path:
    from draftsmith.train.heads.eagle3 import Eagle3Config

    if head.family not in ("eagle3", "peagle"):
        raise ConvertError(f"the eagle3 layout holds EAGLE-3 heads, not a {head.family} head")
    cfg = Eagle3Config(**head.config)
    _refuse_unwritable(cfg, "eagle3")
    default = default_ids(cfg.target.get("num_hidden_layers") or 0) if cfg.target.get("num_hidden_layers") else None
    if list(cfg.aux_layer_ids) != default:
        raise ConvertError(
            f"the eagle3 release layout records no aux ids, so it holds only heads on the default layers {default}; "
            f"this head reads {list(cfg.aux_layer_ids)}: write --to specforge or --to vllm (they record the ids)"
        )
    config = _layer_config(cfg, dtype)
    with atomic_dir(out) as tmp:
        torch.save(_eagle_tensors(head, cfg, dtype), tmp / "pytorch_model.bin")
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def write_vllm(head: ForeignHead, out: Path, *, verifier: str, target_config, dialect: str, k: int | None,
               dtype: str, force: bool, source) -> Path:  # fmt: skip
    from draftsmith.train.heads import families

    family = families.get(head.family)
    options = {"dialect": dialect, "k": k} if "dialect" in family.export_options else {}
    return family.exporter(
        head.state, family.config(**head.config), out, verifier=verifier, dtype=dtype, target_config=target_config,
        source=source, force=force, trained_on=None, **options,
    )  # fmt: skip
