"""Render a conversation with the target's own chat template and mask everything but the assistant's words.

The mask is found from text, not from template internals: for each assistant turn we render the
prefix with the generation prompt (which tells us where the turn's text begins), locate the message
content after it, and map character spans to tokens through the tokenizer's offsets. Text the
template inserts inside the turn (role headers, empty think blocks) is therefore never supervised;
the end-of-turn special token(s) right after the content are, because the head must learn to stop.
"""

from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass
from typing import Iterable, Iterator

from draftsmith.train.data.conversations import DataError


@dataclass
class Sample:
    """One rendered conversation; loss_mask[t] = 1 where token t is a supervised prediction target."""

    input_ids: list[int]
    loss_mask: list[int]
    conv_id: str = ""


_SPECIAL_IDS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def special_ids(tokenizer) -> frozenset[int]:
    """Ids of the tokenizer's special tokens (eos, <|im_end|>, ...), cached per tokenizer."""
    try:
        return _SPECIAL_IDS[tokenizer]
    except (KeyError, TypeError):
        pass
    ids = set(tokenizer.all_special_ids)
    for i, tok in getattr(tokenizer, "added_tokens_decoder", {}).items():
        if getattr(tok, "special", False):
            ids.add(int(i))
    out = frozenset(ids)
    try:
        _SPECIAL_IDS[tokenizer] = out
    except TypeError:
        pass
    return out


@dataclass(frozen=True)
class TemplateOptions:
    """How a run renders its conversations, kept with its tokenizer (`set_template_options`) so that training
    samples, regeneration prompts and served prompts all render alike.

    kwargs: the chat template's extra variables, as vLLM's `chat_template_kwargs` passes them at serving time
        (e.g. {"enable_thinking": false} for Qwen3's non-thinking mode).
    reasoning: "keep" renders an answer's reasoning (`reasoning_content`, or `<think>...</think>` in the answer) the
        way the template does and supervises it: a reasoning model generates it, so a draft head must predict it;
        "drop" removes it before rendering (a head for a deployment that serves non-thinking mode).
    """

    kwargs: tuple = ()  # sorted (name, value) pairs: hashable
    reasoning: str = "keep"

    @classmethod
    def of(cls, kwargs: dict | None = None, reasoning: str = "keep") -> "TemplateOptions":
        if reasoning not in ("keep", "drop"):
            raise DataError(f"data.reasoning={reasoning!r}: keep | drop")
        return cls(tuple(sorted((kwargs or {}).items())), reasoning)

    def describe(self) -> dict:
        return {"chat_template_kwargs": dict(self.kwargs), "reasoning": self.reasoning}


_OPTIONS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def set_template_options(tokenizer, options: TemplateOptions) -> None:
    """Every later render with `tokenizer` uses `options`."""
    _OPTIONS[tokenizer] = options


def template_options(tokenizer) -> TemplateOptions:
    try:
        return _OPTIONS.get(tokenizer, TemplateOptions())
    except TypeError:
        return TemplateOptions()


def chat_text(tokenizer, messages: list[dict], add_generation_prompt: bool = False) -> str:
    """The chat template's text for `messages` (the exact string the serving engine renders, with the run's
    chat_template_kwargs)."""
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(f"tokenizer {type(tokenizer).__name__} has no chat template")
    options = template_options(tokenizer)
    if options.reasoning == "drop":
        messages = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in messages]
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, **dict(options.kwargs)
    )


def _encode(tokenizer, text: str | list[str]):
    try:
        return tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    except NotImplementedError as e:  # slow (python) tokenizers have no offsets
        raise DataError(f"tokenizer {type(tokenizer).__name__} gives no offsets; load the fast tokenizer") from e


def _turn_start(tokenizer, messages: list[dict], i: int, full: str, cursor: int) -> int:
    """Character index in `full` where assistant turn i's text (after its header) begins."""
    if i == 0:
        return cursor
    gen = chat_text(tokenizer, messages[:i], add_generation_prompt=True)
    if full.startswith(gen):
        return len(gen)
    # The template renders history differently from a prompt (e.g. it strips old reasoning):
    # find the generation header itself after the previous turn instead.
    plain = chat_text(tokenizer, messages[:i])
    header = gen[len(plain) :] if gen.startswith(plain) else ""
    j = full.find(header, cursor) if header else -1
    return j + len(header) if j >= 0 else cursor


def _turn_end(tokenizer, messages: list[dict], i: int, full: str) -> int:
    """Character index in `full` where the text rendered for messages[:i+1] ends (len(full) if unknown)."""
    upto = chat_text(tokenizer, messages[: i + 1])
    return len(upto) if full.startswith(upto) else len(full)


