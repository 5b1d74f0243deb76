"""TargetEnds reads the embedding, final norm and lm_head of every checkpoint layout it knows, sharded or not, and
names the tensors it looked for when it knows none (fast: tiny safetensors written here)."""

import json

import pytest
import torch
from safetensors.torch import save_file

from draftsmith.errors import ConfigError
from draftsmith.train.target import TargetEnds


def write_target(root, tensors: dict, tie: bool, shards: int = 1):
    from transformers import LlamaConfig

    root.mkdir()
    LlamaConfig(
        vocab_size=16,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=6,
        num_attention_heads=2,
        tie_word_embeddings=tie,
    ).save_pretrained(root)
    names = sorted(tensors)
    if shards == 1:
        save_file(tensors, root / "model.safetensors")
        return root
    weight_map = {}
    for i in range(shards):
        part = {n: tensors[n] for n in names[i::shards]}
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file(part, root / file)
        weight_map.update(dict.fromkeys(part, file))
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return root


@pytest.mark.parametrize(
    "prefix,head,tie,shards",
    [
        ("model.", "lm_head.weight", False, 1),  # Llama-3.x, Qwen3, Mistral: untied
        ("model.", None, True, 2),  # SmolLM2, Qwen3 small: tied, sharded
        ("model.language_model.", "lm_head.weight", False, 3),  # multimodal wrappers (Gemma 3, Mistral 3, Qwen-VL)
        ("language_model.model.", "language_model.lm_head.weight", False, 1),  # older wrappers (LLaVA)
    ],
)
def test_every_known_layout(tmp_path, prefix, head, tie, shards):
    torch.manual_seed(0)
    embed, norm, out = torch.randn(16, 8), torch.rand(8) + 0.5, torch.randn(16, 8)
    tensors = {
        prefix + "embed_tokens.weight": embed,
        prefix + "norm.weight": norm,
        prefix + "layers.0.mlp.up_proj.weight": torch.zeros(16, 8),
    }
    if head:
        tensors[head] = out
    t = TargetEnds(str(write_target(tmp_path / "t", tensors, tie, shards)), aux_layer_ids=[1, 2, 3])
    torch.testing.assert_close(t.embed_tokens.weight, embed)
    torch.testing.assert_close(t.norm.weight, norm)
    torch.testing.assert_close(t.output_weight(torch.tensor([3, 7])), (out if head else embed)[[3, 7]])


def test_an_unknown_layout_names_what_was_looked_for(tmp_path):
    tensors = {"transformer.wte.weight": torch.zeros(16, 8), "transformer.ln_f.weight": torch.ones(8)}
    with pytest.raises(ConfigError, match="no tensor for the input embedding \\(one of model.embed_tokens.weight"):
        TargetEnds(str(write_target(tmp_path / "gpt2", tensors, True)), aux_layer_ids=[1, 2, 3])
    untied = {"model.embed_tokens.weight": torch.zeros(16, 8), "model.norm.weight": torch.ones(8)}
    with pytest.raises(ConfigError, match="the lm_head \\(tie_word_embeddings is false\\) \\(one of lm_head.weight"):
        TargetEnds(str(write_target(tmp_path / "untied", untied, False)), aux_layer_ids=[1, 2, 3])
