"""Re-answer a dataset's first user turns with the target itself.

A head learns what the target will say, not what some other model once said: trained on the target's
own answers, the draft sees at training time the token stream it will be asked to continue when
serving. The output is a JSONL of conversations (`{"id", "messages", ...}`) that `data.path=` reads
like any other dataset; ids are kept, so the held-out split (by id) is the same as the source's.

    draftsmith regenerate --target smollm2 --data sharegpt --out regen.jsonl --num-conversations 2000

Generation runs in vLLM (a child process, batched) when it is installed, else with the HF target.
Every finished batch is appended and fsynced at once; a killed run resumes where it stopped, and a
torn last line from the kill is dropped, never duplicated.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from tqdm.auto import tqdm

from draftsmith.atomic import atomic_write
from draftsmith.errors import ConfigError
from draftsmith.generate import default_threads, iter_generate, resolve_backend
from draftsmith.train.data.conversations import read_conversations
from draftsmith.train.data.render import render_prompt

SETTINGS = ("target", "data", "max_tokens", "temperature", "seed", "max_prompt_tokens")


def first_turns(data: str, limit: int | None, tokenizer, max_prompt_tokens: int) -> tuple[list[dict], int]:
    """[{id, messages (up to the first answer), prompt_ids}] and how many were too long to keep."""
    out, too_long = [], 0
    for conv in read_conversations(data, limit):
        k = next(i for i, m in enumerate(conv.messages) if m["role"] == "assistant")
        ids = render_prompt(tokenizer, conv.messages[:k])
        if len(ids) > max_prompt_tokens:
            too_long += 1
            continue
        out.append({"id": conv.id, "messages": conv.messages[:k], "prompt_ids": ids})
    return out, too_long


def load_done(out: Path) -> dict[str, dict]:
    """Records already written; rewrites the file without a torn last line (a kill mid-append)."""
    if not out.is_file():
        return {}
    done, good = {}, []
    with open(out, "rb") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue  # only a kill mid-write leaves one; it is regenerated
            if isinstance(rec, dict) and "id" in rec and rec["id"] not in done:
                done[rec["id"]] = rec
                good.append(line if line.endswith(b"\n") else line + b"\n")
    atomic_write(out, b"".join(good))
    return done


def _append(out: Path, records: list[dict]) -> None:
    with open(out, "a", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def regenerate(
    target: str,
    data: str,
    out: str,
    num_conversations: int | None = None,
    max_tokens: int = 256,
    temperature: float = 0.0,
    seed: int = 0,
    max_prompt_tokens: int = 1024,
    batch_size: int = 64,
    backend: str = "auto",
    threads: int | None = None,
    kv_cache_gib: int = 2,
) -> dict:
    """Write (or finish writing) `out`; returns counts, generation speed and the ids of the prompts asked for.

    With vLLM, one engine with `threads` OpenMP threads (None: every core) answers `batch_size` prompts per call:
    on 2 cores, 2 threads ran 1.71x one thread, and two one-thread engines side by side no faster than that
    (bench/regenerate.py, README "Data preparation on every core")."""
    from transformers import AutoTokenizer

    from draftsmith.assets import resolve_target

    target_path = resolve_target(target)
    out_path = Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    settings = {
        "target": str(target),
        "data": str(data),
        "max_tokens": max_tokens,
        "temperature": temperature,
        "seed": seed,
        "max_prompt_tokens": max_prompt_tokens,
        "out": str(out_path),
    }
    meta_path = out_path.with_name(out_path.name + ".meta.json")
    if meta_path.is_file():
        old = json.loads(meta_path.read_text())
        diff = {k: (old.get(k), settings[k]) for k in SETTINGS if old.get(k) != settings[k]}
        if diff:
            raise ConfigError(
                f"{out_path} was generated with other settings {diff} (old, new); use another --out or delete it"
            )
    else:
        meta_path.write_text(json.dumps(settings, indent=2))
    backend = resolve_backend(backend)

    tokenizer = AutoTokenizer.from_pretrained(target_path)
    prompts, too_long = first_turns(data, num_conversations, tokenizer, max_prompt_tokens)
    done = load_done(out_path)
    todo = [p for p in prompts if p["id"] not in done]
    print(
        f"regenerate: {len(prompts)} first turns from {data} ({too_long} prompts over {max_prompt_tokens} tokens "
        f"skipped), {len(done)} already in {out_path}, {len(todo)} to go, backend {backend}",
        flush=True,
    )
    new_tokens, t0 = 0, time.perf_counter()
    if todo:
        threads = threads or default_threads()
        kw = (
            {"threads": threads, "kv_cache_gib": kv_cache_gib, "log_path": str(out_path) + ".log"}
            if backend == "vllm"
            else {}
        )
        batches = iter_generate(
            target_path,
            [p["prompt_ids"] for p in todo],
            max_tokens,
            temperature,
            seed,
            backend,
            batch_size=batch_size,
            **kw,
        )
        bar = tqdm(total=len(todo), desc="regenerate", unit="prompt", dynamic_ncols=True)
        for start, token_ids, finish in batches:
            records = []
            for p, ids, why in zip(todo[start : start + len(token_ids)], token_ids, finish):
                text = tokenizer.decode(ids, skip_special_tokens=True).strip()
                records.append(
                    {
                        "id": p["id"],
                        "messages": p["messages"] + [{"role": "assistant", "content": text}],
                        "answer_tokens": len(ids),
                        "finish_reason": why,
                    }
                )
                new_tokens += len(ids)
            _append(out_path, records)
            bar.update(len(records))
            bar.set_postfix(tok_s=f"{new_tokens / (time.perf_counter() - t0):.0f}")
        bar.close()
    seconds = time.perf_counter() - t0
    stats = {
        "prompts": len(prompts),
        "too_long": too_long,
        "resumed_with": len(done),
        "generated": len(todo),
        "new_tokens": new_tokens,
        "seconds": seconds,
        "tokens_per_s": new_tokens / seconds if todo else None,
        "backend": backend,
        "threads": threads if backend == "vllm" else None,
        "batch_size": batch_size,
        "out": str(out_path),
        "ids": [p["id"] for p in prompts],
    }
    print(
        f"regenerate: {len(todo)} answers, {new_tokens} tokens in {seconds:.0f} s "
        f"({stats['tokens_per_s'] or 0:.0f} tok/s) -> {out_path}",
        flush=True,
    )
    return stats


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="draftsmith regenerate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2", help="HF dir/id, or smollm2 (the embedded default)")
    ap.add_argument("--data", default="sharegpt", help="sharegpt, a JSON/JSONL file, or hf:NAME[:SPLIT]")
    ap.add_argument("--out", required=True, help="JSONL to write (resumed if it exists)")
    ap.add_argument("--num-conversations", type=int, default=None)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (what greedy serving sees)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-prompt-tokens", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=64, help="prompts per generate() call (and per saved chunk)")
    ap.add_argument("--backend", default="auto", choices=["auto", "vllm", "hf"])
    ap.add_argument("--threads", type=int, default=None, help="OMP threads of the vLLM engine (default: every core)")
    a = ap.parse_args(argv)
    regenerate(
        a.target,
        a.data,
        a.out,
        a.num_conversations,
        a.max_tokens,
        a.temperature,
        a.seed,
        a.max_prompt_tokens,
        a.batch_size,
        a.backend,
        a.threads,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
