"""The EAGLE-3 draft head: fc over the target's aux states, decoder layers (the first on 2·H), norm, lm_head.

Parameter names are vLLM's checkpoint keys (`fc`, `layers.{i}.*`, `norm`, `lm_head`, `d2t`, `t2d`), so
export is a state_dict save. One call of `forward` is one draft step, as in vLLM's draft model:
the TTT unroll (train/ttt/unroll.py) calls it K times, passing `ttt_cache()` along; the reference decoder
(eval/reference_decoder.py) calls it row by row with a `kv_cache()`, as vLLM decodes.

`parallel_drafting` is the P-EAGLE head (family `peagle`): draft step s > 0 reads no draft token and no previous
output but a mask slot, the embedding of `mask_token_id` and fc(`mask_hidden`), so vLLM drafts all k tokens in one
forward (`parallel_drafting: true`); its attention is the same as the sequential head's (causal over the context,
its own block's earlier slots).

`num_layers` > 1 is vLLM llama_eagle3's multi-layer drafter: layer 0 reads [norm(embeds), norm(hidden)] (2·H),
later layers are plain pre-norm Llama layers on H; every layer keeps its own keys and values.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn


def freeze_output_side(head, head_cfg) -> None:
    """head.freeze_lm_head: the draft's lm_head rows stay as they start (the optimizer skips frozen parameters)."""
    if getattr(head_cfg, "freeze_lm_head", False):
        head.lm_head.weight.requires_grad_(False)


def layer_attr(config, name: str):
    """A decoder-layer setting of a target config, or None. Gemma 4's config keeps some per layer and refuses the
    global read (transformers' AmbiguousGlobalPerLayerAttributeError); the value it stores globally is then taken."""
    try:
        return getattr(config, name, None)
    except Exception:  # noqa: BLE001 - that error class moves between transformers releases
        return config.to_dict().get(name)


@dataclass
class Eagle3Config:
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # target vocab
    draft_vocab_size: int
    target_hidden_size: int
    aux_layer_ids: list[int]
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None  # HF rope_parameters beyond the default type, passed through on export
    max_position_embeddings: int = 2048
    norm_before_residual: bool = False
    # RMSNorm on fc's input, as vLLM's llama_eagle3 loads them: one over all the aux states (`input_norm`), or one
    # per aux state (`fc_norm.{i}`)
    norm_before_fc: bool = False
    fc_norm: bool = False
    # the next draft step reads this step's state after the final norm (vLLM's norm_output; speculators 0.9's default)
    # instead of before it; the logits read the normed state either way
    norm_output: bool = False
    # fc reads the channels whose RMS is above `fc_outlier_ratio` x the median channel's scaled down to that median
    # (buffer `fc_in_scale`, set from the first training batch; export folds it into fc.weight): 0 = off
    fc_outlier_ratio: float = 0.0
    hidden_act: str = "silu"
    num_layers: int = 1  # draft decoder layers (vLLM: num_hidden_layers of the draft config)
    ttt_steps: int = 7
    # P-EAGLE: steps s > 0 are mask slots (embed(mask_token_id), fc(mask_hidden)), all drafted in one forward
    parallel_drafting: bool = False
    mask_token_id: Optional[int] = None
    target_model_type: str = "llama"
    target: dict = field(default_factory=dict)  # provenance: name_or_path, architectures, num_hidden_layers

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_run(cls, head, target_config, aux_layer_ids: list[int]) -> "Eagle3Config":
        """The head a run's `head.*` keys (train/config.py HeadConfig) describe for this target."""
        return cls.from_target(
            target_config,
            head.draft_vocab_size,
            aux_layer_ids,
            ttt_steps=head.ttt_steps,
            norm_before_residual=head.norm_before_residual,
            norm_before_fc=head.norm_before_fc,
            fc_norm=head.fc_norm,
            norm_output=head.norm_output,
            fc_outlier_ratio=head.fc_outlier_ratio,
            intermediate_size=head.intermediate_size,
            num_layers=head.num_layers,
            **(
                {"parallel_drafting": True, "mask_token_id": default_mask_token(target_config, head.mask_token_id)}
                if head.family == "peagle"
                else {}
            ),
        )

    @classmethod
    def from_target(cls, target_config, draft_vocab_size: int, aux_layer_ids: list[int], **kw) -> "Eagle3Config":
        """Shape the draft layer like one of the target's decoder layers."""
        tc = target_config
        rope = dict(getattr(tc, "rope_parameters", None) or getattr(tc, "rope_scaling", None) or {})
        theta = rope.pop("rope_theta", getattr(tc, "rope_theta", 10000.0))
        rope_scaling = rope if rope.get("rope_type", "default") != "default" else None
        head_dim = layer_attr(tc, "head_dim") or tc.hidden_size // tc.num_attention_heads
        intermediate = kw.pop("intermediate_size", None) or tc.intermediate_size
        return cls(
            hidden_size=tc.hidden_size,
            num_attention_heads=tc.num_attention_heads,
            num_key_value_heads=getattr(tc, "num_key_value_heads", tc.num_attention_heads),
            head_dim=head_dim,
            intermediate_size=intermediate,
            vocab_size=tc.vocab_size,
            draft_vocab_size=min(draft_vocab_size, tc.vocab_size),
            target_hidden_size=tc.hidden_size,
            aux_layer_ids=list(aux_layer_ids),
            rms_norm_eps=tc.rms_norm_eps,
            rope_theta=float(theta),
            rope_scaling=rope_scaling,
            max_position_embeddings=tc.max_position_embeddings,
            hidden_act=getattr(tc, "hidden_act", "silu"),
            target_model_type=tc.model_type,
            target={
                "name_or_path": getattr(tc, "_name_or_path", ""),
                "architectures": list(getattr(tc, "architectures", None) or []),
                "num_hidden_layers": tc.num_hidden_layers,
                "model_type": tc.model_type,
            },
            **kw,
        )


