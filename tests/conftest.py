"""Shared fixtures: a tiny Llama target (built here, seconds on CPU) and the real embedded SmolLM2."""

from __future__ import annotations

import os
from pathlib import Path

# `make test` runs the tiers on two pytest-xdist workers, one per core: each worker (and every engine, trainer and
# extractor it starts, which inherit the mask) keeps to its own share of the cores, so the two never fight over
# OpenMP threads. This must happen before torch loads its OpenMP runtime, which sizes its pool from the mask.
_WORKER, _WORKERS = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
if _WORKER and _WORKERS > 1 and hasattr(os, "sched_setaffinity"):
    _cpus = sorted(os.sched_getaffinity(0))
    if len(_cpus) >= _WORKERS:
        _share = _cpus[int(_WORKER.removeprefix("gw")) % _WORKERS :: _WORKERS]
        os.sched_setaffinity(0, _share)
        os.environ["OMP_NUM_THREADS"] = str(len(_share))

import pytest  # noqa: E402
import torch  # noqa: E402

# vLLM on 2 CPU cores: in-process engine, eager, small KV cache (see DESIGN.md "Known traps").
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Longest files first. With `--dist loadfile` a file runs whole on one worker, so a long file that starts last is the
# run's tail; xdist's default reorder (most tests first) started the real-model and live-server files, one to five
# tests each, last. Serial seconds per file on a 2-core AVX2 EPYC (bench/results/2026-12-05/avx2_zen3/
# make_test_durations.txt; test_serve_live from its 2026-12-06 runs); files not named keep collection order after
# these. `make test` passes --no-loadscope-reorder so this order is the one the workers take files in.
FILE_SECONDS = {
    "test_serve_live.py": 1200,
    "test_real_model.py": 1400,  # 1,170 before the doctor's four real-model tests
    "test_mlp_real_model.py": 864,
    "test_architectures.py": 819,
    "test_vllm_contract.py": 662,
    "test_adapt.py": 232,
    "test_matrix.py": 140,
    "test_mlp_serving.py": 135,
    "test_batch_sweep.py": 134,
    "test_extract.py": 109,
    "test_offline_memory.py": 107,
    "test_shipped.py": 99,
    "test_distributed.py": 93,
    "test_eval.py": 84,
    "test_features.py": 72,
    "test_user_errors.py": 71,
    "test_probes_round3.py": 60,
    "test_convert.py": 80,
    "test_mlp_train.py": 52,
    "test_train.py": 37,
}


def pytest_collection_modifyitems(config, items):
    first = {}
    for i, item in enumerate(items):
        first.setdefault(item.path, i)
    items.sort(key=lambda item: (-FILE_SECONDS.get(item.path.name, 0), first[item.path]))


TINY = dict(
    hidden_size=128,  # vLLM's CPU attention supports head_dim 32..256, not smaller
    intermediate_size=256,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=2048,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
)


def skip_policy(head_score: float):
    """A served hybrid policy the contract tests share: the head when its chain score is above `head_score`, else
    whichever training-free draft there is; a long n-gram match (n >= 3) beats any head draft, so there the head's
    chain is skipped."""
    from draftsmith.serve.policy import Calibration, HybridPolicy

    return HybridPolicy(
        k=3,
        members={
            "head": Calibration([head_score], [0.2, 1.5], [1, 1]),
            "ngram": Calibration([2.5], [1.0, 2.0], [1, 1]),
            "suffix": Calibration([], [1.0], [1]),
        },
    )


def save_beside(policy, head_dir) -> None:
    """Save a hand-made hybrid policy (or HybridPolicies) beside an exported head, recording that head's digest as
    `eval fit-hybrid` does: a served policy must name the head it was fitted for."""
    from draftsmith.serve.policy import HybridPolicies
    from draftsmith.train.checkpoint import head_digest_of

    policies = policy if isinstance(policy, HybridPolicies) else HybridPolicies([policy])
    digest = head_digest_of(head_dir)
    for p in policies.policies:
        p.fitted_on = {**p.fitted_on, "head": digest}
    policies.save(head_dir)


def assert_sources_add_up(row: dict) -> None:
    """A served hybrid's per-source counts against vLLM's own: every scheduled draft token was proposed by a member
    (a finished request drops its last), and no member is credited more than vLLM accepted."""
    src, counters = row["hybrid_sources"], row["counters"]
    assert sum(v["draft_tokens"] for v in src.values()) >= counters["num_draft_tokens"], (src, counters)
    assert sum(v["accepted_tokens"] for v in src.values()) <= counters["num_accepted_tokens"], (src, counters)


def build_tiny_llama(vocab_size: int, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        **TINY,
    )
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="session")
def smollm2_dir():
    """The real embedded target, converted once to a safetensors HF dir (cached across runs)."""
    from draftsmith.assets import prepare_smollm2

    return prepare_smollm2()


@pytest.fixture(scope="session")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="session")
def tiny_model():
    """A tiny random Llama over a 128-token vocab, for pure tensor tests."""
    return build_tiny_llama(vocab_size=128)


@pytest.fixture(scope="session")
def tiny_target_dir(tmp_path_factory, smollm2_dir, tokenizer):
    """A tiny Llama with SmolLM2's real tokenizer and chat template, saved as an HF dir vLLM can serve."""
    out = tmp_path_factory.mktemp("tiny_target")
    model = build_tiny_llama(vocab_size=len(tokenizer))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def same_served_files(converted: Path, served: Path) -> None:
    """vLLM (and the plugin's MLP proposer) builds a draft from config.json and the weights alone: equal files serve
    equal drafts. draftsmith.json (provenance, the recorded target) is ours and may differ."""
    import json

    from safetensors.torch import load_file

    assert json.loads((converted / "config.json").read_text()) == json.loads((served / "config.json").read_text())
    names = sorted(p.name for p in served.glob("*.safetensors"))
    assert names and names == sorted(p.name for p in converted.glob("*.safetensors"))
    for f in names:
        got, want = load_file(converted / f), load_file(served / f)
        assert sorted(got) == sorted(want), f
        for name in want:
            assert got[name].dtype == want[name].dtype and torch.equal(got[name], want[name]), (f, name)
