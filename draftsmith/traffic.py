"""The requests a deployment saw, read as prompts for `draftsmith adapt`.

One file, any of the shapes users have:

* OpenAI chat-completions requests, one JSON object per line (`{"model", "messages": [...], ...}`), or the OpenAI
  batch-file lines that wrap them (`{"custom_id", "method", "url", "body": {...}}`);
* completions requests (`{"prompt": "..."}`, or a list of strings: one prompt each), read as one user turn;
* a `messages` JSONL (`{"messages": [...]}`, or ShareGPT's `{"conversations": [...]}`), answers and all;
* a JSON array of any of these;
* a vLLM server log started with `--enable-log-requests --log-level DEBUG`: its `Request ... JSON body: {...}`
  lines (vLLM writes request bodies only at DEBUG; other lines carry no prompt and are passed over).

A prompt is the request's messages up to its last user turn (a logged answer after it is dropped: the target answers
again). Identical prompts count once. Bad records (not JSON, no user text, content that is not text, a prompt over
the token limit) are each named by file and line; by default any of them stops the read before anything is made,
`skip_invalid=True` reads past them and reports each.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from draftsmith.errors import DataError

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant"}
LOG_BODY = re.compile(r"Request (\S+) JSON body: (.*)$")
# a line of a vLLM (or any Python logging) server log: "INFO 12-06 07:49:18 [file.py:12] ...", "(APIServer pid=7) INFO
# ...", "2026-12-06 07:49:18,123 - INFO - ...", "INFO:     127.0.0.1:5000 - "POST ..." (uvicorn)
LOG_LINE = re.compile(r"^(\(\w+ pid=\d+\) )?((DEBUG|INFO|WARNING|ERROR|CRITICAL)\b|\d{4}-\d\d-\d\d[ T]\d\d:\d\d)")
SHOWN_PROBLEMS = 20  # problem lines printed in full; the rest are counted


class BadRecord(Exception):
    """One record that cannot be a prompt, and why."""


@dataclass
class Traffic:
    """Unique prompts (first occurrence order) and what was passed over."""

    path: Path
    prompts: list[dict] = field(default_factory=list)  # {"id", "messages", "where", "tokens"}
    records: int = 0  # requests read (each prompt of a completions list counts)
    duplicates: int = 0
    problems: list[str] = field(default_factory=list)  # "FILE:LINE: why"
    log_lines_without_body: int = 0

    def summary(self, with_path: bool = True) -> str:
        parts = [plural(self.records, "request"), f"{plural(len(self.prompts), 'unique prompt')}"]
        if self.duplicates:
            parts.append(f"{plural(self.duplicates, 'repeat')} counted once")
        if self.problems:
            parts.append(f"{len(self.problems)} skipped")
        return (f"{self.path}: " if with_path else "") + ", ".join(parts)


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def prompt_id(messages: list[dict]) -> str:
    """A prompt's id: the hash of its messages (the same prompt has the same id in every file and run)."""
    return "traffic:" + hashlib.sha1(json.dumps(messages, ensure_ascii=False).encode("utf-8")).hexdigest()[:16]


