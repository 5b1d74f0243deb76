"""Where a served decoding step's time goes, per method and batch size, tabulated from `draftsmith eval acceptance`
runs: every engine eval acceptance starts times its model runner's calls inside the engine (serve/step_timer.py)
and records them per method as `step_breakdown` in acceptance.json.

    python bench/step_breakdown.py --eval runs/batch1 --eval runs/batch8 --out bench/results/DAY/step_breakdown

Each --eval is one acceptance run (its batch size, or each batch size of a --batch-sizes sweep). Writes
OUT/step_breakdown.json (per method and batch size: engine steps, milliseconds per step of each part and its share,
tokens per target step, tok/s over none's, outputs equal to none's, the run it came from) and OUT/step_breakdown.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftsmith.paths import make_portable
from draftsmith.serve.step_timer import PARTS


def cells(result: dict) -> list[tuple[int, dict]]:
    """(batch size, {method: row}) of one acceptance.json: each sweep entry, or the run's own batch size."""
    if result.get("sweep"):
        return [(s["batch_size"], s["methods"]) for s in result["sweep"]]
    return [(result["engine"]["batch_size"], result["methods"])]


def rows_of(path: Path) -> list[dict]:
    result = json.loads((path / "acceptance.json").read_text())
    out = []
    for batch, methods in cells(result):
        for name, m in methods.items():
            b = m.get("step_breakdown") or {}
            out.append({
                "method": name, "batch_size": batch, "k": result.get("k"), "run": str(path), "steps": b.get("steps"),
                "ms_per_step": {p: 1e3 * v for p, v in (b.get("seconds_per_step") or {}).items()},
                "share": b.get("share") or {}, "tokens_per_target_step": m.get("tokens_per_target_step"),
                "tok_s": m.get("output_tokens_per_s"), "speedup_vs_none": m.get("speedup_vs_none"),
                "match_vs_none": m.get("match_vs_none"),
            })  # fmt: skip
    return out


def table(rows: list[dict]) -> str:
    lines = [
        "| method | batch | k | tok/step | tok/s vs none | ms per step | " + " | ".join(PARTS) + " |",
        "|" + "---|" * (6 + len(PARTS)),
    ]
    for r in rows:
        ms = r["ms_per_step"]
        if not ms:
            lines.append(f"| {r['method']} | {r['batch_size']} | {r['k']} | (no breakdown recorded) |")
            continue
        tps, sp = r["tokens_per_target_step"], r["speedup_vs_none"]
        parts = [f"{ms[p]:.1f} ({100 * r['share'][p]:.0f} %)" for p in PARTS]
        lines.append(
            f"| {r['method']} | {r['batch_size']} | {r['k']} | {tps:.2f} | {sp:.2f}× | {sum(ms.values()):.1f} | "
            + " | ".join(parts)
            + " |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--eval", action="append", required=True, metavar="DIR", help="an eval acceptance --out (repeat)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    rows = [r for d in args.eval for r in rows_of(Path(d))]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "step_breakdown.json").write_text(json.dumps({"parts": list(PARTS), "rows": rows}, indent=2) + "\n")
    text = table(rows)
    (out / "step_breakdown.md").write_text(text + "\n")
    make_portable(out)  # committed records carry paths relative to the repo
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
