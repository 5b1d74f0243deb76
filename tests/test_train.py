"""End to end on a tiny target: train.py runs, checkpoints, resumes exactly, exports; every preset composes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "train" / "run.py"


def conversations(n: int) -> list[dict]:
    topics = ["the sea", "a red fox", "prime numbers", "tea", "the moon", "rivers", "old maps", "bicycles"]
    out = []
    for i in range(n):
        t = topics[i % len(topics)]
        out.append(
            {
                "id": f"c{i}",
                "conversations": [
                    {"from": "human", "value": f"Tell me something about {t}, please ({i})."},
                    {"from": "gpt", "value": f"Here is a fact about {t}: it is often described as remarkable. " * 3},
                    {"from": "human", "value": "And one more?"},
                    {"from": "gpt", "value": f"Another fact: {t} appears in many stories."},
                ],
            }
        )
    return out


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "chats.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in conversations(40)))
    return path


def run_train(tiny_target_dir, data_file, out_dir, *overrides):
    args = [
        sys.executable,
        str(RUN),
        "conf=eagle3_smollm2",
        f"target.name_or_path={tiny_target_dir}",
        "target.hidden_size=128",
        "target.num_hidden_layers=6",
        "target.vocab_size=49152",
        "target.aux_layer_ids=[1,3,4]",
        f"data.path={data_file}",
        "data.also=[]",  # not the preset's code sets
        "data.num_conversations=32",
        "data.heldout=4",
        "data.max_length=96",
        "data.max_tokens_per_batch=512",
        "data.max_batch_size=4",
        "head.draft_vocab_size=512",
        "data.features=online",  # bit-exact resume; memory mode recomputes features after a resume
        "optim.max_steps=8",
        "optim.warmup_steps=2",
        "optim.max_minutes=null",
        "log_every=1",
        "eval_every=4",
        "save_every=4",
        "keep_checkpoints=3",
        "eval_batches=1",
        "wandb.mode=disabled",
        f"output_dir={out_dir}",
        *overrides,
    ]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env, cwd=out_dir.parent)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def test_train_checkpoint_resume_is_exact_and_exports(tiny_target_dir, data_file, tmp_path):
    full = tmp_path / "full"
    proc = run_train(tiny_target_dir, data_file, full)
    assert "(timed probe)" in proc.stdout  # mixed_precision=auto, nothing recorded yet
    ckpts = sorted((full / "checkpoints").glob("step_*"))
    assert [p.name for p in ckpts] == ["step_00000004", "step_00000008"]
    logs = [json.loads(x) for x in (full / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in logs if "loss" in r]
    assert len(losses) == 8 and all(x == x for x in losses)
    assert any("eval/acc" in r for r in logs)
    assert (full / "heldout_prompts.jsonl").read_text().count("\n") == 4

    # resume from step 4 in a fresh run dir: the step-8 weights must equal the uninterrupted run's
    resumed = tmp_path / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    import shutil

    shutil.copytree(ckpts[0], resumed / "checkpoints" / ckpts[0].name)
    proc = run_train(tiny_target_dir, data_file, resumed, "resume=auto")
    assert "resumed from" in proc.stdout and f"(recorded in {resumed / 'checkpoints' / ckpts[0].name})" in proc.stdout
    a = load_file(full / "checkpoints" / "step_00000008" / "head.safetensors")
    b = load_file(resumed / "checkpoints" / "step_00000008" / "head.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)
    start = load_file(ckpts[0] / "head.safetensors")
    assert not torch.equal(start["fc.weight"], a["fc.weight"])  # it trained

    # the precision a resume uses is the checkpoint's record, not a new probe (whose timing may answer otherwise)
    meta = json.loads((ckpts[0] / "head.json").read_text())
    assert isinstance(meta["fast_bf16"], bool)
    flipped = tmp_path / "flipped" / "checkpoints" / ckpts[0].name
    shutil.copytree(ckpts[0], flipped)
    (flipped / "head.json").write_text(json.dumps({**meta, "fast_bf16": not meta["fast_bf16"]}))
    from draftsmith.train.checkpoint import CHECKSUMS, file_sha256

    sums = json.loads((flipped / CHECKSUMS).read_text())  # as if saved so: its record of head.json follows
    (flipped / CHECKSUMS).write_text(json.dumps({**sums, "head.json": file_sha256(flipped / "head.json")}))
    proc = run_train(tiny_target_dir, data_file, flipped.parent.parent, "resume=auto", "optim.max_steps=5")
    assert f"autocast {'no' if meta['fast_bf16'] else 'bf16'}\n" in proc.stdout
    saved = (flipped.parent.parent / "config.yaml").read_text()
    assert f"fast_bf16: {str(not meta['fast_bf16']).lower()}" in saved
    # fast_bf16 set on the command line overrides a record, and says the resume is not exact
    proc = run_train(
        tiny_target_dir, data_file, flipped.parent.parent, "resume=auto", "optim.max_steps=6",
        f"fast_bf16={str(meta['fast_bf16']).lower()}",
    )  # fmt: skip
    assert "(fast_bf16 set)" in proc.stdout and "not an exact resume" in proc.stdout

    # export the run dir (latest checkpoint), contract-checked against the tiny target
    from draftsmith.cli import main

    assert main(["export", "--format", "vllm", str(full), str(tmp_path / "exported")]) == 0
    config = json.loads((tmp_path / "exported" / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3"
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    assert config["speculators_config"]["verifier"]["name_or_path"] == str(tiny_target_dir)
    assert config["draft_vocab_size"] == 512


def test_wrong_target_preset_fails_fast(tiny_target_dir, data_file, tmp_path):
    args = [
        sys.executable,
        str(RUN),
        "conf=eagle3_smollm2",
        f"target.name_or_path={tiny_target_dir}",
        f"data.path={data_file}",
        f"output_dir={tmp_path / 'x'}",
        "wandb.mode=disabled",
    ]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "not the model this preset describes" in proc.stderr


@pytest.mark.parametrize("preset", sorted(p.stem for p in (ROOT / "conf" / "conf").glob("*.yaml")))
def test_every_preset_composes(preset):
    from hydra import compose, initialize_config_dir

    from draftsmith.train.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"conf={preset}", "head.ttt_steps=2"])
    assert cfg.head.ttt_steps == 2
    assert cfg.run_name == preset
    assert len(cfg.target.aux_layer_ids) == 3


def test_llama8b_preset_matches_the_issue():
    from hydra import compose, initialize_config_dir

    from draftsmith.train.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["conf=eagle3_llama8b"])
        assert (cfg.target.hidden_size, cfg.target.num_hidden_layers, cfg.target.vocab_size) == (4096, 32, 128256)
        assert list(cfg.target.aux_layer_ids) == [2, 16, 29]
        assert (cfg.head.draft_vocab_size, cfg.head.ttt_steps, cfg.head.ttt_decay) == (32000, 7, 0.8)
        assert cfg.data.max_length == 2048 and cfg.mixed_precision == "bf16"
        with pytest.raises(Exception, match="tt_steps"):
            compose(config_name="config", overrides=["conf=eagle3_llama8b", "head.tt_steps=3"])


def test_supervise_all_trains_on_prompt_rows_too(tiny_target_dir, data_file, tmp_path):
    """data.supervise=all scores every real token (prompt rows included); held-out eval stays assistant-only."""
    runs = {}
    for mode in ("assistant", "all"):
        out = tmp_path / mode
        run_train(
            tiny_target_dir,
            data_file,
            out,
            f"data.supervise={mode}",
            "optim.max_steps=2",
            "eval_every=2",
            "save_every=0",
        )
        runs[mode] = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    tokens = {m: [r["tokens"] for r in logs if "loss" in r][-1] for m, logs in runs.items()}
    assert tokens["all"] > 1.3 * tokens["assistant"], tokens  # the user turns and system prompt join the loss

    # a token budget counts those tokens too, so the lr cosine spans the steps the budget takes and has come down
    # when the budget stops the run (it spanned 1.3x too many steps once: the run stopped with its lr mid-way)
    out = tmp_path / "budget"
    run_train(
        tiny_target_dir,
        data_file,
        out,
        "data.supervise=all",
        "optim.max_steps=null",
        f"optim.max_tokens={4 * tokens['all']}",
        "save_every=0",
    )
    logs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in logs if "loss" in r]
    peak = max(r["lr"] for r in steps)
    assert steps[-1]["tokens"] >= 4 * tokens["all"] > steps[-2]["tokens"]
    assert steps[-1]["lr"] <= 0.12 * peak, [round(r["lr"] / peak, 3) for r in steps]  # min_lr_ratio 0.1


def test_overflow_split_trains_on_every_window(tiny_target_dir, data_file, tmp_path):
    """data.overflow=split turns the tokens truncation drops into more samples, and the truncating run says what
    it drops and how to keep it."""
    procs, stats = {}, {}
    for mode in ("truncate", "split"):
        out = tmp_path / mode
        procs[mode] = run_train(
            tiny_target_dir, data_file, out, "data.max_length=64", f"data.overflow={mode}", "optim.max_steps=1"
        )
        stats[mode] = json.loads((out / "data_stats.json").read_text())
    t, s = stats["truncate"], stats["split"]
    assert t["render"]["train"]["truncated"] > 0 and s["render"]["train"]["extra_windows"] > 0
    assert s["train_samples"] == t["train_samples"] + s["render"]["train"]["extra_windows"]
    assert s["train_tokens"] > t["train_tokens"] and s["heldout_tokens"] == t["heldout_tokens"]
    assert "data.overflow=split keeps them" in procs["truncate"].stdout + procs["truncate"].stderr
    assert "data.overflow=split keeps them" not in procs["split"].stdout + procs["split"].stderr


def test_supervise_rejects_unknown_values(tiny_target_dir, data_file, tmp_path):
    with pytest.raises(AssertionError, match=r"data.supervise=everything: expected one of assistant \| all"):
        run_train(tiny_target_dir, data_file, tmp_path / "x", "data.supervise=everything")


def test_auto_precision_follows_the_timed_probe(monkeypatch):
    """mixed_precision=auto takes bf16 on a CPU only where the probe measured it >= 1.2x faster than fp32."""
    import torch

    from draftsmith.train import build

    monkeypatch.setattr(build, "_PINNED", [])  # no training run's decision pinned in this process
    flags = open("/proc/cpuinfo").read()
    if " avx512_bf16" not in flags and " amx_bf16" not in flags:
        assert not build.fast_bf16(torch.device("cpu"))  # no native bf16: never, whatever a probe would say
        return
    for speedup, want in ((2.0, True), (1.19, False), (0.4, False)):
        monkeypatch.setattr(build, "_cpu_bf16_speedup", lambda s=speedup: s)
        assert build.fast_bf16(torch.device("cpu")) is want, speedup
        assert build.target_dtype("auto", torch.device("cpu")) == (torch.bfloat16 if want else torch.float32)
    assert build.target_dtype("float32", torch.device("cpu")) == torch.float32
    # a run's pinned decision wins over the probe (train/run.py pins what its checkpoints record)
    monkeypatch.setattr(build, "_cpu_bf16_speedup", lambda: 2.0)
    build.pin_fast_bf16(False)
    assert not build.fast_bf16(torch.device("cpu")) and build.target_dtype("auto", torch.device("cpu")) == torch.float32


@pytest.mark.parametrize("supervise", ["assistant", "all"])
def test_token_budget_schedule_spans_the_steps_the_budget_takes(supervise):
    """optim.max_tokens becomes the steps the lr cosine spans through the tokens a step counts: with data.supervise=all
    every real token, not only the assistant's (else the cosine spans more steps than the budget allows and the run
    stops before its lr has come down)."""
    import math
    import random
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from draftsmith.train.data.dataset import epoch_batches
    from draftsmith.train.data.render import Sample
    from draftsmith.train.loop import total_steps

    rng = random.Random(0)
    train = []
    for i in range(300):
        prompt, answer = rng.randint(20, 200), rng.randint(10, 250)
        train.append(Sample(input_ids=[1] * (prompt + answer), loss_mask=[0] * prompt + [1] * answer, conv_id=f"c{i}"))
    cfg = OmegaConf.create(
        {
            "data": {"supervise": supervise, "max_tokens_per_batch": 1024, "max_batch_size": 16, "seed": 0},
            "optim": {"max_steps": None, "max_tokens": 200_000, "grad_accum": 1, "epochs": 1},
        }
    )
    data = SimpleNamespace(train=train)
    # the tokens the steps of one epoch count, as Trainer.step counts them
    batches = epoch_batches(data, cfg, 0, 0, 1)
    counted = [
        sum(len(train[i].input_ids) if supervise == "all" else sum(train[i].loss_mask) for i in b) for b in batches
    ]
    want = math.ceil(200_000 / (sum(counted) / len(batches)))
    assert total_steps(cfg, data, len(batches), 1) == want
    if supervise == "all":  # the prompt rows count: fewer steps than the assistant tokens alone would need
        assert want < math.ceil(200_000 / (sum(sum(s.loss_mask) for s in train) / len(batches)))
