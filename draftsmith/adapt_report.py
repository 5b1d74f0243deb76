"""`draftsmith adapt`'s report (draftsmith/adapt.py judges and decides): WORK/report.md with the verdict, the reasons
and every workload's tokens per target step for HEAD, the adapted head and the baselines, and WORK/report.png."""

from __future__ import annotations

from pathlib import Path


def write_report(work: Path, summary: dict, show_prompts: bool, heldout: list[dict]) -> Path:
    rows = summary["judge"]
    names = ["current", "adapted"] + [m for m in ("none", "ngram", "suffix") if any(m in r for r in rows.values())]
    lines = [
        "# draftsmith adapt",
        "",
        f"HEAD `{summary['head']}`, traffic `{summary['traffic']['file']}`: {summary['traffic']['summary']}; "
        f"{summary['traffic']['train']} prompts answered by the target and trained on, "
        f"{summary['traffic']['heldout']} held out by hash; replay of HEAD's data: {summary['replay_conversations']} "
        f"conversations; {train_line(summary)}; judge: {summary['judge_backend']}.",
        "",
        f"**Verdict: {'promoted to `' + summary['out'] + '`' if summary['promoted'] else 'not promoted'}.**",
        *([""] + [f"* {w}" for w in summary["why_not"]] if summary["why_not"] else []),
        "",
        "| workload | " + " | ".join(f"{n} tok/step" for n in names) + " | adapted / current |",
        "|---|" + "---|" * (len(names) + 1),
    ]
    for w, methods in rows.items():
        cells = [
            f"{methods[n]['tokens_per_target_step']:.3f}" if methods.get(n, {}).get("tokens_per_target_step") else "—"
            for n in names
        ]
        g = summary["gains"].get(w)
        lines.append(
            f"| {w} | " + " | ".join(cells) + f" | {g:.3f}x |" if g else f"| {w} | " + " | ".join(cells) + " | — |"
        )
    lines += [
        "",
        f"Rule: adapted / current above {summary['min_gain']:g} on the traffic, at least {1 - summary['tolerance']:g} "
        "on every other workload, every greedy output equal to no speculation's.",
    ]
    if show_prompts:
        lines += ["", "## Held-out traffic prompts (--show-prompts)", ""]
        lines += [f"* `{p['id']}`: {p['messages'][-1]['content'][:120]!r}" for p in heldout]
    report = work / "report.md"
    report.write_text("\n".join(lines) + "\n")
    try:
        plot_report(rows, summary["gains"], work / "report.png")
    except ImportError:
        pass
    return report


def train_line(summary: dict) -> str:
    t = summary.get("train") or {}
    if not t.get("tokens"):
        return f"{summary['minutes']:g} training minutes on the clock"
    return (
        f"{t['steps']} steps, {t['tokens']:,} supervised tokens at {t['tok_per_s']:.0f} tok/s "
        f"(clock: {summary['minutes']:g} min)"
    )


def plot_report(rows: dict, gains: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(rows)
    fig, ax = plt.subplots(figsize=(5.6, 3.4))
    width = 0.38
    top = 1.0
    for i, name in enumerate(("current", "adapted")):
        ys = [rows[w].get(name, {}).get("tokens_per_target_step") or 0 for w in workloads]
        ax.bar([x + (i - 0.5) * width for x in range(len(workloads))], ys, width, label=name)
        top = max(top, *ys)
    best = [
        max((rows[w].get(m, {}).get("tokens_per_target_step") or 0) for m in ("ngram", "suffix")) for w in workloads
    ]
    if any(best):  # --baselines: the better training-free method per workload
        ax.scatter(range(len(workloads)), best, marker="_", s=900, color="black", label="best of ngram / suffix")
        top = max(top, *best)
    ax.set_xticks(range(len(workloads)), [f"{w}\n{gains[w]:.2f}x" if w in gains else w for w in workloads])
    ax.set_ylabel("tokens per target step")
    ax.set_ylim(0, top * 1.3)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.legend(fontsize=8, loc="upper left", ncol=3, markerscale=0.4)
    ax.set_title("draftsmith adapt: HEAD against the adapted head")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
