"""What a served-acceptance run will serve (eval/acceptance.py), checked before anything starts: its engine settings
against their defaults, the batch sizes, repeats and k schedules, the method and head names, and each method's
speculative config (a hybrid's from its fitted policy, a head's k schedule in it)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from draftsmith.eval.methods import BASELINES, check_parallel_drafting, speculative_config
from draftsmith.serve.recipe import check_schedule

ENGINE_DEFAULTS = {
    "dtype": "float32",  # the converted targets are fp32
    "kv_cache_gib": None,  # VLLM_CPU_KVCACHE_SPACE; None = the environment's value, else 2
    "batch_size": 1,  # prompts per generate() call: 1 = the latency regime speculation is for
    # vLLM's own default is 5..5 ("arbitrarily chosen" in its source). 2..5 drafts more often: on 20
    # Spec-Bench prompts (SmolLM2, k=3) τ 2.30 but 1.24 tokens/step, against 5..5's τ 3.58 and 1.15.
    "ngram_min": 2,
    "ngram_max": 5,
    "max_model_len": None,  # None = longest prompt + max_tokens + k + 1
    "enforce_eager": True,  # no torch.compile: engine start ~4 s instead of 60-100 s on 2 cores
    "threads": None,  # OMP_NUM_THREADS per engine; None = the environment's value, else 1 (see below)
    "timeout_s": None,  # per method; a method past it is killed and reported as failed
    "warmup_tokens": 16,  # an untimed request on the first prompt's first N tokens (0 = none)
    # a sweep: every prompt once per batch size ([1, 4, 8, 16]), a fresh engine per method and size; None = batch_size
    "batch_sizes": None,
    "max_num_seqs": None,  # the engine's most concurrent requests; None = vLLM's default
    # a sweep served this many times, round by round (every method and size, then again): each cell's speed-up is the
    # median of its rounds' ratios to no speculation in the same round, so a slow minute of the machine hits both
    "repeats": 1,
    # heads only: vLLM's num_speculative_tokens_per_batch_size, [[lo, hi, k], ...] (k = 0: no drafting there), for
    # every head, or {head name: schedule} for some
    "k_schedule": None,
    # heads: None = as the export says (a P-EAGLE head drafts in parallel, an EAGLE-3 one step by step); True / False
    # insist, and a head not trained that way is refused
    "parallel_drafting": None,
    # the chat template's variables the prompts are rendered with, as the deployment passes vLLM's
    # chat_template_kwargs (Qwen3 non-thinking: {"enable_thinking": False}); {} = the template's defaults
    "chat_template_kwargs": None,
    # training-free methods (none, ngram, suffix) served before into the same out_dir with the identical job (target,
    # prompt token ids, sampling, engine settings, batch) and the same vLLM/torch/transformers/arctic-inference are
    # taken from runs/NAME.result.json instead of served again: greedy outputs and counters are deterministic, so a
    # later run adds only its heads (the quickstart serves the baselines before training to time this machine's
    # serving). Their tok/s is the earlier run's. Not with a sweep.
    "reuse_baselines": False,
}


@dataclass
class Plan:
    settings: dict  # ENGINE_DEFAULTS with the run's own
    sizes: list[int] | None  # a batch-size sweep, or None
    repeats: int
    cap: int | None  # the engine's max_num_seqs
    schedule: dict | None  # head -> checked k schedule rows
    force: dict  # hybrid head -> the role its choice is pinned to (None: its policy's)
    hybrid_of: dict  # "hybrid(NAME)" -> NAME
    names: list[str]  # every method served, in order
    spec: dict  # method -> its speculative_config (None: no speculation)


def plan_methods(methods: list[str], heads: dict[str, str], k: int, hybrids, engine: dict) -> Plan:
    """The run's plan, or a ValueError / TypeError naming what is wrong, before any engine starts."""
    unknown = set(engine) - set(ENGINE_DEFAULTS)
    if unknown:
        raise TypeError(f"unknown engine settings {sorted(unknown)}; known: {sorted(ENGINE_DEFAULTS)}")
    settings = {**ENGINE_DEFAULTS, **engine}
    sizes = settings["batch_sizes"]
    if sizes is not None:
        if not sizes or any(not isinstance(b, int) or b < 1 for b in sizes) or len(set(sizes)) != len(sizes):
            raise ValueError(f"batch sizes {sizes}: distinct integers >= 1, e.g. 1,4,8,16")
    repeats = settings["repeats"]
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats {repeats!r}: an integer >= 1")
    if repeats > 1 and sizes is None:
        raise ValueError("repeats serve a batch-size sweep round by round: give batch sizes too (e.g. --batch-sizes 8)")
    cap = settings["max_num_seqs"]
    too_big = [b for b in (sizes or [settings["batch_size"]]) if cap and b > cap]
    if too_big:
        raise ValueError(
            f"batch sizes {too_big} above the engine's max_num_seqs={cap}: vLLM would run at most {cap} requests "
            f"at once and the figure would be that batch's, not the one asked for. Raise --max-num-seqs or drop them"
        )
    schedule = settings["k_schedule"]
    if schedule is not None:
        per_head = schedule if isinstance(schedule, dict) else dict.fromkeys(heads, check_schedule(schedule, k, cap))
        unknown_heads = sorted(set(per_head) - set(heads))
        if unknown_heads:
            raise ValueError(f"k schedules for {unknown_heads}, which are not heads of this run ({sorted(heads)})")
        schedule = {n: check_schedule(x, k, cap) for n, x in per_head.items()}
    bad = [m for m in methods if m not in BASELINES]
    if bad:
        raise ValueError(f"unknown methods {bad}: choose from {list(BASELINES)} (heads go in `heads`)")
    clash = sorted(set(heads) & set(BASELINES))
    if clash:
        raise ValueError(f"head names {clash} clash with built-in methods; rename them")
    odd = [h for h in heads if not re.fullmatch(r"[A-Za-z0-9_.-]+", h)]
    if odd:
        raise ValueError(f"head names {odd} must be letters, digits, '_', '.', '-' (they name files)")
    missing = [h for h in hybrids if h not in heads]
    if missing:
        raise ValueError(f"hybrids {missing}: name heads given in `heads`")
    force = dict(hybrids) if isinstance(hybrids, dict) else dict.fromkeys(hybrids)
    hybrid_of = {f"hybrid({h})" if not force[h] else f"hybrid({h}:{force[h]})": h for h in force}
    names = list(dict.fromkeys([*methods, *heads, *hybrid_of]))
    if not names:
        raise ValueError("nothing to run: give methods and/or heads")
    from draftsmith.serve.hybrid import hybrid_kwargs

    spec = {
        n: hybrid_kwargs(heads[hybrid_of[n]], k)["speculative_config"]
        if n in hybrid_of
        else speculative_config(n, k, heads, settings["ngram_min"], settings["ngram_max"])
        for n in names
    }
    if settings["parallel_drafting"] is not None:
        for n in heads:
            check_parallel_drafting(n, heads[n], settings["parallel_drafting"])
    for n, rows in (schedule or {}).items():  # a head reads its schedule; the training-free methods keep k
        spec[n]["num_speculative_tokens_per_batch_size"] = rows
    return Plan(settings, sizes, repeats, cap, schedule, force, hybrid_of, names, spec)
