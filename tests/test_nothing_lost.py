"""Nothing lost, round two: overwrite checks everything before it deletes, one process per run / features / export
directory, corrupt checkpoint bytes are refused, and the file system's refusals (read-only, size limit) are one
paragraph naming the path and the errno. Each case runs the real entry points in real processes."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_distributed import chats, tiny_args
from test_user_errors import ENV, RUN, loss_steps, snapshot

ROOT = Path(__file__).resolve().parents[1]
DS = [sys.executable, "-m", "draftsmith.cli"]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("nothing_lost") / "chats.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in chats(40)))
    return path


def train(target, data, out, *extra, **kw):
    return subprocess.run(
        [sys.executable, str(RUN), *tiny_args(target, data, out, *extra)],
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
        **kw,
    )


@pytest.fixture(scope="module")
def finished_run(tiny_target_dir, data_file, tmp_path_factory):
    """A tiny run with two checkpoints (steps 2 and 4)."""
    run = tmp_path_factory.mktemp("finished") / "run"
    p = train(tiny_target_dir, data_file, run, "optim.max_steps=4", "save_every=2")
    assert p.returncode == 0, p.stderr[-3000:]
    return run


def copy_run(run: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "run"
    shutil.copytree(run, dest)
    return dest


@pytest.mark.parametrize(
    "bad, says",
    [
        ("data.path=/no/such/data.jsonl", "/no/such/data.jsonl"),
        ("target.name_or_path=/no/such/model", "/no/such/model"),
        ("BAD_RECORDS", "bad.jsonl"),
    ],
    ids=["data path", "target path", "only bad records"],
)
def test_overwrite_deletes_nothing_until_the_inputs_are_good(
    finished_run, tiny_target_dir, data_file, tmp_path, bad, says
):
    run = copy_run(finished_run, tmp_path)
    before = snapshot(run)
    if bad == "BAD_RECORDS":
        (tmp_path / "bad.jsonl").write_text('{"id": 1}\nnot json\n{"conversations": []}\n')
        bad = f"data.path={tmp_path / 'bad.jsonl'}"
    p = train(tiny_target_dir, data_file, run, "optim.max_steps=2", "overwrite=true", bad)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert says in p.stderr, p.stderr[-2000:]
    assert snapshot(run) == before  # the earlier run's checkpoints and metrics are all still there


def test_a_refused_run_leaves_no_trace(tiny_target_dir, data_file, tmp_path):
    for bad, code in (("optim.lr=-1", 2), ("data.path=/no/such/data.jsonl", 1), ("head.tt_steps=3", 2)):
        out = tmp_path / "never"
        p = train(tiny_target_dir, data_file, out, bad)
        assert p.returncode == code and "Traceback" not in p.stderr, (bad, p.stderr[-2000:])
        assert not out.exists(), f"{bad}: the refused run created {out}"
    assert not (ROOT / "run.log").exists()


def test_a_typo_key_or_missing_preset_exits_2_naming_the_closest(tiny_target_dir, data_file, tmp_path):
    p = train(tiny_target_dir, data_file, tmp_path / "r", "head.tt_steps=3")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "head.tt_steps: no such config key (did you mean head.ttt_steps" in p.stderr
    assert "+head" not in p.stderr  # never the hint that would add an unused key
    p = subprocess.run(DS + ["train", "conf=eagle3_smolm2"], capture_output=True, text=True, env=ENV, timeout=120)
    assert p.returncode == 2 and "conf=eagle3_smolm2: no such preset (did you mean eagle3_smollm2" in p.stderr
    p = subprocess.run(DS + ["train", "output_dir=my", "runs"], capture_output=True, text=True, env=ENV, timeout=120)
    assert p.returncode == 2 and "must reach Hydra quoted" in p.stderr


def test_train_help_lists_presets_groups_and_keys():
    p = subprocess.run(DS + ["train", "--help"], capture_output=True, text=True, env=ENV, timeout=120)
    assert p.returncode == 0
    for want in ("eagle3_smollm2", "mlp_llama8b", "optim.max_minutes", "data.num_conversations", "target/"):
        assert want in p.stdout
    assert "schema" not in p.stdout.split("Presets")[1].split("Keys")[0]  # no internal Hydra entries
    from draftsmith.train.usage import COMMON, schema_keys

    keys = schema_keys()
    assert set(COMMON) <= set(keys)
    assert keys["data.heldout"][1].startswith("conversations held out") and keys["head.ttt_steps"][1].startswith(
        "K: the"
    )


def test_a_second_process_on_a_run_dir_is_refused_naming_the_first(tiny_target_dir, data_file, tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, str(RUN), *tiny_args(tiny_target_dir, data_file, run, "optim.max_steps=100000")]
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and not (run / "metrics.jsonl").exists():
            assert first.poll() is None, first.communicate()[1][-3000:]
            time.sleep(0.2)
        p = train(tiny_target_dir, data_file, run, "resume=auto")
        assert p.returncode == 2 and "Traceback" not in p.stderr
        assert f"{run} is in use: training into {run} (pid {first.pid}" in p.stderr
    finally:
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=300)
    steps = loss_steps(run)
    assert steps == list(range(1, len(steps) + 1))  # one run's lines, in order, none dropped
    # the holder is gone: its lock file is left, and the next run takes it over
    p = train(tiny_target_dir, data_file, run, "resume=auto", f"optim.max_steps={steps[-1] + 1}")
    assert p.returncode == 0, p.stderr[-3000:]


def test_a_second_export_into_one_directory_is_refused(finished_run, tmp_path):
    out = tmp_path / "exported"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from draftsmith.lock import acquire_beside; acquire_beside({str(out)!r}, 'exporting X'); "
            "print('held', flush=True); import time; time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        p = subprocess.run(DS + ["export", str(finished_run), str(out)], capture_output=True, text=True, env=ENV)
        assert p.returncode == 2 and f"is in use: exporting X (pid {holder.pid}" in p.stderr
        assert not out.exists()
    finally:
        holder.kill()
        holder.wait()
    p = subprocess.run(DS + ["export", str(finished_run), str(out)], capture_output=True, text=True, env=ENV)
    assert p.returncode == 0, p.stderr[-2000:]


def corrupt(path: Path) -> None:
    """4 KB of 0xFF written into the middle of the file, its size unchanged."""
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 4096] = b"\xff" * 4096
    path.write_bytes(bytes(data))


def test_corrupt_checkpoint_bytes_are_refused_everywhere(finished_run, tiny_target_dir, data_file, tmp_path):
    run = copy_run(finished_run, tmp_path)
    latest = run / "checkpoints" / "step_00000004"
    assert json.loads((latest / "sha256.json").read_text()).keys() == {"head.safetensors", "head.json", "trainer.pt"}
    corrupt(latest / "head.safetensors")
    p = subprocess.run(DS + ["export", str(run), str(tmp_path / "out")], capture_output=True, text=True, env=ENV)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert f"{latest}/head.safetensors: unreadable checkpoint file" in p.stderr and "sha256 differs" in p.stderr
    assert "step_00000002" in p.stderr  # the older checkpoint it could use instead
    assert not (tmp_path / "out").exists()
    before = snapshot(run)
    p = train(tiny_target_dir, data_file, run, "resume=auto", "optim.max_steps=6")
    assert p.returncode != 0 and "sha256 differs" in p.stderr and "loss is nan" not in p.stderr
    assert snapshot(run) == before
    p = train(tiny_target_dir, data_file, run, f"resume={run / 'checkpoints' / 'step_00000002'}", "optim.max_steps=6")
    assert p.returncode == 0, p.stderr[-3000:]  # from the good one, when the user names it


def test_an_exported_head_with_nan_is_not_served(finished_run, tmp_path, tiny_target_dir):
    from safetensors.torch import load_file, save_file

    from draftsmith.eval.head_check import check_head_for_target
    from draftsmith.train.checkpoint import CheckpointError

    out = tmp_path / "exported"
    p = subprocess.run(DS + ["export", str(finished_run), str(out)], capture_output=True, text=True, env=ENV)
    assert p.returncode == 0, p.stderr[-2000:]
    tensors = load_file(out / "model.safetensors")
    name = next(k for k, v in tensors.items() if v.is_floating_point() and v.dim() == 2)
    tensors[name][0, 0] = float("nan")
    save_file(tensors, out / "model.safetensors")
    with pytest.raises(CheckpointError, match=f"NaN or inf in {name}"):
        check_head_for_target(out, str(tiny_target_dir))


def in_readonly(directory: Path, argv: list[str]) -> subprocess.CompletedProcess:
    """Run argv where `directory` is a read-only bind mount (a user namespace: no privileges needed)."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare here for a read-only bind mount")
    script = 'mount --bind -o ro "$1" "$1" && shift && exec "$@"'
    cmd = ["unshare", "-rm", "sh", "-c", script, "sh", str(directory), *argv]
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)
    if p.returncode != 0 and (p.stderr.startswith("unshare:") or p.stderr.startswith("mount:")):
        pytest.skip(f"no read-only bind mount here: {p.stderr.strip()[:200]}")
    return p