def default_mask_token(target_config, chosen: int | None = None) -> int:
    """The token id a P-EAGLE head's mask slots read: `chosen`, else the target's pad token, else its first eos.
    Its embedding is the target's (frozen); the learned part of a mask slot is `mask_hidden`."""
    if chosen is not None:
        if not 0 <= chosen < target_config.vocab_size:
            raise ValueError(
                f"head.mask_token_id={chosen}: outside the target's vocab 0..{target_config.vocab_size - 1}"
            )
        return int(chosen)
    for candidate in (getattr(target_config, "pad_token_id", None), getattr(target_config, "eos_token_id", None)):
        if isinstance(candidate, (list, tuple)):
            candidate = candidate[0] if candidate else None
        if candidate is not None and 0 <= candidate < target_config.vocab_size:
            return int(candidate)
    return 0


def target_problems(config: dict, target_config) -> list[str]:
    """What keeps an EAGLE-3 head (its config, or the part of it an export records) off this target: its vocab and
    aux widths, a draft vocab larger than the target's, aux layers beyond its depth, another depth trained on."""
    problems = [
        f"{key} head={config[key]} target={value}"
        for key, value in (("vocab_size", target_config.vocab_size), ("target_hidden_size", target_config.hidden_size))
        if config.get(key) is not None and config[key] != value
    ]
    draft = config.get("draft_vocab_size")
    if draft is not None and draft > target_config.vocab_size:
        problems.append(f"draft_vocab_size head={draft} above the target's vocab_size {target_config.vocab_size}")
    n = target_config.num_hidden_layers
    bad_aux = [i for i in config.get("aux_layer_ids") or [] if not 0 <= i < n]
    if bad_aux:
        problems.append(f"aux layers {bad_aux} beyond {n}")
    trained = (config.get("target") or {}).get("num_hidden_layers")
    if trained is not None and trained != n:
        problems.append(f"num_hidden_layers head={trained} target={n}")
    return problems


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.promote_types(dtype, torch.float32))
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)  # HF/vLLM: normalise in fp32
        return self.weight * x.to(dtype)


