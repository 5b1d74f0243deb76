"""Write an MLP speculator as an HF `MLPSpeculatorPreTrainedModel` directory and check it.

config.json: `model_type: mlp_speculator`, `architectures: ["MLPSpeculatorPreTrainedModel"]`, `emb_dim`,
`inner_dim`, `n_predict`, `top_k_tokens_per_head`, `n_candidates`, `tie_weights`, `scale_input`,
`vocab_size`; tensors `speculator.{emb,proj,ln,head}.i.*`. With tie_weights each shared tensor is
stored once (`emb.0`, `ln.0`, `proj.0`, `proj.1`), as loaders that deduplicate parameters read it.
Loaders skip unknown keys silently, so every write ends with an exact key-set and shape check.

A speculator trained over a draft vocab (`head.draft_vocab_size`) has `head.i` of draft_vocab_size rows; the
directory then also records `draft_vocab_size` in config.json and the map in `draft_vocab.safetensors` (`d2t`
int64 offsets [Vd], target_id = draft_id + d2t[draft_id], and `t2d` bool [V], as EAGLE-3 heads store them). Our
vLLM plugin and reference decoder apply it; a loader of the published HF format does not know it, which is why the
full-vocab head stays the default.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from draftsmith.atomic import atomic_dir
from draftsmith.export.destination import carry_fitted, check_export_destination
from draftsmith.export.vllm import ExportError, check_vocab_maps
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
VOCAB_FILE = "draft_vocab.safetensors"


def expected_shapes(cfg: MLPSpeculatorConfig) -> dict[str, tuple]:
    """The golden tensor set (without the `speculator.` prefix): name -> shape."""
    n, E, D, V = cfg.n_predict, cfg.emb_dim, cfg.inner_dim, cfg.vocab_size
    stages = [0] if cfg.tie_weights else list(range(n))
    shapes = {f"head.{i}.weight": (cfg.draft_vocab_size, D) for i in range(n)}
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
        **({"draft_vocab_size": cfg.draft_vocab_size} if cfg.reduced else {}),
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
        draft_vocab_size=config.get("draft_vocab_size", 0),
    )


def check_vocab_map(maps: dict[str, torch.Tensor], cfg: MLPSpeculatorConfig, where) -> None:
    """d2t: int64 offsets [Vd] to distinct ascending target ids inside the target's vocab; t2d: bool [V] marking
    exactly those ids. Raises ExportError naming `where` otherwise."""
    d2t, t2d = maps.get("d2t"), maps.get("t2d")
    if d2t is None or t2d is None:
        raise ExportError(f"{where}: needs tensors d2t and t2d (has {sorted(maps)})")
    Vd, V = cfg.draft_vocab_size, cfg.vocab_size
    if d2t.dtype != torch.int64 or tuple(d2t.shape) != (Vd,):
        raise ExportError(f"{where}: d2t must be int64 [{Vd}] (draft_vocab_size), got {d2t.dtype} {list(d2t.shape)}")
    if t2d.dtype != torch.bool or tuple(t2d.shape) != (V,):
        raise ExportError(
            f"{where}: t2d must be bool [{V}] (the vocab_size the speculator was trained for), got {t2d.dtype} "
            f"{list(t2d.shape)}"
        )
    ids = torch.arange(Vd) + d2t
    if not bool((ids[1:] > ids[:-1]).all()):
        raise ExportError(f"{where}: d2t maps draft ids to target ids out of order (they must ascend)")
    try:  # range and agreement with t2d: the check EAGLE-3's maps pass
        check_vocab_maps(d2t, t2d, cfg)
    except ExportError as e:
        raise ExportError(f"{where}: {e}") from None


def validate_mlp_export(out_dir: str | os.PathLike, target_config=None) -> dict:
    """Re-read an exported directory and check the contract; returns its config.json."""
    out_dir = Path(out_dir)
    config = json.loads((out_dir / "config.json").read_text())
    if config.get("model_type") != "mlp_speculator" or config.get("architectures") != [ARCH]:
        raise ExportError(f"{out_dir}/config.json is not an {ARCH} config")
    keys = CONFIG_KEYS | ({"draft_vocab_size"} if "draft_vocab_size" in config else set())
    if set(config) != keys:
        raise ExportError(
            f"config keys differ: missing {sorted(keys - set(config))}, unexpected {sorted(set(config) - CONFIG_KEYS)}"
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
    if cfg.reduced:
        if not (out_dir / VOCAB_FILE).is_file():
            raise ExportError(
                f"{out_dir}: config.json says draft_vocab_size={cfg.draft_vocab_size} (< vocab_size "
                f"{cfg.vocab_size}) but {VOCAB_FILE}, the map of its rows to target ids, is missing"
            )
        check_vocab_map(load_file(out_dir / VOCAB_FILE), cfg, out_dir / VOCAB_FILE)
    if target_config is not None:
        check_target(cfg, target_config)
    return config


def vocab_map(out_dir: str | os.PathLike) -> dict[str, torch.Tensor]:
    """{"d2t", "t2d"} of an exported speculator with a draft vocab; {} for a full-vocab one."""
    path = Path(out_dir) / VOCAB_FILE
    return load_file(path) if path.is_file() else {}


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
    maps = {k: state[k].detach().cpu().contiguous() for k in ("d2t", "t2d") if k in state}
    if cfg.reduced:
        check_vocab_map(maps, cfg, "the checkpoint's draft vocab")
    elif maps:
        raise ExportError(f"a full-vocab speculator's state carries a draft vocab map ({sorted(maps)})")
    tensors = {
        "speculator." + k: v.detach().to("cpu", torch_dtype).contiguous() for k, v in state.items() if k not in maps
    }
    out_dir = Path(out_dir)
    with atomic_dir(out_dir) as tmp:
        save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
        if maps:
            save_file(maps, tmp / VOCAB_FILE, metadata={"format": "pt"})
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
        if out_dir.is_dir():  # a re-export of the same head keeps its fitted policy and k schedule
            carry_fitted(out_dir, tmp)
    return out_dir


def read_export(out_dir: str | os.PathLike) -> tuple[dict, dict[str, torch.Tensor]]:
    """(head config, tensors under the checkpoint keys) of an exported directory."""
    out_dir = Path(out_dir)
    config = json.loads((out_dir / "draftsmith.json").read_text())["head_config"]
    prefix = "speculator."
    state = {k[len(prefix) :]: v for k, v in load_file(out_dir / "model.safetensors").items()}
    return config, {**state, **vocab_map(out_dir)}
