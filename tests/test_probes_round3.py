"""Reliability round three: each probe a new user ran against main, through the real entry points. Every case ends
with one paragraph and the right exit status, no traceback, and nothing of the user's deleted or half-written."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_distributed import chats, tiny_args
from test_user_errors import ENV

from draftsmith.eval.head_check import check_depth
from draftsmith.train.checkpoint import CheckpointError, checkpoints

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "train" / "run.py"


def cli(*args, env=None, timeout=300, cwd=ROOT):
    return subprocess.run(
        [sys.executable, "-m", "draftsmith.cli", *args], capture_output=True, text=True, timeout=timeout,
        env=env or ENV, cwd=cwd,
    )  # fmt: skip


def one_paragraph(p, code: int, *wants: str) -> None:
    assert p.returncode == code, (p.returncode, p.stdout[-1500:], p.stderr[-2000:])
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout, p.stderr[-3000:]
    for want in wants:
        assert want in p.stderr, (want, p.stderr[-2000:])


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("round3") / "chats.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in chats(40)))
    return path


@pytest.fixture(scope="module")
def tiny_run(tiny_target_dir, data_file, tmp_path_factory):
    """A finished tiny training run with checkpoints at steps 2, 4 and 6."""
    run = tmp_path_factory.mktemp("round3_run") / "run"
    p = subprocess.run(
        [sys.executable, str(RUN), *tiny_args(tiny_target_dir, data_file, run, "save_every=2", "keep_checkpoints=3")],
        capture_output=True, text=True, timeout=600, env=ENV,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    assert [c.name for c in checkpoints(run)] == ["step_00000002", "step_00000004", "step_00000006"]
    assert not (run / ".draftsmith.lock").exists()  # a finished run leaves no lock file behind
    return run


# ---------------------------------------------------------------- 1. adapt --forget deletes only what adapt made


def test_forget_refuses_a_directory_adapt_did_not_make(tmp_path):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "adapt.json").write_text("{}")
    (d / "notes.txt").write_text("keep\n")
    one_paragraph(cli("adapt", "--forget", str(d)), 2, "not a work directory draftsmith adapt made", "nothing deleted")
    assert (d / "notes.txt").read_text() == "keep\n"


def test_forget_refuses_a_planted_private_path(tmp_path):
    """The probe: `private_paths` naming a file of the user's. Even with an owner file planted beside it, a path
    outside draftsmith's cache roots is refused, and nothing at all is deleted."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    d = tmp_path / "d"
    d.mkdir()
    (d / ".draftsmith-adapt").write_text(json.dumps({"token": "t0k"}))
    (d / "adapt.json").write_text(json.dumps({"owner": "t0k", "private_paths": [str(victim)]}))
    p = cli("adapt", "--forget", str(d), env={**ENV, "DRAFTSMITH_CACHE": str(tmp_path / "cache")})
    one_paragraph(p, 2, f"lists {victim}", "deletes nothing")
    assert victim.read_text() == "keep\n" and d.is_dir()

    # a cache entry of ours (the shape an adapted run records) is forgotten with the work dir; --dry-run lists first
    entry = tmp_path / "cache" / "features" / "abc123-eagle3-bfloat16"
    entry.mkdir(parents=True)
    (entry / "shard.safetensors").write_bytes(b"x")
    (d / "adapt.json").write_text(json.dumps({"owner": "t0k", "private_paths": [str(entry)]}))
    env = {**ENV, "DRAFTSMITH_CACHE": str(tmp_path / "cache")}
    p = cli("adapt", "--forget", str(d), "--dry-run", env=env)
    assert p.returncode == 0 and f"would delete {entry}" in p.stdout and f"would delete {d}" in p.stdout, p.stdout
    assert entry.is_dir() and d.is_dir()
    p = cli("adapt", "--forget", str(d), env=env)
    assert p.returncode == 0, p.stderr
    assert not entry.exists() and not d.exists() and victim.read_text() == "keep\n"


