"""`draftsmith export` never deletes what it was not asked to replace, and a non-checkpoint says what is missing (fast).

Each refusal: the exit status, a message naming the path and the fix, and every file still there afterwards.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch
from conftest import build_tiny_llama
from safetensors.torch import save_file

from draftsmith.cli import main as cli
from draftsmith.errors import ConfigError
from draftsmith.export.destination import check_export_destination, is_previous_export
from draftsmith.train.checkpoint import CheckpointError, resolve_checkpoint

AUX = [1, 3, 4]


def tiny_target(path: Path, seed: int = 0, vocab_size: int = 256) -> Path:
    """A tiny Llama saved as an HF dir (config.json + model.safetensors; no tokenizer, export does not need one)."""
    build_tiny_llama(vocab_size=vocab_size, seed=seed).save_pretrained(path)
    return path


def make_run(run: Path, target_dir: Path, family: str = "eagle3", step: int = 4) -> Path:
    """A run dir with one checkpoint of a freshly initialised head, as training writes it (head.json + tensors)."""
    from transformers import AutoConfig

    tc = AutoConfig.from_pretrained(target_dir)
    torch.manual_seed(0)
    if family == "eagle3":
        from draftsmith.train.heads.eagle3 import Eagle3Config, Eagle3Head

        cfg = Eagle3Config.from_target(tc, 64, AUX, ttt_steps=2)
        head = Eagle3Head(cfg)
        t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        t2d[:64] = True  # the draft vocab: the first 64 target ids
        head.set_vocab(torch.zeros(64, dtype=torch.long), t2d)
        state = head.trainable_state_dict()
    elif family == "dflash":
        from draftsmith.train.heads.dflash import DFlashConfig, DFlashHead

        cfg = DFlashConfig.from_target(tc, 64, AUX, mask_token_id=1, block_size=4)
        head = DFlashHead(cfg)
        t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        t2d[:64] = True
        head.set_vocab(torch.zeros(64, dtype=torch.long), t2d)
        state = head.trainable_state_dict()
    else:
        from draftsmith.train.heads.mlp_speculator import MLPSpeculator, MLPSpeculatorConfig

        cfg = MLPSpeculatorConfig.from_target(tc, n_predict=2)
        state = MLPSpeculator(cfg).trainable_state_dict()
    ckpt = run / "checkpoints" / f"step_{step:08d}"
    ckpt.mkdir(parents=True)
    save_file({k: v.detach().contiguous() for k, v in state.items()}, ckpt / "head.safetensors")
    (ckpt / "head.json").write_text(json.dumps({"family": family, "config": cfg.to_dict(), "step": step}))
    (run / "metrics.jsonl").write_text('{"step": 4}\n')
    return run


def snapshot(root: Path) -> dict[str, str]:
    """Every file under root -> its sha256: equal snapshots mean nothing was deleted or changed."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def target_a(tmp_path_factory):
    return tiny_target(tmp_path_factory.mktemp("targets") / "target_a")


@pytest.fixture
def run(tmp_path, target_a):
    return make_run(tmp_path / "runs" / "a", target_a)


def export(capsys, *args) -> tuple[int, str]:
    rc = cli(["export", "--format", "vllm", *map(str, args)])
    return rc, capsys.readouterr().err


# ---------------------------------------------------------------- refusals


def test_out_that_is_a_file_is_refused(run, tmp_path, capsys):
    out = tmp_path / "notes.txt"
    out.write_text("my notes\n")
    for extra in ([], ["--force"]):
        rc, err = export(capsys, run, out, *extra)
        assert rc == 2, err
        assert f"{out} is a file; pick a directory" in err and "Traceback" not in err
    assert out.read_text() == "my notes\n"


@pytest.mark.parametrize("force", [False, True])
def test_out_that_is_the_run_or_its_checkpoint_is_refused_even_with_force(run, capsys, force):
    before = snapshot(run)
    ckpt = resolve_checkpoint(run)
    for src, out in [(run, run), (ckpt, ckpt), (ckpt, ckpt.parent), (run, run / "checkpoints")]:
        rc, err = export(capsys, src, out, *(["--force"] if force else []))
        assert rc == 2, (src, out, err)
        assert f"export destination {out}" in err and "--force does not override this" in err
        assert "would delete the head being exported" in err and "Pick a directory outside it" in err
    assert snapshot(run) == before


def test_out_that_contains_the_run_is_refused(tmp_path, target_a, capsys):
    runs = tmp_path / "runs"
    a, b = make_run(runs / "a", target_a), make_run(runs / "b", target_a, step=8)
    before = snapshot(runs)
    for extra in ([], ["--force"]):
        rc, err = export(capsys, a, runs, *extra)
        assert rc == 2 and f"export destination {runs} contains {a}" in err, err
    assert snapshot(runs) == before and resolve_checkpoint(b).name == "step_00000008"


