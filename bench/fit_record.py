"""The hybrid fit's recording cost: every member's proposal at every answer position, with the head's chains drafted
for all positions at once (`greedy_every_row`, what `eval fit-hybrid` runs) against one chain per position (the
reference drafter's `propose`, what it ran before), on the same conversations, in one process, rounds interleaved.

    python bench/fit_record.py --head outputs/quickstart/exported --exclude outputs/quickstart/heldout_prompts.jsonl
    python bench/fit_record.py --head DIR --num-conversations 24 --max-tokens 128 --rounds 2

The conversations are the ones `eval fit-hybrid` would take with the same flags (its answers cached under the
draftsmith cache, generated in vLLM the first time). It prints the seconds per recorded position both ways, their
ratio, and whether the two record sets agree (draft lengths and accepted counts equal, signals within 1e-4).
Not a test: the figures depend on the machine (its CPU flags are printed).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch


def agree(a: list[list[dict]], b: list[list[dict]]) -> bool:
    pairs = [(x[r], y[r]) for ca, cb in zip(a, b) for x, y in zip(ca, cb) for r in x]
    same = all(p["n"] == q["n"] and p["accepted"] == q["accepted"] for p, q in pairs)
    return same and all(abs(p["signal"] - q["signal"]) < 1e-4 for p, q in pairs) and len(a) == len(b)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--head", required=True, help="an exported EAGLE-3 head (what --hybrid fits)")
    ap.add_argument("--exclude", default=None, help="prompts the fit leaves out (a quickstart's heldout_prompts.jsonl)")
    ap.add_argument("--num-conversations", type=int, default=24, help="the quickstart's fit: 24")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()

    from draftsmith.assets import resolve_target
    from draftsmith.eval.hybrid import fit_conversations, hybrid_members, record_positions
    from draftsmith.eval.reference_decoder import load_head_drafter
    from draftsmith.probe import cpu_flags
    from draftsmith.train.checkpoint import read_head
    from draftsmith.train.target import Target

    target = resolve_target(args.target)
    _, _, _, convs = fit_conversations(
        target, Path(args.head), None, args.num_conversations, args.max_tokens, exclude=args.exclude
    )
    _, head_config, _, _ = read_head(args.head)
    tgt = Target.from_pretrained(target, aux_layer_ids=head_config.get("aux_layer_ids") or [0])
    positions = sum(len(a) - 1 for _, a in convs)
    times: dict[str, list[float]] = {"batched": [], "row by row": []}
    records = {}
    for _ in range(args.rounds):
        for way in times:
            members = hybrid_members(load_head_drafter("head", args.head, tgt)[0], ("head", "ngram", "suffix"))
            t = time.perf_counter()
            records[way] = record_positions(tgt, members, convs, args.k, batched=way == "batched")
            times[way].append(time.perf_counter() - t)
    print(f"CPU flags: {cpu_flags()}; torch threads {torch.get_num_threads()}; {len(convs)} conversations, "
          f"{positions} positions, k={args.k}, median of {args.rounds} round(s)")  # fmt: skip
    print("| recording | s | ms per position |\n|---|---|---|")
    med = {w: statistics.median(v) for w, v in times.items()}
    for way, s in med.items():
        print(f"| {way} | {s:.1f} | {1000 * s / positions:.2f} |")
    print(f"row by row / batched: {med['row by row'] / med['batched']:.2f}x; records agree: "
          f"{agree(records['batched'], records['row by row'])}")  # fmt: skip


if __name__ == "__main__":
    main()