def test_a_refused_adapt_leaves_no_work_directory(tiny_run, tmp_path):
    traffic = tmp_path / "few.jsonl"
    traffic.write_text(
        "".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"}]}) + "\n" for i in range(3))
    )
    work = tmp_path / "work"
    p = cli("adapt", str(tiny_run), "--traffic", str(traffic), "--out", str(tmp_path / "out"), "--work", str(work),
            "--max-prompt-tokens", "64")  # fmt: skip
    one_paragraph(p, 1, "3 unique prompts; adapt needs at least 10")
    assert not work.exists()

    user = tmp_path / "user_dir"  # a work dir holding someone's files is refused before anything is read
    user.mkdir()
    (user / "thesis.tex").write_text("keep\n")
    p = cli("adapt", str(tiny_run), "--traffic", str(traffic), "--out", str(tmp_path / "out"), "--work", str(user))
    one_paragraph(p, 2, "holds files that draftsmith adapt did not make")
    assert [x.name for x in user.iterdir()] == ["thesis.tex"]


def test_a_vllm_log_without_bodies_says_how_to_log_them(tiny_run, tmp_path):
    log = tmp_path / "server.log"
    lines = [
        "INFO 12-06 07:49:18 [api_server.py:1200] Starting vLLM API server 0 on http://127.0.0.1:8000",
        "(APIServer pid=77) INFO 12-06 07:49:20 [loggers.py:123] Engine 000: Avg prompt throughput: 12.0 tokens/s",
        'INFO:     127.0.0.1:40000 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
    ]
    log.write_text("\n".join(lines * 50) + "\n")
    p = cli(
        "adapt", str(tiny_run), "--traffic", str(log), "--out", str(tmp_path / "out"), "--work", str(tmp_path / "w")
    )
    one_paragraph(p, 1, "150 log lines, none with a request body", "--enable-log-requests --log-level DEBUG")
    assert "not JSON" not in p.stderr and "--skip-invalid to" not in p.stderr
    assert not (tmp_path / "w").exists()


# ---------------------------------------------------------------- 2-3. tracebacks, checkpoints


@pytest.mark.parametrize("budget", ["nan", "inf", "-5", "0"])
def test_quickstart_budget_must_be_a_finite_positive_number(budget):
    p = cli("quickstart", "--budget", budget, "--plan-only")
    one_paragraph(p, 2, "--budget", "must be a finite number > 0")


def test_export_names_a_malformed_run_config(tiny_run, tmp_path):
    run = tmp_path / "run"
    subprocess.run(["cp", "-r", str(tiny_run), str(run)], check=True)
    (run / "config.yaml").write_text("data: {path: [unclosed\n")
    out = tmp_path / "out"
    p = cli("export", "--format", "vllm", str(run), str(out))
    one_paragraph(p, 1, f"{run / 'config.yaml'}: the run's saved config cannot be read", "line")
    assert not out.exists()
    assert not [x for x in tmp_path.iterdir() if x.name.endswith(".lock")]  # no lock file left beside OUT


