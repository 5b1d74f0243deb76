"""Serve an exported MLP speculator in vLLM V1 through vLLM's `custom_class` proposer hook.

    from vllm import LLM
    from draftsmith.serve.plugin import speculative_kwargs
    llm = LLM(model=TARGET, **speculative_kwargs("exported/mlp_smollm2", k=3), disable_log_stats=False)
    # = speculative_config={"method": "custom_class", "model": "draftsmith.serve.plugin.MLPSpeculatorProposer",
    #                       "num_speculative_tokens": 3},
    #   additional_config={"mlp_speculator": "exported/mlp_smollm2"}

vLLM 0.32 V1 has no MLP-speculator method (its `mlp_speculator` model is disabled in the registry and the
model runner raises "Unknown speculative decoding method" for it), but it builds any class named by
`speculative_config.model` when method is `custom_class`, and then:

* calls `drafter.load_model(target_model)` after loading the target (the CPU runner does; so do GPU
  runners for drafters with a model), which is where we hook the target's forward to keep its final
  (post-norm) hidden states, the positions, and each request's row range (`query_start_loc` from the
  step's attention metadata);
* calls `drafter.propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)` after every step, with
  the tokens each request accepted this step. The state the speculator needs is the target's hidden
  state at the position that produced the last accepted token: for request i with L_i tokens, position
  L_i - 2, which sits in request i's rows at offset (L_i - 2) - (first position of those rows).

Rejection, the bonus token and the spec-decode counters (`vllm:spec_decode_*`) are vLLM's own, as for
every other method. Where the exported directory comes from: `additional_config["mlp_speculator"]`
(vLLM's slot for plugin settings) or, failing that, the environment variable DRAFTSMITH_MLP_SPECULATOR.

The `vllm.general_plugins` entry point (`register`, run by vLLM in every engine process) also lets the
directory itself name the class: `{"method": "custom_class", "model": "exported/mlp_smollm2.MLPSpeculator"}`.
vLLM imports the part before the last dot as a module; the plugin's import finder answers for a path
to an exported MLP speculator with a module whose `MLPSpeculator` is this proposer bound to that path
(the path must contain no other dot, since Python reads dots in module names as packages).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

CLASS_PATH = "draftsmith.serve.plugin.MLPSpeculatorProposer"
ENV = "DRAFTSMITH_MLP_SPECULATOR"


def speculative_kwargs(head_dir: str | os.PathLike, k: int | None = None) -> dict:
    """LLM(...) keyword arguments that serve the exported MLP speculator at `head_dir` with k tokens."""
    head_dir = str(Path(head_dir).resolve())
    n = json.loads((Path(head_dir) / "config.json").read_text())["n_predict"]
    return {
        "speculative_config": {"method": "custom_class", "model": CLASS_PATH, "num_speculative_tokens": k or n},
        "additional_config": {"mlp_speculator": head_dir},
    }


def load_speculator(head_dir: str | os.PathLike, device="cpu", dtype=torch.float32):
    """Our MLPSpeculator module from an exported HF MLPSpeculatorPreTrainedModel directory (validated)."""
    from safetensors.torch import load_file

    from draftsmith.export.mlp import config_from_hf, validate_mlp_export, vocab_map
    from draftsmith.train.heads.mlp_speculator import MLPSpeculator

    config = validate_mlp_export(head_dir)  # a draft vocab's map is checked against the config's vocab here
    head = MLPSpeculator(config_from_hf(config))
    state = {k[len("speculator.") :]: v for k, v in load_file(Path(head_dir) / "model.safetensors").items()}
    state.update(vocab_map(head_dir))  # d2t / t2d of a draft-vocab speculator: picks map back to target ids
    missing = head.load_state_dict(state, strict=False)
    assert set(missing.missing_keys) <= set(head.state_dict()) - set(head.trainable_state_dict()), missing
    return head.to(device=device, dtype=dtype).eval()


class MLPSpeculatorProposer:
    """vLLM `custom_class` drafter: the MLP speculator's greedy chain on the target's last hidden state."""

    head_dir: str | None = None  # set on the classes the import finder binds to a directory

    def __init__(self, vllm_config):
        extra = vllm_config.additional_config if isinstance(vllm_config.additional_config, dict) else {}
        head_dir = self.head_dir or extra.get("mlp_speculator") or os.environ.get(ENV)
        if not head_dir:
            raise ValueError(
                f"{CLASS_PATH}: no speculator directory; pass additional_config={{'mlp_speculator': DIR}} or set {ENV}"
            )
        self.k = vllm_config.speculative_config.num_speculative_tokens
        self.head_dir = str(head_dir)
        self.head = None
        self.captured: dict = {}
        self.vllm_config = vllm_config
        # set by the hybrid drafter (draftsmith.serve.hybrid) around each call: the chain's length this step (None: k),
        # and whether to keep `last_probs`, per stage the head's probability of each request row's pick (0 for rows
        # that drafted nothing)
        self.steps: int | None = None
        self.keep_probs = False
        self.last_probs: list[list[float]] = []

    def load_model(self, target_model) -> None:
        """Load the speculator next to the target and hook the target's forward (called once by the runner)."""
        params = next(target_model.parameters())
        self.head = load_speculator(self.head_dir, device=params.device, dtype=params.dtype)
        n = self.head.config.n_predict
        if self.k > n:
            raise ValueError(f"num_speculative_tokens={self.k} but the speculator at {self.head_dir} has {n} heads")
        hf = self.vllm_config.model_config.hf_config
        problems = [
            f"{what} {mine} != the target's {theirs}"
            for what, mine, theirs in (
                ("emb_dim", self.head.config.emb_dim, hf.hidden_size),
                ("vocab_size", self.head.config.vocab_size, getattr(hf, "vocab_size", self.head.config.vocab_size)),
            )
            if mine != theirs
        ]
        if problems:
            vocab = " (its draft vocab maps rows to ids of that vocab)" if self.head.config.reduced else ""
            raise ValueError(
                f"the MLP speculator at {self.head_dir} was trained for another target: {'; '.join(problems)}{vocab}"
            )
        target_model.register_forward_hook(self._capture, with_kwargs=True)

    def _capture(self, module, args, kwargs, output) -> None:
        from vllm.forward_context import get_forward_context, is_forward_context_available

        hidden = output[0] if isinstance(output, tuple) else output  # [num_tokens, H] post final norm
        positions = kwargs.get("positions", args[1] if len(args) > 1 else None)  # [num_tokens]
        qsl = None
        if is_forward_context_available():
            md = get_forward_context().attn_metadata
            md = md[0] if isinstance(md, list) and md else md
            if isinstance(md, dict) and md:
                qsl = getattr(next(iter(md.values())), "query_start_loc", None)
        if not isinstance(hidden, torch.Tensor) or positions is None or qsl is None:
            return  # a profiling/dummy run, or pipeline-parallel intermediate tensors: nothing to draft from
        self.captured = {"hidden": hidden, "positions": positions, "qsl": qsl.tolist()}

    @torch.no_grad()
    def propose(
        self, sampled_token_ids: list[list[int]], num_tokens_no_spec, token_ids_cpu, slot_mappings=None, **_
    ) -> list[list[int]]:
        cap = self.captured
        rows, tokens, live = [], [], []
        for i, sampled in enumerate(sampled_token_ids):
            if not sampled or not cap or i + 1 >= len(cap["qsl"]):
                continue  # a partial prefill (nothing sampled) or a request this step did not run
            start, end = cap["qsl"][i], cap["qsl"][i + 1]
            n_tok = int(num_tokens_no_spec[i])  # tokens so far, the accepted ones included
            row = start + (n_tok - 2) - int(cap["positions"][start])
            if not start <= row < end:
                continue  # should not happen; drafting nothing is always safe
            rows.append(row)
            tokens.append(sampled[-1])
            live.append(i)
        drafts: list[list[int]] = [[] for _ in sampled_token_ids]
        steps = self.k if self.steps is None else min(self.k, self.steps)
        self.last_probs = [[0.0] * len(sampled_token_ids) for _ in range(steps)] if self.keep_probs else []
        if rows and steps > 0:
            hidden = cap["hidden"][torch.tensor(rows, device=cap["hidden"].device)]  # [N, H]
            tok = torch.tensor(tokens, device=hidden.device)  # [N]
            if self.keep_probs:
                out, probs = self.head.propose(hidden, tok, steps, probs=True)
                for s, row in enumerate(probs.t().tolist()):  # [steps][N]
                    for i, p in zip(live, row):
                        self.last_probs[s][i] = p
            else:
                out = self.head.propose(hidden, tok, steps)
            for i, d in zip(live, out.tolist()):  # [N, steps]
                drafts[i] = d
        self.captured = {}
        return drafts


