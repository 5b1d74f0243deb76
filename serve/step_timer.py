"""Where a served decoding step's time goes, timed inside the engine: the model runner's own calls, wrapped on the
worker that runs them (installed through `LLM.collective_rpc`, as the runner does for every method).

    from draftsmith.serve import step_timer
    llm.collective_rpc(step_timer.install)
    before = step_timer.read(llm); llm.generate(...); after = step_timer.read(llm)
    step_timer.breakdown(step_timer.delta(after, before), generation_s)
    # {"steps": 412, "seconds_per_step": {"target forward": ..., "draft": ..., ...}, "share": {...}}

Parts of one engine step (vLLM 0.32's GPUModelRunner, which the CPU runner inherits):

* target forward   `_model_forward`: the target's forward over the step's tokens (k+1 per request when drafting)
* prepare          the rest of `execute_model`: input preparation, attention metadata, logits
* sample + verify  `_sample`: sampling, and the rejection sampler when drafts were proposed
* draft            `propose_draft_token_ids`: the drafter (a head's forward(s), suffix's tree walk, ngram's lookup;
                   a hybrid's whole choice, its n-gram matcher included)
* bookkeeping      the rest of `sample_tokens`: state updates, copying tokens out
* engine loop      what the engine spends outside the runner per step: scheduling, output processing,
                   detokenisation, Python (the generation's wall time minus the runner's calls)
"""

from __future__ import annotations

import time

CALLS = ("execute_model", "_model_forward", "_sample", "propose_draft_token_ids", "sample_tokens")
PARTS = ("target forward", "prepare", "sample + verify", "draft", "bookkeeping", "engine loop")


def install(worker) -> bool:
    """Wrap this worker's model runner calls (idempotent); False where the runner has none of them."""
    runner = worker.model_runner
    if getattr(runner, "_draftsmith_step_timer", None) is not None:
        return True
    timer = runner._draftsmith_step_timer = {name: [0.0, 0] for name in CALLS}
    wrapped = False
    for name in CALLS:
        original = getattr(runner, name, None)
        if original is None:
            continue

        def timed(*args, _original=original, _cell=timer[name], **kwargs):
            t0 = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                _cell[0] += time.perf_counter() - t0
                _cell[1] += 1

        setattr(runner, name, timed)
        wrapped = True
    return wrapped


def _read(worker) -> dict:
    timer = getattr(worker.model_runner, "_draftsmith_step_timer", None) or {}
    return {name: list(v) for name, v in timer.items()}


def read(llm) -> dict:
    """{call: [seconds, calls]} so far, summed over the engine's workers ({} where the timer is not installed)."""
    try:
        parts = llm.collective_rpc(_read)
    except Exception:  # an engine in another process without the timer: no figure rather than no run
        return {}
    out: dict = {}
    for part in parts:
        for name, (s, n) in part.items():
            cell = out.setdefault(name, [0.0, 0])
            cell[0] += s
            cell[1] += n
    return out


def delta(after: dict, before: dict) -> dict:
    return {k: [v[0] - before.get(k, [0.0, 0])[0], v[1] - before.get(k, [0.0, 0])[1]] for k, v in after.items()}


def breakdown(calls: dict, generation_s: float) -> dict:
    """The parts of a step (module docstring) from one generation's call times and its wall time: seconds per
    engine step (the steps are `execute_model`'s calls) and each part's share of the wall time."""
    if not calls or not calls.get("execute_model", [0, 0])[1]:
        return {}
    s = {k: v[0] for k, v in calls.items()}
    steps = calls["execute_model"][1]
    parts = {
        "target forward": s.get("_model_forward", 0.0),
        "prepare": s["execute_model"] - s.get("_model_forward", 0.0),
        "sample + verify": s.get("_sample", 0.0),
        "draft": s.get("propose_draft_token_ids", 0.0),
        "bookkeeping": s.get("sample_tokens", 0.0) - s.get("_sample", 0.0) - s.get("propose_draft_token_ids", 0.0),
        "engine loop": generation_s - s["execute_model"] - s.get("sample_tokens", 0.0),
    }
    parts = {k: max(v, 0.0) for k, v in parts.items()}  # a call timed inside another never goes below zero
    total = sum(parts.values()) or 1.0
    return {
        "steps": steps,
        "seconds_per_step": {k: v / steps for k, v in parts.items()},
        "share": {k: v / total for k, v in parts.items()},
        "draft_calls": calls.get("propose_draft_token_ids", [0, 0])[1],
    }
