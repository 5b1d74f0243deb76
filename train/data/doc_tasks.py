"""Long-document prompts built from the embedded ShareGPT file: the `doctask:` data source.

A head trained on chat first turns and code drafts prose it composes itself; on prompts whose answer quotes a
document (summarise this, answer from this passage: Spec-Bench's summarization and RAG) it loses to suffix and ngram,
which read the prompt (the 2026-12-07 quickstart record: 0.80x and 0.95x the best training-free method). These
prompts teach it the target's way with a document in front of it. Their documents are ShareGPT's own assistant
answers, English prose of MIN_CHARS-MAX_CHARS characters without code, taken from the records past SKIP_RECORDS (no
chat pool's first turns reach them, so a held-out chat prompt's topic is not in a document); the target answers the
prompts through `regen:doctask:...`:

    data.also=[{path: regen:doctask:summarize, num_conversations: 200}]   # "Summarize: DOCUMENT", 4 phrasings
    data.also=[regen:doctask:qa]      # DOCUMENT and the question that produced it, answered from it, 3 phrasings

`doctask:KIND[:N]`: KIND is `summarize` or `qa`; N keeps the first N prompts. The two kinds take alternate documents
(summarize the 1st, 3rd, ..., qa the 2nd, 4th, ...), so both can train together without repeating a document. The
order is the file's, so a source names the same prompts on every machine. Records are
`{"id": "doctask:KIND:CONVERSATION_ID", "messages": [user]}`.

Translation is not here: the embedded file holds a handful of non-English first turns (11 German, French or Spanish
of 17,327), too few to build a translation set from.
"""

from __future__ import annotations

from typing import Iterable, Iterator

from draftsmith.errors import DataError
from draftsmith.train.data.code_prompts import parse_counted

KINDS = ("summarize", "qa")
# each kind's phrasings, taken in turn (a head should not learn one wording of the instruction)
ASK = {
    "summarize": (
        "Summarize: {doc}",
        "Summarize the following text.\n\n{doc}",
        "{doc}\n\nWrite a short summary of the text above.",
        "Give the main points of this text in a few sentences:\n\n{doc}",
    ),
    "qa": (
        "{doc}\n\nUsing the text above, answer this question: {question}",
        "Read the passage and answer the question.\n\nPassage: {doc}\n\nQuestion: {question}",
        "Answer the question from the document below.\n\nQuestion: {question}\n\nDocument:\n{doc}",
    ),
}
SKIP_RECORDS = 8000  # the shipped chat pool answers the first 8,000 first turns (a budgeted plan asks <= 4,000)
MIN_CHARS, MAX_CHARS = 800, 2400  # ~200-600 tokens: prompt and a 256-token answer fit data.max_length=1024
MAX_QUESTION_CHARS = 400
MIN_ASCII = 0.97  # English prose: the share of ASCII characters a document holds at least


def parse_source(path: str) -> tuple[str, int | None]:
    """(KIND, N) of `doctask:KIND[:N]`, with a clear error for anything else."""
    return parse_counted(path, "doctask", KINDS, "KIND")


def is_document(text: str) -> bool:
    """English prose of the right length: no code block, almost all ASCII."""
    if not MIN_CHARS <= len(text) <= MAX_CHARS or "```" in text:
        return False
    return sum(c.isascii() for c in text) >= MIN_ASCII * len(text)


def documents(convs) -> Iterator[tuple[str, str, str]]:
    """(conversation id, question, document) of each conversation past SKIP_RECORDS whose first answer is a document
    and whose first turn is a question short enough to ask again."""
    for i, conv in enumerate(convs):
        if i < SKIP_RECORDS:
            continue
        m = conv.messages
        if len(m) < 2 or m[0]["role"] != "user" or m[1]["role"] != "assistant":
            continue
        question, doc = m[0]["content"].strip(), m[1]["content"].strip()
        if question and len(question) <= MAX_QUESTION_CHARS and is_document(doc):
            yield conv.id, question, doc


def doctask_records(path: str, convs: Iterable) -> Iterator[tuple[dict, str]]:
    """(record, where) of `doctask:KIND[:N]`, as the data readers take them; a bad source fails at the call.
    `convs`: the conversations to read documents from, in order (the data readers pass the embedded ShareGPT file's,
    counted as the regen pools count first turns)."""
    kind, n = parse_source(path)
    parity = KINDS.index(kind)
    picked = (d for j, d in enumerate(documents(convs)) if j % 2 == parity)
    prompts = []
    for conv_id, question, doc in picked:
        ask = ASK[kind][len(prompts) % len(ASK[kind])]
        prompts.append((conv_id, ask.format(doc=doc, question=question)))
        if n is not None and len(prompts) >= n:
            break
    if not prompts:
        raise DataError(f"{path}: no document found past the first {SKIP_RECORDS} ShareGPT records")
    return (
        ({"id": f"doctask:{kind}:{cid}", "messages": [{"role": "user", "content": text}]}, f"{path}:prompt {i + 1}")
        for i, (cid, text) in enumerate(prompts)
    )
