"""The quickstart's reports: the plan with an ETA per stage, the served rows, the README's headline table and
quickstart.json."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from draftsmith.quickstart.plan import PASSES, Plan, Rates, stage_replans


def fmt_min(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def machine_line(rates: Rates) -> str:
    return (
        f"machine: {rates.cpu} ({rates.flags}), {rates.threads} torch threads, bf16 {'on' if rates.bf16 else 'off'}; "
        f"target forward {rates.forward_tok_s:.0f} tok/s, head step {rates.train_tok_s:.0f} tok/s"
    )


def print_plan(plan: Plan, rates: Rates, spent: dict[str, float]) -> None:
    print(machine_line(rates), flush=True)
    data = f"the target's answers to {plan.conversations:,} ShareGPT first turns ({plan.heldout} held out)"
    if plan.code_sets:
        data += " + the preset's code sets"
    elif plan.code_prompts:
        data += f", {plan.code_prompts:,} stdlib code-completion prompts"
    if plan.doc_prompts:
        data += f", {plan.doc_prompts:,} long-document prompts (summarize, answer from a text)"
    print(
        f"plan ({'--full: the preset as measured' if plan.budget_min is None else f'budget {plan.budget_min:g} min'}):"
        f" {data}; {plan.train_minutes:g} training minutes (~{PASSES:g} passes); served on "
        f"{', '.join(plan.workloads)} x {plan.num_prompts} prompts"
        + ("; the head's hybrid fitted and served beside it" if plan.hybrid else ""),
        flush=True,
    )
    clock = sum(spent.values())
    for name, seconds in plan.stages.items():
        clock += seconds
        print(f"  {name:<9} {fmt_min(seconds):>9}   ETA +{fmt_min(clock)}", flush=True)


def served_rows(results: dict[str, dict]) -> list[dict]:
    """Per workload and method: tokens per target step, served tok/s and the speed-up against no speculation."""
    rows = []
    for workload, result in results.items():
        none = result["methods"].get("none", {})
        for name, r in result["methods"].items():
            if r.get("status") != "ok":
                rows.append({"workload": workload, "method": name, "status": r.get("status"), "error": r.get("error")})
                continue
            rows.append(
                {
                    "workload": workload,
                    "method": name,
                    "tokens_per_target_step": r["tokens_per_target_step"],
                    "per_position_acceptance": r["per_position_acceptance"],
                    "output_tok_s": r["output_tokens_per_s"],
                    "speedup_vs_none": (
                        r["output_tokens_per_s"] / none["output_tokens_per_s"]
                        if none.get("output_tokens_per_s")
                        else None
                    ),
                    "match_vs_none": r.get("match_vs_none"),
                }
            )
    return rows


def headline(rows: list[dict], rates: Rates, head: str = "eagle3") -> str:
    """The README's headline table: per workload, the head's tokens per target step against ngram and suffix, and
    its served speed against no speculation; with --hybrid, hybrid(head)'s beside them."""
    by = {(r["workload"], r["method"]): r for r in rows if "tokens_per_target_step" in r}
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    hybrid = f"hybrid({head})"
    with_hybrid = any(r["method"] == hybrid for r in rows)
    extra = " hybrid tok/step | hybrid / best training-free | hybrid tok/s vs none |" if with_hybrid else ""
    out = [
        f"machine: {rates.cpu} ({rates.flags}), 2 cores; served in vLLM at batch 8, greedy, k=3, 128 tokens",
        "",
        "| workload | head tok/step | ngram | suffix | head / best training-free | head tok/s vs none "
        "| outputs = none |" + extra,
        "|---|---|---|---|---|---|---|" + "---|" * (3 if with_hybrid else 0),
    ]
    for w in workloads:
        h, n, s = by.get((w, head)), by.get((w, "ngram")), by.get((w, "suffix"))
        if not (h and n and s):
            pad = " |" * (3 if with_hybrid else 0)  # the hybrid's columns
            out.append(f"| {w} | failed: see acceptance/{w}/acceptance.md | | | | | |" + pad)
            continue
        best = max(n["tokens_per_target_step"], s["tokens_per_target_step"])
        matches = [h["match_vs_none"]]
        cells = ""
        if with_hybrid:
            y = by.get((w, hybrid))
            if y:
                matches.append(y["match_vs_none"])
                cells = (
                    f" **{y['tokens_per_target_step']:.2f}** | {y['tokens_per_target_step'] / best:.2f}x | "
                    f"{y['speedup_vs_none']:.2f}x |"
                )
            else:
                cells = " failed | | |"
        out.append(
            f"| {w} | **{h['tokens_per_target_step']:.2f}** | {n['tokens_per_target_step']:.2f} | "
            f"{s['tokens_per_target_step']:.2f} | {h['tokens_per_target_step'] / best:.2f}x | "
            f"{h['speedup_vs_none']:.2f}x | {min(matches):.2f} |" + cells
        )
    return "\n".join(out)


def write_summary(
    out: Path,
    plan: Plan,
    rates: Rates,
    spent: dict,
    total_s: float,
    results: dict,
    family: str = "eagle3",
    hybrid_fit: dict | None = None,
    argv: tuple[str, ...] = (),
) -> dict:
    from draftsmith.atomic import atomic_write_json

    log = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in log if "tok_per_s" in r][-1]
    last_eval = [r for r in log if "eval/acc" in r][-1]
    rows = served_rows(results)
    order = ["prepare", "probe", "data", "extract", "baselines", "train", "export", "hybrid", "serve"]
    replanned = stage_replans(plan)
    line = [
        f"{s} {fmt_min(plan.stages[s]) if s in plan.stages else '-'}"
        + (f" (re-planned {fmt_min(replanned[s])})" if s in replanned else "")
        + f" / {fmt_min(spent.get(s, 0))}"
        for s in order
        if s in spent or s in plan.stages
    ]
    summary = {
        "command": " ".join(["draftsmith", "quickstart", *argv]),
        "machine": {"cpu": rates.cpu, "flags": rates.flags, "threads": rates.threads, "bf16": rates.bf16},
        "probe": {"forward_tok_s": round(rates.forward_tok_s), "train_tok_s": round(rates.train_tok_s)},
        "plan": asdict(plan),
        "stage_seconds_planned": {k: round(v, 1) for k, v in plan.stages.items()},
        "stage_seconds_replanned": {k: round(v, 1) for k, v in replanned.items()},
        "stage_seconds_spent": spent,
        "total_seconds": total_s,
        "train": {
            "steps": last["step"],
            "tokens": last["tokens"],
            "tok_per_s": last["tok_per_s"],
            "eval_acc_per_step": last_eval["eval/acc"],
            "eval_sim_accept_len": last_eval["eval/sim_accept_len"],
        },
        "served": rows,
        "family": family,
        **({"hybrid_fit": hybrid_fit} if hybrid_fit else {}),
        "headline": headline(rows, rates, family),
        "stage_line": line,
    }
    atomic_write_json(out / "quickstart.json", summary)
    return summary
