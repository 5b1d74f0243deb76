"""How much of what the target writes repeats its own context: the share of output tokens t_i whose three tokens
before (in prompt + output so far) occurred earlier, followed by t_i (what a suffix/ngram drafter can copy).

Measured on the no-speculation outputs of ../preset_2threads (40 HumanEval, 40 MT-Bench prompts; greedy, 128 tokens)
and on 300 random answers of the preset's training data (the target's own answers to ShareGPT first turns, the regen
pool in the draftsmith cache), all of them and the code-like ones. Run from the repo root:

    .venv/bin/python bench/results/2026-11-27/code_copy/analyze.py > bench/results/2026-11-27/code_copy/copy.json
"""

import json
import random
import re
import sys
from pathlib import Path

from transformers import AutoTokenizer

from draftsmith.assets import cache_dir, resolve_target
from draftsmith.train.data.render import render_prompt

N = 3
RUNS = Path("bench/results/2026-11-27/preset_2threads/bench_prompts")
CODE = re.compile(r"```|\bdef |#include|public static|\bfunction\b")


def copied(ctx: list[int], out: list[int]) -> tuple[int, int]:
    """(output tokens whose N-token left context occurred earlier followed by the same token, output tokens)"""
    seq, seen, hit = list(ctx), set(), 0
    for i in range(N, len(seq)):
        seen.add(tuple(seq[i - N : i + 1]))
    for t in out:
        gram = tuple(seq[-N:]) + (t,)
        hit += len(seq) >= N and gram in seen
        seq.append(t)
        if len(seq) > N:
            seen.add(tuple(seq[-N - 1 :]))
    return hit, len(out)


def share(pairs) -> dict:
    h = t = 0
    for ctx, out in pairs:
        a, b = copied(ctx, out)
        h, t = h + a, t + b
    return {"copied": round(h / t, 3), "tokens": t, "samples": len(pairs)}


def main() -> int:
    tok = AutoTokenizer.from_pretrained(resolve_target("smollm2"))
    res = {}
    for wl in ("code", "mtbench"):
        job = json.loads((RUNS / wl / "runs" / "none.job.json").read_text())
        out = json.loads((RUNS / wl / "runs" / "none.result.json").read_text())
        res[f"served {wl}"] = share(list(zip(job["prompt_token_ids"], out["output_token_ids"])))
    pool = sorted((cache_dir() / "regen").glob("*.first4000.jsonl"))
    if not pool:
        sys.exit("no regen pool in the draftsmith cache: run the preset's data preparation first")
    rows = [json.loads(x) for x in pool[0].read_text().split("\n") if x]
    random.Random(0).shuffle(rows)
    every, code = [], []
    for rec in rows[:300]:
        k = next(i for i, m in enumerate(rec["messages"]) if m["role"] == "assistant")
        answer = rec["messages"][k]["content"]
        pair = (render_prompt(tok, rec["messages"][:k]), tok(answer, add_special_tokens=False)["input_ids"])
        every.append(pair)
        if CODE.search(answer + rec["messages"][k - 1]["content"]):
            code.append(pair)
    res["training answers, all"] = share(every)
    res["training answers, code-like"] = share(code)
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
