"""The head's optimizer: AdamW, or Muon on the hidden matrices with AdamW on the rest (optim.name).

    optimizer = build_optimizer(cfg.optim, head)

Muon (Jordan et al., 2024) steps a weight matrix along its momentum orthogonalised by a Newton-Schulz iteration:
every singular direction of the update moves by the same amount, so no single input column (such as SmolLM2's aux
channel near 1,000) sets the step. Its update is scaled by 0.2·sqrt(max(rows, cols)) so that its RMS matches
AdamW's (Liu et al., "Muon is Scalable for LLM Training"), which lets both parts share optim.lr, the warmup and
the cosine. The output side (lm_head, the MLP speculator's heads and embeddings) and every vector (norm weights)
stay with AdamW, as Muon's authors use it. One Optimizer, so schedulers, checkpoints and accelerate see one object.
"""

from __future__ import annotations

import torch
from torch import nn

from draftsmith.errors import ConfigError

# the quintic Newton-Schulz coefficients of Muon's reference implementation (maximise the slope at zero)
NS_COEFFS = (3.4445, -4.7750, 2.0315)
OUTPUT_SIDE = ("lm_head", "head.", "emb.", "embed_tokens")  # parameter-name prefixes that stay with AdamW


def orthogonalise(g: torch.Tensor, steps: int = 5, eps: float = 1e-7, dtype=torch.float32) -> torch.Tensor:
    """[m, n] -> approximately U·Vᵀ of g's SVD (singular values pushed towards 1), in g's dtype. The iteration
    runs in `dtype`: bf16 is what Muon's reference uses (~6x faster than fp32 on an AMX CPU for fc's shape)."""
    a, b, c = NS_COEFFS
    x = g.to(dtype)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / (x.norm() + eps)  # spectral norm <= Frobenius norm <= 1: inside the iteration's basin
    for _ in range(steps):
        s = x @ x.T
        x = a * x + (b * s + c * s @ s) @ x
    return (x.T if tall else x).to(g.dtype)


class MuonAdamW(torch.optim.Optimizer):
    """Param groups with `muon=True` take Muon steps (2-D parameters only), the others AdamW steps."""

    def __init__(self, groups: list[dict], lr: float, betas=(0.9, 0.95), weight_decay: float = 0.0, eps=1e-8,
                 momentum: float = 0.95, nesterov: bool = True, ns_steps: int = 5, ns_bf16: bool = False):  # fmt: skip
        defaults = dict(
            lr=lr, betas=tuple(betas), weight_decay=weight_decay, eps=eps, momentum=momentum, nesterov=nesterov,
            ns_steps=ns_steps, ns_bf16=ns_bf16, muon=False,
        )  # fmt: skip
        super().__init__(groups, defaults)
        for group in self.param_groups:
            if group["muon"] and any(p.ndim != 2 for p in group["params"]):
                raise ValueError("Muon steps 2-D weight matrices only")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, wd = group["lr"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if wd:
                    p.mul_(1 - lr * wd)  # decoupled weight decay, as AdamW
                if group["muon"]:
                    if not state:
                        state["momentum"] = torch.zeros_like(p)
                    buf, mu = state["momentum"], group["momentum"]
                    buf.mul_(mu).add_(p.grad)
                    update = p.grad.add(buf, alpha=mu) if group["nesterov"] else buf
                    scale = 0.2 * max(p.shape) ** 0.5  # update RMS of AdamW's (Muon is scalable, sec. 2.2)
                    ns_dtype = torch.bfloat16 if group["ns_bf16"] else torch.float32
                    p.add_(orthogonalise(update, group["ns_steps"], dtype=ns_dtype), alpha=-lr * scale)
                else:
                    if not state:
                        state["step"] = torch.zeros((), dtype=torch.float32)
                        state["exp_avg"] = torch.zeros_like(p)
                        state["exp_avg_sq"] = torch.zeros_like(p)
                    b1, b2 = group["betas"]
                    state["step"] += 1
                    t = float(state["step"])
                    state["exp_avg"].lerp_(p.grad, 1 - b1)
                    state["exp_avg_sq"].mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                    denom = (state["exp_avg_sq"] / (1 - b2**t)).sqrt_().add_(group["eps"])
                    p.addcdiv_(state["exp_avg"], denom, value=-lr / (1 - b1**t))
        return loss


def muon_groups(head: nn.Module) -> list[dict]:
    """The head's trainable parameters split into Muon's (hidden 2-D matrices) and AdamW's (the rest)."""
    hidden, rest = [], []
    for name, p in head.named_parameters():
        if not p.requires_grad:
            continue
        (hidden if p.ndim == 2 and not name.startswith(OUTPUT_SIDE) else rest).append(p)
    return [{"params": hidden, "muon": True}, {"params": rest, "muon": False}]


def decays(name: str, p: torch.Tensor, mode: str) -> bool:
    """Whether optim.decay=`mode` applies weight decay to parameter `name`: all | matrices (not the norm weights
    and other vectors) | hidden (only the hidden matrices Muon steps: not lm_head, the embeddings, the vectors)."""
    if mode == "all":
        return True
    if mode == "matrices":
        return p.ndim >= 2
    if mode == "hidden":
        return p.ndim == 2 and not name.startswith(OUTPUT_SIDE)
    raise ConfigError(f"optim.decay={mode!r}: expected all | matrices | hidden")


def split_decay(groups: list[dict], names: dict, weight_decay: float, mode: str) -> list[dict]:
    """`groups` with each split into its decayed and undecayed parameters (weight_decay 0 on the latter); with
    mode=all, the groups as they are (so checkpoints of runs from before optim.decay resume)."""
    if mode == "all":
        return groups
    out = []
    for g in groups:
        for on in (True, False):
            params = [p for p in g["params"] if decays(names[p], p, mode) == on]
            if params:
                out.append({**g, "params": params, "weight_decay": weight_decay if on else 0.0})
    return out


def build_optimizer(optim_cfg, head: nn.Module, distributed: str = "no") -> torch.optim.Optimizer:
    """optim.name's optimizer over the head's trainable parameters. `distributed`: accelerate's distributed type
    name; Muon needs whole matrices, so it refuses the sharded ones (DeepSpeed, FSDP). `optim_cfg`: the run's
    optim config or an OptimConfig (train/config.py holds every default)."""
    name, wd, mode = optim_cfg.name, optim_cfg.weight_decay, optim_cfg.decay
    kw = dict(lr=optim_cfg.lr, betas=tuple(optim_cfg.betas), weight_decay=wd)
    names = {p: n for n, p in head.named_parameters()}
    if name == "adamw":
        groups = [{"params": [p for p in head.parameters() if p.requires_grad]}]
        return torch.optim.AdamW(split_decay(groups, names, wd, mode), **kw)
    if name == "muon":
        if distributed.upper() in ("DEEPSPEED", "FSDP"):
            raise ConfigError(
                f"optim.name=muon orthogonalises whole weight matrices; {distributed} shards them. "
                "Use optim.name=adamw or a DDP/single-process launch"
            )
        from draftsmith.train.build import fast_bf16

        device = next(p.device for p in head.parameters())
        # bf16 Newton-Schulz where it is faster
        groups = split_decay(muon_groups(head), names, wd, mode)
        return MuonAdamW(groups, ns_steps=optim_cfg.ns_steps, ns_bf16=fast_bf16(device), **kw)
    raise ConfigError(f"optim.name={name!r}: expected adamw | muon")
