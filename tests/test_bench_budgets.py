"""bench/acceptance_per_minute.py's budgets reach the training command as the bench says: --tokens caps supervised
tokens, --epochs passes, and --minutes alone trains until the clock; the harness adds no budget of its own beyond
those flags (it builds its runs from the preset)."""

import argparse
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def apm():
    spec = importlib.util.spec_from_file_location("apm", ROOT / "bench" / "acceptance_per_minute.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def command(apm, tmp_path, spec="preset", **budget):
    args = argparse.Namespace(
        tokens=None, minutes=None, epochs=None, regen_data=None, features_dir=None, curve=[], curve_every=400
    )
    for k, v in budget.items():
        setattr(args, k, v)
    ovr = apm.train_command("x", spec, args, tmp_path / "run")
    keys = [o.split("=", 1)[0] for o in ovr]
    assert len(keys) == len(set(keys)), f"a key given twice (Hydra refuses it): {ovr}"
    return dict(o.split("=", 1) for o in ovr)


def test_minutes_alone_trains_until_the_clock(apm, tmp_path):
    from draftsmith.train.config import compose_config

    cmd = command(apm, tmp_path, minutes=54)
    assert "optim.epochs" not in cmd  # the preset's own (no epoch cap), not a number the harness picked
    ovr = [f"{k}={v}" for k, v in cmd.items() if k not in ("run_name", "output_dir")]
    o = compose_config(ovr).optim
    assert (o.max_minutes, o.max_tokens, o.max_steps, o.epochs) == (54, None, None, None)  # only the clock binds


@pytest.mark.parametrize(
    "budget, epochs",
    [
        (dict(minutes=60, tokens=4_000_000), None),  # the token cap binds (or the clock): the preset's epochs stay
        (dict(tokens=150_000), None),
        (dict(epochs=2), "2"),
        (dict(minutes=60, epochs=2), "2"),
    ],
)
def test_token_and_epoch_budgets_pass_through(apm, tmp_path, budget, epochs):
    cmd = command(apm, tmp_path, **budget)
    assert cmd.get("optim.epochs") == epochs
    assert cmd["optim.max_tokens"] == str(budget.get("tokens", "null"))


def test_a_lever_with_its_own_epochs_keeps_them(apm, tmp_path):
    assert command(apm, tmp_path, spec="preset+ep4", minutes=60)["optim.epochs"] == "4"
    assert command(apm, tmp_path, spec="preset+ep4", epochs=2)["optim.epochs"] == "4"