def _text(content, j: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        kinds = {p.get("type") if isinstance(p, dict) else type(p).__name__ for p in content}
        if kinds - {"text"}:
            raise BadRecord(f"message {j} holds content that is not text ({', '.join(sorted(map(str, kinds)))})")
        return "".join(p.get("text") or "" for p in content)
    if content is None:
        return ""
    raise BadRecord(f"message {j} content is {type(content).__name__}, not text")


def _messages(turns, roles: dict[str, str], rkey: str, ckey: str) -> list[dict]:
    if not isinstance(turns, list):
        raise BadRecord(f"messages are {type(turns).__name__}, not a list")
    out = []
    for j, m in enumerate(turns):
        if not isinstance(m, dict):
            raise BadRecord(f"message {j} is {type(m).__name__}, not an object")
        role = m.get(rkey)
        if role not in roles:
            raise BadRecord(f"message {j} has role {role!r} (read: {', '.join(sorted(roles))})")
        text = _text(m.get(ckey), j)
        if roles[role] == "assistant" and not text.strip():
            raise BadRecord(f"message {j} is an assistant turn without text (a tool call?)")
        out.append({"role": roles[role], "content": text})
    return out


def request_prompts(rec) -> list[list[dict]]:
    """The prompt(s) of one request record (see the module doc); BadRecord says why there is none."""
    if not isinstance(rec, dict):
        raise BadRecord(f"a JSON {type(rec).__name__}, not a request object")
    if isinstance(rec.get("body"), dict):  # an OpenAI batch-file line
        rec = rec["body"]
    if "messages" in rec:
        convs = [_messages(rec["messages"], ROLES, "role", "content")]
    elif "conversations" in rec:
        convs = [_messages(rec["conversations"], SHAREGPT_ROLES, "from", "value")]
    elif "prompt" in rec:
        prompts = rec["prompt"] if isinstance(rec["prompt"], list) else [rec["prompt"]]
        if not prompts or not all(isinstance(p, str) for p in prompts):
            raise BadRecord("a completions prompt that is not text (token ids?)")
        convs = [[{"role": "user", "content": p}] for p in prompts]
    else:
        raise BadRecord("no messages, conversations or prompt")
    out = []
    for messages in convs:
        last_user = max(
            (i for i, m in enumerate(messages) if m["role"] == "user" and m["content"].strip()), default=None
        )
        if last_user is None:
            raise BadRecord("no user message with text")
        out.append(messages[: last_user + 1])
    return out


def _records(path: Path):
    """(record or BadRecord, "FILE:LINE") for every request in the file; log lines without a body are counted."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text ({e}); expected JSONL requests or a vLLM log") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read it ({e.strerror or e})") from None
    first = text.lstrip()[:1]
    if not first:
        raise DataError(f"{path}: empty: no requests to adapt to")
    if first == "[":
        try:
            records = json.loads(text)
        except ValueError as e:
            yield BadRecord(f"not JSON ({e.msg}, line {e.lineno} column {e.colno})"), f"{path}:{e.lineno}"
            return
        for i, rec in enumerate(records):
            yield rec, f"{path}[{i}]"
        return
    lines = text.splitlines()
    # a server log, with request bodies or without (then every line is passed over and read_traffic says how to log
    # them), never read line by line as JSON
    log = first != "{" and any(LOG_BODY.search(line) or LOG_LINE.match(line) for line in lines)
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        if log:
            m = LOG_BODY.search(line)
            if not m:
                yield None, where  # a log line without a request body
                continue
            line = m.group(2)
        try:
            yield json.loads(line), where
        except ValueError as e:
            why = "a request body cut short (vLLM's --max-log-len?)" if log else "not JSON"
            yield BadRecord(f"{why} ({e.msg} at column {e.colno})"), where


def read_traffic(
    path: str | Path, count_tokens=None, max_prompt_tokens: int | None = None, skip_invalid: bool = False
) -> Traffic:
    """The unique prompts of a traffic file. `count_tokens(messages) -> int` (the target's chat template) measures
    each against `max_prompt_tokens`. Raises DataError naming every bad record (up to SHOWN_PROBLEMS, then a count)
    unless `skip_invalid`, and when no prompt is left."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file (the traffic: JSONL requests or a vLLM log)")
    traffic, seen = Traffic(path=path), set()
    for rec, where in _records(path):
        if rec is None:
            traffic.log_lines_without_body += 1
            continue
        try:
            if isinstance(rec, BadRecord):
                raise rec
            found = request_prompts(rec)
        except BadRecord as e:
            traffic.records += 1
            traffic.problems.append(f"{where}: {e}")
            continue
        for messages in found:
            traffic.records += 1
            pid = prompt_id(messages)
            if pid in seen:
                traffic.duplicates += 1
                continue
            tokens = count_tokens(messages) if count_tokens else None
            if max_prompt_tokens is not None and tokens is not None and tokens > max_prompt_tokens:
                traffic.problems.append(
                    f"{where}: the prompt is {tokens} tokens, over the limit of {max_prompt_tokens} "
                    "(--max-prompt-tokens)"
                )
                continue
            seen.add(pid)
            traffic.prompts.append({"id": pid, "messages": messages, "where": where, "tokens": tokens})
    if traffic.records == 0:
        hint = (
            f" ({plural(traffic.log_lines_without_body, 'log line')}, none with a request body: a vLLM server logs "
            "request bodies only when started with --enable-log-requests --log-level DEBUG; restart it so, collect "
            "the traffic again and pass that log; --skip-invalid cannot recover what was never logged)"
            if traffic.log_lines_without_body
            else ""
        )
        raise DataError(f"{path}: no requests in it{hint}")
    if traffic.problems and not skip_invalid:
        raise DataError(problem_lines(traffic, "fix them, or pass --skip-invalid to adapt on the rest"))
    if not traffic.prompts:
        raise DataError(problem_lines(traffic, "no usable prompt is left"))
    return traffic


def problem_lines(traffic: Traffic, verdict: str) -> str:
    """`PATH: N verdict:` and one line per problem (the first SHOWN_PROBLEMS), then how many more."""
    n = len(traffic.problems)
    lines = [f"{traffic.path}: {plural(n, 'bad record')}; {verdict}:"] if n else [f"{traffic.path}: {verdict}"]
    lines += [f"  {p}" for p in traffic.problems[:SHOWN_PROBLEMS]]
    if len(traffic.problems) > SHOWN_PROBLEMS:
        lines.append(f"  ... and {len(traffic.problems) - SHOWN_PROBLEMS} more")
    return "\n".join(lines)


def split_heldout(prompts: list[dict], n: int, salt: str = "adapt") -> tuple[list[dict], list[dict]]:
    """(train, held-out): the n prompts with the smallest sha1(salt, id) are held out, whatever the file's order."""
    from draftsmith.train.data.conversations import rank_key

    rank = sorted(prompts, key=lambda p: rank_key(salt, p["id"]))
    held = {p["id"] for p in rank[:n]}
    return [p for p in prompts if p["id"] not in held], [p for p in prompts if p["id"] in held]
