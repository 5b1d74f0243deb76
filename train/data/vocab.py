"""The reduced draft vocabulary: the most frequent supervised tokens, as vLLM's `d2t` offsets and `t2d` mask."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import torch


def count_supervised(samples: Iterable, vocab_size: int) -> torch.LongTensor:
    """Counts [V] of token ids at supervised (loss_mask = 1) positions."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for s in samples:
        ids = torch.as_tensor(s.input_ids, dtype=torch.long)  # [T]
        keep = torch.as_tensor(s.loss_mask, dtype=torch.bool)  # [T]
        sup = ids[keep]  # [n_supervised]
        if sup.numel() == 0:
            continue
        if int(sup.min()) < 0 or int(sup.max()) >= vocab_size:
            raise ValueError(f"sample {getattr(s, 'conv_id', '')!r} has token ids outside [0, {vocab_size})")
        counts += torch.bincount(sup, minlength=vocab_size)  # [V]
    return counts


def target_to_draft(draft_to_target: torch.Tensor, vocab_size: int) -> torch.LongTensor:
    """[V] the draft id of each target id, -1 for ids outside the draft vocab (`draft_to_target`: [Vd] target ids)."""
    lookup = torch.full((vocab_size,), -1, dtype=torch.long, device=draft_to_target.device)  # [V]
    lookup[draft_to_target] = torch.arange(draft_to_target.numel(), device=draft_to_target.device)
    return lookup


@dataclass(eq=False)  # tensor fields: compare with torch.equal, not ==
class DraftVocab:
    """Draft vocab: target_id = draft_id + d2t[draft_id]; t2d[target_id] says whether it is in the draft vocab."""

    d2t: torch.LongTensor  # [Vd] offsets, as vLLM reads them
    t2d: torch.BoolTensor  # [V]
    draft_to_target: torch.LongTensor  # [Vd] target ids, ascending
    _target_to_draft: torch.LongTensor = field(init=False, repr=False)  # [V], -1 outside

    def __post_init__(self):
        self._target_to_draft = target_to_draft(self.draft_to_target, self.t2d.numel())

    @property
    def vocab_size(self) -> int:
        return self.t2d.numel()

    @property
    def draft_vocab_size(self) -> int:
        return self.d2t.numel()

    def coverage(self, counts: torch.Tensor) -> float:
        """Share of the counted tokens that fall inside the draft vocab (0.0 when nothing is counted)."""
        counts = torch.as_tensor(counts)
        if counts.numel() != self.vocab_size:
            raise ValueError(f"counts has {counts.numel()} entries, the target vocab has {self.vocab_size}")
        total = int(counts.sum())
        return float(int(counts[self.t2d].sum()) / total) if total else 0.0

    def to_draft(self, target_ids) -> torch.LongTensor:
        """Draft ids for target ids (same shape); -1 where a target id is not in the draft vocab."""
        ids = torch.as_tensor(target_ids, dtype=torch.long)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size):
            raise ValueError(
                f"target ids must be in [0, {self.vocab_size}), got range [{int(ids.min())}, {int(ids.max())}]"
            )
        return self._target_to_draft[ids]


def _from_targets(draft_to_target: torch.Tensor, vocab_size: int) -> DraftVocab:
    d2t_ids = torch.sort(draft_to_target.long()).values  # [Vd] ascending, so d2t offsets are >= 0
    t2d = torch.zeros(vocab_size, dtype=torch.bool)  # [V]
    t2d[d2t_ids] = True
    d2t = d2t_ids - torch.arange(d2t_ids.numel())  # [Vd]
    return DraftVocab(d2t=d2t, t2d=t2d, draft_to_target=d2t_ids)


def vocab_from_d2t(d2t: torch.Tensor, vocab_size: int) -> DraftVocab:
    """The draft vocab a head's stored `d2t` offsets describe (a checkpoint's or an export's)."""
    d2t = torch.as_tensor(d2t).long()
    return _from_targets(torch.arange(d2t.numel()) + d2t, vocab_size)


def build_draft_vocab(counts: torch.Tensor, draft_vocab_size: int, pinned_ids: Sequence[int] = ()) -> DraftVocab:
    """The `draft_vocab_size` most frequent ids (ties: lower id first), always including `pinned_ids`."""
    counts = torch.as_tensor(counts)
    if counts.dim() != 1 or counts.numel() == 0:
        raise ValueError(
            f"counts must be a non-empty 1-D vector over the target vocab, got shape {tuple(counts.shape)}"
        )
    if (counts < 0).any():
        raise ValueError("counts must be non-negative")
    V = counts.numel()
    if draft_vocab_size <= 0:
        raise ValueError(f"draft_vocab_size must be > 0, got {draft_vocab_size}")
    pinned = sorted({int(i) for i in pinned_ids})
    bad = [i for i in pinned if not 0 <= i < V]
    if bad:
        raise ValueError(f"pinned ids {bad} are outside the target vocab [0, {V})")
    if draft_vocab_size >= V:
        return _from_targets(torch.arange(V), V)
    if len(pinned) > draft_vocab_size:
        raise ValueError(f"{len(pinned)} pinned ids do not fit in a draft vocab of {draft_vocab_size}")
    # Stable sort on -count keeps ascending id order among equal counts: deterministic ties, and
    # never-seen ids follow by id when fewer than draft_vocab_size tokens ever occur.
    order = torch.sort(-counts.long(), stable=True).indices  # [V] most frequent first
    chosen = torch.zeros(V, dtype=torch.bool)  # [V]
    chosen[pinned] = True
    free = order[~chosen[order]][: draft_vocab_size - len(pinned)]  # [Vd - n_pinned]
    chosen[free] = True
    return _from_targets(chosen.nonzero().squeeze(1), V)


def coverage_report(
    counts: torch.Tensor, sizes: Iterable[int], pinned_ids: Sequence[int] = ()
) -> list[tuple[int, float]]:
    """[(draft_vocab_size, coverage)] for each size: how much of the counted mass each draft vocab keeps."""
    return [(int(n), build_draft_vocab(counts, int(n), pinned_ids).coverage(counts)) for n in sizes]
