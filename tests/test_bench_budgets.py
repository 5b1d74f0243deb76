"""bench/acceptance_per_minute.py's budgets reach the training command as the bench says: --tokens caps supervised
tokens, --epochs passes, and --minutes alone trains until the clock (the preset's one epoch does not end it first)."""

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
    cmd = command(apm, tmp_path, minutes=54)
    assert cmd["optim.max_minutes"] == "54" and cmd["optim.max_tokens"] == "null"
    assert int(cmd["optim.epochs"]) == apm.CLOCK_EPOCHS > 1


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
