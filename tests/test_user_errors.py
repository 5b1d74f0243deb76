"""What a new user hits: a bad config or argument gets one paragraph naming the key (never a traceback), a
fresh run never mixes with an earlier one, Ctrl-C and a full disk lose nothing that was finished."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from test_distributed import chats, tiny_args

from draftsmith.errors import ConfigError, DraftsmithError, Interrupted, handle_errors
from draftsmith.train.checkpoint import checkpoints, trim_metrics

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "train" / "run.py"
ENV = {
    **os.environ,
    "WANDB_MODE": "disabled",
    "OMP_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "DRAFTSMITH_DEBUG": "",
    "HYDRA_FULL_ERROR": "",
}


def compose(*overrides):
    from draftsmith.train.config import compose_config as compose_run

    return compose_run(["conf=eagle3_smollm2", *overrides])


@pytest.mark.parametrize(
    "override, key",
    [
        ("optim.lr=-1", "optim.lr=-1.0"),
        ("optim.lr=0", "optim.lr=0.0"),
        ("optim.max_steps=0", "optim.max_steps=0"),
        ("optim.max_steps=-1", "optim.max_steps=-1"),
        ("optim.max_minutes=0", "optim.max_minutes=0"),
        ("optim.grad_clip=0", "optim.grad_clip=0.0"),
        ("optim.grad_accum=0", "optim.grad_accum=0"),
        ("optim.ns_steps=0", "optim.ns_steps=0"),
        ("optim.decay=norms", "optim.decay=norms"),
        ("optim.betas=[0.9,1.5]", "optim.betas="),
        ("head.ttt_steps=0", "head.ttt_steps=0"),
        ("head.num_layers=0", "head.num_layers=0"),
        ("head.draft_vocab_size=100000", "head.draft_vocab_size=100000"),
        ("head.draft_vocab_size=0", "head.draft_vocab_size=0"),
        ("head.family=medusa", "head.family=medusa"),
        ("data.num_conversations=0", "data.num_conversations=0"),
        ("data.max_tokens_per_batch=100", "data.max_tokens_per_batch=100"),
        ("data.features=disk", "data.features=disk"),
        ("data.max_disk=lots", "data.max_disk=lots"),
        ("data.supervise=everything", "data.supervise=everything"),
        ("data.overflow=wrap", "data.overflow=wrap"),
        ("data.also=[sharegpt,'']", "data.also[1]=''"),
        ("data.path=pycode:stdlib", "data.path=pycode:stdlib"),
        ("data.also=[regen:sharegpt,pycode:stdlib]", "data.also[1]=pycode:stdlib"),
        ("data.path=doctask:summarize", "data.path=doctask:summarize"),
        ("data.also=[regen:sharegpt,doctask:qa]", "data.also[1]=doctask:qa"),
        ("data.also=[{path:sharegpt,seed:1}]", "data.also[0].path=sharegpt"),
        ("data.also=[{path:'regen:sharegpt',regen_temperature:-1}]", "data.also[0].regen_temperature=-1"),
        ("data.also=[{path:'regen:sharegpt',temperature:0.7}]", "data.also[0].temperature"),
        ("keep_checkpoints=0", "keep_checkpoints=0"),
        ("resume=/no/such/run", "resume=/no/such/run"),
        ("mixed_precision=fp8", "mixed_precision=fp8"),
    ],
)
def test_every_bad_value_is_named_with_its_key(override, key):
    from draftsmith.train.config import config_problems, validate_config

    problems = config_problems(compose(override))
    assert len(problems) == 1 and problems[0].startswith(key), problems
    with pytest.raises(ConfigError, match="Fix the key"):
        validate_config(compose(override))


@pytest.mark.parametrize(
    "override, key",
    [("head.slot_weights=chain", "head.slot_weights=chain"), ("head.slot_weight_floor=2", "head.slot_weight_floor=2")],
)
def test_dflash_slot_weights_are_checked(override, key):
    from draftsmith.train.config import config_problems

    problems = config_problems(compose("conf=dflash_smollm2", override))
    assert len(problems) == 1 and problems[0].startswith(key), problems


def test_the_presets_themselves_are_valid():
    from draftsmith.train.config import config_problems

    for preset in sorted(p.stem for p in (ROOT / "conf" / "conf").glob("*.yaml")):
        from draftsmith.train.config import compose_config as compose_run

        assert config_problems(compose_run([f"conf={preset}"])) == [], preset
    assert config_problems(compose("conf=mlp_smollm2", "head.stage=2")) == [
        "head.stage=2 without head.init_from: stage 2 continues a stage-1 head; set head.init_from=<stage-1 run dir> "
        "(or head.init_from=scratch for stage 2 from a fresh head)"
    ]
    assert config_problems(compose("conf=mlp_smollm2", "head.stage=2", "head.init_from=scratch")) == []


def test_handler_prints_one_paragraph_and_honours_debug(capsys, monkeypatch):
    def bad():
        raise ConfigError("optim.lr=-1: must be > 0")

    monkeypatch.delenv("DRAFTSMITH_DEBUG", raising=False)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    assert handle_errors("train", bad) == 2
    assert capsys.readouterr().err == "train: error: optim.lr=-1: must be > 0\n"
    assert handle_errors("x", lambda: (_ for _ in ()).throw(Interrupted("stopped at step 3"))) == 130
    assert handle_errors("x", lambda: (_ for _ in ()).throw(KeyboardInterrupt())) == 130
    assert "run the same command again" in capsys.readouterr().err
    with pytest.raises(ValueError):  # not a project error: a bug, shown in full
        handle_errors("x", lambda: int("nan?"))
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(ConfigError):
        handle_errors("train", bad)
    with pytest.raises(DraftsmithError):
        handle_errors("x", bad, argv=["--debug"])


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("user_errors") / "chats.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in chats(40)))
    return path


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1] if text.strip() else ""


def cli(*args, env=None, timeout=300):
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, env=env or ENV, cwd=ROOT)


def test_bad_configs_and_arguments_reach_the_user_as_one_message(tmp_path, smollm2_dir, data_file):
    """A table of what new users typed: each fails with a message naming the key, file or directory, no traceback."""
    no_config = tmp_path / "not_a_model"
    no_config.mkdir()
    a_file = tmp_path / "a_file.txt"
    a_file.write_text("user data\n")
    train = [sys.executable, str(RUN), f"output_dir={tmp_path / 'run'}", "wandb.mode=disabled"]
    ds = [sys.executable, "-m", "draftsmith.cli"]
    cases = [
        (
            train + ["optim.lr=-1", "head.ttt_steps=0", "data.num_conversations=0"],
            ["optim.lr=-1.0", "head.ttt_steps=0", "data.num_conversations=0"],
            2,
        ),
        (train + ["optim.max_steps=-1"], ["optim.max_steps=-1"], 2),
        (train + ["head.draft_vocab_size=100000"], ["head.draft_vocab_size=100000", "49152"], 2),
        (
            train + ["target.name_or_path=/no/such/model"],
            ["target.name_or_path=/no/such/model", "no such directory"],
            2,
        ),
        (train + [f"target.name_or_path={no_config}"], ["no config.json"], 2),
        (
            train + ["conf=eagle3_llama8b"],
            ["target.name_or_path=meta-llama/Llama-3.1-8B-Instruct", "set target.name_or_path"],
            2,
        ),
        (train + ["head.tt_steps=3"], ["head.tt_steps: no such config key (did you mean head.ttt_steps"], 2),
        (train + ["conf=nosuch"], ["conf=nosuch: no such preset"], 2),
        (ds + ["export", str(tmp_path), str(tmp_path / "out")], [str(tmp_path)], 1),
        (
            ds
            + [
                "eval",
                "acceptance",
                "--target",
                "smollm2",
                "--prompts",
                str(tmp_path / "missing.jsonl"),
                "--out",
                str(tmp_path / "acc"),
            ],
            ["missing.jsonl"],
            2,
        ),
        (ds + ["extract", "--validate", str(tmp_path / "no_features")], ["no_features"], 1),
        (ds + ["nosuchverb"], ["unknown verb"], 2),
        (
            ds + ["extract", "--out", str(tmp_path / "f"), "conf=eagle3_smollm2", "optim.grad_clip=0"],
            ["optim.grad_clip=0"],
            2,
        ),
        (
            ds + ["eval", "acceptance", "--target", "smollm2", "--prompts", "x.jsonl", "--k", "0", "--out", "o"],
            ["--k"],
            2,
        ),
        (ds + ["export", str(tmp_path), str(a_file)], [str(tmp_path)], 1),  # not a checkpoint; the file is kept
    ]
    for argv, wants, code in cases:
        p = cli(*argv)
        shown = p.stdout + p.stderr
        print(f"\n$ {' '.join(argv[1:])}\n  -> rc {p.returncode}: {last_line(p.stderr)[:300]}")
        assert "Traceback" not in shown, shown[-3000:]
        assert p.returncode != 0, argv
        assert p.returncode == code, (argv, p.returncode, p.stderr[-2000:])
        for want in wants:
            assert want in p.stderr, (argv, want, p.stderr[-2000:])
    assert a_file.read_text() == "user data\n"


def run_tiny(target_dir, data_file, out, *extra, timeout=600):
    return subprocess.run(
        [sys.executable, str(RUN), *tiny_args(target_dir, data_file, out, *extra)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
    )


def loss_steps(run: Path) -> list[int]:
    return [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


def snapshot(run: Path) -> dict[str, bytes]:
    """Every file of a run dir and its bytes (not the lock file, which names whichever process held it last)."""
    return {
        str(p.relative_to(run)): p.read_bytes()
        for p in sorted(run.rglob("*"))
        if p.is_file() and p.name != ".draftsmith.lock"
    }


def test_a_fresh_run_never_mixes_with_an_earlier_one(tiny_target_dir, data_file, tmp_path):
    run = tmp_path / "run"
    p = run_tiny(tiny_target_dir, data_file, run, "optim.max_steps=4", "save_every=2")
    assert p.returncode == 0, p.stderr[-3000:]
    before = snapshot(run)

    p = run_tiny(tiny_target_dir, data_file, run, "optim.max_steps=2", "save_every=2")  # the same command, no resume
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert f"output_dir {run} already holds a run (2 checkpoint(s) up to step_00000004" in p.stderr
    assert "resume=auto" in p.stderr and "overwrite=true" in p.stderr
    assert snapshot(run) == before  # nothing touched: checkpoints, metrics, config.yaml

    p = run_tiny(tiny_target_dir, data_file, run, "optim.max_steps=2", "save_every=2", "overwrite=true")
    assert p.returncode == 0, p.stderr[-3000:]
    assert [c.name for c in checkpoints(run)] == ["step_00000002"]  # the old step 4 cannot win the next export
    assert loss_steps(run) == [1, 2]

    fresh = tmp_path / "fresh"  # resume=auto before any checkpoint exists (a run killed early): from step 0
    fresh.mkdir()
    (fresh / "metrics.jsonl").write_text('{"step": 1, "loss": 9.0}\n')
    p = run_tiny(tiny_target_dir, data_file, fresh, "optim.max_steps=1", "resume=auto")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "no checkpoint yet; starting from step 0" in p.stdout
    rows = [json.loads(x) for x in (fresh / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["loss"] != 9.0) for r in rows if "loss" in r] == [(1, True)]


@pytest.mark.parametrize("features", ["online", "stream"])
def test_ctrl_c_saves_a_checkpoint_and_resume_continues(tiny_target_dir, data_file, tmp_path, features):
    """A terminal's Ctrl-C (SIGINT to the whole process group: with stream features, the producer process too)."""
    run = tmp_path / "run"
    extra = ("optim.max_steps=400", f"data.features={features}")
    cmd = [sys.executable, str(RUN), *tiny_args(tiny_target_dir, data_file, run, *extra)]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, start_new_session=True
    )
    metrics, deadline = run / "metrics.jsonl", time.time() + 600
    try:
        while time.time() < deadline and proc.poll() is None:
            if metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
                os.killpg(proc.pid, signal.SIGINT)
                break
            time.sleep(0.05)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    stopped = loss_steps(run)[-1]
    assert stopped < 400
    assert f"interrupted (Ctrl-C) at step {stopped}: checkpoint saved" in err
    assert [c.name for c in checkpoints(run)] == [f"step_{stopped:08d}"]  # save_every=0: only the Ctrl-C save

    if features == "stream":  # the producer stopped cleanly after the save (it wrote its stats, then exited)
        stats = json.loads((run / "stream_features" / "rank-00000" / "stream_stats.json").read_text())
        assert not Path(f"/proc/{stats['pid']}").exists()

    p = run_tiny(tiny_target_dir, data_file, run, f"optim.max_steps={stopped + 2}", "resume=auto", extra[1])
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"resumed from {run / 'checkpoints' / f'step_{stopped:08d}'}" in p.stdout
    assert loss_steps(run) == list(range(1, stopped + 3))  # each step once: the Ctrl-C step is not redone