def test_a_read_only_destination_is_one_paragraph(finished_run, tiny_target_dir, data_file, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "old_run").mkdir()
    cases = [
        (DS + ["export", str(finished_run), str(ro / "exported")], "draftsmith export: error: could not write"),
        (
            DS + ["extract", "--out", str(ro / "features"), *tiny_args(tiny_target_dir, data_file, ro / "x")],
            "draftsmith extract: error: could not write",
        ),
        ([sys.executable, str(RUN), *tiny_args(tiny_target_dir, data_file, ro / "run")], "train: error: could not"),
        ([sys.executable, str(RUN), *tiny_args(tiny_target_dir, data_file, ro / "old_run")], "train: error: could"),
    ]
    for argv, says in cases:
        p = in_readonly(ro, argv)
        assert p.returncode == 1, (argv, p.stderr[-2000:])
        assert "Traceback" not in p.stderr and says in p.stderr, p.stderr[-2000:]
        assert "read-only (EROFS)" in p.stderr and "free there" not in p.stderr
    assert sorted(os.listdir(ro)) == ["old_run"] and not os.listdir(ro / "old_run")


def test_extract_with_too_small_a_disk_budget_leaves_nothing(tiny_target_dir, data_file, tmp_path):
    out = tmp_path / "features"
    argv = DS + ["extract", "--out", str(out), "--max-disk", "1K", *tiny_args(tiny_target_dir, data_file, tmp_path)]
    p = subprocess.run(argv, capture_output=True, text=True, env=ENV, timeout=300)
    assert p.returncode == 2 and "nothing was written" in p.stderr
    assert not out.exists()