def test_an_incomplete_newest_checkpoint_names_the_intact_one(tiny_run, tiny_target_dir, data_file, tmp_path):
    run = tmp_path / "run"
    subprocess.run(["cp", "-r", str(tiny_run), str(run)], check=True)
    newest, intact = checkpoints(run)[-1], checkpoints(run)[-2]
    (newest / "head.safetensors").unlink()
    p = cli("export", "--format", "vllm", str(run), str(tmp_path / "out"))
    one_paragraph(p, 1, f"{newest}, the run's newest checkpoint, is incomplete (no head.safetensors)", str(intact))

    # resume=auto continues from the intact one, says so, and sets the incomplete one aside (kept, not deleted)
    args = tiny_args(tiny_target_dir, data_file, run, "save_every=2", "keep_checkpoints=3", "optim.max_steps=8")
    p = subprocess.run(
        [sys.executable, str(RUN), *args, "resume=auto"], capture_output=True, text=True, timeout=600, env=ENV
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"continuing from {intact}, the newest intact one" in p.stdout
    assert f"resumed from {intact} at step 4" in p.stdout
    assert (run / "checkpoints" / f"incomplete-{newest.name}" / "head.json").is_file()
    assert checkpoints(run)[-1].name == "step_00000008"
    p = cli("export", "--format", "vllm", str(run), str(tmp_path / "out"))
    assert p.returncode == 0, p.stderr[-2000:]
    assert not (tmp_path / ".out.draftsmith.lock").exists()  # released when the export finished


# ---------------------------------------------------------------- 5. numbers that cannot work


def test_counts_below_one_are_usage_errors(tiny_run, tmp_path):
    p = cli("export", "--format", "vllm", str(tiny_run), str(tmp_path / "out"), "--k", "0")
    one_paragraph(p, 2, "--k", "must be >= 1")
    assert not (tmp_path / "out").exists()
    p = cli("eval", "acceptance", "--target", "x", "--prompts", "p.jsonl", "--num-prompts", "-1", "--out", "o")
    one_paragraph(p, 2, "--num-prompts", "must be >= 1")


def test_k_past_the_heads_depth_is_named(tmp_path):
    eagle = tmp_path / "eagle"
    eagle.mkdir()
    spec = {"proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 2}]}
    (eagle / "config.json").write_text(json.dumps({"speculators_model_type": "eagle3", "speculators_config": spec}))
    assert check_depth(eagle, 2, "mine") is None
    assert "--k 50 is past the depth mine was made for (k=2" in check_depth(eagle, 50, "mine")
    mlp = tmp_path / "mlp"
    mlp.mkdir()
    (mlp / "config.json").write_text(json.dumps({"model_type": "mlp_speculator", "n_predict": 3}))
    with pytest.raises(CheckpointError, match="has 3 stages"):
        check_depth(mlp, 4, "m")


# ---------------------------------------------------------------- 6. Hydra behaves as Hydra


def test_hydra_flags_and_a_multirun_sweep(tmp_path):
    p = subprocess.run(
        [sys.executable, str(RUN), "conf=eagle3_smollm2", "--cfg", "job"], capture_output=True, text=True, env=ENV,
        timeout=300,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert "run_name: eagle3_smollm2" in p.stdout and "draft_vocab_size: 4096" in p.stdout

    p = subprocess.run(
        [sys.executable, str(RUN), "conf=eagle3_smollm2", "optim.lr=1e-3,2e-3", "dry_run=true"],
        capture_output=True, text=True, env=ENV, timeout=300,
    )  # fmt: skip
    one_paragraph(p, 2, "optim.lr=1e-3,2e-3 is a sweep", "-m")

    out = tmp_path / "sweep"
    p = subprocess.run(
        [sys.executable, str(RUN), "-m", "conf=eagle3_smollm2", "optim.lr=1e-3,2e-3", "dry_run=true",
         f"output_dir={out}"],
        capture_output=True, text=True, env=ENV, timeout=300,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    jobs = [x for x in p.stdout.splitlines() if x.startswith("multirun job ")]
    assert len(jobs) == 2, p.stdout[-3000:]
    for n, (job, lr) in enumerate(zip(jobs, ("0.001", "0.002"))):
        assert (
            job.startswith(f"multirun job {n}: ") and f"optim.lr={lr}" in job and job.endswith(f"output_dir={out}/{n}")
        )
    assert p.stdout.count("dry run: ") == 2, p.stdout[-3000:]  # one job per value

    p = subprocess.run(
        [sys.executable, str(RUN), "-m", "conf=eagle3_smollm2", "optim.lrr=1e-3,2e-3", "dry_run=true"],
        capture_output=True, text=True, env=ENV, timeout=300,
    )  # fmt: skip
    one_paragraph(p, 2, "optim.lrr: no such config key")


@pytest.mark.slow
def test_ctrl_c_during_vllm_extraction_prints_one_line(smollm2_dir, tmp_path):
    """The quickstart's data+extract child (train/run.py prepare_only=true, the vLLM backend in a spawned process):
    Ctrl-C reaches the whole group; the extraction process exits quietly and the run says once what was kept."""
    import signal
    import time

    log = tmp_path / "out.log"
    args = [sys.executable, "-m", "draftsmith.train.run", "conf=eagle3_smollm2", f"output_dir={tmp_path / 'run'}",
            "data.features_backend=vllm", "data.also=[]", "data.num_conversations=150", "data.heldout=8",
            "prepare_only=true"]  # fmt: skip
    with open(log, "w") as f:
        proc = subprocess.Popen(
            args, stdout=f, stderr=subprocess.STDOUT, env=ENV, start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )  # fmt: skip
        t0 = time.time()
        while "extract:" not in log.read_text() and proc.poll() is None and time.time() - t0 < 600:
            time.sleep(1)
        time.sleep(5)
        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole foreground group
        code = proc.wait(300)
    text = log.read_text()
    assert code == 130, text[-3000:]
    assert "Traceback" not in text, text[-4000:]
    assert text.count("interrupted (Ctrl-C)") == 1