def test_a_size_limit_during_a_checkpoint_keeps_the_previous_one(tmp_path):
    """A real failed write (the file-size limit makes write() fail with EFBIG): named as a size limit, not as a full
    disk, for the weights (safetensors) and for trainer.pt (torch's writer, which drops the errno)."""
    run = tmp_path / "run"
    script = textwrap.dedent(f"""
        import resource, signal, sys, torch
        from draftsmith.errors import handle_errors
        from draftsmith.train.checkpoint import save_checkpoint
        run = {str(run)!r}
        save_checkpoint(run, 1, {{"w": torch.zeros(8)}}, {{"family": "eagle3", "step": 1}}, {{"step": 1}}, keep=2)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing us
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        big = {{"w": torch.zeros(1 << 20)}}  # 4 MiB: past the 1 MiB limit
        small = {{"w": torch.zeros(8)}}
        weights, trainer = (big, {{"step": 2}}) if sys.argv[1] == "weights" else (small, {{"s": torch.zeros(1 << 20)}})
        sys.exit(handle_errors("train", lambda: save_checkpoint(run, 2, weights, {{"step": 2}}, trainer, keep=2)))
    """)
    for which in ("weights", "trainer"):
        p = subprocess.run([sys.executable, "-c", script, which], capture_output=True, text=True, timeout=120, env=ENV)
        assert p.returncode == 1, p.stderr[-3000:]
        assert "Traceback" not in p.stderr and "enforce fail" not in p.stderr
        assert (
            f"train: error: could not write checkpoint {run}/checkpoints/step_00000002: the file is larger" in p.stderr
        )
        assert "(EFBIG)" in p.stderr and "free there" not in p.stderr  # not a full disk
        assert f"the previous one, {run}/checkpoints/step_00000001, is intact" in p.stderr
        assert "resume=auto" in p.stderr
        assert sorted(x.name for x in (run / "checkpoints").iterdir()) == ["step_00000001"]  # no half-written dir


