"""The IBM MLP speculator (arXiv 2404.19124; HF `MLPSpeculatorPreTrainedModel`).

`n_predict` stages, each an MLP step on a running state. The first state is the target's final
(post-norm) hidden state at the position that produced token x; stage i reads the token chosen before
it (x itself for stage 0, then stage i-1's pick) and predicts the next one:

    state   = ln0(state) / sqrt(2)                                  (only with scale_input)
    state_i = gelu(ln_i(proj_i(state_{i-1}) * w_state + emb_i(token_i) * w_emb))      [.., inner_dim]
    logits_i = head_i(state_i)                                                          [.., vocab]

`head_i` has `draft_vocab_size` rows: the target's vocab by default (the published HF format), or the most frequent
tokens of the training data (the d2t idea EAGLE-3 uses): a pick is mapped back to its target id
(`target_id = draft_id + d2t[draft_id]`) before it is emitted or fed to the next stage's embedding, which keeps
the target's vocab. With w_state = 0.5 ** (0.5 / n_predict) and w_emb = sqrt((1 - w_state**2) * inner_dim / 2), so the
state and embedding terms keep a fixed share of the variance at every depth. `ln` is an RMS
normalisation with a learned scale *and shift* (eps 1e-6); `ln0` has neither. With tie_weights all
stages share `emb.0`, `ln.0` and (after the first, whose input is the target's width) `proj.1`.

Parameter names are the checkpoint keys (exported with the `speculator.` prefix).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from draftsmith.errors import ConfigError


@dataclass
class MLPSpeculatorConfig:
    emb_dim: int  # the target's hidden size
    vocab_size: int  # the target's vocab
    inner_dim: int = 0  # 0 = emb_dim
    n_predict: int = 3
    tie_weights: bool = False
    scale_input: bool = False
    draft_vocab_size: int = 0  # rows of each head: 0 = vocab_size (no draft vocab), else a subset built from the data
    target: dict = field(default_factory=dict)  # provenance: name_or_path, architectures, num_hidden_layers

    def __post_init__(self):
        if self.inner_dim == 0:
            self.inner_dim = self.emb_dim
        if not self.draft_vocab_size or self.draft_vocab_size > self.vocab_size:
            self.draft_vocab_size = self.vocab_size
        if self.tie_weights and self.n_predict < 2:
            raise ConfigError("tie_weights needs n_predict >= 2 (there is nothing to tie with one stage)")

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def reduced(self) -> bool:
        """Whether the heads predict over a draft vocab smaller than the target's (then d2t / t2d map it)."""
        return self.draft_vocab_size < self.vocab_size

    @property
    def state_weight(self) -> float:
        return 0.5 ** (0.5 / self.n_predict)

    @property
    def emb_weight(self) -> float:
        return math.sqrt((1 - self.state_weight**2) * (self.inner_dim / 2))

    @classmethod
    def from_run(cls, head, target_config, aux_layer_ids=None) -> "MLPSpeculatorConfig":
        """The speculator a run's `head.*` keys (train/config.py HeadConfig) describe for this target (it reads the
        last hidden state: no aux layers)."""
        return cls.from_target(
            target_config,
            inner_dim=head.inner_dim,
            n_predict=head.n_predict,
            tie_weights=head.tie_weights,
            scale_input=head.scale_input,
            draft_vocab_size=head.get("draft_vocab_size") or 0,
        )

    @classmethod
    def from_target(cls, target_config, **kw) -> "MLPSpeculatorConfig":
        tc = target_config
        return cls(
            emb_dim=tc.hidden_size,
            vocab_size=tc.vocab_size,
            target={
                "name_or_path": getattr(tc, "_name_or_path", ""),
                "architectures": list(getattr(tc, "architectures", None) or []),
                "num_hidden_layers": tc.num_hidden_layers,
                "model_type": tc.model_type,
            },
            **kw,
        )


def target_problems(config: dict, target_config) -> list[str]:
    """What keeps an MLP speculator (its config, or the part of it an export records) off this target: the vocab
    it predicts over and the width of the hidden state it reads."""
    return [
        f"{key} head={config[key]} target={value}"
        for key, value in (("vocab_size", target_config.vocab_size), ("emb_dim", target_config.hidden_size))
        if config.get(key) is not None and config[key] != value
    ]


