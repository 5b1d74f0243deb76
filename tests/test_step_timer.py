"""serve/step_timer.py on a stand-in model runner whose calls take known times (the real runner's are timed in every
served method of the slow tier: eval acceptance records each one's `step_breakdown`)."""

import time
from types import SimpleNamespace

import pytest

from draftsmith.serve import step_timer


class Runner:
    """Calls nested as vLLM's: execute_model runs _model_forward; sample_tokens runs _sample, then the drafter."""

    def execute_model(self):
        time.sleep(0.002)
        self._model_forward()

    def _model_forward(self):
        time.sleep(0.01)

    def sample_tokens(self):
        self._sample()
        self.propose_draft_token_ids()
        time.sleep(0.001)

    def _sample(self):
        time.sleep(0.003)

    def propose_draft_token_ids(self):
        time.sleep(0.005)


def test_each_part_of_a_step_is_what_its_calls_took():
    worker = SimpleNamespace(model_runner=Runner())
    assert step_timer.install(worker) and step_timer.install(worker)  # idempotent: no double wrap
    llm = SimpleNamespace(collective_rpc=lambda fn: [fn(worker)])
    before = step_timer.read(llm)
    t0 = time.perf_counter()
    for _ in range(5):
        worker.model_runner.execute_model()
        worker.model_runner.sample_tokens()
        time.sleep(0.004)  # the engine loop outside the runner
    wall = time.perf_counter() - t0
    calls = step_timer.delta(step_timer.read(llm), before)
    assert {k: v[1] for k, v in calls.items()} == dict.fromkeys(step_timer.CALLS, 5)
    b = step_timer.breakdown(calls, wall)
    ms = {k: 1e3 * v for k, v in b["seconds_per_step"].items()}
    assert b["steps"] == 5 and b["draft_calls"] == 5 and list(ms) == list(step_timer.PARTS)
    for part, expected in {"target forward": 10, "prepare": 2, "sample + verify": 3, "draft": 5, "bookkeeping": 1,
                           "engine loop": 4}.items():  # fmt: skip
        assert expected <= ms[part] < 2 * expected + 5, (part, ms)  # sleeps overshoot on a loaded machine
    assert sum(b["share"].values()) == pytest.approx(1.0)


def test_no_steps_no_breakdown():
    assert step_timer.breakdown({}, 1.0) == {}
    assert step_timer.breakdown({"execute_model": [0.0, 0]}, 1.0) == {}
