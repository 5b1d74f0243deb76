"""The target's features computed by vLLM (`draftsmith extract --backend vllm`, `data.features_backend=vllm`).

The serving engine runs the prefill; its `extract_hidden_states` speculative method captures the residual stream at
the run's aux layers (vLLM's own layer convention, the one the served head reads) and at the last layer, and
`draftsmith.serve.hidden_states.CpuHiddenStatesConnector` hands each request's rows over as a file. From them a row
is what the HF backend writes: `aux` (the aux states side by side), `last` (the final norm applied to the last
layer's residual stream, as the HF forward's `last_hidden_state` is) and, for held-out samples, `top` (the
full-vocab argmax of the lm_head over `last`). Only the final norm and the lm_head are read outside vLLM
(`TargetEnds`); the decoder layers load once, in the engine.

The engine runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, as every engine draftsmith starts on CPU).
A finished request's rows are copied out at the engine's next step, so after each batch the engine is stepped
until every file is there. Prefix caching is off: a cached prefix would skip the forward that captures its rows.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from draftsmith.errors import ConfigError
from draftsmith.train.features.shards import row_of

DRAIN_STEPS = 64  # engine steps after a batch before its missing files are an error (one step writes them all)


class VllmFeatures:
    """A vLLM engine over the target that yields feature rows; `rows` has `feature_rows`' signature."""

    def __init__(self, target, max_len: int, max_batch_tokens: int, workdir: Path, log=print):
        """`target`: the run's Target or TargetEnds (its path, aux layer ids and dtype; its final norm and lm_head
        turn the last layer's states into `last` and `top`)."""
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # read when the engine starts: steps run here
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        # the engine's start-up log is ~40 lines of INFO/WARNING a user of `extract` has no use for; errors still show
        # (set VLLM_LOGGING_LEVEL=INFO to see it)
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        from vllm import LLM

        self.ends, dtype, aux_layer_ids = target, target.dtype, list(target.aux_layer_ids)
        self.n_aux = len(aux_layer_ids)
        layers = [
            *aux_layer_ids,
            target.config.get_text_config().num_hidden_layers,
        ]  # the last entry: the residual stream after the last decoder layer
        self.tmp = Path(tempfile.mkdtemp(prefix=".vllm-states-", dir=workdir))
        names = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
        t0 = time.time()
        self.llm = LLM(
            model=target.config._name_or_path,
            dtype=names[dtype],
            enforce_eager=True,
            max_model_len=max_len + 1,
            max_num_batched_tokens=max(max_batch_tokens, max_len + 1),
            enable_prefix_caching=False,
            seed=0,
            speculative_config={
                "method": "extract_hidden_states",
                "num_speculative_tokens": 1,
                "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": layers}},
            },
            kv_transfer_config={
                "kv_connector": "CpuHiddenStatesConnector",
                "kv_connector_module_path": "draftsmith.serve.hidden_states",
                "kv_role": "kv_producer",
                "kv_connector_extra_config": {"shared_storage_path": str(self.tmp), "use_synchronization_lock": False},
            },
        )
        log(f"extract: vLLM engine ready in {time.time() - t0:.0f} s (aux layers {list(aux_layer_ids)} + last)")

    def close(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)
        del self.llm

    def _states(self, prompts: list[list[int]]) -> list[torch.Tensor]:
        """Each prompt's captured states [n, n_aux + 1, H], in order."""
        from safetensors.torch import load_file
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        outs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompts], SamplingParams(max_tokens=1), use_tqdm=False
        )
        paths = [o.kv_transfer_params["hidden_states_path"] for o in outs]
        core = self.llm.llm_engine.engine_core
        for _ in range(DRAIN_STEPS):  # the last requests' rows are copied out at the next engine step
            if all(os.path.exists(p) for p in paths):
                break
            core.get_output()
        states = []
        for p, ids in zip(paths, prompts):
            if not os.path.exists(p):
                raise RuntimeError(f"vLLM wrote no hidden states to {p} after {DRAIN_STEPS} engine steps")
            got = load_file(p)
            os.unlink(p)
            if got["token_ids"].tolist() != ids:
                raise RuntimeError(f"{p}: vLLM's hidden states belong to another prompt")
            states.append(got["hidden_states"])  # [n, n_aux + 1, H]
        return states

    @torch.no_grad()
    def rows(self, target, samples, indices: list[int], fields, dtype: torch.dtype, pad_id: int, device) -> list[dict]:
        del target, pad_id, device  # the engine holds the target
        states = self._states([list(samples[i].input_ids) for i in indices])
        full_vocab = None
        rows = []
        for i, hs in zip(indices, states):
            n = len(samples[i].input_ids)
            norm = self.ends.norm
            last = norm(hs[:, self.n_aux].to(norm.weight.dtype)).to(dtype)  # [n, H]
            values = {"aux": hs[:, : self.n_aux].reshape(n, -1).to(dtype), "last": last}  # [n, n_aux*H], [n, H]
            if "top" in fields:
                if full_vocab is None:
                    full_vocab = torch.arange(self.ends.config.get_text_config().vocab_size)
                w = self.ends.output_weight(full_vocab)  # [V, H]
                values["top"] = (last.to(w.dtype) @ w.T).argmax(-1)  # [n]
            rows.append(row_of(samples[i], i, {k: values[k] for k in fields}, dtype))
        return rows


def check_backend(backend: str, world: int) -> None:
    """The vLLM backend extracts in one process (the value itself is checked with the config's choices)."""
    if backend == "vllm" and world > 1:
        raise ConfigError(
            "the vLLM backend extracts in one process (the engine uses every core, and its own tensor parallelism "
            "on GPUs): run draftsmith extract --backend vllm without torchrun/accelerate launch"
        )
