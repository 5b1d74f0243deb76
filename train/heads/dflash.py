"""The DFlash block drafter: one non-causal forward drafts a whole block, conditioned on the target's hidden states.

vLLM 0.32 serves it as `method: "dflash"` (`DFlashQwen3ForCausalLM`), and parameter names are its checkpoint keys
(`fc`, `hidden_norm`, `layers.{i}.*` with Qwen3's per-head `q_norm` / `k_norm`, `norm`, `lm_head`, `d2t`), so
export is a state_dict save plus `mask_embedding.pt`. What one round computes, as vLLM does:

* context: every committed position i < p contributes keys and values to every draft layer, projected from
  c_i = hidden_norm(fc(aux_i)) (the target's aux states at i, fused once): k = k_norm(k_proj(c_i)) rotated to
  position i, v = v_proj(c_i). The context never runs through a draft layer.
* block: the newest token x_p (verified, no target state yet) and k mask slots at positions p..p+k; a mask slot's
  input is `mask_embedding` (vLLM: mask_embedding.pt, substituted wherever the input id is `mask_token_id`), other
  inputs the target's own embedding (borrowed, frozen, never exported). The block runs through pre-norm Qwen3
  layers whose attention sees the whole context and the whole block (non-causal inside it).
* slot j's output, through norm and lm_head, is the draft for position p + j.

Training (`train/block_loss.py`) draws anchors a in each sequence and runs every anchor's block at once: the block
[x_a, mask, ...] at positions a..a+B-1 sees the context rows < a and its own block; slot j is scored against the
target's distribution for x_{a+j}.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from draftsmith.train.heads.eagle3 import MLP, RMSNorm, apply_rope, rope_cos_sin, rope_inv_freq


@dataclass
class DFlashConfig:
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # target vocab
    draft_vocab_size: int
    target_hidden_size: int
    aux_layer_ids: list[int]  # vLLM's numbering (the layer whose input is taken); the export writes theirs - 1
    mask_token_id: int
    block_size: int = 4  # the block trained on: the verified token and block_size - 1 mask slots (serve k <= that)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None
    max_position_embeddings: int = 2048
    hidden_act: str = "silu"
    num_layers: int = 1
    target_model_type: str = "llama"
    target: dict = field(default_factory=dict)  # provenance: name_or_path, architectures, num_hidden_layers

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_target(cls, target_config, draft_vocab_size: int, aux_layer_ids: list[int], mask_token_id: int,
                    **kw) -> "DFlashConfig":  # fmt: skip
        """Shape the draft layers like the target's decoder layers (as EAGLE-3's)."""
        from draftsmith.train.heads.eagle3 import Eagle3Config

        e = Eagle3Config.from_target(target_config, draft_vocab_size, aux_layer_ids)
        return cls(
            hidden_size=e.hidden_size,
            num_attention_heads=e.num_attention_heads,
            num_key_value_heads=e.num_key_value_heads,
            head_dim=e.head_dim,
            intermediate_size=kw.pop("intermediate_size", None) or e.intermediate_size,
            vocab_size=e.vocab_size,
            draft_vocab_size=e.draft_vocab_size,
            target_hidden_size=e.target_hidden_size,
            aux_layer_ids=list(aux_layer_ids),
            mask_token_id=int(mask_token_id),
            rms_norm_eps=e.rms_norm_eps,
            rope_theta=e.rope_theta,
            rope_scaling=e.rope_scaling,
            max_position_embeddings=e.max_position_embeddings,
            hidden_act=e.hidden_act,
            target_model_type=e.target_model_type,
            target=e.target,
            **kw,
        )

    @classmethod
    def from_run(cls, head, target_config, aux_layer_ids: list[int]) -> "DFlashConfig":
        """The head a run's `head.*` keys describe for this target."""
        return cls.from_target(
            target_config,
            head.draft_vocab_size,
            aux_layer_ids,
            default_mask_token(target_config, head.mask_token_id),
            block_size=head.block_size,
            intermediate_size=head.intermediate_size,
            num_layers=head.num_layers,
        )


def default_mask_token(target_config, chosen: int | None = None) -> int:
    """The id whose input is the learned mask embedding: `chosen`, else a token the target never generates as an
    answer token (vLLM substitutes the mask embedding wherever the input id is this one, the verified token too):
    its bos token when that is not an eos token, else its pad token, else id 0."""
    if chosen is not None:
        if not 0 <= chosen < target_config.vocab_size:
            raise ValueError(
                f"head.mask_token_id={chosen}: outside the target's vocab 0..{target_config.vocab_size - 1}"
            )
        return int(chosen)
    eos = getattr(target_config, "eos_token_id", None)
    eos = set(eos if isinstance(eos, (list, tuple)) else [eos])
    for candidate in (getattr(target_config, "bos_token_id", None), getattr(target_config, "pad_token_id", None)):
        if candidate is not None and candidate not in eos and 0 <= candidate < target_config.vocab_size:
            return int(candidate)
    return 0


def target_problems(config: dict, target_config) -> list[str]:
    """What keeps a DFlash head off this target (the EAGLE-3 checks: vocab and aux widths, layers, depth)."""
    from draftsmith.train.heads.eagle3 import target_problems as eagle3_problems

    problems = eagle3_problems(config, target_config)
    mask = config.get("mask_token_id")
    if mask is not None and not 0 <= mask < target_config.vocab_size:
        problems.append(f"mask_token_id head={mask} outside the target's vocab {target_config.vocab_size}")
    return problems


