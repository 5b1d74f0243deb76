"""Write an EAGLE-3 head as a vLLM-loadable directory and check it against the contracts.

Two dialects:
* speculators (default): `speculators_model_type: eagle3`, a full `transformer_layer_config`, the
  verifier (target) recorded, tensors `layers.{i}.*`; `vllm serve <dir>` works from the directory alone.
* native: `architectures: ["LlamaForCausalLMEagle3"]`, `eagle_config`, tensors `midlayer.*` (layer 0), `layers.{i}.*`.

A P-EAGLE head (family peagle, `parallel_drafting`) adds the tensor `mask_hidden` and its `mask_token_id`; its
speculators dialect is `speculators_model_type: peagle` (vLLM turns that into eagle3 + parallel_drafting), the native
one needs `parallel_drafting: true` in the speculative_config (`eval/acceptance.py` passes it for both).

vLLM's loaders skip unknown keys silently, so every write ends with an exact key-set check.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from draftsmith.atomic import atomic_dir
from draftsmith.errors import DraftsmithError
from draftsmith.export.destination import carry_fitted, check_export_destination
from draftsmith.train.heads.eagle3 import Eagle3Config, fold_fc_input_scale, target_problems

SPECULATORS_ARCH = "Eagle3DraftModel"  # as speculators >= 0.9 writes it; vLLM keys on speculators_model_type
NATIVE_ARCH = "LlamaForCausalLMEagle3"
LAYER_KEYS = [
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "input_layernorm.weight",
    "hidden_norm.weight",
    "post_attention_layernorm.weight",
]


class ExportError(DraftsmithError, ValueError):
    """A head that would load in vLLM but serve wrongly (or not load at all)."""


def expected_shapes(cfg: Eagle3Config, layer_prefix: str = "layers.0.") -> dict[str, tuple]:
    """The golden tensor set: name -> shape. Nothing more, nothing less, goes into model.safetensors."""
    H, hd = cfg.hidden_size, cfg.head_dim
    shapes = {
        "fc.weight": (H, len(cfg.aux_layer_ids) * cfg.target_hidden_size),
        "norm.weight": (H,),
        "lm_head.weight": (cfg.draft_vocab_size, H),
    }
    if cfg.norm_before_fc:
        shapes["input_norm.weight"] = (len(cfg.aux_layer_ids) * cfg.target_hidden_size,)
    if cfg.fc_norm:
        shapes.update({f"fc_norm.{i}.weight": (cfg.target_hidden_size,) for i in range(len(cfg.aux_layer_ids))})
    if cfg.parallel_drafting:  # what a mask slot reads in place of the aux states, before fc
        shapes["mask_hidden"] = (len(cfg.aux_layer_ids) * cfg.target_hidden_size,)
    if cfg.draft_vocab_size != cfg.vocab_size:
        # vLLM 0.32 builds no draft_id_to_target_id for a full-vocab head and fails to load a d2t it cannot place
        shapes.update({"d2t": (cfg.draft_vocab_size,), "t2d": (cfg.vocab_size,)})
    for i in range(cfg.num_layers):
        width = 2 * H if i == 0 else H  # layer 0 reads [embeds, hidden]; later layers the running hidden
        layer = {
            "self_attn.q_proj.weight": (cfg.num_attention_heads * hd, width),
            "self_attn.k_proj.weight": (cfg.num_key_value_heads * hd, width),
            "self_attn.v_proj.weight": (cfg.num_key_value_heads * hd, width),
            "self_attn.o_proj.weight": (H, cfg.num_attention_heads * hd),
            "mlp.gate_proj.weight": (cfg.intermediate_size, H),
            "mlp.up_proj.weight": (cfg.intermediate_size, H),
            "mlp.down_proj.weight": (H, cfg.intermediate_size),
            "input_layernorm.weight": (H,),
            "hidden_norm.weight": (H,),  # later layers: built by vLLM, never used, but it refuses a checkpoint without
            "post_attention_layernorm.weight": (H,),
        }
        shapes.update({(layer_prefix if i == 0 else f"layers.{i}.") + k: v for k, v in layer.items()})
    return shapes


def unused_norms(num_layers: int) -> list[str]:
    """vLLM builds a `hidden_norm` in every draft layer but uses only layer 0's, and refuses a checkpoint without the
    others: export writes these as ones, read_export drops them."""
    return [f"layers.{i}.hidden_norm.weight" for i in range(1, num_layers)]


def transformer_layer_config(cfg: Eagle3Config, dtype: str) -> dict:
    """A full decoder config for the one draft layer, as vLLM's Llama layer reads it."""
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling:
        rope.update(cfg.rope_scaling)
    return {
        "model_type": "llama",  # vLLM's EAGLE-3 layer is Llama-shaped for llama/qwen/mistral-style targets
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "num_hidden_layers": cfg.num_layers,
        "hidden_act": cfg.hidden_act,
        "rms_norm_eps": cfg.rms_norm_eps,
        # both spellings: transformers 5 reads rope_parameters, 4.x reads rope_theta/rope_scaling and would
        # otherwise fall back to theta 10000 silently
        "rope_theta": cfg.rope_theta,
        "rope_scaling": dict(rope) if cfg.rope_scaling else None,
        "rope_parameters": rope,
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
    }