def test_resume_drops_metrics_lines_past_the_checkpoint(tmp_path):
    log = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "loss": 1.0 / s} for s in range(1, 8)] + [{"step": 6, "eval/acc": [0.1]}]
    log.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in rows) + b'{"step": 8, "lo')  # a torn line
    assert trim_metrics(log, 5) == 4  # steps 6, 7, the step-6 eval and the torn line
    assert [json.loads(x)["step"] for x in log.read_text().splitlines()] == [1, 2, 3, 4, 5]
    assert trim_metrics(log, 5) == 0


def test_committed_results_hold_no_machine_paths():
    from draftsmith.paths import machine_paths, portable

    found = machine_paths(ROOT / "bench" / "results")
    tracked = subprocess.run(["git", "ls-files", "bench/results"], cwd=ROOT, capture_output=True, text=True)
    if tracked.returncode == 0 and tracked.stdout:  # what is committed (run dirs beside it are gitignored)
        found = {f: hits for f, hits in found.items() if str(Path(f).relative_to(ROOT)) in tracked.stdout.split()}
    assert found == {}
    home = str(Path.home())
    assert portable(f'"{ROOT}/bench/x.json" {home}/.cache/draftsmith/f') == '"bench/x.json" ~/.cache/draftsmith/f'


def test_quickstart_leaves_ctrl_c_to_the_training_child(tmp_path):
    """Ctrl-C reaches the whole foreground group: the child finishes its save, the quickstart waits for it."""
    script = textwrap.dedent(f"""
        import os, signal, sys, threading, time
        from draftsmith.quickstart.run import run_child
        child = "import time, sys\\ntry:\\n    time.sleep(60)\\nexcept KeyboardInterrupt:\\n    time.sleep(1.0)\\n"
        child += "    open({str(tmp_path / "saved")!r}, 'w').write('ok')\\n    sys.exit(130)"
        threading.Timer(2.0, lambda: os.killpg(os.getpgid(0), signal.SIGINT)).start()  # a terminal's Ctrl-C
        print("child exit", run_child([sys.executable, "-c", child]), flush=True)
    """)
    p = subprocess.run(["setsid", sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=ENV)
    assert "child exit 130" in p.stdout, p.stdout + p.stderr[-2000:]
    assert (tmp_path / "saved").read_text() == "ok"  # the child was not killed mid-save
