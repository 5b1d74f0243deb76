"""The doctask: data source: long-document prompts built from ShareGPT's own answers."""

from __future__ import annotations

import pytest

from draftsmith.train.data import doc_tasks as dt
from draftsmith.train.data.conversations import Conversation, DataError, read_conversations

PROSE = "The committee met on Tuesday and agreed on three points. " * 20  # 1,140 characters of English prose


def conv(i: int, question: str = "What did the committee decide?", answer: str = PROSE) -> Conversation:
    return Conversation(
        id=f"c{i}", messages=[{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    )


@pytest.fixture
def convs(monkeypatch):
    """Ten records past a SKIP_RECORDS of 4: two skipped documents, then eight, of which 3 are not documents."""
    monkeypatch.setattr(dt, "SKIP_RECORDS", 4)
    out = [conv(i) for i in range(4)]  # inside SKIP_RECORDS: never asked
    out += [conv(4), conv(5, answer="Too short."), conv(6), conv(7, answer=PROSE + "```python\nx = 1\n```")]
    out += [conv(8, question="q" * 401), conv(9), conv(10, answer="Ü" * 1000), conv(11)]
    return out


def test_documents_skip_the_chat_pools_records_and_what_is_not_prose(convs):
    assert [cid for cid, _, _ in dt.documents(convs)] == ["c4", "c6", "c9", "c11"]


def test_the_two_kinds_take_alternate_documents_and_ask_them_their_own_way(convs):
    summarize = [r for r, _ in dt.doctask_records("doctask:summarize", convs)]
    qa = [r for r, _ in dt.doctask_records("doctask:qa", convs)]
    assert [r["id"] for r in summarize] == ["doctask:summarize:c4", "doctask:summarize:c9"]
    assert [r["id"] for r in qa] == ["doctask:qa:c6", "doctask:qa:c11"]
    doc = PROSE.strip()
    # each prompt in the next of its kind's phrasings
    assert [r["messages"] for r in summarize] == [
        [{"role": "user", "content": "Summarize: " + doc}],
        [{"role": "user", "content": "Summarize the following text.\n\n" + doc}],
    ]
    first, second = (r["messages"][0]["content"] for r in qa)
    assert first == doc + "\n\nUsing the text above, answer this question: What did the committee decide?"
    assert second.endswith(f"Passage: {doc}\n\nQuestion: What did the committee decide?")
    # N keeps the first N, in the source's order
    assert [r["id"] for r, _ in dt.doctask_records("doctask:qa:1", convs)] == ["doctask:qa:c6"]


@pytest.mark.parametrize("path", ["doctask:translate", "doctask:qa:0", "doctask:qa:x", "doctask", "doctask:qa:1:2"])
def test_a_bad_source_names_what_it_expects(path):
    with pytest.raises(DataError, match="doctask"):
        read_conversations(path)


def test_a_source_with_no_document_says_so(monkeypatch):
    monkeypatch.setattr(dt, "SKIP_RECORDS", 0)
    with pytest.raises(DataError, match="no document found"):
        dt.doctask_records("doctask:summarize", [conv(0, answer="short")])


def test_the_embedded_file_gives_each_kind_its_documents():
    """On the embedded ShareGPT file: each kind has its share of documents, past the shipped chat pool's records."""
    for kind in dt.KINDS:
        records = list(read_conversations(f"doctask:{kind}:50", questions=True))
        assert len(records) == 50 and len({r.id for r in records}) == 50
        assert all(r.messages[0]["role"] == "user" and len(r.messages) == 1 for r in records)