class DFlashAttention(nn.Module):
    """Qwen3 attention (per-head RMSNorm on q and k, then rope) whose keys and values are the context's, projected
    from the fused target states, followed by the block's own."""

    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.nh, self.nkv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        H = cfg.hidden_size
        self.q_proj = nn.Linear(H, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, H, bias=False)
        self.q_norm = RMSNorm(self.hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.hd, cfg.rms_norm_eps)
        inv_freq, self.rope_scale = rope_inv_freq(cfg)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # derived from the config, not a key

    def keys_values(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, T, H] (normed) at positions [B, T] -> k, v [B, nkv, T, hd] (k normed and rotated)."""
        B, T, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(B, T, self.nkv, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        cos, sin = rope_cos_sin(positions, self.inv_freq, self.rope_scale, k.dtype)
        return apply_rope(k, cos, sin), v

    def forward(self, x, positions, context: tuple[torch.Tensor, torch.Tensor], mask) -> torch.Tensor:
        """x [B, Q, H] block rows; context (k, v) [B, nkv, T, hd]; mask [B, 1, Q, T+Q] bool or None (all)."""
        B, Q, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, Q, self.nh, self.hd)).transpose(1, 2)  # [B, nh, Q, hd]
        cos, sin = rope_cos_sin(positions, self.inv_freq, self.rope_scale, q.dtype)
        q = apply_rope(q, cos, sin)
        k, v = self.keys_values(x, positions)  # [B, nkv, Q, hd]
        k = torch.cat([context[0].to(k.dtype), k], dim=2)  # [B, nkv, T+Q, hd]
        v = torch.cat([context[1].to(v.dtype), v], dim=2)
        rep = self.nh // self.nkv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [B, nh, Q, hd]
        return self.o_proj(out.transpose(1, 2).reshape(B, Q, self.nh * self.hd))


class DFlashLayer(nn.Module):
    """A pre-norm Qwen3 decoder layer over the block rows (vLLM's DFlashQwen3DecoderLayer)."""

    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.self_attn = DFlashAttention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, positions, context, mask) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), positions, context, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashHead(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        if cfg.block_size < 2:
            raise ValueError(f"block_size={cfg.block_size}: a block is the verified token and at least one mask slot")
        self.config = cfg
        H = cfg.hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, H)  # the target's, frozen; never exported
        self.embed_tokens.weight.requires_grad_(False)
        self.mask_embedding = nn.Parameter(torch.zeros(H))  # mask_embedding.pt in the export
        self.fc = nn.Linear(len(cfg.aux_layer_ids) * cfg.target_hidden_size, H, bias=False)
        self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.layers = nn.ModuleList([DFlashLayer(cfg) for _ in range(cfg.num_layers)])
        self.norm = RMSNorm(H, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(H, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer(
            "t2d",
            torch.ones(cfg.vocab_size, dtype=torch.bool)
            if cfg.draft_vocab_size == cfg.vocab_size
            else torch.zeros(cfg.vocab_size, dtype=torch.bool),
        )
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
        nn.init.normal_(self.mask_embedding, std=0.02)

    @torch.no_grad()
    def attach_target(self, target) -> None:
        """Borrow the target's input embedding (frozen, never exported)."""
        self.embed_tokens.weight.copy_(target.embed_tokens.weight.float())

    def set_vocab(self, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        assert d2t.shape == self.d2t.shape and t2d.shape == self.t2d.shape, "draft vocab does not match the head"
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    @property
    def draft_to_target(self) -> torch.Tensor:
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t  # [Vd]

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """[B, Q] ids -> [B, Q, H]: the target's embedding, the mask embedding where the id is mask_token_id."""
        e = self.embed_tokens(ids).to(self.fc.weight.dtype)
        is_mask = (ids == self.config.mask_token_id)[..., None]
        return torch.where(is_mask, self.mask_embedding.to(e.dtype), e)

    def context(self, aux: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """aux [B, T, n·Ht] at positions [B, T] -> per layer the context's (k, v) [B, nkv, T, hd]."""
        c = self.hidden_norm(self.fc(aux.to(self.fc.weight.dtype)))  # [B, T, H]
        return [layer.self_attn.keys_values(c, positions) for layer in self.layers]

    def block_inputs(self, first: torch.Tensor, k: int) -> torch.Tensor:
        """[B, A] verified tokens -> [B, A·(k+1)] block ids: each token followed by k mask slots."""
        B, A = first.shape
        ids = torch.full((B, A, k + 1), self.config.mask_token_id, dtype=torch.long, device=first.device)
        ids[..., 0] = first
        return ids.view(B, A * (k + 1))

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, context: list, mask: torch.Tensor | None):
        """Block rows ids/positions [B, Q] over the context (`context`) -> their last hidden [B, Q, H] (pre-norm).

        mask: [B, 1, Q, T+Q] bool, which context and block rows each block row sees; None = all of them."""
        if len(context) != len(self.layers):
            raise ValueError(f"context holds {len(context)} layers, the head has {len(self.layers)}")
        x = self.embed(ids)
        for layer, kv in zip(self.layers, context):
            x = layer(x, positions, kv, mask)
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden))  # [..., Vd]

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """Everything the export writes: all parameters and buffers except the frozen target embedding."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("embed_tokens.")}