def speculators_config(cfg: Eagle3Config, verifier: str, k: int, dtype: str) -> dict:
    method = "peagle" if cfg.parallel_drafting else "eagle3"
    layer = transformer_layer_config(cfg, dtype)
    if cfg.parallel_drafting:
        # vLLM's peagle reader copies neither fc_norm nor norm_output to the draft config, which starts from this one
        layer.update({"fc_norm": cfg.fc_norm, "norm_output": False})
    return {
        "architectures": [SPECULATORS_ARCH],
        "speculators_model_type": method,
        "speculators_version": "0.9.0",
        "transformer_layer_config": layer,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "norm_before_residual": cfg.norm_before_residual,  # vLLM defaults this to true: always write it
        "norm_before_fc": cfg.norm_before_fc,
        "fc_norm": cfg.fc_norm,
        "norm_output": cfg.norm_output,
        "eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids),
        **({"mask_token_id": cfg.mask_token_id} if cfg.parallel_drafting else {}),
        "speculators_config": {
            "algorithm": method,
            "proposal_methods": [
                {"proposal_type": "greedy", "speculative_tokens": k, "verifier_accept_k": 1, "accept_tolerance": 0.0}
            ],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": list(cfg.target.get("architectures") or [])},
        },
        "torch_dtype": dtype,
    }


def native_config(cfg: Eagle3Config, dtype: str) -> dict:
    out = transformer_layer_config(cfg, dtype)
    out.update(
        {
            "architectures": [NATIVE_ARCH],
            "draft_vocab_size": cfg.draft_vocab_size,
            "target_hidden_size": cfg.target_hidden_size,
            "norm_before_residual": cfg.norm_before_residual,
            "fc_norm": cfg.fc_norm,  # vLLM reads it from the top level, norm_before_fc from eagle_config
            "norm_output": cfg.norm_output,  # top level too
            **({"mask_token_id": cfg.mask_token_id} if cfg.parallel_drafting else {}),
            "eagle_config": {
                "eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids),
                "use_aux_hidden_state": True,
                "norm_before_fc": cfg.norm_before_fc,
            },
        }
    )
    return out


def check_vocab_maps(d2t: torch.Tensor, t2d: torch.Tensor, cfg: Eagle3Config) -> None:
    """d2t: int64 offsets [Vd]; t2d: bool [V]; both describe the same sorted set of target ids. `cfg`: any head
    config with vocab_size and draft_vocab_size (EAGLE-3's, the MLP speculator's)."""
    if d2t.dtype != torch.int64:
        raise ExportError(f"d2t must be int64 offsets, got {d2t.dtype}")
    if t2d.dtype != torch.bool:
        raise ExportError(f"t2d must be a bool mask over the target vocab, got {t2d.dtype}")
    targets = torch.arange(d2t.numel()) + d2t
    if targets.min() < 0 or targets.max() >= cfg.vocab_size:
        raise ExportError(f"d2t maps draft ids outside the target vocab [0, {cfg.vocab_size})")
    if int(t2d.sum()) != cfg.draft_vocab_size or not torch.equal(t2d.nonzero().flatten(), targets):
        raise ExportError("d2t and t2d disagree: t2d must mark exactly the ascending target ids arange(Vd) + d2t")


