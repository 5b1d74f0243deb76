"""The tables and the plot of a served-acceptance run (eval/acceptance.py's result): one row per method, and the
batch-size sweep as a table and a PNG (matplotlib, Agg backend)."""

from __future__ import annotations

import json
from pathlib import Path


def format_sweep(result: dict) -> str:
    """The batch-size sweep as one markdown table: per method and batch size, tokens per target step, served tok/s
    and its ratio to no speculation at the same batch size, and whether greedy outputs equal it."""
    sizes = [s["batch_size"] for s in result["sweep"]]
    names = list(result["sweep"][0]["methods"])
    lines = [
        f"k={result['k']}, {result['num_prompts']} prompts from `{Path(result['prompts_file']).name}`, "
        f"max_tokens={result['max_tokens']}, temperature={result['temperature']}"
        + (f", k schedules {json.dumps(result['engine']['k_schedule'])}" if result["engine"].get("k_schedule") else "")
        + (
            f"; {result['engine']['repeats']} rounds: vs none is the median of each round's ratio (their range in "
            "brackets), tok/s the mean"
            if result["engine"].get("repeats", 1) > 1
            else ""
        ),
        "",
        "| method | "
        + " | ".join(f"batch {b}: tok/step, tok/s, vs none, draft/step" for b in sizes)
        + " | outputs = none |",
        "|---|" + "---|" * (len(sizes) + 1),
    ]
    for name in names:
        cells, match = [], []
        for s in result["sweep"]:
            r = s["methods"][name]
            if r["status"] != "ok":
                cells.append("failed")
                continue
            draft = f", draft {r['draft_ms_per_step']:.1f} ms" if r.get("draft_ms_per_step") else ""
            spread = r.get("speedup_rounds")
            spread = f" ({_fmt(min(spread))}-{_fmt(max(spread))})" if spread else ""
            cells.append(
                f"{_fmt(r['tokens_per_target_step'])}, {_fmt(r['output_tokens_per_s'], '.1f')}, "
                f"**{_fmt(r['speedup_vs_none'])}x**{spread}{draft}"
            )
            match.append(r["match_vs_none"])
        same = "ref" if name == "none" else (_fmt(min(match)) if match and None not in match else "—")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {same} |")
    return "\n".join(lines)


def plot_sweep(result: dict, path: Path) -> None:
    """Served speed-up over no speculation against concurrent requests, one line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [s["batch_size"] for s in result["sweep"]]
    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    for name in result["sweep"][0]["methods"]:
        ys = [s["methods"][name].get("speedup_vs_none") for s in result["sweep"]]
        if name != "none" and any(y is not None for y in ys):
            ax.plot(sizes, [y if y is not None else float("nan") for y in ys], marker="o", label=name)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.set_xlabel("concurrent requests (batch size)")
    ax.set_ylabel("served tok/s / no speculation")
    ax.set_title(f"{Path(result['prompts_file']).name}, k={result['k']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fmt(x, spec: str = ".2f", none: str = "—") -> str:
    return none if x is None else format(x, spec)


# one method's row, as result_cells gives it (the markdown table and the console's rich table)
RESULT_COLUMNS = (
    "method", "τ", "α", "accept/pos", "tok/step", "tok/s", "speedup", "match none", "gen tokens", "gen s",
    "engine start s",
)  # fmt: skip


def result_cells(name: str, r: dict) -> list[str]:
    """A finished method's row, as both tables show it (markdown `format_table`, rich `eval/cli.py rich_table`)."""
    pos = r["per_position_acceptance"]
    return [
        name,
        _fmt(r["mean_acceptance_length"]),
        _fmt(r["acceptance_rate"]),
        "[" + ", ".join(_fmt(p) for p in pos) + "]" if pos else "—",
        _fmt(r["tokens_per_target_step"]),
        _fmt(r["output_tokens_per_s"], ".1f"),
        _fmt(r["speedup_vs_none"]),
        "ref" if name == "none" else _fmt(r["match_vs_none"]),
        str(r["generated_tokens"]),
        _fmt(r["generation_s"], ".1f"),
        _fmt(r["engine_start_s"], ".1f"),
    ]


def format_table(result: dict) -> str:
    """The run as a markdown table (one row per method) with a one-line header of its settings."""
    head = (
        f"k={result['k']}, {result['num_prompts']} prompts from `{Path(result['prompts_file']).name}`, "
        f"max_tokens={result['max_tokens']}, temperature={result['temperature']}, "
        f"target `{Path(result['target']).name}`, vLLM {result['versions'].get('vllm')}"
    )
    cols = RESULT_COLUMNS
    lines = [head, "", "| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for name, r in result["methods"].items():
        if r["status"] != "ok":
            cells = [name, f"failed: {r['error'][:80]}"] + [""] * (len(cols) - 2)
        else:
            cells = result_cells(name, r)
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    covered = {n: r["draft_vocab_coverage"] for n, r in result["methods"].items() if r.get("draft_vocab_coverage")}
    if covered:
        lines += ["", "Draft vocab coverage, the share of no speculation's output tokens each head's draft vocab holds "
                  "(a token outside it is a sure rejection): "
                  + ", ".join(f"{n} {c:.1%}" for n, c in covered.items())]  # fmt: skip
    return "\n".join(lines)
