"""Every preset says in its header which budget ends it (`# budget: clock N min | epochs N | tokens N`), and composing
it shows that this budget, and no other, can end the run: a clock-bound preset has no epoch, token or step cap that
could stop it first (the shipped smollm2 preset once inherited one epoch and stopped at a third of its hour)."""

import re
from pathlib import Path

import pytest

from draftsmith.train.config import compose_config, validate_config

ROOT = Path(__file__).resolve().parents[1]
PRESETS = sorted(p.stem for p in (ROOT / "conf" / "conf").glob("*.yaml"))
BUDGET = re.compile(r"^# budget: (clock (?P<min>[\d.]+) min|epochs (?P<ep>\d+)|tokens (?P<tok>[\d_,]+))", re.M)


def promised(name: str) -> dict:
    m = BUDGET.search((ROOT / "conf" / "conf" / f"{name}.yaml").read_text())
    assert m, f"conf/conf/{name}.yaml: no '# budget: ...' line in its header"
    if m["min"]:
        return {"max_minutes": float(m["min"]), "epochs": None, "max_tokens": None, "max_steps": None}
    if m["ep"]:
        return {"max_minutes": None, "epochs": int(m["ep"]), "max_tokens": None, "max_steps": None}
    return {"max_minutes": None, "epochs": None, "max_tokens": int(m["tok"].replace(",", "")), "max_steps": None}


@pytest.mark.parametrize("name", PRESETS)
def test_the_promised_budget_is_the_only_one(name):
    cfg = compose_config([f"conf={name}"])
    validate_config(cfg)
    o = cfg.optim
    have = {k: o[k] for k in ("max_minutes", "epochs", "max_tokens", "max_steps")}
    assert have == promised(name), f"conf={name}: its header promises {promised(name)}, the config says {have}"


def test_the_quickstart_plan_keeps_the_clock_budget():
    """The quickstart's training stage is the preset with its minutes set: still only the clock ends it."""
    from draftsmith.quickstart.plan import training_overrides

    o = compose_config(training_overrides("/tmp/qs", minutes=21.5, conversations=2000, also=[], extra=[])).optim
    assert (o.max_minutes, o.epochs, o.max_tokens, o.max_steps) == (21.5, None, None, None)


def test_an_unbounded_run_is_refused():
    from draftsmith.errors import ConfigError

    cfg = compose_config(["conf=eagle3_smollm2", "optim.max_minutes=null"])
    with pytest.raises(ConfigError, match="nothing would end the run"):
        validate_config(cfg)
