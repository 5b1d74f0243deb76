"""One table from a bench/quickstart_reserve.sh OUT: per workload (every OUT/NAME/acceptance.json), the head's and its
hybrid's tokens per target step beside ngram's and suffix's, each over the better of the two, their tok/s over no
speculation's, and whether every output equalled no speculation's. Writes OUT/reserve.json and OUT/reserve.md.

    python bench/reserve_report.py OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

BASELINES = ("none", "ngram", "suffix")
# the order quickstart_reserve.sh serves them in; any other workload after these, by name
ORDER = [
    "chat",
    "mtbench",
    "code",
    *(f"specbench_{c}" for c in ("translation", "summarization", "qa", "math_reasoning", "rag")),
]


def workload_row(res: dict) -> dict:
    methods = {n: m for n, m in res["methods"].items() if m.get("status") == "ok"}
    heads = [n for n in methods if n not in BASELINES]
    step = {n: round(m["tokens_per_target_step"], 3) for n, m in methods.items()}
    best = max(step.get("ngram", 0.0), step.get("suffix", 0.0))
    row = {
        "prompts": res["num_prompts"],
        "categories": res.get("categories"),
        "tokens_per_target_step": step,
        "speedup_vs_none": {n: round(m["speedup_vs_none"], 3) for n, m in methods.items() if m.get("speedup_vs_none")},
        "every_output_equal": all(methods[n].get("match_vs_none") == 1.0 for n in methods if n != "none"),
        "failed": sorted(set(res["methods"]) - set(methods)),
    }
    if best:
        row["over_best_training_free"] = {h: round(step[h] / best, 3) for h in heads}
    return row


def report(out: Path) -> dict:
    rows = {}
    rank = {name: i for i, name in enumerate(ORDER)}
    for path in sorted(
        out.glob("*/acceptance.json"), key=lambda p: (rank.get(p.parent.name, len(ORDER)), p.parent.name)
    ):
        rows[path.parent.name] = workload_row(json.loads(path.read_text()))
    if not rows:
        raise SystemExit(f"{out}: no */acceptance.json (run bench/quickstart_reserve.sh first)")
    return rows


def table(rows: dict) -> str:
    heads = list(dict.fromkeys(h for r in rows.values() for h in r.get("over_best_training_free", {})))
    cols = [*heads, "ngram", "suffix"]
    lines = [
        "| workload | prompts | " + " | ".join(cols) + " | " + " | ".join(f"{h} / best training-free" for h in heads)
        + " | " + " | ".join(f"{h} tok/s vs none" for h in heads) + " | outputs = none |",
        "|---|---|" + "---|" * (len(cols) + 2 * len(heads) + 1),
    ]  # fmt: skip
    for name, r in rows.items():
        step, over, speed = r["tokens_per_target_step"], r.get("over_best_training_free", {}), r["speedup_vs_none"]
        cells = [f"{step[c]:.2f}" if c in step else "-" for c in cols]
        cells += [f"{over[h]:.2f}x" if h in over else "-" for h in heads]
        cells += [f"{speed[h]:.2f}x" if h in speed else "-" for h in heads]
        lines.append(f"| {name} | {r['prompts']} | " + " | ".join(cells) + f" | {r['every_output_equal']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 1:
        raise SystemExit(__doc__)
    out = Path(args[0])
    rows = report(out)
    md = table(rows)
    (out / "reserve.json").write_text(json.dumps(rows, indent=1) + "\n")
    (out / "reserve.md").write_text(md)
    print(md, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
