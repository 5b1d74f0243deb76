"""bench/gpu_check.sh: on a machine without a GPU it exits 0 saying so; every command it would run on a GPU day
is accepted by its own parser, and the training run it would start composes and validates (DRY=1 prints them)."""

from __future__ import annotations

import importlib
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from test_readme import Parsed, check_training, parse_only  # noqa: F401 - the fixture

from draftsmith.cli import VERBS

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "gpu_check.sh"


def test_without_a_gpu_it_says_so_and_exits_0():
    env = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""}
    p = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "no CUDA GPU here" in p.stdout


def test_every_command_it_runs_parses(parse_only, tmp_path):  # noqa: F811
    env = {**os.environ, "PYTHON": sys.executable, "DRY": "1", "OUT": str(tmp_path)}
    p = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    lines = [x[2:] for x in p.stdout.splitlines() if x.startswith("+ ")]
    assert len(lines) == 5  # extract, train, export, eval x 2
    for line in lines:
        argv = shlex.split(line)[1:]  # after the interpreter
        if argv[0].endswith("train/run.py"):
            check_training(argv[1:])
            continue
        assert argv[:2] == ["-m", "draftsmith.cli"], line
        module, _, function = VERBS[argv[2]][0].partition(":")
        main = getattr(importlib.import_module(module), function or "main")
        with pytest.raises(Parsed) as parsed:
            main(argv[3:])
        check_training(getattr(parsed.value.args_, "overrides", None) or [])
