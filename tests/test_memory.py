"""Dry run: exact parameter counts from meta-device builds, layout arithmetic, and the run.py entry (no weights)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def compose(*overrides):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from draftsmith.train.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(overrides))


def test_llama8b_dry_run_counts_and_layouts():
    from draftsmith.train.memory import GiB, estimate

    cfg = compose("conf=eagle3_llama8b")
    e = estimate(cfg, processes=8)
    assert e["target_params"] == 8_030_261_248  # Llama-3.1-8B, from the preset's arch numbers alone
    H, I, V, Vd = 4096, 14336, 128256, 32000
    layer = 2 * H * 4096 + 2 * 2 * H * 1024 + 4096 * H + 3 * H * I + 3 * H  # q,k,v on 2H, o, mlp, 3 norms
    assert e["head_trainable_params"] == 3 * H * H + layer + H + H * Vd  # fc, layer, norm, lm_head
    assert e["head_frozen_params"] == V * H  # the target embedding copy
    ddp, z3 = e["layouts"]["ddp"], e["layouts"]["zero3 / fsdp FULL_SHARD"]
    assert ddp["target weights"] == pytest.approx(8_030_261_248 * 2 / GiB)  # bf16, whole on every rank
    assert z3["target weights"] == ddp["target weights"]  # the frozen target is never sharded
    assert z3["AdamW state (2 x fp32)"] == pytest.approx(ddp["AdamW state (2 x fp32)"] / 8)
    assert z3["head params (fp32)"] == pytest.approx(ddp["head params (fp32)"] / 8)
    assert ddp["total"] < 80  # the preset fits an 80 GB GPU, as its header says


def test_offline_features_keep_only_the_target_ends():
    from draftsmith.train.memory import GiB, estimate

    e = estimate(compose("conf=eagle3_llama70b"), processes=8)
    assert e["target_params"] > 70e9
    V, H, Vd = 128256, 8192, 32000  # embedding + final norm + the draft vocab's lm_head rows, bf16
    assert e["layouts"]["ddp"]["target weights"] == pytest.approx((V + 1 + Vd) * H * 2 / GiB)  # 2.4 GiB, not 131
    assert e["layouts"]["ddp"]["target forward (transient)"] == 0
    whole = estimate(compose("conf=eagle3_llama70b", "data.features=online"), processes=8)
    assert whole["layouts"]["ddp"]["target weights"] > 50 * e["layouts"]["ddp"]["target weights"]
    assert e["stream_producer_gib"] is None and whole["stream_producer_gib"] is None
    # stream: the rank holds the same ends; the whole target sits in its producer process, reported apart
    stream = estimate(compose("conf=eagle3_llama70b", "data.features=stream"), processes=8)
    assert stream["layouts"]["ddp"]["target weights"] == e["layouts"]["ddp"]["target weights"]
    assert stream["stream_producer_gib"] == pytest.approx(whole["layouts"]["ddp"]["target weights"])


def test_tiny_dry_run_matches_the_built_models(tiny_target_dir, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from draftsmith.train.build import build_head
    from draftsmith.train.data.vocab import build_draft_vocab
    from draftsmith.train.memory import estimate
    from draftsmith.train.target import Target

    over = [
        f"target.name_or_path={tiny_target_dir}",
        "target.hidden_size=128",
        "target.num_hidden_layers=6",
        "target.vocab_size=49152",
        "target.aux_layer_ids=[1,3,4]",
        "head.draft_vocab_size=512",
    ]
    cfg = compose("conf=eagle3_smollm2", *over)
    e = estimate(cfg, processes=2)
    model = AutoModelForCausalLM.from_pretrained(tiny_target_dir)
    assert e["target_params"] == sum(p.numel() for p in model.parameters())
    vocab = build_draft_vocab(torch.ones(49152, dtype=torch.long), 512, pinned_ids=[])
    head = build_head(cfg.head, Target(model, [1, 3, 4]), vocab)
    assert e["head_trainable_params"] == sum(p.numel() for p in head.parameters() if p.requires_grad)
    # the entry point: prints the table and stops before loading anything or writing checkpoints
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "train" / "run.py"),
            "conf=eagle3_smollm2",
            *over,
            "dry_run=true",
            "dry_run_processes=2",
            f"output_dir={out}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| zero3 / fsdp FULL_SHARD |" in proc.stdout and "2 processes" in proc.stdout
    assert not (out / "checkpoints").exists()
