"""Regeneration throughput: the target re-answering first turns with vLLM, threads x batch size, on the same prompts.

    python bench/regenerate.py --out bench/results/regen --num-conversations 192 --configs 1:32,1:64,2:64,2:128

Each config `T:B` runs `draftsmith regenerate` with one engine of T OpenMP threads and B prompts per generate()
call, one config after the other (so they never share the cores), on the same first turns, greedy, into a fresh
file. Reports new tokens per second of the whole call (engine start-up included, as a user pays it), the ratio to
the first config, and how many answers equal the first config's token for token. Writes bench.json and bench.md
under --out; not a test: figures depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from draftsmith.probe import cpu_name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--data", default="sharegpt")
    ap.add_argument("--num-conversations", type=int, default=192)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--configs", default="1:32,1:64,2:64,2:128", help="comma-separated THREADS:BATCH_SIZE")
    a = ap.parse_args(argv)
    from draftsmith.atomic import atomic_write_json
    from draftsmith.train.data.regenerate import regenerate

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, answers = [], {}
    with tempfile.TemporaryDirectory(prefix="bench-regen-") as tmp:
        for config in a.configs.split(","):
            threads, batch = (int(x) for x in config.split(":"))
            path = Path(tmp) / f"{config}.jsonl"
            t0 = time.perf_counter()
            stats = regenerate(
                a.target,
                a.data,
                str(path),
                a.num_conversations,
                a.max_tokens,
                batch_size=batch,
                backend="vllm",
                threads=threads,
            )
            wall = time.perf_counter() - t0
            recs = {r["id"]: r["messages"][-1]["content"] for r in map(json.loads, path.read_text().splitlines())}
            answers[config] = recs
            first = answers[a.configs.split(",")[0]]
            rows.append(
                {
                    "config": config,
                    "threads": threads,
                    "batch_size": batch,
                    "answers": len(recs),
                    "new_tokens": stats["new_tokens"],
                    "seconds": round(wall, 1),
                    "tok_per_s": round(stats["new_tokens"] / wall, 1),
                    "same_as_first": sum(recs[k] == first.get(k) for k in recs),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    base = rows[0]["tok_per_s"]
    for r in rows:
        r["vs_first"] = round(r["tok_per_s"] / base, 2)
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "target": a.target,
        "data": a.data,
        "num_conversations": a.num_conversations,
        "max_tokens": a.max_tokens,
    }
    atomic_write_json(out / "bench.json", {"meta": meta, "rows": rows})
    lines = [
        f"# Regeneration throughput ({meta['date']}, {meta['cpu']}, {meta['cores']} cores)",
        "",
        f"{rows[0]['answers']} first turns of {a.data} re-answered by {a.target} in one vLLM engine, greedy, "
        f"<= {a.max_tokens} tokens; wall time of the whole call (engine start-up included).",
        "",
        "| threads | prompts per call | answers | new tokens | seconds | tok/s | vs first | answers equal to first |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['threads']} | {r['batch_size']} | {r['answers']} | {r['new_tokens']:,} | {r['seconds']} | "
            f"{r['tok_per_s']} | {r['vs_first']:.2f}x | {r['same_as_first']} / {r['answers']} |"
        )
    (out / "bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
