"""A crash loses nothing that was finished: kill -9 mid-run then resume continues the loss curve bit for bit;
a write killed midway leaves the previous checkpoint; rotation; unusable checkpoints and NaN losses explain
themselves."""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_distributed import chats, tiny_args

from draftsmith.train import checkpoint as ckpt_mod
from draftsmith.train.checkpoint import CheckpointError, checkpoints, load_head, load_trainer_state, resolve_checkpoint

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "train" / "run.py"
ENV = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
STEPS = 24


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("resume_data") / "chats.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in chats(40)))
    return path


def args(target_dir, data_file, out, *extra):
    # 24 steps over 4-batch epochs: the kill and the resume cross epoch boundaries (data order per epoch)
    return [
        sys.executable,
        str(RUN),
        *tiny_args(
            target_dir, data_file, out, f"optim.max_steps={STEPS}", "save_every=3", "keep_checkpoints=2", *extra
        ),
    ]


def losses(run_dir: Path) -> dict[int, list[float]]:
    """step -> every loss logged for it (a step logged twice would show up as two values)."""
    out: dict[int, list[float]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if "loss" in r:
            out.setdefault(r["step"], []).append(r["loss"])
    return out


def test_kill9_then_resume_is_bit_exact(tiny_target_dir, data_file, tmp_path):
    full = tmp_path / "full"
    p = subprocess.run(args(tiny_target_dir, data_file, full), capture_output=True, text=True, timeout=600, env=ENV)
    assert p.returncode == 0, p.stderr[-3000:]

    kill_at = random.Random(5).randint(4, STEPS - 8)  # a step after the first checkpoint (step 3), before the end
    for attempt in range(3):  # on a starved machine the poller can miss the window: try again, killing earlier
        killed = tmp_path / f"killed{attempt}"
        proc = subprocess.Popen(
            args(tiny_target_dir, data_file, killed), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV
        )
        metrics = killed / "metrics.jsonl"
        deadline = time.time() + 1800  # generous: on a shared 2-core machine a niced run can be starved for minutes
        try:
            while time.time() < deadline and proc.poll() is None:
                if metrics.exists() and len(metrics.read_text().splitlines()) >= kill_at:
                    proc.send_signal(signal.SIGKILL)
                    break
                time.sleep(0.005)
        finally:
            if proc.poll() is None:
                proc.kill()  # never leave the child behind (a second SIGKILL is harmless)
            proc.wait()
        if proc.returncode == -signal.SIGKILL:
            break
        kill_at = 4
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    last = max(losses(killed))
    assert last < STEPS
    saved = int(resolve_checkpoint(killed).name.split("_")[1])
    assert 3 <= saved <= last

    p = subprocess.run(
        args(tiny_target_dir, data_file, killed, "resume=auto"), capture_output=True, text=True, timeout=1800, env=ENV
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"resumed from {killed / 'checkpoints' / f'step_{saved:08d}'}" in p.stdout
    ref, got = losses(full), losses(killed)
    assert sorted(got) == sorted(ref) == list(range(1, STEPS + 1))
    print(
        f"\nSIGKILL after step {last}, resumed from step {saved}; losses per step (uninterrupted | killed+resumed): "
        + ", ".join(f"{s}: {ref[s][0]:.6f} | {got[s]}" for s in sorted(ref))
    )
    for step, values in got.items():  # steps run before the kill, re-run after it, and new ones: all identical
        assert all(v == ref[step][0] for v in values), (step, values, ref[step])
    # the resume drops the lines the kill left past its checkpoint: every step is logged once, as in `full`
    assert all(len(v) == 1 for v in got.values()), {s: v for s, v in got.items() if len(v) != 1}
    a = load_file(full / "checkpoints" / f"step_{STEPS:08d}" / "head.safetensors")
    b = load_file(killed / "checkpoints" / f"step_{STEPS:08d}" / "head.safetensors")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)
    sa = load_trainer_state(full)
    sb = load_trainer_state(killed)
    assert sa["scheduler"] == sb["scheduler"] and (sa["epoch"], sa["cursor"]) == (sb["epoch"], sb["cursor"])
    for (ka, va), (_, vb) in zip(sa["optimizer"]["state"].items(), sb["optimizer"]["state"].items()):
        for name in va:
            assert torch.equal(torch.as_tensor(va[name]), torch.as_tensor(vb[name])), (ka, name)
    assert [p.name for p in checkpoints(killed)] == [f"step_{STEPS - 3:08d}", f"step_{STEPS:08d}"]  # keep 2


def fake_state(step: int) -> tuple[dict, dict, dict]:
    return {"w": torch.full((4,), float(step))}, {"family": "eagle3", "config": {}, "step": step}, {"step": step}


def test_write_killed_midway_keeps_previous_and_rotation(tmp_path, monkeypatch):
    run = tmp_path / "run"
    for step in (1, 2, 3, 4):
        ckpt_mod.save_checkpoint(run, step, *fake_state(step), keep=3)
    assert [p.name for p in checkpoints(run)] == ["step_00000002", "step_00000003", "step_00000004"]

    def dies(*a, **k):  # the process dies after the weights, before the trainer state
        raise KeyboardInterrupt

    monkeypatch.setattr(ckpt_mod.torch, "save", dies)
    with pytest.raises(KeyboardInterrupt):
        ckpt_mod.save_checkpoint(run, 5, *fake_state(5), keep=3)
    monkeypatch.undo()
    # a SIGKILL leaves its temporary directory behind: it is never taken for a checkpoint
    stray = run / "checkpoints" / ".tmp-step_00000006-x"
    stray.mkdir()
    (stray / "head.safetensors").write_bytes(b"partial")
    assert resolve_checkpoint(run).name == "step_00000004"
    meta, tensors = load_head(run)
    assert meta["step"] == 4 and tensors["w"][0].item() == 4.0
    assert not (run / "checkpoints" / "step_00000005").exists()


def test_truncated_or_corrupt_checkpoint_names_the_file(tmp_path):
    run = tmp_path / "run"
    for step in (1, 2):
        ckpt_mod.save_checkpoint(run, step, *fake_state(step), keep=3)
    latest = run / "checkpoints" / "step_00000002"
    data = (latest / "head.safetensors").read_bytes()
    (latest / "head.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"step_00000002/head.safetensors: unreadable.*step_00000001"):
        load_head(run)
    (latest / "trainer.pt").write_bytes(b"\x00garbage")
    with pytest.raises(CheckpointError, match="trainer.pt: unreadable"):
        load_trainer_state(run)
    (latest / "head.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="head.json: unreadable"):
        load_head(latest)


@pytest.fixture(scope="module")
def two_steps(tiny_target_dir, data_file, tmp_path_factory):
    """A run dir whose only checkpoint is step 2."""
    run = tmp_path_factory.mktemp("two_steps") / "run"
    p = subprocess.run(
        args(tiny_target_dir, data_file, run, "optim.max_steps=2", "save_every=2"),
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return run


def test_checkpoint_from_another_target_or_vocab_is_refused(tiny_target_dir, data_file, two_steps, tmp_path):
    run = two_steps
    other = tmp_path / "other"  # the same run resumed with another head shape: refused, naming the field
    shutil.copytree(run / "checkpoints", other / "checkpoints")
    p = subprocess.run(
        [*args(tiny_target_dir, data_file, other, "resume=auto", "head.intermediate_size=64")],
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
    )
    assert p.returncode != 0
    assert "trained for another target or head shape: intermediate_size checkpoint=256 here=64" in p.stderr
    words = tmp_path / "words.jsonl"  # other data, so another draft vocab of the same size
    words.write_text(
        "".join(
            json.dumps(
                {
                    "id": f"w{i}",
                    "messages": [
                        {"role": "user", "content": f"Spell {i} zebra quantum violin."},
                        {
                            "role": "assistant",
                            "content": f"Zebra {i}, quantum {i * 7}, violin {i * 13}: xylophone jukebox.",
                        },
                    ],
                }
            )
            + "\n"
            for i in range(40)
        )
    )
    p = subprocess.run(
        [*args(tiny_target_dir, words, other, "resume=auto", "head.draft_vocab_size=128")],
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
    )
    assert p.returncode != 0 and "draft_vocab_size checkpoint=512 here=128" in p.stderr
    p = subprocess.run(
        [*args(tiny_target_dir, words, other, "resume=auto")], capture_output=True, text=True, timeout=600, env=ENV
    )
    assert p.returncode != 0 and "its draft vocab differs" in p.stderr


def test_a_checkpoint_from_before_a_head_field_existed_counts_as_its_default(tiny_model, tmp_path):
    """head.json written before `num_layers` existed resumes into a one-layer head and is refused for two."""
    from draftsmith.train.checkpoint import check_same_head, field_defaults
    from draftsmith.train.heads.eagle3 import Eagle3Config

    one = Eagle3Config.from_target(tiny_model.config, 32, [1, 3, 4]).to_dict()
    old = {"family": "eagle3", "config": {k: v for k, v in one.items() if k != "num_layers"}}
    defaults = field_defaults(Eagle3Config)
    check_same_head(old, one, tmp_path, defaults=defaults)
    with pytest.raises(CheckpointError, match="num_layers checkpoint=1 here=2"):
        check_same_head(old, {**one, "num_layers": 2}, tmp_path, defaults=defaults)


def test_nan_loss_stops_naming_the_step_and_keeps_the_checkpoint(tiny_target_dir, data_file, two_steps, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(two_steps / "checkpoints", run / "checkpoints")
    before = (run / "checkpoints" / "step_00000002" / "head.safetensors").read_bytes()
    # the same target with a NaN in one weight: the next step's loss is NaN
    from transformers import AutoModelForCausalLM

    bad = tmp_path / "nan_target"
    model = AutoModelForCausalLM.from_pretrained(tiny_target_dir)
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight[0, 0] = float("nan")
    model.save_pretrained(bad)
    for f in Path(tiny_target_dir).glob("*"):
        if f.name.startswith(("tokenizer", "chat_template", "special_tokens")):
            shutil.copy(f, bad / f.name)
    p = subprocess.run(
        [*args(bad, data_file, run, "resume=auto")], capture_output=True, text=True, timeout=600, env=ENV
    )
    assert p.returncode != 0
    assert "train: error: loss is nan at step 2 (epoch 0, batch 2, conversations on rank 0: ['c" in p.stderr
    assert "Traceback" not in p.stderr  # one message, no stack
    assert "last good checkpoint kept" in p.stderr
    assert [c.name for c in checkpoints(run)] == ["step_00000002"]
    assert (run / "checkpoints" / "step_00000002" / "head.safetensors").read_bytes() == before


def test_eval_and_export_refuse_a_head_from_another_target(two_steps, tiny_model, tmp_path, capsys):
    from draftsmith.cli import main
    from draftsmith.eval.reference_decoder import load_head_drafter
    from draftsmith.train.target import Target

    other = Target(tiny_model, [1, 3, 4])  # same width, a 128-token vocab instead of 49,152
    with pytest.raises(
        CheckpointError, match=r"trained for .*tiny_target.*not this target: vocab_size head=49152 target=128"
    ):
        load_head_drafter("mine", two_steps, other)
    tiny_model.save_pretrained(tmp_path / "other_target")
    assert (
        main(
            [
                "export",
                "--format",
                "vllm",
                str(two_steps),
                str(tmp_path / "out"),
                "--target",
                str(tmp_path / "other_target"),
            ]
        )
        == 1
    )
    assert "vocab" in capsys.readouterr().err


def test_prepare_only_stops_before_training_and_resume_auto_trains(tiny_target_dir, data_file, tmp_path):
    """The quickstart's first child (prepare_only=true): the data and the offline features are made and the held-out
    prompts written, no step is trained; the same command with resume=auto then trains from step 0 on those features
    (not extracted again)."""
    run, cache = tmp_path / "run", tmp_path / "cache"
    env = {**ENV, "DRAFTSMITH_CACHE": str(cache)}
    base = args(tiny_target_dir, data_file, run, "data.features=offline", "resume=auto")
    p = subprocess.run([*base, "prepare_only=true"], capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "prepare_only: data and features ready" in p.stdout + p.stderr
    assert not checkpoints(run) and not (run / "metrics.jsonl").exists()
    held = [json.loads(x) for x in (run / "heldout_prompts.jsonl").read_text().splitlines()]
    assert len(held) == 4 and all(h["messages"] for h in held)
    shards = sorted(cache.rglob("*.safetensors"))
    assert shards and json.loads((run / "prepare_seconds.json").read_text())["features_s"] > 0
    stamps = {s: s.stat().st_mtime_ns for s in shards}
    p = subprocess.run(base, capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert sorted(losses(run)) == list(range(1, STEPS + 1))
    assert {s: s.stat().st_mtime_ns for s in sorted(cache.rglob("*.safetensors"))} == stamps  # not extracted again
