r"""`draftsmith eval schedule`: the k per batch size that serves a head fastest, from measured batch-size sweeps.

    draftsmith eval acceptance --target smollm2 --head mine=exported/mine --prompts chat.jsonl \
        --batch-sizes 1,4,8,16 --out runs/sweep_chat          # (and one per workload, or per k with --k)
    draftsmith eval schedule --head mine runs/sweep_chat runs/sweep_mtbench --out exported/mine/schedule.json

For each measured batch size it takes, over the given runs (workloads, values of k), the k whose served tok/s over
no speculation's in the same run is best on the geometric mean of the workloads, with k = 0 (do not speculate)
wherever no k beats no speculation. Batch sizes between two measured ones take the larger one's k (the cautious
side: speculation pays less as the batch grows). Writes schedule.json with vLLM's
`num_speculative_tokens_per_batch_size` and the measurements behind each choice; serve it with
`draftsmith eval acceptance ... --k-schedule schedule.json`, or in vLLM:

    speculative_config={"method": "eagle3", "model": DIR, "num_speculative_tokens": 3,
                        "num_speculative_tokens_per_batch_size": [[1, 4, 3], [5, 256, 0]]}
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from draftsmith.serve.recipe import check_schedule


def sweep_speedups(result: dict, head: str) -> dict[int, float | None]:
    """batch size -> the head's served tok/s over no speculation's (one run of `eval acceptance --batch-sizes`)."""
    out = {}
    for entry in result["sweep"]:
        row = entry["methods"].get(head)
        out[entry["batch_size"]] = row.get("speedup_vs_none") if row and row["status"] == "ok" else None
    return out


def make_schedule(results: list[dict], head: str) -> tuple[list[list[int]], list[dict]]:
    """(schedule, one line of evidence per measured batch size) from sweep results that serve `head`."""
    by_k: dict[int, dict[int, list[float]]] = {}  # k -> batch size -> speed-ups over the workloads
    for r in results:
        if "sweep" not in r:
            raise ValueError(f"{r.get('_path', 'a run')}: no batch-size sweep (run eval acceptance --batch-sizes)")
        if head not in r["sweep"][0]["methods"]:
            raise ValueError(f"{r.get('_path', 'a run')}: no method {head!r} (it has {list(r['sweep'][0]['methods'])})")
        if r["engine"].get("k_schedule"):
            raise ValueError(f"{r.get('_path', 'a run')}: served with a k schedule already; measure at fixed k")
        for b, x in sweep_speedups(r, head).items():
            by_k.setdefault(r["k"], {}).setdefault(b, []).append(x)
    sizes = sorted({b for per in by_k.values() for b in per})
    evidence, chosen = [], []
    for b in sizes:
        means = {}
        for k, per in by_k.items():
            xs = per.get(b) or []
            if xs and all(x for x in xs):  # every workload measured at this k and batch size
                means[k] = math.exp(sum(math.log(x) for x in xs) / len(xs))
        best_k, best = max(means.items(), key=lambda kv: kv[1], default=(0, None))
        k = best_k if best is not None and best > 1.0 else 0
        chosen.append(k)
        evidence.append({"batch_size": b, "speedup_by_k": {str(kk): round(v, 3) for kk, v in means.items()}, "k": k})
    schedule, lo = [], 1
    for b, k in zip(sizes, chosen):
        if schedule and schedule[-1][2] == k:
            schedule[-1][1] = b
        else:
            schedule.append([lo, b, k])
        lo = b + 1
    schedule[-1][1] = max(schedule[-1][1], 256)  # vLLM's default max_num_seqs: every batch it can run
    return check_schedule(schedule, max(by_k)), evidence


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="draftsmith eval schedule", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("runs", nargs="+", help="output dirs (or acceptance.json files) of eval acceptance --batch-sizes")
    p.add_argument("--head", required=True, help="the method name the head was served under")
    p.add_argument("--out", required=True, help="schedule.json to write")
    args = p.parse_args(argv)
    results = []
    for run in args.runs:
        path = Path(run) / "acceptance.json" if Path(run).is_dir() else Path(run)
        if not path.is_file():
            print(f"draftsmith eval schedule: {path}: no such file (an eval acceptance output dir?)", file=sys.stderr)
            return 2
        results.append({**json.loads(path.read_text()), "_path": str(path)})
    try:
        schedule, evidence = make_schedule(results, args.head)
    except ValueError as e:
        print(f"draftsmith eval schedule: {e}", file=sys.stderr)
        return 2
    for line in evidence:
        ks = ", ".join(f"k={k}: {v:.2f}x" for k, v in line["speedup_by_k"].items()) or "not measured"
        print(f"batch {line['batch_size']:>3}: {ks} -> k={line['k']}")
    doc = {
        "num_speculative_tokens_per_batch_size": schedule,
        "head": args.head,
        "runs": [r["_path"] for r in results],
        "evidence": evidence,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"schedule {json.dumps(schedule)} -> {args.out}")
    print(f"serve it: draftsmith eval acceptance ... --k-schedule {args.out}")
    return 0