def assistant_spans(tokenizer, messages: list[dict], full: str) -> list[tuple[int, int, int, bool]]:
    """(start, content_end, turn_end, through) character spans of each assistant message inside `full`.

    start is where the content begins, or, when the template rendered the turn's reasoning, where the turn itself
    begins (the reasoning block, `<think>` included, is generated text). through: the turn calls tools, and the
    calls the template writes after the content are generated text too, up to the end-of-turn token."""
    spans = []
    cursor = 0
    keep = template_options(tokenizer).reasoning == "keep"
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start = _turn_start(tokenizer, messages, i, full, cursor)
        content = m["content"]
        a = full.find(content, start)
        if a < 0 and content.strip():  # some templates trim message content
            content = content.strip()
            a = full.find(content, start)
        if a < 0:
            raise DataError(f"assistant message {i} does not appear verbatim in the rendered chat template")
        b = a + len(content)
        reasoning = (m.get("reasoning_content") or "").strip() if keep else ""
        if reasoning and start <= full.find(reasoning, start) < a:  # rendered (templates drop it from old turns)
            a = start
        end = max(_turn_end(tokenizer, messages, i, full), b)
        spans.append((a, b, end, bool(m.get("tool_calls"))))
        cursor = b
    return spans


def _mask(tokenizer, full: str, spans, ids: list[int], offsets) -> list[int]:
    """loss mask over `ids`: tokens overlapping assistant content, plus the end-of-turn special token(s)."""
    special = special_ids(tokenizer)
    mask = [0] * len(ids)
    t = 0
    for a, b, end, through in spans:
        # Content: every token overlapping [a, b). A token straddling the header/content border is
        # kept: the head has to produce it either way.
        while t < len(ids) and offsets[t][1] <= a:
            t += 1
        while t < len(ids) and offsets[t][0] < b:
            if offsets[t][1] > a:
                mask[t] = 1
            t += 1
        while through and t < len(ids) and offsets[t][0] < end and ids[t] not in special:
            mask[t] = 1  # the tool calls the template writes after the content: the model generates them
            t += 1
        # End of turn: the first run of special tokens in the turn's tail ([b, end)), e.g. <|im_end|>;
        # whitespace before it and text after it (the "\n" ChatML puts after <|im_end|>) stay unsupervised.
        k = t
        while (
            k < len(ids)
            and offsets[k][0] < end
            and ids[k] not in special
            and not full[offsets[k][0] : offsets[k][1]].strip()
        ):
            k += 1
        while k < len(ids) and offsets[k][0] < end and ids[k] in special:
            mask[k] = 1
            k += 1
        t = k
    return mask


def render(tokenizer, messages: list[dict], max_length: int, conv_id: str = "") -> Sample | None:
    """Tokenize `messages` with the chat template; supervise assistant content + end-of-turn token(s) only."""
    if max_length <= 0:
        raise ValueError(f"max_length must be > 0, got {max_length}")
    full = chat_text(tokenizer, messages)
    spans = assistant_spans(tokenizer, messages, full)
    enc = _encode(tokenizer, full)
    ids = list(enc["input_ids"])
    mask = _mask(tokenizer, full, spans, ids, enc["offset_mapping"])
    return truncate(Sample(input_ids=ids, loss_mask=mask, conv_id=conv_id), max_length)


def render_many(
    tokenizer, convs: Iterable[tuple[str, list[dict]]], max_length: int, batch_size: int = 64
) -> Iterator[Sample | DataError | None]:
    """`render` over (conv_id, messages) pairs in batches (one tokenizer call per batch uses every core); yields
    Sample, None or DataError."""
    if max_length <= 0:
        raise ValueError(f"max_length must be > 0, got {max_length}")
    it = iter(convs)
    while True:
        batch = list(itertools.islice(it, batch_size))
        if not batch:
            return
        texts, results = [], []
        for conv_id, messages in batch:
            try:
                full = chat_text(tokenizer, messages)
                results.append((conv_id, full, assistant_spans(tokenizer, messages, full)))
                texts.append(full)
            except DataError as e:
                results.append(DataError(f"id={conv_id}: {e}"))
        enc = _encode(tokenizer, texts) if texts else {"input_ids": [], "offset_mapping": []}
        j = 0
        for r in results:
            if isinstance(r, DataError):
                yield r
                continue
            conv_id, full, spans = r
            ids = list(enc["input_ids"][j])
            mask = _mask(tokenizer, full, spans, ids, enc["offset_mapping"][j])
            j += 1
            yield truncate(Sample(input_ids=ids, loss_mask=mask, conv_id=conv_id), max_length)


def truncate(sample: Sample, max_length: int) -> Sample | None:
    """Keep the first `max_length` tokens (the first turns are the context); None if nothing supervised is left."""
    if len(sample.input_ids) > max_length:
        sample = Sample(sample.input_ids[:max_length], sample.loss_mask[:max_length], sample.conv_id)
    return sample if any(sample.loss_mask) else None


def split_windows(sample: Sample, max_length: int) -> list[Sample]:
    """`sample` cut into consecutive windows of `max_length` tokens (the last one shorter), dropping windows with no
    supervised token or fewer than 2 tokens; window w > 0 is named `<conv_id>#w`. Each window is a sample of its
    own: the target sees only that window's tokens as context when its features are computed."""
    out = []
    for w, start in enumerate(range(0, len(sample.input_ids), max_length)):
        ids, mask = sample.input_ids[start : start + max_length], sample.loss_mask[start : start + max_length]
        if len(ids) >= 2 and any(mask):
            out.append(Sample(ids, mask, sample.conv_id if w == 0 else f"{sample.conv_id}#{w}"))
    return out


def render_prompt(tokenizer, messages: list[dict]) -> list[int]:
    """Prompt token ids with the generation prompt appended (what the serving engine sees before answering)."""
    text = chat_text(tokenizer, messages, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
