"""What the one loop asks of a head family: which target features it needs and how its loss is computed.

    objective = build_objective(cfg.head, head)
    model = objective.wrap(head)                        # the module accelerate prepares (one forward call)
    feats = objective.features(target, head, batch)     # no grad
    out = objective(model, feats, batch)                # .loss, .losses, .accs, .counts, .accept_len, .rows

EAGLE-3: the TTT unroll against the target's distribution (train/ttt/unroll.py). DFlash: anchored blocks against
the same distributions (train/block_loss.py). MLP speculator:
per-head cross-entropy against the sequence's own next tokens, teacher-forced (`per_head_loss`). At
eval both score agreement with the target's greedy token, which is what greedy serving accepts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from draftsmith.train.ttt.unroll import Unrolled, shift_left


@dataclass
class PerHeadOutput:
    loss: torch.Tensor  # scalar: sum_i weight_i * loss_i
    losses: list[torch.Tensor]  # per-head cross-entropy (detached)
    accs: list[torch.Tensor]  # per-head top-1 accuracy against the labels (detached)
    counts: list[torch.Tensor]  # per-head number of supervised positions
    accept_len: torch.Tensor  # summed leading run of correct heads over head-0 rows (simulated chain acceptance)
    rows: torch.Tensor  # number of head-0 supervised rows


def per_head_loss(
    head,
    last: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    weights: list[float],
    target_top: torch.Tensor | None = None,
    denoms: torch.Tensor | None = None,
) -> PerHeadOutput:
    """Teacher-forced MLP speculator loss. Row t holds the target's final hidden state at position t.

    Head i at row t reads token x_{t+1+i} (x_{t+1} is the target's own next token at serving time, then
    each head's pick) and predicts x_{t+2+i}; it is scored where that token is supervised. With a draft vocab a
    label outside it adds no loss (no row can predict it) and counts as a miss; the denominators still count it.

    Args:
        last: [B, T, E] target final (post-norm) hidden states; input_ids, loss_mask: [B, T].
        target_top: [B, T] the target's greedy token after position t; if given, the labels are the
            target's greedy choices (eval) instead of the sequence's tokens (training).
        denoms: [n_predict] denominators of each head's mean; None = this batch's counts (see `supervised_counts`).
    """
    state = head.prepare(last)  # [B, T, E]
    losses, accs, counts, hits = [], [], [], []
    total = last.new_zeros((), dtype=torch.float32)
    for i, w in enumerate(weights):
        tokens = shift_left(input_ids, 1 + i)  # [B, T] x_{t+1+i}
        state = head.step(i, state, tokens)  # [B, T, D]
        labels = shift_left(input_ids, 2 + i) if target_top is None else shift_left(target_top, 1 + i)  # [B, T]
        mask = shift_left(loss_mask, 2 + i) > 0  # [B, T]; False past the end
        # the vocab matmul only where a label is supervised: it is the step's dominant cost
        logits = head.logits(i, state[mask]).float()  # [N, Vd]
        y = head.to_draft(labels[mask])  # [N] draft ids; -1 where a draft vocab lacks the label (never a hit)
        n = mask.sum()
        d = n.clamp(min=1) if denoms is None else denoms[i].clamp(min=1)
        loss_i = F.cross_entropy(logits, y, ignore_index=-1, reduction="sum") / d
        total = total + w * loss_i
        hit = torch.zeros_like(mask, dtype=torch.float32)  # [B, T]
        hit[mask] = (logits.argmax(-1) == y).float()
        losses.append(loss_i.detach())
        accs.append((hit.sum() / d).detach())
        counts.append(n.detach())
        hits.append(hit.detach())
    rows = (shift_left(loss_mask, 2) > 0).float()  # [B, T]
    run = torch.cumprod(torch.stack(hits, dim=-1), dim=-1).sum(-1)  # [B, T] leading correct heads
    return PerHeadOutput(total, losses, accs, counts, (run * rows).sum(), rows.sum())


def supervised_counts(loss_mask: torch.Tensor, k: int) -> torch.Tensor:
    """[k] positions scored by TTT step / head i: both score row t where token t+2+i is supervised."""
    return torch.stack([shift_left(loss_mask, 2 + i).sum() for i in range(k)]).float()


class PerHead(nn.Module):
    """The speculator and its per-head loss as one forward call (so DDP/FSDP see a single pass)."""

    def __init__(self, head, weights: list[float]):
        super().__init__()
        self.head, self.weights = head, list(weights)

    def forward(self, last, input_ids, loss_mask, target_top=None, denoms=None) -> PerHeadOutput:
        return per_head_loss(self.head, last, input_ids, loss_mask, self.weights, target_top, denoms)


class EagleObjective:
    """EAGLE-3 and P-EAGLE (the head's config says which steps read mask slots, train/ttt/unroll.py)."""

    def __init__(self, cfg):
        self.family = cfg.get("family", "eagle3")
        self.steps, self.decay = cfg.ttt_steps, cfg.ttt_decay
        self.loss, self.topk = cfg.get("loss", "kl"), cfg.get("loss_topk", 8)
        self.feature_loss = cfg.get("feature_loss", 0.0) or 0.0

    def wrap(self, head) -> nn.Module:
        return Unrolled(head, self.steps, self.decay, self.loss, self.topk, self.feature_loss)

    def vocab_ids(self, head) -> torch.Tensor:
        return head.draft_to_target  # target logits only over the draft vocab: the loss needs no more

    def features(self, target, head, batch, eval: bool = False):
        # the full-vocab argmax at eval: exact agreement where the draft vocab misses tokens
        return target.features(batch["input_ids"], batch["attention_mask"], self.vocab_ids(head), full_top=eval)

    def supervised_counts(self, loss_mask: torch.Tensor) -> torch.Tensor:
        return supervised_counts(loss_mask, self.steps)

    def __call__(self, model, feats, batch, eval: bool = False, denoms=None):
        top = feats.top if eval else None
        last = feats.last if self.feature_loss else None
        return model(feats.aux, feats.logits, batch["input_ids"], batch["loss_mask"], top, denoms, last)


class DFlashObjective(EagleObjective):
    """DFlash: EAGLE-3's features and target distributions, every anchor's block in one forward
    (train/block_loss.py); one figure per block slot."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.family, self.size, self.anchors = "dflash", cfg.block_size, cfg.anchors
        self.feature_loss = 0.0  # not a DFlash key (its blocks are scored on distributions only)
        self.slot_weights, self.floor = cfg.slot_weights, cfg.slot_weight_floor

    def wrap(self, head) -> nn.Module:
        from draftsmith.train.block_loss import Blocks

        return Blocks(head, self.anchors, self.decay, self.loss, self.topk, self.slot_weights, self.floor)

    def supervised_counts(self, loss_mask: torch.Tensor) -> torch.Tensor:
        from draftsmith.train.block_loss import block_counts

        return block_counts(loss_mask, self.size - 1, self.anchors)


class MLPObjective:
    family = "mlp_speculator"

    def __init__(self, cfg):
        self.weights = [cfg.ttt_decay**i for i in range(cfg.n_predict)]

    def wrap(self, head) -> nn.Module:
        return PerHead(head, self.weights)

    def vocab_ids(self, head) -> torch.Tensor:
        # an empty vocab slice skips the target's lm_head: training needs only `last` (labels are tokens)
        return torch.zeros(0, dtype=torch.long, device=head.head[0].weight.device)

    def features(self, target, head, batch, eval: bool = False):
        # eval also wants the target's greedy tokens (full_top)
        return target.features(batch["input_ids"], batch["attention_mask"], self.vocab_ids(head), full_top=eval)

    def supervised_counts(self, loss_mask: torch.Tensor) -> torch.Tensor:
        return supervised_counts(loss_mask, len(self.weights))

    def __call__(self, model, feats, batch, eval: bool = False, denoms=None):
        top = feats.top if eval else None
        return model(feats.last, batch["input_ids"], batch["loss_mask"], top, denoms)


def build_objective(cfg):
    """The objective of head.family (its entry in train/heads/families.py)."""
    from draftsmith.train.heads import families

    return families.get(cfg.family).objective(cfg)