def rope_inv_freq(cfg: "Eagle3Config") -> tuple[torch.Tensor, float]:
    """(inverse frequencies [head_dim/2], attention scale) of the draft layer's RoPE: the target's own rope type
    (llama3, yarn, linear, longrope, ... as transformers and vLLM compute them), so a head trained here rotates its
    keys as vLLM's draft layer does. Dynamic scaling depends on the sequence length and is refused."""
    hd = cfg.head_dim
    kind = (cfg.rope_scaling or {}).get("rope_type") or (cfg.rope_scaling or {}).get("type") or "default"
    if kind == "default":
        return 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd)), 1.0
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if kind not in ROPE_INIT_FUNCTIONS or kind == "dynamic":
        raise ValueError(f"rope_type {kind!r}: the draft layer supports default, {', '.join(ROPE_INIT_FUNCTIONS)}")
    lc = LlamaConfig(
        hidden_size=cfg.num_attention_heads * hd,
        num_attention_heads=cfg.num_attention_heads,
        head_dim=hd,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_parameters={"rope_theta": cfg.rope_theta, **cfg.rope_scaling, "rope_type": kind},
    )
    inv_freq, scale = ROPE_INIT_FUNCTIONS[kind](lc, torch.device("cpu"))
    return inv_freq.float(), float(scale)


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, scale: float, dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE tables for positions [B, T] -> cos, sin [B, 1, T, head_dim] (`rope_inv_freq`'s frequencies)."""
    freqs = positions[..., None].to(inv_freq.dtype) * inv_freq  # [B, T, hd/2]
    emb = torch.cat([freqs, freqs], dim=-1)  # [B, T, hd]  (HF "rotate_half" layout, as vLLM's neox style)
    return (emb.cos() * scale)[:, None].to(dtype), (emb.sin() * scale)[:, None].to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Attention(nn.Module):
    """Llama attention on a 2·H input (layer 0) or an H one (later layers), with the TTT cache: step s attends
    causally to step 0's keys and to its own row's keys from steps 1..s (what vLLM's draft sees at draft position s)."""

    def __init__(self, cfg: Eagle3Config, in_features: int):
        super().__init__()
        self.nh, self.nkv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(in_features, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(in_features, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(in_features, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, cfg.hidden_size, bias=False)
        inv_freq, self.rope_scale = rope_inv_freq(cfg)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # not a checkpoint key: derived from the config

    def rope(self, positions: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_cos_sin(positions, self.inv_freq, self.rope_scale, dtype)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: list | LayerKV) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)  # [B, nh, T, hd]
        k = self.k_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)  # [B, nkv, T, hd]
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        cos, sin = self.rope(positions, q.dtype)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        rep = self.nh // self.nkv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)  # [B, nh, T, hd]
        if isinstance(cache, LayerKV):  # decoding: these rows follow the cached ones
            out = cache.attend(q, k, v)
        else:
            cache.append((k, v))
            if len(cache) == 1:  # step 0: plain causal attention over the target-feature rows
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, nh, T, hd]
            else:
                out = ttt_attention(q, cache)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.nh * self.hd))


