"""The EAGLE-3 training-time-test (TTT) unroll.

Row j of a sequence x_0..x_{T-1} holds the target's aux state at position j. Draft step k at row j
reads token x_{j+1+k} and (for k > 0) its own step k-1 output, sits at position j+k, and predicts
x_{j+2+k}, whose target distribution is the target's softmax at position j+1+k. Attention per step is
in `heads/eagle3.py` (causal over step 0, diagonal over later steps): the context vLLM gives draft
position k at inference.

A P-EAGLE head (`head.config.parallel_drafting`) reads a mask slot at every step k > 0 instead (the mask token and
fc(mask_hidden), `Eagle3Head.mask_inputs`): the same rows, positions, attention and targets, but no step depends on
another's output, which is what lets vLLM draft the whole block in one forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class TTTOutput:
    loss: torch.Tensor  # scalar: sum_k decay**k * loss_k
    losses: list[torch.Tensor]  # per-step soft-CE, each a scalar (detached)
    accs: list[torch.Tensor]  # per-step top-1 agreement with the target's argmax (detached)
    counts: list[torch.Tensor]  # per-step number of supervised positions
    accept_len: torch.Tensor  # summed leading-run length of agreeing steps over step-0 positions
    rows: torch.Tensor  # number of step-0 supervised positions (denominator of accept_len)


def shift_left(x: torch.Tensor, n: int, fill=0) -> torch.Tensor:
    """x[:, t] <- x[:, t+n] along dim 1, padding the tail with `fill`."""
    if n == 0:
        return x
    pad = torch.full_like(x[:, :n], fill)
    return torch.cat([x[:, n:], pad], dim=1)


def ttt_unroll(
    head,
    aux: torch.Tensor,
    target_logits: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    steps: int,
    decay: float,
    target_top: torch.Tensor | None = None,
    denoms: torch.Tensor | None = None,
    loss: str = "kl",
    topk: int = 8,
    last: torch.Tensor | None = None,
    feature_loss: float = 0.0,
) -> TTTOutput:
    """Unroll the head `steps` times on its own hidden outputs and score each step against the target.

    Args:
        aux: [B, T, 3·Ht] target aux states; input_ids, loss_mask: [B, T].
        target_logits: [B, T, V] over the target vocab, or [B, T, Vd] already restricted to the draft vocab.
        target_top: [B, T] the target's full-vocab argmax; if None it is taken from target_logits (within the
            draft vocab when those are restricted, which over-counts agreement where coverage is below 100%).
        denoms: [steps] per-step denominators of the loss and accuracy means; None = this batch's own counts.
            Training passes the global counts of the whole optimizer step (all ranks, all micro-batches),
            so that summing the outputs over micro-batches and ranks gives the mean over every token.
        loss: what each step is scored against (`target_distribution`): kl | argmax | topk (the top `topk` tokens).
        last: [B, T, H] the target's final (post-norm) hidden states, read when feature_loss > 0: step k at row j
            also regresses its normed output onto last[j+1+k] (smooth L1, mean over channels, weight feature_loss).
    """
    if feature_loss and last is None:
        raise ValueError("feature_loss > 0 needs the target's final hidden states (`last`)")
    B, T = input_ids.shape
    positions = torch.arange(T, device=input_ids.device).expand(B, T)  # [B, T]
    d2t_ids = head.draft_to_target  # [Vd]
    # Only supervised rows pay for the vocab side (lm_head, log-softmax, target softmax): prompt and padding
    # rows still run the decoder layer (later rows attend to them) but never reach the [., Vd] matmuls.
    # Row j at step k predicts x_{j+2+k}, scored against the target's distribution at position j+1+k, so the
    # target side is needed exactly at positions i with loss_mask[i+1] (`need`), each normalised once.
    need = shift_left(loss_mask, 1) > 0  # [B, T]
    slot = torch.full((B, T), -1, dtype=torch.long, device=input_ids.device)
    slot[need] = torch.arange(int(need.sum()), device=input_ids.device)  # [B, T] row of `need` in target_p
    restricted = target_logits.shape[-1] == d2t_ids.numel() and target_logits.shape[-1] != head.config.vocab_size
    sub = target_logits[need] if restricted else target_logits[need][..., d2t_ids]  # [N, Vd]
    target_p = target_distribution(sub.float(), loss, topk)  # [N, Vd]
    if target_top is None:  # the target's greedy token as a target id
        target_top = torch.full((B, T), -1, dtype=torch.long, device=input_ids.device)
        target_top[need] = d2t_ids[sub.argmax(-1)] if restricted else target_logits[need].argmax(-1)
    hidden = head.fuse(aux.to(head.fc.weight.dtype))  # [B, T, H] (a bf16 target's states into fp32 master weights)
    cache = head.ttt_cache()
    parallel = getattr(head.config, "parallel_drafting", False)
    losses, accs, counts, agree = [], [], [], []
    total = aux.new_zeros(())
    for k in range(steps):
        if parallel and k > 0:  # a mask slot: neither the true token nor the previous step's output
            tokens, step_in = head.mask_inputs(B, T)
        elif k == 0:  # x_{j+1} and the target's fused states
            tokens, step_in = shift_left(input_ids, 1), hidden
        else:  # x_{j+1+k} and what the previous step hands on (`Eagle3Head.carry`)
            tokens, step_in = shift_left(input_ids, 1 + k), head.carry(hidden)
        hidden = head(tokens, positions + k, step_in, cache)  # [B, T, H]
        mask = shift_left(loss_mask, 2 + k) > 0  # [B, T] x_{j+2+k} is supervised (False past the end)
        logits = head.logits(hidden[mask]).float()  # [n, Vd]
        p = target_p[shift_left(slot, 1 + k, -1)[mask]]  # [n, Vd] target distribution at position j+1+k
        n = mask.sum()
        d = n.clamp(min=1) if denoms is None else denoms[k].clamp(min=1)
        loss_k = -(p * F.log_softmax(logits, dim=-1)).sum() / d  # forward KL up to a constant
        total = total + (decay**k) * loss_k
        if feature_loss:  # the target's own final state at j+1+k, from which its distribution above came
            want = shift_left(last, 1 + k)[mask].float()  # [n, H]
            normed = head.norm(hidden[mask]).float()  # [n, H] what lm_head reads in `logits` above
            reg = F.smooth_l1_loss(normed, want, reduction="none").mean(-1).sum() / d
            total = total + (decay**k) * feature_loss * reg
        hit = torch.zeros((B, T), device=input_ids.device)  # [B, T] draft top-1 == target top-1, supervised rows
        hit[mask] = (d2t_ids[logits.argmax(-1)] == shift_left(target_top, 1 + k, -1)[mask]).float()
        losses.append(loss_k.detach())
        accs.append((hit.sum() / d).detach())
        counts.append(n.detach())
        agree.append(hit.detach())
    # simulated chain acceptance at each supervised step-0 row: how many leading steps all agree
    row_mask = shift_left(loss_mask, 2).float()  # [B, T]
    run = torch.cumprod(torch.stack(agree, dim=-1), dim=-1).sum(-1)  # [B, T]
    return TTTOutput(total, losses, accs, counts, (run * row_mask).sum(), row_mask.sum())


def target_distribution(logits: torch.Tensor, loss: str, topk: int = 8) -> torch.Tensor:
    """[N, Vd] target logits over the draft vocab -> the distribution a step's cross-entropy is taken against.

    kl: the softmax (cross-entropy against it is forward KL up to the target's entropy); argmax: one-hot at the
    target's greedy token (what greedy serving accepts); topk: the softmax of its `topk` largest logits."""
    if loss == "kl":
        return F.softmax(logits, dim=-1)
    if loss == "argmax":
        return F.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)
    if loss == "topk":
        values, ids = logits.topk(min(topk, logits.shape[-1]), dim=-1)
        return torch.zeros_like(logits).scatter_(-1, ids, F.softmax(values, dim=-1))
    raise ValueError(f"unknown loss {loss!r} (kl | argmax | topk)")


class Unrolled(torch.nn.Module):
    """The head and its unroll as one forward call, so DDP/FSDP see (and synchronise) a single pass."""

    def __init__(self, head, steps: int, decay: float, loss: str = "kl", topk: int = 8, feature_loss: float = 0.0):
        super().__init__()
        self.head, self.steps, self.decay, self.loss, self.topk = head, steps, decay, loss, topk
        self.feature_loss = feature_loss

    def forward(self, aux, target_logits, input_ids, loss_mask, target_top=None, denoms=None, last=None) -> TTTOutput:
        return ttt_unroll(
            self.head,
            aux,
            target_logits,
            input_ids,
            loss_mask,
            self.steps,
            self.decay,
            target_top,
            denoms,
            self.loss,
            self.topk,
            last,
            self.feature_loss,
        )
