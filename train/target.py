"""The frozen target: aux hidden states (vLLM's layer convention), final hidden state, logits.

This is the only file that knows transformers internals.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from draftsmith.errors import ConfigError


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """EAGLE-3's low/mid/high picks in vLLM's convention: (2, n//2, n-3)."""
    ids = [2, num_layers // 2, num_layers - 3]
    if len(set(ids)) != 3 or min(ids) < 0:
        # a shallow target would repeat a layer, and vLLM crashes at start-up on repeated ids
        raise ConfigError(f"target has {num_layers} layers: default aux layers {ids} collide; set target.aux_layer_ids")
    return ids


@dataclass
class Features:
    aux: torch.Tensor  # [B, T, n_aux*H] concatenated aux hidden states, low→high
    last: torch.Tensor  # [B, T, H] final post-norm hidden state (MLP speculator input)
    logits: torch.Tensor  # [B, T, V] (or [B, T, Vd] over the draft vocab) target logits; position t predicts t+1
    top: torch.Tensor | None = None  # [B, T] full-vocab argmax, when logits are restricted and it was asked for


class Target(nn.Module):
    """A frozen HF causal LM that returns the features a draft head trains on."""

    def __init__(self, model: nn.Module, aux_layer_ids: list[int] | None = None):
        super().__init__()
        self.model = model.eval().requires_grad_(False)
        cfg = model.config
        self.config = cfg
        n = cfg.num_hidden_layers
        self.aux_layer_ids = list(aux_layer_ids) if aux_layer_ids else default_aux_layer_ids(n)
        pad = getattr(cfg, "pad_token_id", None)
        self.pad_id = pad if pad is not None else (cfg.eos_token_id if isinstance(cfg.eos_token_id, int) else 0)
        bad = [i for i in self.aux_layer_ids if not 0 <= i < n]
        if bad:
            raise ConfigError(f"aux layer ids {bad} out of range for a target with {n} decoder layers")

    @classmethod
    def from_pretrained(cls, name_or_path: str, aux_layer_ids=None, dtype: torch.dtype = torch.float32) -> "Target":
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype)
        return cls(model, aux_layer_ids)

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    @property
    def lm_head(self) -> nn.Linear:
        return self.model.get_output_embeddings()

    @property
    def norm(self) -> nn.Module:
        return self.model.model.norm

    def decoder_layer(self, idx: int) -> nn.Module:
        return self.model.model.layers[idx]

    @torch.no_grad()
    def features(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        vocab_ids: torch.Tensor | None = None,
        full_top: bool = False,
    ) -> Features:
        """One no-grad forward pass. input_ids: [B, T].

        Args:
            vocab_ids: if given, logits only over these target ids (the draft vocab): [B, T, Vd]. The lm_head
                over the full vocab is the target's most expensive matmul at small H, and the loss needs only these.
            full_top: also return the argmax over the full vocab (exact accuracy when the draft vocab misses tokens).
        """
        out = self.model.model(
            input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, use_cache=False
        )
        hs = out.hidden_states  # n+1 tensors [B, T, H]; hs[k] = residual stream entering layer k (vLLM's id k)
        aux = torch.cat([hs[k] for k in self.aux_layer_ids], dim=-1)  # [B, T, 3H]
        last = out.last_hidden_state  # [B, T, H] post final norm
        weight = self.lm_head.weight  # [V, H]
        logits = F.linear(last, weight if vocab_ids is None else weight[vocab_ids])  # [B, T, V or Vd]
        top = F.linear(last, weight).argmax(-1) if full_top and vocab_ids is not None else None  # [B, T]
        return Features(aux=aux, last=last, logits=logits, top=top)

    def new_cache(self):
        """An empty KV cache for `step` (the reference speculative decoder's incremental forwards)."""
        from transformers import DynamicCache

        return DynamicCache(config=self.config)

    @torch.no_grad()
    def step(self, input_ids: torch.Tensor, cache) -> Features:
        """Incremental forward: input_ids [B, T] continue the sequence held in `cache`, which grows by T."""
        out = self.model.model(input_ids=input_ids, past_key_values=cache, use_cache=True, output_hidden_states=True)
        hs = out.hidden_states  # hs[k]: residual stream entering layer k, [B, T, H]
        aux = torch.cat([hs[k] for k in self.aux_layer_ids], dim=-1)  # [B, T, 3H]
        last = out.last_hidden_state  # [B, T, H]
        return Features(aux=aux, last=last, logits=self.lm_head(last))  # logits [B, T, V]

    @staticmethod
    def truncate_cache(cache, length: int) -> None:
        """Drop cached positions >= length (rejected draft tokens)."""
        extra = cache.get_seq_length() - length
        if extra > 0:
            cache.crop(-extra)  # transformers 5: a negative count removes that many trailing tokens
