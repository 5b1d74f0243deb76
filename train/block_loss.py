"""The DFlash training objective: every anchor's block drafted at once, each slot scored against the target.

A sequence x_0..x_{T-1} with the target's aux states at every position. An anchor a stands for a serving round
whose newest verified token is x_a: its block [x_a, mask x (B-1)] sits at positions a..a+B-1, sees the context
rows 0..a-1 (their target states are known, x_a's is not) and its own block (non-causal), and slot j predicts
x_{a+j}, scored against the target's distribution at position a+j-1 with weight decay**(j-1) (the DFlash paper's
exponential decay: an early slot's miss loses the rest of the block), or (`head.slot_weights=acceptance`) with
slot j's share of the block's expected accepted length: d E[accepted] / d log q_j = sum over m >= j of
prod_{i <= m} q_i, q_i the draft's probability of the target's token at slot i, each smoothed to
(1 - floor)·q_i + floor and not differentiated. Each anchor then teaches slot j in proportion to how often the slots
before it draft right there, the rounds where slot j's draft is verified at all. All anchors of a batch run in one
forward: queries [B, A·B'] over keys [context T | blocks A·B'], masked per anchor.

Anchors are supervised positions whose next token is supervised, drawn without replacement per sequence
(`head.anchors` of them, all when fewer) by a generator seeded from the sequence's own loss mask: the loop counts
each slot's supervised rows before the forward (`block_counts`, the global denominators), and both must draw the
same anchors.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from draftsmith.train.ttt.unroll import TTTOutput, target_distribution


def pick_anchors(loss_mask: torch.Tensor, n: int) -> torch.Tensor:
    """[B, T] loss mask -> [B, A] anchor positions (A <= n; -1 pads a row with fewer candidates), ascending.

    A candidate is a position a >= 1 whose next token is supervised (a = 0 has no context to draft from)."""
    B, T = loss_mask.shape
    cand = torch.zeros(B, T, dtype=torch.bool, device=loss_mask.device)
    cand[:, 1 : T - 1] = loss_mask[:, 2:] > 0
    rows = []
    for b in range(B):
        ids = cand[b].nonzero().flatten().cpu()
        if ids.numel() > n:
            # the row's own mask seeds its draw: the same anchors for the counts and for the forward
            seed = int((loss_mask[b].cpu().long() * torch.arange(1, T + 1)).sum()) * 1_000_003 + T
            g = torch.Generator().manual_seed(seed % (2**63 - 1))
            ids = ids[torch.randperm(ids.numel(), generator=g)[:n]].sort().values
        rows.append(ids)
    A = max([r.numel() for r in rows] + [1])
    out = torch.full((B, A), -1, dtype=torch.long)
    for b, r in enumerate(rows):
        out[b, : r.numel()] = r
    return out.to(loss_mask.device)


def slot_supervision(loss_mask: torch.Tensor, anchors: torch.Tensor, k: int) -> torch.Tensor:
    """[B, A, k] bool: slot j+1 of each anchor predicts a supervised token inside the sequence."""
    T = loss_mask.shape[1]
    pos = anchors[..., None] + torch.arange(1, k + 1, device=anchors.device)  # [B, A, k]
    ok = (anchors[..., None] >= 0) & (pos < T)
    sup = loss_mask.gather(1, pos.clamp(max=T - 1).flatten(1)).view_as(pos) > 0
    return ok & sup


def block_counts(loss_mask: torch.Tensor, k: int, n: int) -> torch.Tensor:
    """[k] supervised rows per slot: the denominators the loop sums over micro-batches and ranks."""
    return slot_supervision(loss_mask, pick_anchors(loss_mask, n), k).sum((0, 1)).float()


def block_mask(anchors: torch.Tensor, T: int, size: int) -> torch.Tensor:
    """[B, 1, Q, T+Q] bool, Q = A·size: a block row sees the context rows before its anchor and its whole block."""
    B, A = anchors.shape
    Q = A * size
    first = anchors.clamp(min=1).repeat_interleave(size, dim=1)  # [B, Q] each row's anchor
    ctx = torch.arange(T, device=anchors.device)[None, None, :] < first[..., None]  # [B, Q, T]
    blk = torch.arange(Q, device=anchors.device) // size
    own = (blk[:, None] == blk[None, :]).expand(B, Q, Q)
    return torch.cat([ctx, own], dim=-1)[:, None]


def block_loss(
    head,
    aux: torch.Tensor,
    target_logits: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    anchors_per_seq: int,
    decay: float,
    target_top: torch.Tensor | None = None,
    denoms: torch.Tensor | None = None,
    loss: str = "kl",
    topk: int = 8,
    slot_weights: str = "decay",
    floor: float = 0.5,
) -> TTTOutput:
    """The DFlash loss of one micro-batch (module docstring). Shapes as `ttt_unroll`'s: aux [B, T, n·Ht],
    target_logits [B, T, V] or [B, T, Vd] (the draft vocab's rows), input_ids / loss_mask [B, T]; target_top [B, T]
    the target's full-vocab greedy token after each position (eval)."""
    B, T = input_ids.shape
    size = head.config.block_size
    k = size - 1
    dev = input_ids.device
    anchors = pick_anchors(loss_mask, anchors_per_seq)  # [B, A]
    A = anchors.shape[1]
    a = anchors.clamp(min=1)
    context = head.context(aux, torch.arange(T, device=dev).expand(B, T))
    ids = head.block_inputs(input_ids.gather(1, a), k)  # [B, A·size]
    positions = (a[..., None] + torch.arange(size, device=dev)).view(B, A * size)
    hidden = head(ids, positions, context, block_mask(anchors, T, size)).view(B, A, size, -1)  # [B, A, size, H]
    sup = slot_supervision(loss_mask, anchors, k)  # [B, A, k]
    d2t_ids = head.draft_to_target
    restricted = target_logits.shape[-1] == d2t_ids.numel() and target_logits.shape[-1] != head.config.vocab_size
    targets, scores, tops = [], [], []
    for j in range(1, size):
        m = sup[..., j - 1]  # [B, A]
        rows = (a + j - 1)[m]  # the position whose target distribution slot j learns (it predicts x_{a+j})
        bidx = torch.arange(B, device=dev)[:, None].expand(B, A)[m]
        sub = target_logits[bidx, rows]
        sub = sub if restricted else sub[..., d2t_ids]  # [n, Vd]
        targets.append(target_distribution(sub.float(), loss, topk))
        scores.append(F.log_softmax(head.logits(hidden[:, :, j][m]).float(), dim=-1))  # [n, Vd]
        tops.append(target_top[bidx, rows] if target_top is not None else d2t_ids[sub.argmax(-1)])
    weights = slot_loss_weights(sup, scores, targets, slot_weights, decay, floor)  # [B, A, k]
    losses, accs, counts, hits = [], [], [], []
    total = aux.new_zeros((), dtype=torch.float32)
    for j in range(1, size):
        m = sup[..., j - 1]
        n = m.sum()
        d = n.clamp(min=1) if denoms is None else denoms[j - 1].clamp(min=1)
        per_row = -(targets[j - 1] * scores[j - 1]).sum(-1)  # [n]
        loss_j = per_row.sum() / d
        total = total + (weights[..., j - 1][m] * per_row).sum() / d
        hit = torch.zeros(B, A, device=dev)
        hit[m] = (d2t_ids[scores[j - 1].argmax(-1)] == tops[j - 1]).float()
        losses.append(loss_j.detach())
        accs.append((hit.sum() / d).detach())
        counts.append(n.detach())
        hits.append(hit.detach())
    run = torch.cumprod(torch.stack(hits, dim=-1), dim=-1).sum(-1)  # [B, A] leading slots all agreeing
    first = sup[..., 0].float()
    return TTTOutput(total, losses, accs, counts, (run * first).sum(), first.sum())


def slot_loss_weights(sup, scores, targets, how: str, decay: float, floor: float) -> torch.Tensor:
    """[B, A, k] each anchor's weight per slot (module docstring): decay**(j-1), or (how="acceptance") slot j's share
    of the expected accepted length, sum_{m >= j} prod_{i <= m} s_i with s_i = (1 - floor)·q_i + floor, q_i the
    draft's probability of the target's likeliest draft-vocab token at slot i (scores: the supervised rows' log
    probabilities per slot, targets: the target's distributions there); an unsupervised slot neither scales the
    ones after it nor counts."""
    B, A, k = sup.shape
    if how == "decay":
        return (decay ** torch.arange(k, device=sup.device, dtype=torch.float32)).expand(B, A, k)
    if how != "acceptance":
        raise ValueError(f"slot_weights={how!r}: expected decay or acceptance")
    s = torch.ones(B, A, k, device=sup.device)
    with torch.no_grad():
        for j in range(k):
            q = scores[j].gather(-1, targets[j].argmax(-1, keepdim=True))[:, 0].exp()
            s[..., j][sup[..., j]] = (1 - floor) * q + floor
        prefix = torch.cumprod(s, dim=-1) * sup
        return prefix.flip(-1).cumsum(-1).flip(-1) * sup


class Blocks(torch.nn.Module):
    """The head and its block loss as one forward call (one pass for DDP/FSDP)."""

    def __init__(self, head, anchors: int, decay: float, loss: str = "kl", topk: int = 8, slot_weights: str = "decay",
                 floor: float = 0.5):  # fmt: skip
        super().__init__()
        self.head, self.anchors, self.decay, self.loss, self.topk = head, anchors, decay, loss, topk
        self.slot_weights, self.floor = slot_weights, floor

    def forward(self, aux, target_logits, input_ids, loss_mask, target_top=None, denoms=None) -> TTTOutput:
        return block_loss(self.head, aux, target_logits, input_ids, loss_mask, self.anchors, self.decay, target_top,
                          denoms, self.loss, self.topk, self.slot_weights, self.floor)  # fmt: skip