class _SpeculatorDirFinder:
    """Import hook: a module name that is a path to an exported MLP speculator -> a module holding its proposer."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        import importlib.util

        if "/" not in fullname and not fullname.startswith("~"):
            return None  # ordinary module names never reach the file system here
        head_dir = Path(fullname).expanduser()
        try:
            config = json.loads((head_dir / "config.json").read_text())
        except (OSError, ValueError):
            return None
        if config.get("model_type") != "mlp_speculator":
            return None
        return importlib.util.spec_from_loader(fullname, _SpeculatorDirLoader(str(head_dir.resolve())))


class _SpeculatorDirLoader:
    def __init__(self, head_dir: str):
        self.head_dir = head_dir

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.MLPSpeculator = type("MLPSpeculator", (MLPSpeculatorProposer,), {"head_dir": self.head_dir})


def register() -> None:
    """vLLM general plugin, run by vLLM in every process it starts (the API server, the engine core, each worker), so
    what it sets up holds in a user's server as in our own runner: it refuses a vLLM outside the tested range
    (serve/compat.py), applies the CPU fixes (serve/fixes.py) on a CPU build, installs the import finder for MLP
    speculator directories, checks each engine's draft against its method (serve/draft_check.py) and wraps the model
    runner for the hybrid drafter (which does nothing unless
    additional_config names a hybrid). Idempotent: vLLM may call it more than once in a process."""
    import sys

    from draftsmith.serve.compat import check_vllm

    check_vllm()
    if not any(isinstance(f, _SpeculatorDirFinder) for f in sys.meta_path):
        sys.meta_path.append(_SpeculatorDirFinder())
    from draftsmith.serve import draft_check, fixes, hybrid

    fixes.apply_on_cpu()
    draft_check.install()
    hybrid.install()
