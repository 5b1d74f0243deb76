"""Hidden states from the serving engine: vLLM's `extract_hidden_states` method with a KV connector that runs on CPU.

vLLM 0.32 computes the target's aux hidden states during prefill (the `extract_hidden_states` speculative method
stores them in a cache-only attention layer's KV cache), and a KV connector copies each finished request's rows out.
Its example connector copies on a CUDA stream into pinned memory, which a CPU-only build cannot do; this subclass
copies synchronously and writes each request's file atomically (temporary name, then rename), so a reader never
sees half a file. Load it by module path:

    kv_transfer_config={"kv_connector": "CpuHiddenStatesConnector",
                        "kv_connector_module_path": "draftsmith.serve.hidden_states", "kv_role": "kv_producer",
                        "kv_connector_extra_config": {"shared_storage_path": DIR}}
"""

from __future__ import annotations

import os

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)


class _Done:
    """Stands in for the CUDA event the base class polls: a synchronous copy is complete when it returns."""

    @staticmethod
    def query() -> bool:
        return True


class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
    """ExampleHiddenStatesConnector with a synchronous copy and write (no CUDA stream, no pinned memory)."""

    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)  # [num_blocks]
        offsets = torch.arange(self._block_size, dtype=torch.long)  # [block_size]
        slots = (blocks[:, None] * self._block_size + offsets[None, :]).flatten()  # [num_blocks * block_size]
        n = pending.token_ids.shape[0]
        states = extract_from_kv_cache(self._kv_cache, slots.to(self._kv_cache.device), n).to("cpu", copy=True)
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        tmp = pending.filename + ".part"
        save_file({"hidden_states": states.contiguous(), "token_ids": pending.token_ids.clone()}, tmp)
        os.replace(tmp, pending.filename)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is not None:
            os.close(lock_fd)  # releases the LOCK_EX a waiting reader sleeps on
        self._req_copy_events[pending.req_id] = _Done()
