"""Re-answer a dataset's user turns with the target itself: the first, or the first N (`--turns`).

A head learns what the target will say, not what some other model once said: trained on the target's
own answers, the draft sees at training time the token stream it will be asked to continue when
serving. The output is a JSONL of conversations (`{"id", "messages", ...}`) that `data.path=` reads
like any other dataset; ids are kept, so the held-out split (by id) is the same as the source's.

    draftsmith regenerate --target smollm2 --data sharegpt --out regen.jsonl --num-conversations 2000
    draftsmith regenerate ... --turns 3     # also the 2nd and 3rd user turns, each after the target's own answers

With `--turns N` a conversation's turn r is asked after the target's own answers to turns 1..r-1 (the source's
answers are never shown), for every conversation whose source has an r-th user turn and whose prompt stays within
`--max-prompt-tokens`; turn r of all conversations is one batched round. The file is one pool for every N: while
a run goes, a record gains a line per answered turn (the last line of an id wins), and a finished run leaves one
line per id, so `data.path=` reads each conversation once; its first answer is the same as with `--turns 1`, and
`truncate_turns` cuts a record back to its first answers.

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
from draftsmith.train.data.conversations import ReadStats, read_conversations
from draftsmith.train.data.render import TemplateOptions, render_prompt, set_template_options

SETTINGS = ("target", "data", "max_tokens", "temperature", "seed", "max_prompt_tokens")


def first_prompts(
    data: str, limit: int | None, tokenizer, max_prompt_tokens: int, last: bool = False
) -> tuple[list[dict], int]:
    """[{id, messages (every message before the first answer: system, user), prompt_ids, source (the whole
    conversation)}] and how many were too long to keep. (eval/prompts.py `first_turns` keeps the first user
    message alone, for served prompts.) last=True: every message up to the last user turn (a request with its
    history, as `draftsmith adapt` reads traffic), answered at its end."""
    out, too_long, stats = [], 0, ReadStats()
    for conv in read_conversations(data, limit, stats, questions=True):  # prompts alone are fine: nothing to replace
        if last:
            k = 1 + max(i for i, m in enumerate(conv.messages) if m["role"] == "user")
        else:
            k = next((i for i, m in enumerate(conv.messages) if m["role"] == "assistant"), len(conv.messages))
        ids = render_prompt(tokenizer, conv.messages[:k])
        if len(ids) > max_prompt_tokens:
            too_long += 1
            continue
        out.append({"id": conv.id, "messages": conv.messages[:k], "prompt_ids": ids, "source": conv.messages})
    if not stats.kept:
        raise ConfigError(f"{data}: no user turn to answer ({stats.summary()})")
    return out, too_long


def answer_positions(messages: list[dict]) -> list[int]:
    """Indices of the answers (assistant messages) in `messages`."""
    return [i for i, m in enumerate(messages) if m["role"] == "assistant"]


def next_turn(messages: list[dict], source: list[dict]) -> list[dict] | None:
    """The messages that ask for the next answer: `messages` (the source's turns so far with the target's
    answers) plus the source's messages after its matching answer up to its next one, or None when the source
    has no further user turn."""
    n = len(answer_positions(messages))
    at = answer_positions(source)
    if len(at) < n:
        return None
    end = at[n] if len(at) > n else len(source)
    ask = source[at[n - 1] + 1 : end]
    return messages + ask if any(m["role"] == "user" for m in ask) else None


def truncate_turns(record: dict, turns: int) -> dict:
    """`record` cut back to its first `turns` answers (and their per-turn counts)."""
    at = answer_positions(record["messages"])
    if len(at) <= turns:
        return record
    out = dict(record, messages=record["messages"][: at[turns - 1] + 1])
    later = record.get("later_turns", [])[: turns - 1]
    if later:
        out["later_turns"] = later
    else:
        out.pop("later_turns", None)
    return out


def read_pool(out: Path) -> tuple[dict[str, dict], dict[str, bytes]]:
    """The records written to `out` and their lines, the last line of each id (a later turn supersedes the record
    before it), in first-seen order; a torn line (a kill mid-append) is skipped. Reads only."""
    done, lines = {}, {}
    if not out.is_file():
        return done, lines
    with open(out, "rb") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue  # only a kill mid-write leaves one; it is regenerated
            if isinstance(rec, dict) and "id" in rec:
                done[rec["id"]] = rec
                lines[rec["id"]] = line if line.endswith(b"\n") else line + b"\n"
    return done, lines


def load_done(out: Path) -> dict[str, dict]:
    """`read_pool`'s records, after rewriting the file as their lines (one per id, no torn line), so that appends
    resume on a clean file."""
    if not out.is_file():
        return {}
    done, lines = read_pool(out)
    clean = b"".join(lines.values())
    if clean != out.read_bytes():  # a clean file is left as it is (its mtime keys the prepared-data cache)
        atomic_write(out, clean)
    return done


def _append(out: Path, records: list[dict]) -> None:
    with open(out, "a", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def take_shipped(target_path, data, settings: dict, backend: str, todo: list[dict], done: dict, out_path: Path):
    """Answer what a shipped pool (draftsmith/shipped.py) already answered for this target, these settings and this
    generator, where its prompt equals the one asked here; append those records to the pool, return the rest."""
    from draftsmith.shipped import prompt_messages, shipped_answers

    keyed = {k: settings[k] for k in ("max_tokens", "temperature", "seed", "max_prompt_tokens")}
    name, answers = shipped_answers(target_path, {"source": str(data), **keyed}, backend)
    if not name:
        return todo
    taken = [
        answers[p["id"]] for p in todo if p["id"] in answers and prompt_messages(answers[p["id"]]) == p["messages"]
    ]
    if taken:
        _append(out_path, taken)
        done.update((r["id"], r) for r in taken)
    print(
        f"regenerate: {len(taken)} of {len(todo)} answers taken from the shipped pool {name} (same target sha256, "
        f"settings and generator; prompts compared one by one)",
        flush=True,
    )
    return [p for p in todo if p["id"] not in done]


def _source_key(source) -> str:
    """A target or data source as a pool's settings record it: an existing file or dir by its absolute path (the same
    file named from another directory, or relative and absolute, is the same pool), anything else (sharegpt, a hub
    id) as given."""
    path = Path(str(source)).expanduser()
    return str(path.resolve()) if path.exists() else str(source)


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
    turns: int = 1,
    last_turn: bool = False,
    chat_template_kwargs: dict | None = None,
) -> dict:
    """Write (or finish writing) `out`; returns counts, generation speed and the ids of the prompts asked for.
    `turns`: answer each conversation's first `turns` user turns (see the module doc); the settings that make a
    pool (SETTINGS) do not include it, so asking for more turns later extends the same file. `last_turn`: answer
    each record's last user turn after its history instead (one turn; `draftsmith adapt`'s traffic).
    `chat_template_kwargs`: the template's variables the prompts are rendered with, as the deployment serves them
    (Qwen3: {"enable_thinking": false} answers without reasoning; unset, it thinks first and the answers carry their
    `<think>` block); part of the pool's settings, and written on every record it makes.

    With vLLM, one engine with `threads` OpenMP threads (None: every core) answers `batch_size` prompts per call:
    on 2 cores, 2 threads ran 1.71x one thread, and two one-thread engines side by side no faster than that
    (bench/regenerate.py, docs/data.md "Data preparation on every core")."""
    from transformers import AutoTokenizer

    from draftsmith.assets import resolve_target

    target_path = resolve_target(target)
    out_path = Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    settings = {
        "target": _source_key(target),
        "data": _source_key(data),
        "max_tokens": max_tokens,
        "temperature": temperature,
        "seed": seed,
        "max_prompt_tokens": max_prompt_tokens,
        "out": str(out_path),
        **({"last_turn": True} if last_turn else {}),
        **({"chat_template_kwargs": dict(chat_template_kwargs)} if chat_template_kwargs else {}),
    }
    meta_path = out_path.with_name(out_path.name + ".meta.json")
    if meta_path.is_file():
        old = json.loads(meta_path.read_text())
        old.update({k: _source_key(old[k]) for k in ("target", "data") if isinstance(old.get(k), str)})
        keys = (*SETTINGS, "last_turn", "chat_template_kwargs")
        diff = {k: (old.get(k), settings.get(k)) for k in keys if old.get(k) != settings.get(k)}
        if diff:
            raise ConfigError(
                f"{out_path} was generated with other settings {diff} (old, new); use another --out or delete it"
            )
    else:
        meta_path.write_text(json.dumps(settings, indent=2))
    backend = resolve_backend(backend)

    tokenizer = AutoTokenizer.from_pretrained(target_path)
    set_template_options(tokenizer, TemplateOptions.of(chat_template_kwargs))
    mode = {"chat_template_kwargs": dict(chat_template_kwargs)} if chat_template_kwargs else {}  # on each record
    if last_turn and turns != 1:
        raise ConfigError(f"regenerate: last_turn answers one turn per record, not turns={turns}")
    prompts, too_long = first_prompts(data, num_conversations, tokenizer, max_prompt_tokens, last=last_turn)
    done = load_done(out_path)
    resumed = len(done)
    todo = [p for p in prompts if p["id"] not in done]
    if todo:
        todo = take_shipped(target_path, data, settings, backend, todo, done, out_path)
    print(
        f"regenerate: {len(prompts)} {'requests' if last_turn else 'first turns'} from {data} ({too_long} prompts "
        f"over {max_prompt_tokens} tokens "
        f"skipped), {len(done)} already in {out_path}, {len(todo)} to go, backend {backend}",
        flush=True,
    )
    threads = threads or default_threads()
    kw = {}
    if backend == "vllm":
        kw = {"threads": threads, "kv_cache_gib": kv_cache_gib, "log_path": str(out_path) + ".log"}
    new_tokens, generated, later_too_long, t0 = 0, 0, 0, time.perf_counter()
    for turn in range(1, turns + 1):
        if turn > 1:  # the conversations answered up to the turn before, with a further user turn
            todo = []
            for p in prompts:
                rec = done.get(p["id"])
                if rec is None or len(answer_positions(rec["messages"])) != turn - 1:
                    continue
                ask = next_turn(rec["messages"], p["source"])
                if ask is None:
                    continue
                ids = render_prompt(tokenizer, ask)
                if len(ids) > max_prompt_tokens:
                    later_too_long += 1
                    continue
                todo.append({"id": p["id"], "messages": ask, "prompt_ids": ids, "record": rec})
            print(f"regenerate: turn {turn}: {len(todo)} to go", flush=True)
        if not todo:
            continue
        bar = tqdm(total=len(todo), desc=f"regenerate turn {turn}", unit="prompt", dynamic_ncols=True)
        t_turn = time.perf_counter()

        def beat(n: int, bar=bar, t_turn=t_turn) -> None:  # a batch of long answers finishes no prompt for minutes
            bar.set_postfix(tokens=n, tok_s=f"{n / (time.perf_counter() - t_turn):.0f}")

        batches = iter_generate(
            target_path,
            [p["prompt_ids"] for p in todo],
            max_tokens,
            temperature,
            seed,
            backend,
            batch_size=batch_size,
            **({"on_tokens": beat} if backend == "vllm" else {}),
            **kw,
        )
        for start, token_ids, finish in batches:
            records = []
            for p, ids, why in zip(todo[start : start + len(token_ids)], token_ids, finish):
                text = tokenizer.decode(ids, skip_special_tokens=True).strip()
                messages = p["messages"] + [{"role": "assistant", "content": text}]
                if turn == 1:
                    rec = {"id": p["id"], "messages": messages, "answer_tokens": len(ids), "finish_reason": why, **mode}
                else:
                    later = p["record"].get("later_turns", []) + [{"answer_tokens": len(ids), "finish_reason": why}]
                    rec = dict(p["record"], messages=messages, later_turns=later)
                records.append(rec)
                done[p["id"]] = rec
                new_tokens += len(ids)
            _append(out_path, records)
            generated += len(records)
            bar.update(len(records))
            bar.set_postfix(tok_s=f"{new_tokens / (time.perf_counter() - t0):.0f}")
        bar.close()
    if turns > 1:  # a record has a line per turn answered; leave one (its last) per id, so that data.path reads
        load_done(out_path)  # each conversation once
    seconds = time.perf_counter() - t0
    stats = {
        "prompts": len(prompts),
        "too_long": too_long,
        "resumed_with": resumed,
        "generated": generated,
        "later_too_long": later_too_long,
        "new_tokens": new_tokens,
        "seconds": seconds,
        "tokens_per_s": new_tokens / seconds if generated else None,
        "backend": backend,
        "threads": threads if backend == "vllm" else None,
        "batch_size": batch_size,
        "out": str(out_path),
        "ids": [p["id"] for p in prompts],
    }
    print(
        f"regenerate: {generated} answers, {new_tokens} tokens in {seconds:.0f} s "
        f"({stats['tokens_per_s'] or 0:.0f} tok/s) -> {out_path}",
        flush=True,
    )
    return stats


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="draftsmith regenerate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2", help="HF dir/id, or smollm2 (the embedded default)")
    ap.add_argument(
        "--data",
        default="sharegpt",
        help="sharegpt, a JSON/JSONL file, hf:NAME[:SPLIT], pycode:stdlib|site-packages[:N] (code prompts) or "
        "doctask:summarize|qa[:N] (long-document prompts)",
    )
    ap.add_argument("--out", required=True, help="JSONL to write (resumed if it exists)")
    ap.add_argument("--num-conversations", type=int, default=None)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (what greedy serving sees)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-prompt-tokens", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=64, help="prompts per generate() call (and per saved chunk)")
    ap.add_argument("--backend", default="auto", choices=["auto", "vllm", "hf"])
    ap.add_argument("--threads", type=int, default=None, help="OMP threads of the vLLM engine (default: every core)")
    ap.add_argument(
        "--turns", type=int, default=1, help="user turns answered per conversation, each after the target's own answers"
    )
    from draftsmith.eval.args import json_object

    ap.add_argument(
        "--chat-template-kwargs",
        type=json_object,
        default=None,
        metavar="JSON",
        help="the chat template's variables, as vLLM's chat_template_kwargs, e.g. '{\"enable_thinking\": false}' "
        "(Qwen3 without reasoning); recorded on each answer",
    )
    a = ap.parse_args(argv)
    if a.turns < 1:
        ap.error(f"--turns must be >= 1, got {a.turns}")
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
        turns=a.turns,
        chat_template_kwargs=a.chat_template_kwargs,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
