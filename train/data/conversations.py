"""Read chat conversations (ShareGPT / OpenAI shapes) from JSON, JSONL or HF datasets, normalised.

Every reader yields the same thing: `Conversation(id, messages)` with messages alternating
user/assistant (an optional system message first), ending on an assistant answer. Records that
cannot be used are skipped and counted by reason in `ReadStats`; only a missing file or an unknown
format stops the read.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from tqdm.auto import tqdm

from draftsmith.errors import DataError

ROLE_MAP = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "assistant": "assistant",
    "system": "system",
    "tool": "tool",  # a tool's result, after an assistant turn that called it (messages format)
}
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"  # reasoning inline in an answer (Qwen3, DeepSeek-R1 and kin)
CHUNK_CHARS = 1 << 20  # the JSON array is decoded 1 MiB at a time
MAX_RECORD_CHARS = 256 << 20  # a "record" this large without closing is a broken file, not a long chat
MAX_EXAMPLES = 5


@dataclass
class Conversation:
    id: str
    messages: list[dict]


@dataclass
class ReadStats:
    """What a read saw: records read, kept, skipped by reason, and a few example messages."""

    read: int = 0
    kept: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    trimmed: dict[str, int] = field(default_factory=dict)  # kept records that lost turns, by reason
    examples: list[str] = field(default_factory=list)
    truncated: bool = False  # the JSON array ended mid-record

    def skip(self, reason: str, where: str, detail: str = "") -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(f"{where}: {reason}" + (f" ({detail})" if detail else ""))

    def summary(self) -> str:
        n_skip = sum(self.skipped.values())
        parts = [f"read {self.read} records, kept {self.kept}, skipped {n_skip}"]
        if self.skipped:
            parts.append("skipped: " + ", ".join(f"{k}={v}" for k, v in sorted(self.skipped.items())))
        if self.trimmed:
            parts.append("trimmed: " + ", ".join(f"{k}={v}" for k, v in sorted(self.trimmed.items())))
        if self.truncated:
            parts.append("the file ended mid-record (the incomplete last record was dropped)")
        parts += [f"  e.g. {e}" for e in self.examples]
        return "\n".join(parts)


class _Skip(Exception):
    """Internal: this record is unusable for `reason`."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(reason)
        self.reason, self.detail = reason, detail


def _is_utf8(s: str) -> bool:
    # Undecodable bytes arrive as lone surrogates (surrogateescape), as do "\ud800"-style escapes.
    try:
        s.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def split_reasoning(content: str) -> tuple[str | None, str]:
    """(reasoning, answer) of an answer that writes its reasoning inline, `<think>...</think>answer`; (None, content)
    when it has no closed think block."""
    if THINK_CLOSE not in content:
        return None, content
    head, answer = content.split(THINK_CLOSE, 1)
    return head.split(THINK_OPEN, 1)[-1].strip("\n"), answer.lstrip("\n")


def _extras(m: dict, role: str, j: int) -> dict:
    """An assistant message's reasoning (`reasoning_content` or `reasoning`, as vLLM and OpenAI-style APIs return
    it) and tool calls, checked; {} for other roles or when it has neither."""
    if role != "assistant":
        return {}
    out = {}
    reasoning = m.get("reasoning_content", m.get("reasoning"))
    if reasoning is not None:
        if not isinstance(reasoning, str):
            raise _Skip("non-string content", f"message {j} reasoning is {type(reasoning).__name__}")
        if reasoning.strip():
            out["reasoning_content"] = reasoning
    calls = m.get("tool_calls")
    if calls:
        ok = isinstance(calls, list) and all(
            isinstance(c, dict) and isinstance(c.get("function", c), dict) and c.get("function", c).get("name")
            for c in calls
        )
        if not ok:
            raise _Skip("bad tool call", f"message {j}: tool_calls must be a list of {{function: {{name, arguments}}}}")
        out["tool_calls"] = calls
    return out