class LayerKV:
    """One draft layer's keys and values for decoding one sequence row by row, as vLLM's draft KV cache does: the
    rows of each call attend to every cached row and causally to each other, then join the cache."""

    def __init__(self, k: torch.Tensor | None = None, v: torch.Tensor | None = None):
        self.k, self.v = k, v  # [B, nh, P, hd] (rope applied, kv heads repeated)

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def fork(self) -> "LayerKV":
        return LayerKV(self.k, self.v)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q, k, v: [B, nh, T, hd] of T new rows -> their attention output [B, nh, T, hd]."""
        P, T = len(self), q.shape[2]
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)  # [B, nh, P+T, hd]
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        mask = torch.ones(T, P + T, dtype=torch.bool, device=q.device).tril(diagonal=P)  # row i: cache + rows <= i
        return F.scaled_dot_product_attention(q, self.k, self.v, attn_mask=mask)


def ttt_attention(q: torch.Tensor, cache: list) -> torch.Tensor:
    """Attention for TTT step s = len(cache)-1 > 0: causal over cache[0], diagonal over cache[1..s].

    Row j's query sees step-0 keys 0..j (the context rows, built from target features) plus its own
    keys from steps 1..s. Computed as one softmax over [T causal scores | s diagonal scores].
    """
    k0, v0 = cache[0]
    T = q.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1])
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    s0 = (q @ k0.transpose(-1, -2)) * scale  # [B, nh, T, T]
    s0 = s0.masked_fill(~causal, float("-inf"))
    sd = torch.stack([(q * k).sum(-1) for k, _ in cache[1:]], dim=-1) * scale  # [B, nh, T, s]
    p = torch.softmax(torch.cat([s0, sd], dim=-1).to(torch.promote_types(q.dtype, torch.float32)), dim=-1).to(
        q.dtype
    )  # [B, nh, T, T+s]
    vd = torch.stack([v for _, v in cache[1:]], dim=-2)  # [B, nh, T, s, hd]
    return p[..., :T] @ v0 + (p[..., T:, None] * vd).sum(-2)  # [B, nh, T, hd]


class KVCache:
    """The head's decoding cache: one `LayerKV` per draft layer (`Eagle3Head.kv_cache()`).

    `fork()` shares the tensors so far: draft steps extend a fork, and the committed cache never sees them."""

    def __init__(self, layers: list[LayerKV]):
        self.layers = list(layers)

    def fork(self) -> "KVCache":
        return KVCache([layer.fork() for layer in self.layers])

    def __len__(self) -> int:  # rows cached (every layer holds the same rows)
        return len(self.layers[0])


class MLP(nn.Module):
    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """vLLM's Eagle3 LlamaDecoderLayer. Layer 0: norms on embeds and hidden, concat, attention, MLP. Later layers:
    a pre-norm Llama layer on the running residual (vLLM builds a `hidden_norm` there too but never uses it; export
    writes its ones)."""

    def __init__(self, cfg: Eagle3Config, index: int = 0):
        super().__init__()
        self.index = index
        self.self_attn = Attention(cfg, (2 if index == 0 else 1) * cfg.hidden_size)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if index == 0:
            self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.norm_before_residual = cfg.norm_before_residual

    def forward(self, embeds, hidden, positions, cache) -> torch.Tensor:
        if self.index == 0:
            residual = hidden
            hidden = self.hidden_norm(hidden)
            if self.norm_before_residual:
                residual = hidden
            x = torch.cat([self.input_layernorm(embeds), hidden], dim=-1)  # [B, T, 2H]
        else:
            residual, x = hidden, self.input_layernorm(hidden)  # [B, T, H]
        residual = residual + self.self_attn(x, positions, cache)
        return residual + self.mlp(self.post_attention_layernorm(residual))  # [B, T, H] pre-norm


class Eagle3Head(nn.Module):
    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        self.config = cfg
        H = cfg.hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, H)  # the target's, frozen; never exported
        self.embed_tokens.weight.requires_grad_(False)
        n_aux, Ht = len(cfg.aux_layer_ids), cfg.target_hidden_size
        if cfg.norm_before_fc:
            self.input_norm = RMSNorm(n_aux * Ht, cfg.rms_norm_eps)
        if cfg.fc_norm:
            self.fc_norm = nn.ModuleList([RMSNorm(Ht, cfg.rms_norm_eps) for _ in range(n_aux)])
        self.fc = nn.Linear(n_aux * Ht, H, bias=False)
        if cfg.fc_outlier_ratio:
            self.register_buffer("fc_in_scale", torch.ones(n_aux * Ht))
        self.layers = nn.ModuleList([DecoderLayer(cfg, i) for i in range(cfg.num_layers)])
        self.norm = RMSNorm(H, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(H, cfg.draft_vocab_size, bias=False)
        if cfg.parallel_drafting:  # what a mask slot reads in place of the target's aux states (vLLM: mask_hidden)
            self.mask_hidden = nn.Parameter(torch.zeros(n_aux * Ht))
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer(
            "t2d",
            torch.ones(cfg.vocab_size, dtype=torch.bool)
            if cfg.draft_vocab_size == cfg.vocab_size
            else torch.zeros(cfg.vocab_size, dtype=torch.bool),
        )
        self.apply(self._init)
        if cfg.parallel_drafting:  # unit RMS per channel, like the aux states fc is trained on (not 0: fc_norm)
            nn.init.normal_(self.mask_hidden, std=1.0)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)

    @torch.no_grad()
    def attach_target(self, target) -> None:
        """Copy what the head borrows from its target: the input embedding (frozen, never exported)."""
        self.embed_tokens.weight.copy_(target.embed_tokens.weight.float())

    def set_vocab(self, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        """Install the draft vocabulary mapping (target_id = draft_id + d2t[draft_id])."""
        assert d2t.shape == self.d2t.shape and t2d.shape == self.t2d.shape, (
            "draft vocab does not match the head's sizes"
        )
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    @property
    def draft_to_target(self) -> torch.Tensor:
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t  # [Vd]

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """[B, T, 3·Ht] target aux states -> [B, T, H] first-step hidden input (vLLM's combine_hidden_states)."""
        x = self.fc_input(aux)
        return self.fc(x * self.fc_in_scale.to(x.dtype) if self.config.fc_outlier_ratio else x)

    @torch.no_grad()
    def calibrate_fc_input(self, sq_sum: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Set `fc_in_scale` from the per-channel sum of squares of fc's input over `rows` rows: channels above
        fc_outlier_ratio x the median RMS are scaled to the median (SmolLM2's aux states carry one near 1,000 where
        the median is ~4: through it, every Adam step on fc moves the fused state ~260x as much). Returns the RMS."""
        rms = (sq_sum / rows.clamp(min=1)).sqrt()  # [3·Ht]
        med = rms.median()
        outlier = rms > self.config.fc_outlier_ratio * med
        self.fc_in_scale.copy_(torch.where(outlier, med / rms, torch.ones_like(rms)))
        return rms

    def mask_inputs(self, B: int, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        """What B x T mask slots read (P-EAGLE): token ids [B, T] of `mask_token_id` and hidden [B, T, H] =
        fc(mask_hidden), as vLLM's parallel drafter builds them (`combine_hidden_states(mask_hidden)`)."""
        ids = torch.full((B, T), self.config.mask_token_id, dtype=torch.long, device=self.mask_hidden.device)
        hidden = self.fuse(self.mask_hidden.to(self.fc.weight.dtype)[None, None])  # [1, 1, H]
        return ids, hidden.expand(B, T, -1)

    def fc_input(self, aux: torch.Tensor) -> torch.Tensor:
        """What fc reads: the aux states, through `input_norm` then the per-state `fc_norm`s where configured."""
        if self.config.norm_before_fc:
            aux = self.input_norm(aux)
        if self.config.fc_norm:
            chunks = aux.chunk(len(self.fc_norm), dim=-1)
            aux = torch.cat([norm(c) for norm, c in zip(self.fc_norm, chunks)], dim=-1)
        return aux

    def ttt_cache(self) -> list[list]:
        """The TTT unroll's cache: per layer, the (keys, values) of each step so far (see `Attention`)."""
        return [[] for _ in self.layers]

    def kv_cache(self) -> KVCache:
        """An empty decoding cache, one `LayerKV` per layer."""
        return KVCache([LayerKV() for _ in self.layers])

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, hidden: torch.Tensor, cache: list | KVCache
    ) -> torch.Tensor:
        """One draft step. input_ids/positions: [B, T]; hidden: [B, T, H]. Returns the pre-norm hidden [B, T, H],
        which is both the next step's `hidden` and, through `logits`, this step's prediction.

        `cache`: `ttt_cache()` (the TTT unroll: step 0 causal, later steps diagonal, see `Attention`) or
        `kv_cache()` (decoding); one entry per layer either way."""
        per_layer = cache.layers if isinstance(cache, KVCache) else cache
        if len(per_layer) != len(self.layers):
            raise ValueError(f"cache holds {len(per_layer)} layers, the head has {len(self.layers)}")
        embeds = self.embed_tokens(input_ids).to(hidden.dtype)  # [B, T, H]
        for layer, layer_cache in zip(self.layers, per_layer):
            hidden = layer(embeds, hidden, positions, layer_cache)
        return hidden

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden))  # [B, T, Vd]

    def carry(self, hidden: torch.Tensor) -> torch.Tensor:
        """What the next draft step reads of this step's output `hidden` (vLLM's aux_output): the state itself, or with
        norm_output the state after the final norm."""
        return self.norm(hidden) if self.config.norm_output else hidden

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """Everything vLLM loads: all parameters and buffers except the frozen target embedding."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("embed_tokens.")}


def fold_fc_input_scale(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A head state with `fc_in_scale` folded into fc.weight (fc(x·s) = (W·diag(s))·x): vLLM's tensor set."""
    if "fc_in_scale" not in state:
        return state
    state = dict(state)
    scale = state.pop("fc_in_scale")
    state["fc.weight"] = state["fc.weight"] * scale.to(state["fc.weight"].dtype)[None, :]
    return state