def check_target(cfg: Eagle3Config, target_config, problems_of=target_problems) -> None:
    """Refuse a head trained for another target: sizes, layer count and aux ids must fit (`problems_of`: the head
    family's `target_problems`, EAGLE-3's by default)."""
    problems = problems_of(cfg.to_dict(), target_config)
    if problems:
        raise ExportError("head does not match the target: " + "; ".join(problems))


def validate_export(out_dir: str | os.PathLike, target_config=None) -> dict:
    """Re-read an exported directory and check every contract; returns its config.json."""
    out_dir = Path(out_dir)
    config = json.loads((out_dir / "config.json").read_text())
    tensors = load_file(out_dir / "model.safetensors")
    method = config.get("speculators_model_type")
    if method in ("eagle3", "peagle"):
        layer_cfg, prefix = config["transformer_layer_config"], "layers.0."
        parallel = method == "peagle"
        ids = config["eagle_aux_hidden_state_layer_ids"]
        norm_before_fc = config.get("norm_before_fc", False)
        k = config["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
        if k < 1:
            raise ExportError(f"speculative_tokens must be >= 1, got {k}")
    elif config.get("architectures") == [NATIVE_ARCH]:
        layer_cfg, prefix = config, "midlayer."
        parallel = config.get("mask_token_id") is not None
        ids = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        norm_before_fc = config["eagle_config"].get("norm_before_fc", config.get("norm_before_fc", False))
    else:
        raise ExportError(f"{out_dir}/config.json is neither an EAGLE-3 / P-EAGLE speculators nor a native config")
    mask_token = config.get("mask_token_id")
    if parallel and not (isinstance(mask_token, int) and 0 <= mask_token < layer_cfg["vocab_size"]):
        raise ExportError(f"mask_token_id {mask_token!r} must be a token id of the target's vocab")
    if "norm_before_residual" not in config:
        raise ExportError("norm_before_residual must be written explicitly (vLLM's default differs by dialect)")
    if len(ids) != len(set(ids)) or len(ids) < 1:
        raise ExportError(f"aux layer ids {ids} must be distinct (vLLM crashes at start-up otherwise)")
    cfg = Eagle3Config(
        hidden_size=layer_cfg["hidden_size"],
        num_attention_heads=layer_cfg["num_attention_heads"],
        num_key_value_heads=layer_cfg["num_key_value_heads"],
        head_dim=layer_cfg["head_dim"],
        intermediate_size=layer_cfg["intermediate_size"],
        vocab_size=layer_cfg["vocab_size"],
        draft_vocab_size=config["draft_vocab_size"],
        target_hidden_size=config["target_hidden_size"],
        aux_layer_ids=ids,
        rms_norm_eps=layer_cfg["rms_norm_eps"],
        rope_theta=layer_cfg["rope_theta"],
        max_position_embeddings=layer_cfg["max_position_embeddings"],
        norm_before_fc=bool(norm_before_fc),
        fc_norm=bool(config.get("fc_norm", False)),
        norm_output=bool(config.get("norm_output", False)),
        num_layers=int(layer_cfg.get("num_hidden_layers", 1)),
        parallel_drafting=parallel,
        mask_token_id=mask_token,
    )
    want = expected_shapes(cfg, prefix)
    missing, extra = sorted(set(want) - set(tensors)), sorted(set(tensors) - set(want))
    if missing or extra:
        raise ExportError(f"{out_dir}/model.safetensors key set is wrong: missing {missing}, unexpected {extra}")
    wrong = {k: (tuple(tensors[k].shape), v) for k, v in want.items() if tuple(tensors[k].shape) != v}
    if wrong:
        raise ExportError(f"tensor shapes differ from the config (got, want): {wrong}")
    if "d2t" in want:
        check_vocab_maps(tensors["d2t"], tensors["t2d"], cfg)
    if target_config is not None:
        check_target(cfg, target_config)
    return config


def layout_tensors(state: dict, cfg: Eagle3Config, dtype: str, midlayer: bool) -> dict[str, torch.Tensor]:
    """The tensors to write (fc_in_scale already folded): layer 0 as `midlayer.*` where the layout names it so, the
    later layers' `hidden_norm` vLLM's loader wants (`unused_norms`), floats in `dtype`, everything on CPU."""
    state = {**state, **{name: torch.ones(cfg.hidden_size) for name in unused_norms(cfg.num_layers)}}
    torch_dtype = getattr(torch, dtype)
    tensors = {}
    for name, t in state.items():
        if midlayer and name.startswith("layers.0."):
            name = "midlayer." + name[len("layers.0.") :]
        tensors[name] = (
            t.detach().to("cpu").contiguous()
            if not t.is_floating_point()
            else t.detach().to("cpu", torch_dtype).contiguous()
        )
    return tensors


def export_eagle3(
    state: dict[str, torch.Tensor],
    cfg: Eagle3Config,
    out_dir: str | os.PathLike,
    *,
    verifier: str,
    dialect: str = "speculators",
    k: int | None = None,
    dtype: str = "float32",
    target_config=None,
    source=None,
    force: bool = False,
    trained_on: dict | None = None,
) -> Path:
    """Write config.json + model.safetensors atomically, then validate the result.

    `out_dir` is replaced as a whole: refused if it is a file, is or contains `source` (the checkpoint), or is a
    non-empty directory that is not a previous export unless `force` (`check_export_destination`). `trained_on`
    (`training_data` of the checkpoint) is kept in draftsmith.json."""
    if dialect not in ("speculators", "native"):
        raise ExportError(f"unknown dialect {dialect!r} (speculators | native)")
    check_export_destination(source, out_dir, force)
    if target_config is not None:
        check_target(cfg, target_config)
    state = fold_fc_input_scale({k_: v for k_, v in state.items() if not k_.startswith("embed_tokens.")})
    check_vocab_maps(state["d2t"], state["t2d"], cfg)
    if cfg.draft_vocab_size == cfg.vocab_size:  # identity map: vLLM wants no d2t/t2d for a full-vocab head
        state = {k_: v for k_, v in state.items() if k_ not in ("d2t", "t2d")}
    tensors = layout_tensors(state, cfg, dtype, midlayer=dialect == "native")
    config = (
        speculators_config(cfg, verifier, k or cfg.ttt_steps, dtype)
        if dialect == "speculators"
        else native_config(cfg, dtype)
    )
    out_dir = Path(out_dir)
    with atomic_dir(out_dir) as tmp:
        save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        # the verifier also here: the native dialect's config.json has no place for it (eval checks it)
        (tmp / "draftsmith.json").write_text(
            json.dumps(
                {
                    "family": "peagle" if cfg.parallel_drafting else "eagle3",
                    "dialect": dialect,
                    "verifier": verifier,
                    "head_config": {**cfg.to_dict(), "fc_outlier_ratio": 0.0},  # its scale is in fc.weight now
                    **({"trained_on": trained_on} if trained_on else {}),
                },
                indent=2,
            )
            + "\n"
        )
        validate_export(tmp, target_config)  # an export that fails its own contract never replaces a good one
        if out_dir.is_dir():  # a re-export of the same head keeps its fitted policy and k schedule
            carry_fitted(out_dir, tmp)
    return out_dir


def read_export(out_dir: str | os.PathLike) -> tuple[dict, dict[str, torch.Tensor]]:
    """(head config, tensors under the checkpoint keys) of an exported directory, either dialect; a full-vocab
    head's identity d2t/t2d, which export leaves out for vLLM, are put back."""
    out_dir = Path(out_dir)
    config = json.loads((out_dir / "draftsmith.json").read_text())["head_config"]
    unused = set(unused_norms(config.get("num_layers", 1)))
    state = {
        ("layers.0." + k[len("midlayer.") :] if k.startswith("midlayer.") else k): v
        for k, v in load_file(out_dir / "model.safetensors").items()
        if k not in unused
    }
    if "d2t" not in state and config["draft_vocab_size"] == config["vocab_size"]:
        state["d2t"] = torch.zeros(config["draft_vocab_size"], dtype=torch.long)
        state["t2d"] = torch.ones(config["vocab_size"], dtype=torch.bool)
    return config, state
