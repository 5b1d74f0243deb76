"""peer.json and peer.md from a bench/peer_speculators.py OUT: tokens per target step per workload for our heads (equal
minutes, equal tokens), the peer's, ngram's and suffix's, with the tokens and minutes each head trained.

    python bench/peer_report.py OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

WORKLOADS = ("chat", "mtbench", "code")
METHODS = ("ours_minutes", "ours_tokens", "peer", "ngram", "suffix")


def ours_trained(run_dir: Path) -> dict:
    """Tokens and training minutes of a draftsmith run, from the last line of its metrics.jsonl that has them."""
    last = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "tokens" in rec:
            last = rec
    return {"tokens": last.get("tokens"), "minutes": round(last["elapsed_s"] / 60, 2) if last else None}


def report(out: Path) -> dict:
    peer = json.loads((out / "peer" / "trained.json").read_text())
    trained = {
        "ours_minutes": {**ours_trained(out / "ours_minutes"), "equal": "minutes"},
        "ours_tokens": {**ours_trained(out / "ours_tokens"), "equal": "tokens"},
        "peer": {"tokens": peer["tokens"], "minutes": round(peer["train_seconds"] / 60, 2),
                 "steps": peer["steps"], "version": peer["version"]},
    }  # fmt: skip
    workloads = {}
    for w in WORKLOADS:
        path = out / f"eval_{w}" / "acceptance.json"
        if not path.is_file():
            continue
        res = json.loads(path.read_text())
        methods = res["methods"]
        row = {m: methods[m]["tokens_per_target_step"] for m in METHODS if methods.get(m, {}).get("status") == "ok"}
        match = {m: methods[m].get("match_vs_none") for m in METHODS if m in methods}
        row["every_output_equal"] = all(v == 1.0 for v in match.values())
        row["prompts"], row["batch_size"], row["k"] = res["num_prompts"], res.get("batch_size", 8), res["k"]
        if "peer" in row:
            for m in ("ours_minutes", "ours_tokens"):
                if m in row:
                    row[f"{m}_over_peer"] = round(row[m] / row["peer"], 3)
        workloads[w] = row
    return {"trained": trained, "workloads": workloads}


def table(rep: dict) -> str:
    lines = ["| workload | ours, equal minutes | ours, equal tokens | peer | ngram | suffix | ours/peer (min, tok) |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for w, row in rep["workloads"].items():
        cells = [f"{row[m]:.2f}" if m in row else "—" for m in METHODS]
        ratio = f"{row.get('ours_minutes_over_peer', 0):.2f}x, {row.get('ours_tokens_over_peer', 0):.2f}x"
        lines.append(f"| {w} | " + " | ".join(cells) + f" | {ratio} |")
    lines.append("")
    for name, t in rep["trained"].items():
        lines.append(f"* {name}: {t['tokens']:,} tokens in {t['minutes']} training minutes")
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
