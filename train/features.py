"""Where a training batch's target features come from.

`online` runs the frozen target on every batch. `memory` runs it once per sample, on the sample's first
use, and keeps the sample's aux states and final hidden state (not the logits: [T, Vd] per token would
be several times larger, and one matmul with the target's lm_head rows rebuilds them). Every later epoch
then costs only the head: on SmolLM2 + a 2-core CPU the target forward is ~55 % of an online step.
Memory: (n_aux + 1) * H values per token in the target's dtype, 4.6 KB/token for SmolLM2 in bf16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from draftsmith.train.target import Features

MODES = ("online", "memory")


class FeatureSource:
    def __init__(self, target, vocab_ids: torch.Tensor | None, mode: str = "online"):
        if mode not in MODES:
            raise ValueError(f"data.features={mode!r}: expected one of {MODES}")
        self.target, self.vocab_ids, self.mode = target, vocab_ids, mode
        self.store: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # sample index -> (aux [n, A], last [n, H])
        self.computed_tokens = 0  # tokens the target has run on (the rest came from the store)

    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.store.values())

    def __call__(self, indices: list[int], batch: dict) -> Features:
        """Features for the collated `batch` of samples `indices` (right-padded: [B, T])."""
        ids, mask = batch["input_ids"], batch["attention_mask"]
        if self.mode == "online":
            self.computed_tokens += int(mask.sum())
            return self.target.features(ids, mask, self.vocab_ids)
        lengths = mask.sum(1).tolist()
        missing = [b for b, i in enumerate(indices) if i not in self.store]
        if missing:
            sub_ids, sub_mask = ids[missing], mask[missing]
            width = int(sub_mask.sum(1).max())
            f = self.target.features(sub_ids[:, :width], sub_mask[:, :width], self.vocab_ids)
            self.computed_tokens += int(sub_mask.sum())
            for row, b in enumerate(missing):
                n = int(lengths[b])
                # clone: a slice would keep the whole batch tensor alive
                self.store[indices[b]] = (f.aux[row, :n].cpu().clone(), f.last[row, :n].cpu().clone())
        B, T = ids.shape
        aux0, last0 = self.store[indices[0]]
        aux = aux0.new_zeros(B, T, aux0.shape[-1])  # [B, T, n_aux*H]; padding rows are masked out of the loss
        last = last0.new_zeros(B, T, last0.shape[-1])  # [B, T, H]
        for b, i in enumerate(indices):
            a, h = self.store[i]
            aux[b, : a.shape[0]] = a
            last[b, : h.shape[0]] = h
        device = ids.device
        aux, last = aux.to(device), last.to(device)
        weight = self.target.lm_head.weight
        logits = F.linear(last, weight if self.vocab_ids is None else weight[self.vocab_ids])  # [B, T, Vd]
        return Features(aux=aux, last=last, logits=logits)
