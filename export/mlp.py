"""Write an MLP speculator as an HF `MLPSpeculatorPreTrainedModel` directory and check it.

config.json: `model_type: mlp_speculator`, `architectures: ["MLPSpeculatorPreTrainedModel"]`, `emb_dim`,
`inner_dim`, `n_predict`, `top_k_tokens_per_head`, `n_candidates`, `tie_weights`, `scale_input`,
`vocab_size`; tensors `speculator.{emb,proj,ln,head}.i.*`. With tie_weights each shared tensor is
stored once (`emb.0`, `ln.0`, `proj.0`, `proj.1`), as loaders that deduplicate parameters read it.
Loaders skip unknown keys silently, so every write ends with an exact key-set and shape check.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from draftsmith.atomic import atomic_dir
from draftsmith.export.destination import check_export_destination
from draftsmith.export.vllm import ExportError
from draftsmith.train.heads.mlp_speculator import MLPSpeculatorConfig, target_problems

ARCH = "MLPSpeculatorPreTrainedModel"
CONFIG_KEYS = {
    "architectures",
    "model_type",
    "emb_dim",
    "inner_dim",
    "n_predict",
    "top_k_tokens_per_head",
    "n_candidates",
    "tie_weights",
    "scale_input",
    "vocab_size",
    "torch_dtype",
}


def expected_shapes(cfg: MLPSpeculatorConfig) -> dict[str, tuple]:
    """The golden tensor set (without the `speculator.` prefix): name -> shape."""
    n, E, D, V = cfg.n_predict, cfg.emb_dim, cfg.inner_dim, cfg.vocab_size
    stages = [0] if cfg.tie_weights else list(range(n))
    shapes = {f"head.{i}.weight": (V, D) for i in range(n)}
    for i in stages:
        shapes.update({f"emb.{i}.weight": (V, D), f"ln.{i}.weight": (D,), f"ln.{i}.bias": (D,)})
    for i in [0, 1] if cfg.tie_weights else range(n):
        shapes[f"proj.{i}.weight"] = (D, E if i == 0 else D)
    return shapes


def hf_config(cfg: MLPSpeculatorConfig, dtype: str) -> dict:
    return {
        "architectures": [ARCH],
        "model_type": "mlp_speculator",
        "emb_dim": cfg.emb_dim,
        "inner_dim": cfg.inner_dim,
        "n_predict": cfg.n_predict,
        "top_k_tokens_per_head": [1] * cfg.n_predict,  # greedy chain, one candidate per head
        "n_candidates": 1,
        "tie_weights": cfg.tie_weights,
        "scale_input": cfg.scale_input,
        "vocab_size": cfg.vocab_size,
        "torch_dtype": dtype,
    }


def check_target(cfg: MLPSpeculatorConfig, target_config) -> None:
    problems = target_problems(cfg.to_dict(), target_config)
    if problems:
        raise ExportError("speculator does not match the target: " + "; ".join(problems))


def config_from_hf(config: dict) -> MLPSpeculatorConfig:
    return MLPSpeculatorConfig(
        emb_dim=config["emb_dim"],
        vocab_size=config["vocab_size"],
        inner_dim=config["inner_dim"],
        n_predict=config["n_predict"],
        tie_weights=config["tie_weights"],
        scale_input=config["scale_input"],
    )


def validate_mlp_export(out_dir: str | os.PathLike, target_config=None) -> dict:
    """Re-read an exported directory and check the contract; returns its config.json."""
    out_dir = Path(out_dir)
    config = json.loads((out_dir / "config.json").read_text())
    if config.get("model_type") != "mlp_speculator" or config.get("architectures") != [ARCH]:
        raise ExportError(f"{out_dir}/config.json is not an {ARCH} config")
    if set(config) != CONFIG_KEYS:
        raise ExportError(
            f"config keys differ: missing {sorted(CONFIG_KEYS - set(config))}, "
            f"unexpected {sorted(set(config) - CONFIG_KEYS)}"
        )
    if len(config["top_k_tokens_per_head"]) != config["n_predict"]:
        raise ExportError("top_k_tokens_per_head must have n_predict entries (HF's config asserts it)")
    cfg = config_from_hf(config)
    tensors = load_file(out_dir / "model.safetensors")
    want = {"speculator." + k: v for k, v in expected_shapes(cfg).items()}
    missing, extra = sorted(set(want) - set(tensors)), sorted(set(tensors) - set(want))
    if missing or extra:
        raise ExportError(f"{out_dir}/model.safetensors key set is wrong: missing {missing}, unexpected {extra}")
    wrong = {k: (tuple(tensors[k].shape), v) for k, v in want.items() if tuple(tensors[k].shape) != v}
    if wrong:
        raise ExportError(f"tensor shapes differ from the config (got, want): {wrong}")
    if target_config is not None:
        check_target(cfg, target_config)
    return config


def export_mlp_speculator(
    state: dict[str, torch.Tensor],
    cfg: MLPSpeculatorConfig,
    out_dir: str | os.PathLike,
    *,
    verifier: str = "",
    dtype: str = "float32",
    target_config=None,
    source=None,
    force: bool = False,
    trained_on: dict | None = None,
) -> Path:
    """Write config.json + model.safetensors atomically, then validate the result (`out_dir` is checked first,
    as in `export_eagle3`: never a file, the checkpoint's own directory, or unrelated files without `force`)."""
    check_export_destination(source, out_dir, force)
    if target_config is not None:
        check_target(cfg, target_config)
    torch_dtype = getattr(torch, dtype)
    tensors = {"speculator." + k: v.detach().to("cpu", torch_dtype).contiguous() for k, v in state.items()}
    out_dir = Path(out_dir)
    with atomic_dir(out_dir) as tmp:
        save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(hf_config(cfg, dtype), indent=2) + "\n")
        (tmp / "draftsmith.json").write_text(
            json.dumps(
                {
                    "family": "mlp_speculator",
                    "verifier": verifier,
                    "head_config": cfg.to_dict(),
                    **({"trained_on": trained_on} if trained_on else {}),
                },
                indent=2,
            )
            + "\n"
        )
        validate_mlp_export(tmp, target_config)  # an export that fails its own contract never replaces a good one
    return out_dir


def read_export(out_dir: str | os.PathLike) -> tuple[dict, dict[str, torch.Tensor]]:
    """(head config, tensors under the checkpoint keys) of an exported directory."""
    out_dir = Path(out_dir)
    config = json.loads((out_dir / "draftsmith.json").read_text())["head_config"]
    prefix = "speculator."
    return config, {k[len(prefix) :]: v for k, v in load_file(out_dir / "model.safetensors").items()}
