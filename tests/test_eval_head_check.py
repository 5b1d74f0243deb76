"""A head is served only next to the target it was made for, checked before any vLLM engine starts (fast).

Tiny targets: A, B (A's architecture and sizes, another seed: another model of the same width), a copy of A in
another directory (the same model), and targets of another width, vocab and depth. No test here starts vLLM:
`subprocess.Popen` is replaced by a function that fails the test.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import TINY
from test_export_refusals import AUX, make_run, tiny_target

from draftsmith.eval.head_check import check_head_for_target, exported_head_config, model_difference
from draftsmith.train.checkpoint import CheckpointError


def other_llama(path: Path, **changes) -> Path:
    """A tiny Llama with some of TINY's sizes changed."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(**{**TINY, "vocab_size": 256, **changes})
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    root = tmp_path_factory.mktemp("targets")
    a = tiny_target(root / "target_a", seed=0)
    copy = root / "copy" / "target_a_copy"
    shutil.copytree(a, copy)
    return {
        "a": a,
        "b": tiny_target(root / "target_b", seed=1),
        "copy": copy,
        "narrow": other_llama(
            root / "narrow", hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1
        ),
        "vocab": tiny_target(root / "vocab320", vocab_size=320),
        "shallow": other_llama(root / "shallow", num_hidden_layers=3),
    }


@pytest.fixture(scope="module")
def heads(targets, tmp_path_factory):
    """Heads made for target A: a run dir, its speculators / native / MLP exports."""
    from draftsmith.cli import main as cli

    root = tmp_path_factory.mktemp("heads")
    run = make_run(root / "run", targets["a"])
    mlp_run = make_run(root / "mlp_run", targets["a"], family="mlp_speculator")
    dflash_run = make_run(root / "dflash_run", targets["a"], family="dflash")
    out = {"run": run, "speculators": root / "speculators", "native": root / "native", "mlp": root / "mlp",
           "dflash": root / "dflash"}  # fmt: skip
    assert cli(["export", str(run), str(out["speculators"])]) == 0
    assert cli(["export", str(run), str(out["native"]), "--dialect", "native"]) == 0
    assert cli(["export", str(mlp_run), str(out["mlp"])]) == 0
    assert cli(["export", str(dflash_run), str(out["dflash"]), "--k", "2"]) == 0
    return out


