"""The MLP speculator's bench harnesses build their runs from the preset: with DRY=1 each prints its commands; every
training run composes and validates, its budget is the clock the harness names (no epoch, token or step cap of its
own), every override it adds is named in its header, and every `draftsmith` command is accepted by its own parser."""

from __future__ import annotations

import importlib
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from test_readme import Parsed, parse_only  # noqa: F401 - the fixture

from draftsmith.cli import VERBS
from draftsmith.train.config import compose_config, validate_config

ROOT = Path(__file__).resolve().parent.parent
# script -> the training clock each of its runs must end on (minutes): the harness's default, or the preset's own
SCRIPTS = {
    "mlp_levers.sh": {6.0},
    "mlp_optim.sh": {6.0},
    "mlp_stage2.sh": {3.0, 6.0},  # the 1+2 arm's two halves
    "mlp_hour.sh": {60},
    "quickstart_lever.sh": {16.2},  # without a quickstart's plan.json: the 2026-12-01 slow record's minutes
    "convert_finetune.sh": {10},
    "dflash_equal_minutes.sh": {12},
}
# the preset each harness's runs start from (mlp_smollm2 where not named)
PRESET_OF = {
    "quickstart_lever.sh": ("eagle3_smollm2",),
    "convert_finetune.sh": ("eagle3_smollm2",),
    "dflash_equal_minutes.sh": ("dflash_smollm2", "eagle3_smollm2"),  # one run of each
}
# harnesses that train nothing (they serve what a run made), with the arguments after OUT
SERVE_ONLY = {"quickstart_reserve.sh": ["QS_OUT"]}
ARGS_BEFORE_OUT = {**SERVE_ONLY, "quickstart_lever.sh": ["QS_OUT"], "convert_finetune.sh": ["RUN"]}
NOT_OVERRIDES = {"conf", "output_dir", "resume"}  # which preset, where, and resume=auto: no setting of the run


def dry_run(script: str, out: Path, **knobs: str) -> list[list[str]]:
    env = {**os.environ, "DRY": "1", **knobs}
    args = [str(out / a) for a in ARGS_BEFORE_OUT.get(script, [])] + [str(out)]
    p = subprocess.run(
        ["bash", str(ROOT / "bench" / script), *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300
    )
    assert p.returncode == 0, p.stderr
    return [shlex.split(line[2:]) for line in p.stdout.splitlines() if line.startswith("+ ")]


def header(script: str) -> str:
    lines = (ROOT / "bench" / script).read_text().splitlines()[1:]
    return "\n".join(line for line in lines[: next(i for i, x in enumerate(lines) if not x.startswith("#"))])


# a harness's A/B knobs (environment variables), each run once more with them set
KNOBS = {"mlp_hour.sh": {"CONVERSATIONS": "8000", "ALSO": "[regen:pycode:stdlib]", "BATCH1": "0"}}


@pytest.mark.parametrize("script,knobs", [(s, {}) for s in sorted(SCRIPTS)] + sorted(KNOBS.items()))
def test_its_runs_are_the_preset_with_the_overrides_it_names(script, knobs, tmp_path):
    runs = [argv[2:] for argv in dry_run(script, tmp_path, **knobs) if argv[:2] == ["python", "train/run.py"]]
    assert runs, f"{script} trains nothing"
    named = header(script)
    for overrides in runs:
        assert any(f"conf={p}" in overrides for p in PRESET_OF.get(script, ("mlp_smollm2",))), overrides
        cfg = compose_config(overrides)
        validate_config(cfg)
        o = cfg.optim
        assert o.max_minutes in SCRIPTS[script] and (o.max_tokens, o.max_steps, o.epochs) == (None, None, None), (
            f"{script}: {overrides}: the clock must be the only budget"
        )
        for key in {x.split("=", 1)[0] for x in overrides} - NOT_OVERRIDES:
            assert re.search(rf"(?<![\w.]){re.escape(key)}\b", named), f"{script}: `{key}` is not named in its header"


@pytest.mark.parametrize("script", sorted(SCRIPTS) + sorted(SERVE_ONLY))
def test_its_draftsmith_commands_parse(script, tmp_path, parse_only):  # noqa: F811
    commands = [argv[1:] for argv in dry_run(script, tmp_path) if argv[0] == "draftsmith"]
    assert any(argv[:2] == ["eval", "acceptance"] for argv in commands), f"{script} serves nothing"
    for argv in commands:
        module, _, function = VERBS[argv[0]][0].partition(":")
        main = getattr(importlib.import_module(module), function or "main")
        with pytest.raises(Parsed):
            main(argv[1:])


def test_mlp_hour_knobs_take_effect(tmp_path):
    commands = dry_run("mlp_hour.sh", tmp_path, CONVERSATIONS="8000", ALSO="[regen:pycode:stdlib]", BATCH1="0")
    (train,) = [argv[2:] for argv in commands if argv[:2] == ["python", "train/run.py"]]
    data = compose_config(train).data
    assert (data.num_conversations, list(data.also)) == (8000, ["regen:pycode:stdlib"])
    outs = [argv[argv.index("--out") + 1] for argv in commands if "--out" in argv]
    assert [Path(o).name for o in outs] == ["served_chat", "served_mtbench", "served_code"]  # no batch1_*
    default = dry_run("mlp_hour.sh", tmp_path)
    assert sum("--batch-sizes" in argv for argv in default) == 3
