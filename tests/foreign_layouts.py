"""Heads written in other projects' layouts, from each format's documented key names and config fields (not by
draftsmith's writers, so a reader bug cannot hide behind the same bug in a writer):

* EAGLE-3 release: config `LlamaForCausalLMEagle3` (+ draft_vocab_size), pytorch_model.bin with `midlayer.*`,
  `fc.weight`, `norm.weight`, `lm_head.weight`, `d2t`, `t2d`; no aux ids (the default layers).
* SpecForge: the same config + `eagle_config.eagle_aux_hidden_state_layer_ids` in its capture numbering (the layer
  whose output is taken: vLLM's id - 1), model.safetensors with its `embed_tokens.weight` (the target's copy).
* vLLM native: as SpecForge's, the ids in vLLM's numbering, no embed_tokens.
* speculators: `speculators_model_type: eagle3` (P-EAGLE: `peagle`, `mask_token_id`, tensor `mask_hidden`),
  `transformer_layer_config`, `eagle_aux_hidden_state_layer_ids`, `speculators_config.verifier`, tensors `layers.0.*`.
* Model-Optimizer: its config template (`LlamaForCausalLMEagle3` + `eagle_config` with `use_aux_hidden_state`,
  `use_last_layernorm`, `parallel_draft_step`, ..., aux ids in the numbering of the layers it hooks: vLLM's - 1),
  model.safetensors with `layers.{i}.*`, `fc`, `norm`, `lm_head`, `d2t` (no t2d, no embed_tokens).
* IBM MLPSpeculator: `model_type: mlp_speculator`, emb_dim / inner_dim / n_predict / vocab_size, tensors
  `speculator.{emb,proj,ln,head}.{i}.*`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file


def _layer(cfg) -> dict:
    return {
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "num_hidden_layers": cfg.num_layers,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }


def _tensors(head, midlayer: bool) -> dict[str, torch.Tensor]:
    out = {}
    for name, t in head.trainable_state_dict().items():
        if midlayer and name.startswith("layers.0."):
            name = "midlayer." + name[len("layers.0.") :]
        out[name] = t.detach().clone().contiguous()
    return out


def _write(out: Path, config: dict, tensors: dict, bin_file: bool = False) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    if bin_file:
        torch.save(tensors, out / "pytorch_model.bin")
    else:
        save_file(tensors, out / "model.safetensors")
    return out


def eagle3_release(head, out: Path) -> Path:
    cfg = head.config
    config = {"architectures": ["LlamaForCausalLMEagle3"], **_layer(cfg), "draft_vocab_size": cfg.draft_vocab_size}
    return _write(out, config, _tensors(head, midlayer=True), bin_file=True)


def specforge(head, out: Path, target_embed: torch.Tensor, embed: torch.Tensor | None = None) -> Path:
    cfg = head.config
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        **_layer(cfg),
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in cfg.aux_layer_ids]},
    }
    tensors = _tensors(head, midlayer=True)
    tensors["embed_tokens.weight"] = (target_embed if embed is None else embed).clone().contiguous()
    return _write(out, config, tensors)


def vllm_native(head, out: Path) -> Path:
    cfg = head.config
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        **_layer(cfg),
        "draft_vocab_size": cfg.draft_vocab_size,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids), "use_aux_hidden_state": True},
    }
    return _write(out, config, _tensors(head, midlayer=True))


def speculators(head, out: Path, verifier: str) -> Path:
    cfg = head.config
    config = {
        "architectures": ["Eagle3DraftModel"],
        "speculators_model_type": "peagle" if cfg.parallel_drafting else "eagle3",
        "transformer_layer_config": {"architectures": ["LlamaForCausalLM"], **_layer(cfg)},
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "norm_before_residual": cfg.norm_before_residual,
        # speculators 0.9 writes its wiring flags (its EAGLE-3 default: norm_before_fc and norm_output true)
        "norm_before_fc": cfg.norm_before_fc,
        "fc_norm": cfg.fc_norm,
        "norm_output": cfg.norm_output,
        "eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids),
        **({"mask_token_id": cfg.mask_token_id} if cfg.parallel_drafting else {}),
        "speculators_config": {
            "algorithm": "peagle" if cfg.parallel_drafting else "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": ["LlamaForCausalLM"]},
        },
    }
    return _write(out, config, _tensors(head, midlayer=False))


def modelopt(head, out: Path) -> Path:
    cfg = head.config
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        **_layer(cfg),
        "draft_vocab_size": cfg.draft_vocab_size,
        "rope_scaling": None,
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": [i - 1 for i in cfg.aux_layer_ids],
            "use_aux_hidden_state": True,
            "use_input_layernorm_in_first_layer": True,
            "use_last_layernorm": True,
            "use_mtp_layernorm": False,
            "next_layer_regular": True,
            "parallel_draft_step": 1,
            "parallel_draft_heads_num_layers": None,
        },
    }
    tensors = {k: v for k, v in _tensors(head, midlayer=False).items() if k != "t2d"}
    return _write(out, config, tensors)


def ibm_mlp(head, out: Path) -> Path:
    cfg = head.config
    config = {
        "architectures": ["MLPSpeculatorPreTrainedModel"],
        "model_type": "mlp_speculator",
        "emb_dim": cfg.emb_dim,
        "inner_dim": cfg.inner_dim,
        "n_predict": cfg.n_predict,
        "top_k_tokens_per_head": [1] * cfg.n_predict,
        "n_candidates": 1,
        "tie_weights": cfg.tie_weights,
        "scale_input": cfg.scale_input,
        "vocab_size": cfg.vocab_size,
    }
    tensors = {"speculator." + k: v.detach().clone().contiguous() for k, v in head.trainable_state_dict().items()}
    return _write(out, config, tensors)


def eagle1(out: Path, hidden: int = 64, vocab: int = 512) -> Path:
    """EAGLE-1/2 (and HASS): a one-layer LlamaForCausalLM whose fc reads [embedding, hidden] with a bias."""
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
              "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": vocab}  # fmt: skip
    tensors = {"fc.weight": torch.zeros(hidden, 2 * hidden), "fc.bias": torch.zeros(hidden),
               "layers.0.self_attn.q_proj.weight": torch.zeros(hidden, hidden)}  # fmt: skip
    return _write(out, config, tensors)