@pytest.fixture(autouse=True)
def no_engine(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a vLLM engine process was started")

    monkeypatch.setattr(subprocess, "Popen", boom)


@pytest.mark.parametrize("kind", ["speculators", "native", "mlp", "dflash", "run"])
def test_same_target_passes(targets, heads, kind):
    check_head_for_target(heads[kind], str(targets["a"]))
    check_head_for_target(heads[kind], str(targets["copy"]))  # a copy elsewhere: equal config and weights


@pytest.mark.parametrize("kind", ["speculators", "native", "mlp", "dflash", "run"])
def test_another_model_of_the_same_width_is_refused(targets, heads, kind):
    a, b = str(targets["a"]), str(targets["b"])
    with pytest.raises(CheckpointError) as e:
        check_head_for_target(heads[kind], b)
    msg = str(e.value)
    assert f"head {heads[kind]} was" in msg and f"for {'target' if kind == 'run' else 'verifier'} {a}" in msg
    assert f"--target is {b}" in msg and "differs" in msg  # same config, sampled weights differ
    assert f"--target {a}" in msg and f"draftsmith export --target {b}" in msg


def test_width_vocab_and_depth_mismatches_are_refused(targets, heads):
    with pytest.raises(CheckpointError, match=r"not this target: target_hidden_size head=128 target=64"):
        check_head_for_target(heads["speculators"], str(targets["narrow"]))
    with pytest.raises(CheckpointError, match=r"emb_dim head=128 target=64"):
        check_head_for_target(heads["mlp"], str(targets["narrow"]))
    with pytest.raises(CheckpointError, match=r"vocab_size head=256 target=320"):
        check_head_for_target(heads["native"], str(targets["vocab"]))
    with pytest.raises(CheckpointError, match=r"aux layers \[3, 4\] beyond 3"):
        check_head_for_target(heads["speculators"], str(targets["shallow"]))
    with pytest.raises(CheckpointError, match=r"target_hidden_size head=128 target=64"):
        check_head_for_target(heads["dflash"], str(targets["narrow"]))
    with pytest.raises(CheckpointError, match=r"aux layers \[3, 4\] beyond 3"):
        check_head_for_target(heads["dflash"], str(targets["shallow"]))


def test_exported_config_is_read_per_dialect(targets, heads):
    a = str(targets["a"])
    spec, native, mlp = (exported_head_config(heads[k]) for k in ("speculators", "native", "mlp"))
    assert spec == {
        "vocab_size": 256,
        "target_hidden_size": 128,
        "draft_vocab_size": 64,
        "aux_layer_ids": AUX,
        "target": {"name_or_path": a},
    }
    assert native == spec
    assert mlp == {"emb_dim": 128, "vocab_size": 256, "target": {"name_or_path": a}}
    assert exported_head_config(heads["dflash"]) == {**spec, "aux_layer_ids": AUX}  # dflash_config's ids + 1


def test_hub_id_verifier_compares_names(targets, heads, tmp_path):
    head = tmp_path / "hub_head"
    shutil.copytree(heads["speculators"], head)
    config = json.loads((head / "config.json").read_text())
    config["speculators_config"]["verifier"]["name_or_path"] = "some-org/target_a"  # not a local dir
    (head / "config.json").write_text(json.dumps(config))
    check_head_for_target(head, str(targets["a"]))  # the same last path component
    with pytest.raises(CheckpointError, match="different names"):
        check_head_for_target(head, str(targets["b"]))
    assert model_difference("smollm2", "SmolLM2-135M-Instruct") is None  # the embedded alias, both spellings


def test_unrecorded_sizes_are_not_guessed(targets, tmp_path):
    """A config that records nothing to compare passes here; vLLM reports it as a failed method."""
    head = tmp_path / "bare"
    head.mkdir()
    (head / "config.json").write_text(json.dumps({"speculators_model_type": "eagle3"}))
    check_head_for_target(head, str(targets["b"]))


def test_run_acceptance_refuses_before_any_engine(targets, heads, tmp_path):
    from draftsmith.eval.acceptance import run_acceptance

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "hi"}) + "\n")
    with pytest.raises(CheckpointError, match=f"--target is {targets['b']}"):
        run_acceptance(
            str(targets["b"]),
            str(prompts),
            ["none"],
            {"mine": str(heads["speculators"])},
            k=3,
            max_tokens=8,
            num_prompts=None,
            out_dir=str(tmp_path / "out"),
        )
    assert not (tmp_path / "out").exists()  # refused before the output directory was made


def test_eval_cli_reports_the_refusal(targets, heads, tmp_path, capsys):
    from draftsmith.eval.cli import main as eval_main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "hi"}) + "\n")
    rc = eval_main(
        [
            "acceptance",
            "--target",
            str(targets["b"]),
            "--head",
            f"mine={heads['speculators']}",
            "--methods",
            "",
            "--prompts",
            str(prompts),
            "--out",
            str(tmp_path / "out"),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and f"head {heads['speculators']} was exported for verifier {targets['a']}" in err


def test_matrix_checks_a_checkpoint_before_exporting_it(targets, heads, tmp_path):
    from transformers import AutoConfig

    from draftsmith.eval.matrix import _prepare_heads

    b = str(targets["b"])
    with pytest.raises(CheckpointError, match=f"head {heads['run']} was trained for target"):
        _prepare_heads({"mine": str(heads["run"])}, b, tmp_path / "m", print, AutoConfig.from_pretrained(b))
    assert not (tmp_path / "m" / "heads").exists()  # refused before the on-the-fly export
    with pytest.raises(CheckpointError, match="was exported for verifier"):
        _prepare_heads({"x": str(heads["native"])}, b, tmp_path / "m", print, AutoConfig.from_pretrained(b))
    a = str(targets["a"])
    served, info = _prepare_heads({"mine": str(heads["run"])}, a, tmp_path / "m", print, AutoConfig.from_pretrained(a))
    assert served["mine"] == str(tmp_path / "m" / "heads" / "mine") and info["mine"]["family"] == "eagle3"
    check_head_for_target(served["mine"], a)  # the on-the-fly export records the target it was checked against