def _raw_messages(rec: Any) -> list[tuple]:
    """(role, content[, extras]) of each message of one record in either shape, with roles mapped; an assistant
    message's reasoning and tool calls ride in extras; raises _Skip."""
    if not isinstance(rec, dict):
        raise _Skip("not an object", type(rec).__name__)
    if "conversations" in rec:
        turns, rkey, ckey = rec["conversations"], "from", "value"
    elif "messages" in rec:
        turns, rkey, ckey = rec["messages"], "role", "content"
    else:
        raise _Skip("no messages", "expected 'conversations' or 'messages'")
    if not isinstance(turns, list):
        raise _Skip("no messages", f"messages are {type(turns).__name__}, not a list")
    out = []
    for j, m in enumerate(turns):
        if not isinstance(m, dict):
            raise _Skip("bad message", f"message {j} is {type(m).__name__}")
        role, content = m.get(rkey), m.get(ckey)
        if not isinstance(role, str) or role not in ROLE_MAP:  # a dict or list role is not even hashable
            raise _Skip("unknown role", f"message {j} role {role!r}")
        extras = _extras(m, ROLE_MAP[role], j)
        if content is None and extras.get("tool_calls"):
            content = ""  # a turn that only calls tools
        if not isinstance(content, str):
            raise _Skip("non-string content", f"message {j} content is {type(content).__name__}")
        if content == "" and not extras.get("tool_calls"):
            raise _Skip("empty content", f"message {j}")
        if not _is_utf8(content) or not _is_utf8(extras.get("reasoning_content", "")):
            raise _Skip("non-UTF-8 text", f"message {j}")
        out.append((ROLE_MAP[role], content, extras) if extras else (ROLE_MAP[role], content))
    return out


def _message(role: str, content: str, extras: dict | None = None) -> dict:
    """A normalized message: inline reasoning (`<think>...</think>`) moved to `reasoning_content`."""
    m = {"role": role, "content": content}
    if role == "assistant":
        reasoning, answer = split_reasoning(content)
        if reasoning is not None:
            m["content"] = answer
            if reasoning.strip():
                m["reasoning_content"] = reasoning
    return {**m, **(extras or {})}


def normalize(pairs: list[tuple], stats: ReadStats | None = None, questions: bool = False) -> list[dict]:
    """Alternate user/assistant (optional leading system), ending on an answer; raises _Skip if no exchange. An
    assistant turn that calls tools is followed by one or more tool results, then by the assistant again.
    questions=True (prompts for the target to answer): a trailing user turn is kept, and a record needs a user turn,
    not an answer."""
    stats = stats if stats is not None else ReadStats()
    out: list[dict] = []
    i = 0
    if pairs and pairs[0][0] == "system":
        out.append({"role": "system", "content": pairs[0][1]})
        i = 1
    start = i
    while i < len(pairs) and pairs[i][0] in ("assistant", "tool"):
        i += 1
    if i > start:
        stats.trimmed["leading assistant"] = stats.trimmed.get("leading assistant", 0) + 1
    expect = {"user"}
    for role, content, *extras in pairs[i:]:
        if role not in expect:
            # Two user turns in a row, a mid-chat system turn, a tool result nothing called...: keep the
            # well-formed prefix.
            stats.trimmed["role order"] = stats.trimmed.get("role order", 0) + 1
            break
        out.append(_message(role, content, extras[0] if extras else None))
        if role == "user":
            expect = {"assistant"}
        elif role == "assistant":
            expect = {"tool"} if out[-1].get("tool_calls") else {"user"}
        else:  # a tool result: more results, or the assistant's next step
            expect = {"tool", "assistant"}
    while not questions and out and (out[-1]["role"] == "tool" or out[-1].get("tool_calls")):
        out.pop()  # a call whose results, or the answer after them, are missing: the well-formed prefix
        stats.trimmed["unanswered tool call"] = stats.trimmed.get("unanswered tool call", 0) + 1
    if questions:
        if not any(m["role"] == "user" for m in out):
            raise _Skip("no user turn", "no user message to answer")
        return out
    if out and out[-1]["role"] == "user":
        out.pop()  # a question with no answer supervises nothing
        stats.trimmed["trailing user"] = stats.trimmed.get("trailing user", 0) + 1
    if not any(m["role"] == "assistant" for m in out):
        raise _Skip("no exchange", "no user turn followed by an assistant answer")
    return out


def _record_id(rec: Any) -> str | None:
    if isinstance(rec, dict):
        for key in ("id", "conversation_id", "uuid"):
            if rec.get(key) is not None:
                return str(rec[key])
    return None


def _content_id(messages: list[dict]) -> str:
    # Records without an id get one from their content, so held-out splits stay order-independent.
    h = hashlib.sha1(json.dumps(messages, ensure_ascii=False).encode("utf-8")).hexdigest()
    return "sha1:" + h[:16]


