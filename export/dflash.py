"""Write a DFlash head as vLLM 0.32's `dflash` loader reads it (`DFlashDraftModel`, qwen3_dflash.py) and check it.

config.json: `architectures: ["DFlashDraftModel"]`, `model_type: qwen3` and the draft layers' Qwen3 fields (widths,
heads, head_dim, norms' eps, rope in both spellings), `vocab_size` (the target's), `draft_vocab_size`,
`target_hidden_size`, `block_size`, and `dflash_config` {`mask_token_id`, `target_layer_ids`, `block_size`}.
`target_layer_ids` are DFlash's numbering, the layer whose *output* is taken: vLLM adds 1 (eagle3_utils), so they
are our aux ids - 1 (the same off-by-one as SpecForge's EAGLE-3 ids).

model.safetensors: `fc.weight`, `hidden_norm.weight`, `layers.{i}.*` (q/k/v/o, `q_norm`, `k_norm`, MLP, two norms),
`norm.weight`, `lm_head.weight`, and `d2t` / `t2d` when the draft vocab is a subset (vLLM reads d2t as
draft_id_to_target_id and skips t2d). No `embed_tokens.weight`: vLLM then shares the target's, which is what the
head trained with. mask_embedding.pt: {"mask_token_id", "embedding" [H]}, the learned input of every mask slot
(vLLM substitutes it wherever the input id is mask_token_id).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from draftsmith.atomic import atomic_dir
from draftsmith.export.destination import carry_fitted, check_export_destination
from draftsmith.export.vllm import ExportError, check_target, check_vocab_maps, transformer_layer_config
from draftsmith.train.heads.dflash import DFlashConfig, target_problems

ARCH = "DFlashDraftModel"
MASK_FILE = "mask_embedding.pt"


def expected_shapes(cfg: DFlashConfig) -> dict[str, tuple]:
    """The tensor set of model.safetensors: name -> shape."""
    H, nh, nkv, hd, inter = (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                             cfg.intermediate_size)  # fmt: skip
    shapes = {
        "fc.weight": (H, len(cfg.aux_layer_ids) * cfg.target_hidden_size),
        "hidden_norm.weight": (H,),
        "norm.weight": (H,),
        "lm_head.weight": (cfg.draft_vocab_size, H),
    }
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": (nh * hd, H), p + "self_attn.k_proj.weight": (nkv * hd, H),
            p + "self_attn.v_proj.weight": (nkv * hd, H), p + "self_attn.o_proj.weight": (H, nh * hd),
            p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
            p + "mlp.gate_proj.weight": (inter, H), p + "mlp.up_proj.weight": (inter, H),
            p + "mlp.down_proj.weight": (H, inter),
            p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
        })  # fmt: skip
    if cfg.draft_vocab_size != cfg.vocab_size:
        shapes.update({"d2t": (cfg.draft_vocab_size,), "t2d": (cfg.vocab_size,)})
    return shapes


def hf_config(cfg: DFlashConfig, dtype: str) -> dict:
    return {
        **transformer_layer_config(cfg, dtype),  # the same layer fields and rope spellings as EAGLE-3's draft layer
        "architectures": [ARCH],
        "model_type": "qwen3",
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "block_size": cfg.block_size,
        "dflash_config": {
            "mask_token_id": cfg.mask_token_id,
            "target_layer_ids": [i - 1 for i in cfg.aux_layer_ids],
            "block_size": cfg.block_size,
        },
    }


def config_from_hf(config: dict, extra: dict | None = None) -> DFlashConfig:
    """The head config an export describes (draftsmith.json's when present: it keeps the provenance)."""
    if extra and extra.get("head_config"):
        return DFlashConfig(**extra["head_config"])
    d = config.get("dflash_config") or {}
    rope = dict(config.get("rope_parameters") or {})
    theta = float(rope.pop("rope_theta", config.get("rope_theta", 10000.0)))
    return DFlashConfig(
        hidden_size=config["hidden_size"], num_attention_heads=config["num_attention_heads"],
        num_key_value_heads=config["num_key_value_heads"], head_dim=config["head_dim"],
        intermediate_size=config["intermediate_size"], vocab_size=config["vocab_size"],
        draft_vocab_size=config.get("draft_vocab_size") or config["vocab_size"],
        target_hidden_size=config.get("target_hidden_size") or config["hidden_size"],
        aux_layer_ids=[i + 1 for i in d["target_layer_ids"]], mask_token_id=d["mask_token_id"],
        block_size=d.get("block_size") or config.get("block_size") or 4, rms_norm_eps=config["rms_norm_eps"],
        rope_theta=theta, rope_scaling=rope if rope.get("rope_type", "default") != "default" else None,
        max_position_embeddings=config["max_position_embeddings"], hidden_act=config.get("hidden_act", "silu"),
        num_layers=config["num_hidden_layers"],
    )  # fmt: skip


def validate_dflash_export(out_dir: str | os.PathLike, target_config=None) -> dict:
    """Re-read an exported directory and check the contract; returns its config.json."""
    out_dir = Path(out_dir)
    config = json.loads((out_dir / "config.json").read_text())
    if config.get("architectures") != [ARCH]:
        raise ExportError(f"{out_dir}/config.json is not a {ARCH} config")
    d = config.get("dflash_config") or {}
    for key in ("mask_token_id", "target_layer_ids"):
        if key not in d:
            raise ExportError(f"{out_dir}/config.json: dflash_config.{key} is missing (vLLM needs it)")
    cfg = config_from_hf(config)
    tensors = load_file(out_dir / "model.safetensors")
    want = expected_shapes(cfg)
    missing, extra = sorted(set(want) - set(tensors)), sorted(set(tensors) - set(want))
    if missing or extra:
        raise ExportError(f"{out_dir}/model.safetensors key set is wrong: missing {missing}, unexpected {extra}")
    wrong = {k: (tuple(tensors[k].shape), v) for k, v in want.items() if tuple(tensors[k].shape) != v}
    if wrong:
        raise ExportError(f"tensor shapes differ from the config (got, want): {wrong}")
    if "d2t" in tensors:
        check_vocab_maps(tensors["d2t"], tensors["t2d"], cfg)
    mask = read_mask_embedding(out_dir)
    if mask["mask_token_id"] != cfg.mask_token_id or tuple(mask["embedding"].shape) != (cfg.hidden_size,):
        raise ExportError(
            f"{out_dir}/{MASK_FILE}: mask_token_id {mask['mask_token_id']} / shape {tuple(mask['embedding'].shape)}, "
            f"config.json says {cfg.mask_token_id} / ({cfg.hidden_size},)"
        )
    if target_config is not None:
        check_target(cfg, target_config, target_problems)
    return config


def read_mask_embedding(out_dir: Path) -> dict:
    path = Path(out_dir) / MASK_FILE
    if not path.is_file():
        raise ExportError(f"{path} is missing: the mask slots' learned input (vLLM would use a token's embedding)")
    data = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(data, dict) or "embedding" not in data:
        raise ExportError(f"{path}: expected {{'mask_token_id': int, 'embedding': tensor}}")
    return data


def export_dflash(
    state: dict[str, torch.Tensor],
    cfg: DFlashConfig,
    out_dir: str | os.PathLike,
    *,
    verifier: str = "",
    dtype: str = "float32",
    target_config=None,
    source=None,
    force: bool = False,
    trained_on: dict | None = None,
    k: int | None = None,
) -> Path:
    """Write config.json, model.safetensors, mask_embedding.pt and draftsmith.json atomically, then validate
    (`out_dir` checked first, as for every export). `k`: the drafts per step recorded for serving (default
    block_size - 1, the most the head was trained to draft)."""
    check_export_destination(source, out_dir, force)
    if target_config is not None:
        check_target(cfg, target_config, target_problems)
    k = cfg.block_size - 1 if k is None else k
    if not 1 <= k <= cfg.block_size - 1:
        raise ExportError(f"--k {k}: a block of {cfg.block_size} drafts 1..{cfg.block_size - 1} tokens")
    torch_dtype = getattr(torch, dtype)
    reduced = cfg.draft_vocab_size != cfg.vocab_size
    tensors = {}
    for name, t in state.items():
        if name in ("d2t", "t2d"):
            if reduced:
                tensors[name] = t.detach().cpu().contiguous()
        elif name != "mask_embedding":
            tensors[name] = t.detach().to("cpu", torch_dtype).contiguous()
    if reduced:
        check_vocab_maps(tensors["d2t"], tensors["t2d"], cfg)
    mask = {"mask_token_id": cfg.mask_token_id, "embedding": state["mask_embedding"].detach().to("cpu", torch_dtype)}
    out_dir = Path(out_dir)
    with atomic_dir(out_dir) as tmp:
        save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
        torch.save(mask, tmp / MASK_FILE)
        (tmp / "config.json").write_text(json.dumps(hf_config(cfg, dtype), indent=2) + "\n")
        (tmp / "draftsmith.json").write_text(
            json.dumps(
                {
                    "family": "dflash",
                    "verifier": verifier,
                    "k": k,
                    "head_config": cfg.to_dict(),
                    **({"trained_on": trained_on} if trained_on else {}),
                },
                indent=2,
            )
            + "\n"
        )
        validate_dflash_export(tmp, target_config)
        if out_dir.is_dir():
            carry_fitted(out_dir, tmp)
    return out_dir


def read_export(out_dir: str | os.PathLike) -> tuple[dict, dict[str, torch.Tensor]]:
    """(head config, tensors under the checkpoint keys) of an exported directory."""
    out_dir = Path(out_dir)
    extra_path = out_dir / "draftsmith.json"
    extra = json.loads(extra_path.read_text()) if extra_path.is_file() else None
    cfg = config_from_hf(json.loads((out_dir / "config.json").read_text()), extra)
    state = dict(load_file(out_dir / "model.safetensors"))
    state["mask_embedding"] = read_mask_embedding(out_dir)["embedding"]
    if "d2t" not in state:  # a full-vocab head: identity maps, as the head holds them
        state["d2t"] = torch.zeros(cfg.draft_vocab_size, dtype=torch.long)
        state["t2d"] = torch.ones(cfg.vocab_size, dtype=torch.bool)
    return cfg.to_dict(), state
