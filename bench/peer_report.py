"""peer.json and peer.md from a bench/peer_speculators.py OUT: tokens per target step per workload for our heads (equal
minutes, equal tokens, and each --lever's two arms), the peer's, ngram's and suffix's, with the tokens and minutes
each head trained.

    python bench/peer_report.py OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

WORKLOADS = ("chat", "mtbench", "code")
BASELINES = ("ngram", "suffix")


def ours_trained(run_dir: Path) -> dict:
    """Tokens, training minutes and tok/s of a draftsmith run (the last line of its metrics.jsonl that has them), and
    its last held-out evaluation: accuracy per TTT step and simulated tau."""
    last, evaluated = {}, {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "tokens" in rec:
            last = rec
        if "eval/acc" in rec:
            evaluated = rec
    out = {"tokens": last.get("tokens"), "minutes": round(last["elapsed_s"] / 60, 2) if last else None}
    if last:
        out["tok_per_s"] = round(last["tok_per_s"])
    if evaluated:
        out["heldout_acc"] = [round(a, 3) for a in evaluated["eval/acc"]]
        out["heldout_sim_tau"] = round(evaluated["eval/sim_accept_len"], 3)
    return out


def arms(out: Path) -> dict[str, dict]:
    """Our arms in OUT: the preset's two and each lever's (levers.json), with their tokens, minutes and overrides."""
    levers = json.loads((out / "levers.json").read_text()) if (out / "levers.json").is_file() else {}
    found = {}
    for suffix, overrides in {"": [], **{f"_{n}": o for n, o in levers.items()}}.items():
        for equal in ("minutes", "tokens"):
            run_dir = out / f"ours_{equal}{suffix}"
            if (run_dir / "metrics.jsonl").is_file():
                lever = {"lever": suffix[1:], "overrides": overrides} if suffix else {}
                found[run_dir.name] = {**ours_trained(run_dir), "equal": equal, **lever}
    return found


def workload_row(res: dict, ours: list[str]) -> dict:
    """Tokens per target step of every head and baseline one evaluation served, our arms over the peer's."""
    methods = res["methods"]
    names = [*ours, "peer", *BASELINES]
    row = {m: methods[m]["tokens_per_target_step"] for m in names if methods.get(m, {}).get("status") == "ok"}
    match = {m: methods[m].get("match_vs_none") for m in names if m in methods}
    row["every_output_equal"] = all(v == 1.0 for v in match.values())
    row["prompts"], row["batch_size"], row["k"] = res["num_prompts"], res.get("batch_size", 8), res["k"]
    if "peer" in row:
        for m in ours:
            if m in row:
                row[f"{m}_over_peer"] = round(row[m] / row["peer"], 3)
    return row


def report(out: Path) -> dict:
    peer = json.loads((out / "peer" / "trained.json").read_text())
    trained = arms(out)
    trained["peer"] = {"tokens": peer["tokens"], "minutes": round(peer["train_seconds"] / 60, 2),
                       "steps": peer["steps"], "version": peer["version"]}  # fmt: skip
    ours = [n for n in trained if n != "peer"]
    workloads, served = {}, {}  # served: one section per lever run, "levers" or "levers_NAME" (a run set aside)
    for w in WORKLOADS:
        preset = out / f"eval_{w}" / "acceptance.json"
        if preset.is_file():
            workloads[w] = workload_row(json.loads(preset.read_text()), ours)
        for path in sorted(out.glob(f"eval_{w}_levers*/acceptance.json")):
            # a lever arms' run (--levers-only) served the peer and the baselines again
            section = path.parent.name.removeprefix(f"eval_{w}_")
            served.setdefault(section, {})[w] = workload_row(json.loads(path.read_text()), ours)
    return {"trained": trained, "workloads": workloads, **dict(sorted(served.items()))}


def table(rep: dict) -> str:
    lines = []
    levers = [k for k in rep if k.startswith("levers")]  # "levers", "levers_wlr8": "levers wlr8 (their own run)"
    sections = [(f"{k.replace('_', ' ', 1)} (their own run)", rep[k]) for k in levers]
    for title, rows in [("", rep["workloads"]), *sections]:
        if not rows:
            continue
        ours = [m for m in rep["trained"] if m != "peer" and any(m in r for r in rows.values())]
        if title:
            lines += ["", title, ""]
        lines += ["| workload | " + " | ".join([*ours, "peer", *BASELINES]) + " | over the peer |",
                  "|---|" + "---|" * (len(ours) + 4)]  # fmt: skip
        for w, row in rows.items():
            cells = [f"{row[m]:.2f}" if m in row else "—" for m in [*ours, "peer", *BASELINES]]
            ratio = ", ".join(f"{row[f'{m}_over_peer']:.2f}x" for m in ours if f"{m}_over_peer" in row)
            lines.append(f"| {w} | " + " | ".join(cells) + f" | {ratio} |")
    screen = {n: t for n, t in rep["trained"].items() if t.get("equal") == "tokens" and "heldout_sim_tau" in t}
    if len(screen) > 1:
        lines += [
            "",
            "equal tokens, held out (the screen)",
            "",
            "| arm | overrides | tokens | tok/s | held-out acc per TTT step | sim tau |",
            "|---|---|---|---|---|---|",
        ]
        for n, t in screen.items():
            lines.append(f"| {n} | {' '.join(t.get('overrides', [])) or 'the preset'} | {t['tokens']:,} | "
                         f"{t['tok_per_s']} | {t['heldout_acc']} | {t['heldout_sim_tau']:.3f} |")  # fmt: skip
    lines.append("")
    for name, t in rep["trained"].items():
        lever = f" ({' '.join(t['overrides'])})" if t.get("overrides") else ""
        lines.append(f"* {name}: {t['tokens']:,} tokens in {t['minutes']} training minutes{lever}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    out = Path((argv or sys.argv[1:])[0])
    rep = report(out)
    (out / "peer.json").write_text(json.dumps(rep, indent=1) + "\n")
    (out / "peer.md").write_text(table(rep))
    print(table(rep), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