def _convert(rec: Any, where: str, stats: ReadStats, questions: bool = False) -> Conversation | None:
    stats.read += 1
    rid = _record_id(rec)
    if rid is not None:
        where = f"{where} (id={rid})"
    try:
        messages = normalize(_raw_messages(rec), stats, questions)
    except _Skip as s:
        stats.skip(s.reason, where, s.detail)
        return None
    stats.kept += 1
    return Conversation(id=rid if rid is not None else _content_id(messages), messages=messages)


def resolve_path(path: str) -> Path:
    """The file behind `path` ("sharegpt" is the embedded ShareGPT_V3 file)."""
    if path == "sharegpt":
        from draftsmith.assets import sharegpt_path

        try:
            return sharegpt_path()
        except FileNotFoundError as e:
            raise DataError(f"sharegpt: {e}") from e
    return Path(path).expanduser()


def first_char(p: Path) -> str:
    """The file's first non-blank character ('[' a JSON array, '{' JSON lines; '' empty)."""
    with open(p, "rb") as f:
        head = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")  # a UTF-8 BOM or blank lines may lead
    return head[:1].decode("ascii", errors="replace")


class _ArrayText:
    """A JSON array file decoded a chunk at a time: the text buffer, a position in it, and line bookkeeping."""

    def __init__(self, f, bar):
        self.f, self.bar = f, bar
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
        self.buf, self.pos, self.eof = "", 0, False
        self.base = 0  # characters dropped from the front of buf so far (for error offsets)
        self.lines, self.col0 = 0, 0  # newlines in the dropped text, characters after its last newline

    def more(self) -> bool:
        """Append the next chunk; False at the end of the file (eof is then set and the decoder flushed)."""
        if self.eof:
            return False
        raw = self.f.read(CHUNK_CHARS)
        self.bar.update(len(raw))
        if self.pos > CHUNK_CHARS:  # drop consumed text so the buffer stays about one record long
            dropped = self.buf[: self.pos]
            nl = dropped.rfind("\n")
            self.lines += dropped.count("\n")
            self.col0 = len(dropped) - nl - 1 if nl >= 0 else self.col0 + len(dropped)
            self.base += self.pos
            self.buf, self.pos = self.buf[self.pos :], 0
        self.buf += self.utf8.decode(raw, final=not raw)
        self.eof = not raw
        return bool(raw)

    def skip_ws(self) -> bool:
        """Advance past whitespace; False at the end of the file."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in " \t\r\n\ufeff":
                self.pos += 1
            if self.pos < len(self.buf):
                return True
            if not self.more():
                return False

    def where(self, i: int) -> str:
        """'line L column C' (1-based, in characters) of buffer position i, counting the dropped text too."""
        nl = self.buf.rfind("\n", 0, i)
        line = self.lines + self.buf.count("\n", 0, i) + 1
        return f"line {line} column {i - nl if nl >= 0 else self.col0 + i + 1}"


# a string token, the group set when it closes; and the brackets and commas outside strings
_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(")?|[\[\]{},]', re.S)
# a "string" that runs to the end of the file yet ends by closing a record and the array: a stray or missing quote
_CLOSED_TAIL = re.compile(r"}\s*]\s*\Z")


def _record_closes(text: str) -> bool:
    """Whether the record that starts `text` closes before the text ends (its brackets balance outside strings).

    At the end of a file this tells a syntax error (the record closed, more text follows the error) from a file
    cut off inside its last record (the text ends before the record closes).
    """
    depth = 0
    for m in _TOKENS.finditer(text):
        tok = m.group()
        if tok[0] == '"':
            if m.group(1) is None:  # a string running to the end of the file
                return bool(_CLOSED_TAIL.search(text))
        elif tok in "[{":
            depth += 1
        elif tok in "]}":
            depth -= 1
            if depth <= 0:  # the record closed (or a scalar record met the array's end)
                return True
        elif depth == 0:  # a comma after a scalar record
            return True
    return False


def _decode_record(s: _ArrayText, decoder: json.JSONDecoder, where: str) -> tuple[bool, Any]:
    """(True, the record at s.pos), reading more text as needed; (False, None) if the file ends inside it."""
    while True:
        try:
            obj, s.pos = decoder.raw_decode(s.buf, s.pos)
            return True, obj
        except RecursionError:
            raise DataError(f"{where}: malformed JSON at {s.where(s.pos)}: nested too deeply") from None
        except json.JSONDecodeError as e:
            # an incomplete record fails at (or just before) the buffer's end, or inside a long string: read on
            incomplete = e.msg.startswith("Unterminated string") or e.pos >= len(s.buf) - 16
            if incomplete and not s.eof:
                if len(s.buf) - s.pos > MAX_RECORD_CHARS:
                    raise DataError(
                        f"{where}: record longer than {MAX_RECORD_CHARS} characters without closing "
                        f"(it starts at {s.where(s.pos)})"
                    ) from None
                s.more()
                continue  # retried with the whole file once at its end
            if s.eof and not _record_closes(s.buf[s.pos :]):
                return False, None  # cut off: the file ends before the record closes
            raise DataError(
                f"{where}: malformed JSON at {s.where(e.pos)} (character {s.base + e.pos}): {e.msg}. "
                "The text goes on after it, so this is a syntax error, not a cut-off file: fix or "
                "delete that record and run again"
            ) from None


def _iter_json_array(p: Path, stats: ReadStats) -> Iterator[tuple[Any, str]]:
    """Stream the elements of a top-level JSON array with raw_decode; a truncated tail is dropped with a warning.

    Truncated means the file ends inside its last record or between records (no closing ']'); a syntax error
    with more text after it is fatal, naming the record, line and column.
    """
    decoder = json.JSONDecoder()
    with (
        open(p, "rb") as f,
        tqdm(total=p.stat().st_size, unit="B", unit_scale=True, desc=f"read {p.name}", leave=False) as bar,
    ):
        s = _ArrayText(f, bar)
        if not s.skip_ws() or s.buf[s.pos] != "[":
            raise DataError(f"{p}: expected a JSON array ('[') at the start of the file")
        s.pos += 1
        index = 0
        while True:
            if not s.skip_ws():
                break  # ended between records: the closing ']' is missing
            if s.buf[s.pos] == "]":
                return
            if index:
                if s.buf[s.pos] != ",":
                    raise DataError(
                        f"{p}:record {index}: malformed JSON at {s.where(s.pos)} (character "
                        f"{s.base + s.pos}): expected ',' or ']' after record {index - 1}, found "
                        f"{s.buf[s.pos]!r}; fix the file there and run again"
                    )
                s.pos += 1
                if not s.skip_ws():
                    break
            complete, obj = _decode_record(s, decoder, f"{p}:record {index}")
            if not complete:
                stats.truncated = True
                warnings.warn(
                    f"{p}: the file ended mid-record (record {index}); kept the {index} complete records before it",
                    stacklevel=3,
                )
                return
            yield obj, f"{p}:record {index}"
            index += 1
    stats.truncated = True
    warnings.warn(f"{p}: the JSON array is not closed (no ']'); kept the {index} complete records", stacklevel=3)


def _iter_jsonl(p: Path, stats: ReadStats) -> Iterator[tuple[Any, str]]:
    """Records of a JSON-lines file; undecodable or malformed lines are counted and skipped."""
    with (
        open(p, "rb") as f,
        tqdm(total=p.stat().st_size, unit="B", unit_scale=True, desc=f"read {p.name}", leave=False) as bar,
    ):
        for lineno, raw in enumerate(f, start=1):
            bar.update(len(raw))
            where = f"{p}:line {lineno}"
            if not raw.strip():
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                stats.read += 1
                stats.skip("non-UTF-8 bytes", where, f"byte {e.start}")
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                stats.read += 1
                stats.skip("malformed JSON", where, f"column {e.colno}: {e.msg}")
                continue
            except RecursionError:  # nesting deeper than Python's stack
                stats.read += 1
                stats.skip("malformed JSON", where, "nested too deeply")
                continue
            yield rec, where


def _iter_hf(ds: Any, name: str) -> Iterator[tuple[Any, str]]:
    for i, rec in enumerate(tqdm(ds, desc=f"read {name}", unit="rec", leave=False)):
        yield rec, f"{name}:record {i}"


def _open_hf(path: str) -> tuple[Any, str]:
    """A datasets.Dataset from `hf:NAME[:SPLIT]` or a save_to_disk directory."""
    import datasets

    try:
        if path.startswith("hf:"):
            name, _, split = path[3:].partition(":")
            return datasets.load_dataset(name, split=split or "train"), path
        ds = datasets.load_from_disk(path)
    except Exception as e:  # hub, network and format errors all mean: cannot read this source
        raise DataError(f"{path}: cannot load as a HF dataset: {type(e).__name__}: {e}") from e
    if isinstance(ds, datasets.DatasetDict):
        split = "train" if "train" in ds else next(iter(ds))
        return ds[split], f"{path}[{split}]"
    return ds, path


def _records(path: str, stats: ReadStats) -> Iterator[tuple[Any, str]]:
    if path.startswith("pycode:"):
        from draftsmith.train.data.code_prompts import pycode_records

        return pycode_records(path)
    if path.startswith("doctask:"):
        from draftsmith.train.data.doc_tasks import doctask_records, parse_source

        parse_source(path)  # a bad source fails before ShareGPT is read
        return doctask_records(path, read_conversations("sharegpt", questions=True))
    if path.startswith("hf:"):
        ds, name = _open_hf(path)
        return _iter_hf(ds, name)
    p = resolve_path(path)
    if not p.exists():
        raise DataError(f"{p}: no such file or directory")
    if p.is_dir():
        ds, name = _open_hf(str(p))
        return _iter_hf(ds, name)
    if p.suffix not in (".json", ".jsonl"):
        raise DataError(f"{p}: unknown data format (expected .json, .jsonl, a saved HF dataset dir or hf:NAME)")
    first = first_char(p)
    if p.suffix == ".jsonl" and first != "":  # trust the extension: a junk first line must not turn it into an array
        return _iter_jsonl(p, stats)
    if first == "[":
        return _iter_json_array(p, stats)
    if first == "{":  # JSON lines, whatever the extension says (HF's to_json writes these as .json)
        return _iter_jsonl(p, stats)
    if first == "":
        raise DataError(f"{p}: the file is empty")
    raise DataError(f"{p}: unknown data format: starts with {first!r}, expected '[' or '{{'")


def read_conversations(
    path: str, limit: int | None = None, stats: ReadStats | None = None, questions: bool = False
) -> Iterator[Conversation]:
    """Yield normalised conversations from `path` ("sharegpt", .json, .jsonl, hf:NAME[:SPLIT], a dataset dir, or
    pycode:ROOT[:N], code-completion prompts from the installed Python, or doctask:KIND[:N], long-document prompts built
    from the embedded ShareGPT file).
    questions=True also yields records that end on a user turn or hold no answer at all (prompts to regenerate)."""
    stats = stats if stats is not None else ReadStats()
    records = _records(str(path), stats)  # eager: a missing file or unknown format fails at the call
    return _kept(records, limit, stats, questions)


def _kept(
    records: Iterator[tuple[Any, str]], limit: int | None, stats: ReadStats, questions: bool = False
) -> Iterator[Conversation]:
    if limit is not None and limit <= 0:
        return
    n = 0
    for rec, where in records:
        conv = _convert(rec, where, stats, questions)
        if conv is None:
            continue
        yield conv
        n += 1
        if limit is not None and n >= limit:
            return


def rank_key(seed: int | str, conv_id: str) -> str:
    """The sha1 held-out splits rank ids by (the smallest are held out): independent of the data's order."""
    return hashlib.sha1(f"{seed}:{conv_id}".encode("utf-8")).hexdigest()


def split_heldout(convs: Iterable[Conversation], n_heldout: int, seed: int) -> tuple[list, list]:
    """(train, heldout): held-out = the ids with the smallest sha1(seed, id); every copy of an id stays on one side."""
    convs = list(convs)
    if n_heldout < 0:
        raise ValueError(f"n_heldout must be >= 0, got {n_heldout}")
    ids = sorted({c.id for c in convs}, key=lambda i: (rank_key(seed, i), i))
    per_id: dict[str, int] = {}
    for c in convs:
        per_id[c.id] = per_id.get(c.id, 0) + 1
    held: set[str] = set()
    n = 0
    for i in ids:
        if n >= n_heldout:
            break
        held.add(i)
        n += per_id[i]  # a duplicated id brings all its copies, so train never sees a held-out id
    train = [c for c in convs if c.id not in held]
    heldout = [c for c in convs if c.id in held]
    return train, heldout