class LayerNorm(nn.Module):
    """RMS normalisation, optionally followed by a learned elementwise scale and shift (the paper's `ln`)."""

    def __init__(self, dim: int, affine: bool = True, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        if affine:
            self.weight = nn.Parameter(torch.ones(dim))
            self.bias = nn.Parameter(torch.zeros(dim))
        else:
            self.weight = self.bias = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x if self.weight is None else x * self.weight + self.bias


class MLPSpeculator(nn.Module):
    def __init__(self, cfg: MLPSpeculatorConfig):
        super().__init__()
        self.config = cfg
        n, E, D, V = cfg.n_predict, cfg.emb_dim, cfg.inner_dim, cfg.vocab_size
        if cfg.tie_weights:
            emb, ln, proj_tied = nn.Embedding(V, D), LayerNorm(D), nn.Linear(D, D, bias=False)
            self.emb = nn.ModuleList([emb] * n)
            self.proj = nn.ModuleList([nn.Linear(E, D, bias=False)] + [proj_tied] * (n - 1))
            self.ln = nn.ModuleList([ln] * n)
        else:
            self.emb = nn.ModuleList([nn.Embedding(V, D) for _ in range(n)])
            self.proj = nn.ModuleList([nn.Linear(E if i == 0 else D, D, bias=False) for i in range(n)])
            self.ln = nn.ModuleList([LayerNorm(D) for _ in range(n)])
        Vd = cfg.draft_vocab_size
        self.head = nn.ModuleList([nn.Linear(D, Vd, bias=False) for _ in range(n)])  # never tied (as vLLM loads it)
        self.ln0 = LayerNorm(E, affine=False)  # no parameters; used only with scale_input
        if cfg.reduced:  # the draft vocab, as EAGLE-3 stores it: target_id = draft_id + d2t[draft_id]; t2d marks them
            self.register_buffer("d2t", torch.zeros(Vd, dtype=torch.long))
            self.register_buffer("t2d", torch.zeros(V, dtype=torch.bool))
            # target id -> draft id (-1 outside): the labels' map in training; rebuilt from d2t, never saved
            self.register_buffer("to_draft_ids", torch.full((V,), -1, dtype=torch.long), persistent=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Scale-preserving init: embeddings N(0, 1/sqrt(D)), linears N(0, 1/sqrt(fan_in)), norms identity."""
        D = self.config.inner_dim
        for m in self.modules():
            if isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, 0, 1 / math.sqrt(D))
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 1 / math.sqrt(m.in_features))
            elif isinstance(m, LayerNorm) and m.weight is not None:
                m.weight.fill_(1.0)
                m.bias.zero_()

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        if self.config.reduced:  # a checkpoint's d2t arrived: the label map follows it
            self._sync_vocab()

    @torch.no_grad()
    def set_vocab(self, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        """Install the draft vocab built from the data (train/data/vocab.py `DraftVocab`)."""
        if not self.config.reduced:
            raise ValueError("a full-vocabulary speculator has no draft vocab to set")
        if d2t.shape != self.d2t.shape or t2d.shape != self.t2d.shape:
            raise ValueError(f"draft vocab shapes {tuple(d2t.shape)}/{tuple(t2d.shape)} do not fit this head")
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)
        self._sync_vocab()

    @torch.no_grad()
    def _sync_vocab(self) -> None:
        from draftsmith.train.data.vocab import target_to_draft

        self.to_draft_ids.copy_(target_to_draft(self.draft_to_target, self.config.vocab_size))

    def to_draft(self, target_ids: torch.Tensor) -> torch.Tensor:
        """Draft ids of target ids (same shape), -1 for a token outside the draft vocab; the ids themselves when
        the heads predict over the target's vocab."""
        return self.to_draft_ids[target_ids] if self.config.reduced else target_ids

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Target ids of the heads' picks (same shape)."""
        return self.draft_to_target[draft_ids] if self.config.reduced else draft_ids

    def attach_target(self, target) -> None:
        """Nothing to borrow: every weight is the speculator's own (the target's hidden state arrives per call)."""

    def prepare(self, state: torch.Tensor) -> torch.Tensor:
        """The target's hidden state [.., E] as the first state (scaled when scale_input)."""
        state = state.to(self.proj[0].weight.dtype)
        return self.ln0(state) / math.sqrt(2) if self.config.scale_input else state

    def step(self, i: int, state: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Stage i: state [.., E or D], tokens [..] (the token chosen before this stage) -> new state [.., D]."""
        z = self.emb[i](tokens)  # [.., D]
        mixed = self.proj[i](state) * self.config.state_weight + z * self.config.emb_weight  # [.., D]
        return F.gelu(self.ln[i](mixed))  # [.., D]

    def logits(self, i: int, state: torch.Tensor) -> torch.Tensor:
        return self.head[i](state)  # [.., V]

    @torch.no_grad()
    def propose(
        self, state: torch.Tensor, token: torch.Tensor, k: int | None = None, probs: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Greedy chain: state [N, E], token [N] -> k draft tokens [N, k] (what serving runs); probs=True also
        returns [N, k] the head's own probability of each pick (its softmax maximum: the hybrid's chain signal)."""
        k = k or self.config.n_predict
        if k > self.config.n_predict:
            raise ValueError(f"k={k} > n_predict={self.config.n_predict}")
        state, out, own = self.prepare(state), [], []
        for i in range(k):
            state = self.step(i, state, token)  # [N, D]
            logits = self.logits(i, state)  # [N, Vd]
            token = self.to_target(logits.argmax(-1))  # [N] target ids
            out.append(token)
            if probs:
                own.append(torch.softmax(logits.float(), dim=-1).amax(dim=-1))
        tokens = torch.stack(out, dim=-1)  # [N, k]
        return (tokens, torch.stack(own, dim=-1)) if probs else tokens

    @property
    def draft_to_target(self) -> torch.Tensor | None:
        """[Vd] the target id of each head row; None for a full-vocabulary speculator (no map)."""
        if not self.config.reduced:
            return None
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t  # [Vd]

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """Each parameter once (tied stages share `emb.0`, `ln.0`, `proj.1`), and the draft vocab's d2t / t2d when
        there is one: the exported key set."""
        out = {k: p for k, p in self.named_parameters()}
        if self.config.reduced:
            out.update(d2t=self.d2t, t2d=self.t2d)
        return out