def test_non_empty_directory_needs_force(run, tmp_path, capsys):
    out = tmp_path / "mine"
    (out / "sub").mkdir(parents=True)
    (out / "notes.txt").write_text("keep me\n")
    (out / "sub" / "data.bin").write_bytes(b"\x00\x01")
    before = snapshot(out)
    rc, err = export(capsys, run, out)
    assert rc == 2, err
    assert f"export destination {out} is a non-empty directory that is not a previous export" in err
    assert "notes.txt, sub/" in err and "add --force" in err
    assert snapshot(out) == before
    rc, err = export(capsys, run, out, "--force")  # asked for: replaced as a whole
    assert rc == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "draftsmith.json", "model.safetensors"]


def test_reexport_into_a_previous_export_needs_no_force(run, tmp_path, capsys):
    out = tmp_path / "exported"
    assert export(capsys, run, out)[0] == 0
    assert is_previous_export(out)
    rc, err = export(capsys, run, out, "--dialect", "native")  # the README's re-run: replaced without asking
    assert rc == 0, err
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLMEagle3"]
    assert is_previous_export(out)
    (out / "README.md").write_text("my write-up\n")  # a user's file beside an export: no longer only an export
    rc, err = export(capsys, run, out)
    assert rc == 2 and "README.md" in err and (out / "README.md").read_text() == "my write-up\n"


def test_mlp_reexport_and_empty_dir(tmp_path, target_a, capsys):
    run = make_run(tmp_path / "mlp_run", target_a, family="mlp_speculator")
    out = tmp_path / "empty"
    out.mkdir()
    assert export(capsys, run, out)[0] == 0  # an empty directory holds nothing to lose
    assert json.loads((out / "config.json").read_text())["model_type"] == "mlp_speculator"
    assert export(capsys, run, out)[0] == 0 and is_previous_export(out)


def test_a_target_recorded_under_home_as_tilde_is_checked(tmp_path, target_a, capsys, monkeypatch):
    """Committed runs record the home directory as `~` (draftsmith/paths.py): export expands it, checks the head
    against that target and records the absolute path, instead of skipping the check."""
    run = make_run(tmp_path / "runs" / "home", target_a)
    head_json = resolve_checkpoint(run) / "head.json"
    meta = json.loads(head_json.read_text())
    meta["config"]["target"]["name_or_path"] = f"~/{target_a.name}"
    head_json.write_text(json.dumps(meta))
    monkeypatch.setenv("HOME", str(target_a.parent))
    rc, err = export(capsys, run, tmp_path / "exported")
    assert rc == 0, err
    assert "check skipped" not in err
    verifier = json.loads((tmp_path / "exported" / "config.json").read_text())["speculators_config"]["verifier"]
    assert verifier["name_or_path"] == str(target_a.resolve())


def test_symlinked_out_is_refused(run, tmp_path, capsys):
    real = tmp_path / "real"
    real.mkdir()
    (real / "keep.txt").write_text("x")
    link = tmp_path / "link"
    os.symlink(real, link)
    rc, err = export(capsys, run, link, "--force")
    assert rc == 2 and f"{link} is a symbolic link" in err
    assert (real / "keep.txt").read_text() == "x" and link.is_symlink()


def test_library_export_is_safe_too(run, tmp_path):
    from draftsmith.export.vllm import export_eagle3
    from draftsmith.train.checkpoint import load_head
    from draftsmith.train.heads.eagle3 import Eagle3Config

    meta, state = load_head(run)
    cfg = Eagle3Config(**meta["config"])
    user = tmp_path / "user"
    user.mkdir()
    (user / "data.csv").write_text("1,2\n")
    with pytest.raises(ConfigError, match="not a previous export"):
        export_eagle3(state, cfg, user, verifier="t")
    with pytest.raises(ConfigError, match="is the directory being exported"):
        export_eagle3(state, cfg, run, verifier="t", source=run, force=True)
    assert (user / "data.csv").read_text() == "1,2\n" and resolve_checkpoint(run).is_dir()
    out = export_eagle3(state, cfg, tmp_path / "fresh", verifier="t")
    assert export_eagle3(state, cfg, out, verifier="t") == out  # a previous export: replaced
    check_export_destination(run, tmp_path / "new" / "deeper")  # a path that does not exist yet is fine


# ---------------------------------------------------------------- not a checkpoint


def test_not_a_checkpoint_names_what_is_missing(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    with pytest.raises(CheckpointError, match=f"{missing} does not exist") as e:
        resolve_checkpoint(missing)
    assert not isinstance(e.value, FileNotFoundError)
    empty = tmp_path / "outputs" / "run"
    (empty / "checkpoints").mkdir(parents=True)
    with pytest.raises(CheckpointError, match="holds no checkpoint: neither head.safetensors") as e:
        resolve_checkpoint(empty)
    assert "Is this the run's output_dir?" in str(e.value) and "save_every" in str(e.value)
    rc, err = export(capsys, empty, tmp_path / "out")
    assert rc == 1 and str(empty) in err and "holds no checkpoint" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_an_exported_dir_is_not_a_checkpoint(run, tmp_path, capsys):
    out = tmp_path / "exported"
    assert export(capsys, run, out)[0] == 0
    rc, err = export(capsys, out, tmp_path / "again")
    assert rc == 1 and f"{out} is an exported head" in err
