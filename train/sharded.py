"""FSDP2 (torch `fully_shard`) over the head: the same code path on GPUs and, with gloo, on CPU.

accelerate 1.15 builds FSDP only for accelerator devices: an FSDP launch on a CPU machine
(`ACCELERATE_USE_CPU=1`, `ACCELERATE_USE_FSDP=true`) silently becomes plain DDP. torch's `fully_shard` itself
runs on CPU with gloo, so `use_fsdp_on_cpu` turns such a launch into what it asked for; everything after that
(accelerate's `prepare`, `no_sync`, gradient clipping) is accelerate's own FSDP2 path, the one a GPU launch takes.
Only the gathering of weights for a checkpoint is ours (`full_model_state`): accelerate's `get_state_dict` asks for a
broadcast from rank 0, which on a CPU mesh hands back the DTensor shards.

A sharded head keeps its weights and optimizer state as per-rank DTensor shards, so a checkpoint gathers them
(`full_optimizer_state`, a collective every rank calls) and a resume scatters them back (`load_full_state`):
the checkpoint holds the whole state whatever the layout, and a resume continues exactly.
"""

from __future__ import annotations

import os

from accelerate.utils import DistributedType

from draftsmith.errors import ConfigError


def use_fsdp_on_cpu(accelerator) -> bool:
    """Make a CPU FSDP launch FSDP (accelerate would run it as DDP); True when it did. A CPU DeepSpeed launch is
    refused: accelerate 1.15 starts no process group for it, so every process would train alone (or, with
    ACCELERATE_USE_CPU=1, as plain DDP). Call right after building the Accelerator, before anything is prepared."""
    state = accelerator.state
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true" and accelerator.device.type == "cpu":
        raise ConfigError(
            "a DeepSpeed launch on a machine without a GPU: accelerate starts no DeepSpeed process group on CPU, so "
            "each process would train alone. Use --config_file conf/accelerate/fsdp.yaml (FSDP2 shards the head on "
            "CPU too) or conf/accelerate/ddp.yaml here, and DeepSpeed on the GPU machine"
        )
    asked = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    if not asked or state.distributed_type != DistributedType.MULTI_CPU:
        return False
    from accelerate.utils import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin()  # reads the FSDP_* variables accelerate launch sets from the config
    if plugin.fsdp_version != 2:
        raise ConfigError(
            "FSDP on CPU needs FSDP2 (fsdp_version: 2 in the accelerate config, as conf/accelerate/fsdp.yaml has): "
            "FSDP1 has no CPU process-group support"
        )
    if accelerator.mixed_precision != "no":
        plugin.set_mixed_precision(accelerator.mixed_precision)
    from accelerate import PartialState

    state.distributed_type = DistributedType.FSDP
    state.fsdp_plugin = plugin
    # every later AcceleratorState() copies PartialState's fields over its own, as accelerate's GPU path expects
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    return True


def is_sharded(accelerator) -> bool:
    """The head's parameters are per-rank shards (FSDP or DeepSpeed ZeRO)."""
    return accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED)


def _options(**kw):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True, **kw)


def _bare(optimizer):
    """The torch optimizer inside accelerate's wrapper."""
    return getattr(optimizer, "optimizer", optimizer)


def full_model_state(model) -> dict:
    """An FSDP2 model's state gathered whole on rank 0 (other ranks get {}; a collective). accelerate's
    `get_state_dict` asks for a broadcast from rank 0 too, which on a CPU mesh hands back the DTensor shards."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_options())


def full_optimizer_state(model, optimizer) -> dict:
    """The optimizer state of an FSDP2 model, gathered whole and keyed by parameter name (a collective)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, _bare(optimizer), options=_options())


def load_full_state(model, optimizer, prefix: str, weights: dict, optimizer_state: dict) -> None:
    """Scatter whole head weights (keys without `prefix`) and a `full_optimizer_state` back into an FSDP2 model's
    shards (every rank calls it with the same tensors)."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    set_model_state_dict(model, {prefix + k: v for k, v in weights.items()}, options=_options(strict=False))
    set_optimizer_state_dict(model, _bare(optimizer), optimizer_state, options=_options())


def sharded_layout(state: dict) -> bool:
    """Whether a saved optimizer state is a gathered FSDP one (keyed by parameter names) rather than torch's own
    (keyed by parameter index)."""
    return any(isinstance(k, str) for k in state.get("state", {})) or any(
        isinstance(p, str) for g in state.get("param_groups", []) for p in g.get("params", [])
    )


def gathered(model):
    """A context in which an FSDP2 model's submodules hold their whole parameters (for calling the head directly,
    outside the wrapped forward, e.g. held-out evaluation); a no-op for any other model."""
    import contextlib

    unshard = getattr(model, "unshard", None)
    if unshard is None:
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def ctx():
        unshard()
        try:
            yield
        finally:
            model.reshard()

    return ctx()
