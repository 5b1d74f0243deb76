"""Code-completion prompts for the target to answer, written to a file: the first N of the `pycode:` data source
(train/data/code_prompts.py: public functions of the installed Python, each cut after its docstring and asked in the
code workload's words). This directory's run made them with its own copy of that code; the package's source writes
the same prompts, byte for byte, and is what this script now calls.

    python make_code_prompts.py OUT.jsonl [--n 1200] [--root stdlib|site-packages]

Writes {"id", "messages": [user]} lines, the conversations format `draftsmith regenerate` and data.also read;
`draftsmith regenerate --data pycode:ROOT:N` reads the source directly.
"""

import argparse
import json

from draftsmith.train.data.code_prompts import pycode_records


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--n", type=int, default=1200)
    ap.add_argument("--root", choices=("stdlib", "site-packages"), default="stdlib")
    args = ap.parse_args()
    records = [rec for rec, _ in pycode_records(f"pycode:{args.root}:{args.n}")]
    with open(args.out, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(rec) + "\n" for rec in records)
    print(f"{len(records)} prompts (pycode:{args.root}:{args.n}) -> {args.out}")


if __name__ == "__main__":
    main()
