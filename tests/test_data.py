"""Data pipeline: reading and normalising conversations, chat rendering + loss mask, draft vocab, batching, cache."""

from __future__ import annotations

import copy
import json
import random
import warnings
from types import SimpleNamespace

import pytest
import torch

from draftsmith.train.data import (
    DataError,
    ReadStats,
    Sample,
    build_draft_vocab,
    collate,
    count_supervised,
    coverage_report,
    make_batches,
    prepare_data,
    read_conversations,
    render,
    render_prompt,
    split_heldout,
)
from draftsmith.train.data import conversations as conv_mod
from draftsmith.train.data.conversations import Conversation
from draftsmith.train.data.render import render_many, split_windows

IM_END = "<|im_end|>"


def sharegpt(i, *turns):
    return {"id": f"c{i}", "conversations": [{"from": f, "value": v} for f, v in turns]}


def openai(*turns):
    return {"messages": [{"role": r, "content": c} for r, c in turns]}


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def read(path, **kw):
    stats = ReadStats()
    return list(read_conversations(str(path), stats=stats, **kw)), stats


# ---------------------------------------------------------------- reading


def test_sharegpt_json_roles_mapped(tmp_path):
    recs = [
        sharegpt(0, ("system", "Be brief."), ("human", "Hi"), ("gpt", "Hello"), ("human", "Bye"), ("chatgpt", "Ciao")),
        sharegpt(1, ("user", "Q"), ("bing", "A")),
    ]
    p = tmp_path / "d.json"
    p.write_text(json.dumps(recs, indent=2))
    convs, stats = read(p)
    assert [c.id for c in convs] == ["c0", "c1"]
    assert convs[0].messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": "Ciao"},
    ]
    assert (stats.read, stats.kept, stats.skipped, stats.truncated) == (2, 2, {}, False)


def test_openai_jsonl_and_content_ids(tmp_path):
    rec = openai(("user", "  keep  spaces \n"), ("assistant", "ok"))
    p = write_jsonl(tmp_path / "d.jsonl", [rec, {"id": 7, **rec}])
    convs, _ = read(p)
    assert convs[0].messages[0]["content"] == "  keep  spaces \n"  # content is never stripped
    assert convs[0].id.startswith("sha1:") and convs[1].id == "7"
    again, _ = read(p)
    assert again[0].id == convs[0].id  # content-derived ids are stable across reads


def test_truncated_json_array_recovers_complete_records(tmp_path, monkeypatch):
    recs = [sharegpt(i, ("human", f"question {i} " * 5), ("gpt", f"answer {i} é✓ " * 5)) for i in range(3)]
    text = json.dumps(recs, ensure_ascii=False, indent=1)
    cut = text.rindex('"answer 2')  # mid-way through the last record
    p = tmp_path / "trunc.json"
    p.write_text(text[:cut], encoding="utf-8")
    monkeypatch.setattr(conv_mod, "CHUNK_CHARS", 7)  # records span many chunks, multibyte chars split across reads
    with pytest.warns(UserWarning, match="ended mid-record"):
        convs, stats = read(p)
    assert [c.id for c in convs] == ["c0", "c1"]
    assert convs[1].messages[1]["content"] == "answer 1 é✓ " * 5
    assert stats.truncated and "ended mid-record" in stats.summary()


def test_json_array_bad_records_skipped(tmp_path):
    good = sharegpt(0, ("human", "q"), ("gpt", "a"))
    body = json.dumps(
        [good, "just a string", sharegpt(2, ("human", "q"), ("gpt", 5)), sharegpt(3, ("human", "q"), ("gpt", "BAD"))]
    ).encode()
    p = tmp_path / "d.json"
    p.write_bytes(body.replace(b"BAD", b"B\xffD"))  # an undecodable byte inside record 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a complete file must not warn about truncation
        convs, stats = read(p)
    assert [c.id for c in convs] == ["c0"]
    assert stats.skipped == {"not an object": 1, "non-string content": 1, "non-UTF-8 text": 1}
    assert any(":record 3 (id=c3): non-UTF-8 text" in e for e in stats.examples)


def test_jsonl_malformed_and_non_utf8_lines(tmp_path):
    ok = json.dumps(openai(("user", "q"), ("assistant", "a"))).encode()
    p = tmp_path / "d.jsonl"
    p.write_bytes(ok + b"\n{not json\n" + ok.replace(b'"a"', b'"\xc3\x28"') + b"\n\n" + ok + b"\n")
    convs, stats = read(p)
    assert len(convs) == 2
    assert stats.skipped == {"malformed JSON": 1, "non-UTF-8 bytes": 1}
    assert stats.read == 4 and stats.kept == 2
    assert any(e.startswith(f"{p}:line 2: malformed JSON") for e in stats.examples)
    assert any(e.startswith(f"{p}:line 3: non-UTF-8 bytes") for e in stats.examples)


def test_empty_content_and_no_exchange_skipped(tmp_path):
    recs = [
        openai(("user", "q"), ("assistant", "")),
        openai(("user", "only a question")),
        openai(("assistant", "orphan answer"), ("user", "q")),
        {"id": "x", "conversations": "not a list"},
        openai(("user", "q"), ("assistant", "a")),
    ]
    convs, stats = read(write_jsonl(tmp_path / "d.jsonl", recs))
    assert len(convs) == 1
    assert stats.skipped == {"empty content": 1, "no exchange": 2, "no messages": 1}
    assert "skipped 4" in stats.summary()


def test_role_order_violation_keeps_prefix(tmp_path):
    recs = [
        sharegpt(
            0,
            ("gpt", "leading answer"),
            ("human", "q1"),
            ("gpt", "a1"),
            ("human", "q2"),
            ("human", "q2 again"),
            ("gpt", "a2"),
        ),
        sharegpt(1, ("human", "q1"), ("gpt", "a1"), ("human", "unanswered")),
    ]
    p = tmp_path / "d.json"
    p.write_text(json.dumps(recs))
    convs, stats = read(p)
    assert convs[0].messages == [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}]
    assert convs[1].messages == [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}]
    assert stats.trimmed == {"leading assistant": 1, "role order": 1, "trailing user": 2}


def test_questions_keep_unanswered_prompts_for_regeneration(tmp_path):
    """Prompts alone (no answers) are what `draftsmith regenerate` answers: questions=True keeps them and a trailing
    user turn; the default (training) read drops both, since a question with no answer supervises nothing."""
    p = write_jsonl(
        tmp_path / "prompts.jsonl",
        [
            {"id": "p0", **openai(("user", "Complete this function."))},
            {"id": "p1", **openai(("system", "Be brief."), ("user", "q1"), ("assistant", "a1"), ("user", "q2"))},
            {"id": "p2", **openai(("system", "Only a system prompt."))},
        ],
    )
    convs, stats = read(p, questions=True)
    assert [c.id for c in convs] == ["p0", "p1"]
    assert convs[0].messages == [{"role": "user", "content": "Complete this function."}]
    assert convs[1].messages[-1] == {"role": "user", "content": "q2"}
    assert stats.skipped == {"no user turn": 1}
    convs, stats = read(p)
    assert [c.id for c in convs] == ["p1"] and convs[0].messages[-1]["role"] == "assistant"
    assert stats.skipped == {"no exchange": 2}


def test_missing_file_and_unknown_format(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(DataError, match="nope.jsonl"):
        read_conversations(str(missing))  # fails at the call, before any iteration
    (tmp_path / "d.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="unknown data format"):
        list(read_conversations(str(tmp_path / "d.csv")))
    (tmp_path / "d.json").write_text("hello")
    with pytest.raises(DataError, match="d.json"):
        list(read_conversations(str(tmp_path / "d.json")))


def test_json_array_syntax_error_is_fatal_with_record_index(tmp_path):
    good = json.dumps(sharegpt(0, ("human", "q"), ("gpt", "a")))
    p = tmp_path / "bad.json"
    p.write_text(f'[{good}, {{"id": "c1",, }}, {good}]')
    with pytest.raises(DataError, match=r"bad.json:record 1: malformed JSON"):
        list(read_conversations(str(p)))


def _syntax_error_near_the_end(good, bad_tail) -> str:
    """A two-record array whose second record holds a syntax error a few characters before the closing ']'."""
    return f"[{good},\n {bad_tail}]\n"


@pytest.mark.parametrize("chunk", [7, 1 << 20])  # records span many chunks, or the whole file is one
@pytest.mark.parametrize(
    "bad_tail, record, line, msg",
    [
        ('{"id": "b", "messages": [{"role": "user", "content": "q"}] ,, }', 1, 2, "Expecting property name"),
        (
            '{"id": "b", "messages": [{"role": "user", "content": "q"}] x}',
            1,
            2,
            "Expecting ',' delimiter",
        ),  # stray char
        ('{"id": "b"\n "messages": []}', 1, 3, "Expecting ',' delimiter"),  # a missing comma between keys
        ('{"id": "b", "messages": []},', 2, 2, "Expecting value"),  # a trailing comma: the "record" after it is empty
        ('{"id": "b}', 1, 2, "Invalid control character"),  # a missing quote: the string swallows the closing ]
    ],
)
def test_json_array_syntax_error_near_the_end_is_fatal_not_truncation(
    tmp_path, monkeypatch, chunk, bad_tail, record, line, msg
):
    """More text after the error means a syntax error (fatal, with line and column), not a file that was cut off."""
    monkeypatch.setattr(conv_mod, "CHUNK_CHARS", chunk)
    good = json.dumps(sharegpt(0, ("human", "q é✓"), ("gpt", "a")), ensure_ascii=False)  # one line
    p = tmp_path / "bad.json"
    p.write_text(_syntax_error_near_the_end(good, bad_tail), encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "ended mid-record" warning on the way
        with pytest.raises(
            DataError,
            match=rf"bad.json:record {record}: malformed JSON at line {line} column \d+ "
            rf"\(character \d+\): {msg}.*not a cut-off file",
        ) as e:
            list(read_conversations(str(p)))
    assert "mid-record" not in str(e.value)


def test_json_array_error_line_and_column_count_text_already_dropped(tmp_path, monkeypatch):
    """The buffer drops decoded text as it goes: line and column still count from the file's start."""
    monkeypatch.setattr(conv_mod, "CHUNK_CHARS", 64)
    recs = [json.dumps(sharegpt(i, ("human", f"question {i}"), ("gpt", f"answer {i}")), indent=1) for i in range(40)]
    text = "[" + ",\n".join(recs) + ',\n{"id": "x", "conversations": [] "oops": 1}\n]'
    p = tmp_path / "long.json"
    p.write_text(text)
    lines = text.splitlines()
    want_line = next(n for n, x in enumerate(lines, 1) if '"oops"' in x)
    want_col = lines[want_line - 1].index('"oops"') + 1
    offset = text.index('"oops"') - 1  # the file's first character ('[') is character 0
    with pytest.raises(
        DataError,
        match=rf"record 40: malformed JSON at line {want_line} column {want_col} "
        rf"\(character {offset + 1}\)",
    ):
        list(read_conversations(str(p)))


def test_json_array_stray_text_between_records_names_line_and_column(tmp_path):
    good = json.dumps(sharegpt(0, ("human", "q"), ("gpt", "a")))
    p = tmp_path / "stray.json"
    p.write_text(f"[{good},\n{good} x]")
    with pytest.raises(
        DataError,
        match=r"stray.json:record 2: malformed JSON at line 2 column \d+ .*expected ',' or "
        r"'\]' after record 1, found 'x'",
    ):
        list(read_conversations(str(p)))


@pytest.mark.parametrize("end", ["", "\n"])  # cut off, or cut off and a newline appended by some tool
@pytest.mark.parametrize("cut", ['"answer 2', '"gpt"', '"value": ', '"value": tr', '"id": "c2"', "true"])
def test_json_array_cut_inside_its_last_record_is_truncation(tmp_path, cut, end):
    """A file that ends before its last record closes (mid-string, mid-literal, after a value) keeps the others."""
    recs = [sharegpt(i, ("human", f"question {i}"), ("gpt", f"answer {i}")) for i in range(3)]
    recs[2]["flag"] = True
    text = json.dumps(recs, indent=1).replace('"flag": true', '"value": true')
    at = text.rindex(cut) + len(cut)
    p = tmp_path / "cut.json"
    p.write_text(text[:at] + end)
    with pytest.warns(UserWarning, match=r"ended mid-record \(record 2\); kept the 2 complete records"):
        convs, stats = read(p)
    assert [c.id for c in convs] == ["c0", "c1"] and stats.truncated and "ended mid-record" in stats.summary()


def test_real_sharegpt_ends_mid_record_and_keeps_every_complete_record():
    """The embedded ShareGPT_V3 file is cut off inside record 17,671: the 17,671 records before it are read."""
    with pytest.warns(UserWarning, match=r"ended mid-record \(record 17671\); kept the 17671 complete records"):
        convs, stats = read("sharegpt")
    assert stats.read == 17671 and stats.truncated and len(convs) == stats.kept > 17000


def test_saved_hf_dataset_dir(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [
        {"id": "a", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
        {"id": "b", "messages": [{"role": "user", "content": "unanswered"}]},
    ]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "ds"))
    convs, stats = read(tmp_path / "ds")
    assert [c.id for c in convs] == ["a"] and stats.skipped == {"no exchange": 1}


def test_limit_counts_kept_records(tmp_path):
    recs = [openai(("user", "q"))] + [openai(("user", f"q{i}"), ("assistant", "a")) for i in range(5)]
    convs, stats = read(write_jsonl(tmp_path / "d.jsonl", recs), limit=3)
    assert [c.messages[0]["content"] for c in convs] == ["q0", "q1", "q2"]
    assert stats.kept == 3 and stats.skipped == {"no exchange": 1}


def test_real_sharegpt_head():
    convs, stats = read("sharegpt", limit=200)
    assert len(convs) == 200 and stats.kept == 200
    for c in convs:
        roles = [m["role"] for m in c.messages if m["role"] != "system"]
        assert roles[0] == "user" and roles[-1] == "assistant"
        assert all(a != b for a, b in zip(roles, roles[1:]))
        assert all(isinstance(m["content"], str) and m["content"] for m in c.messages)


def test_split_heldout_deterministic_disjoint_order_free():
    convs = [Conversation(id=f"id{i}", messages=[]) for i in range(100)] + [Conversation(id="id3", messages=[])]
    train, held = split_heldout(convs, 10, seed=1)
    held_ids = {c.id for c in held}
    assert not held_ids & {c.id for c in train}
    assert len(train) + len(held) == len(convs) and len(held) >= 10
    shuffled = convs[:]
    random.Random(0).shuffle(shuffled)
    assert {c.id for c in split_heldout(shuffled, 10, seed=1)[1]} == held_ids
    assert {c.id for c in split_heldout(convs, 10, seed=2)[1]} != held_ids
    # A held-out id stays held out when more data arrives, as long as it still ranks among the n smallest.
    assert {c.id for c in split_heldout(convs[:50], 3, seed=1)[1]} <= {
        c.id for c in split_heldout(convs[:50], 30, seed=1)[1]
    }


# ---------------------------------------------------------------- rendering

TWO_EXCHANGES = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "It is 4."},
    {"role": "user", "content": "And 3+3?"},
    {"role": "assistant", "content": " Six,\nof course. "},
]


def supervised_text(tok, s):
    return tok.decode([i for i, m in zip(s.input_ids, s.loss_mask) if m])


def test_render_mask_is_assistant_content_plus_im_end(tokenizer):
    s = render(tokenizer, TWO_EXCHANGES, max_length=4096, conv_id="x")
    assert len(s.input_ids) == len(s.loss_mask) and s.conv_id == "x"
    assert supervised_text(tokenizer, s) == "It is 4." + IM_END + " Six,\nof course. " + IM_END
    unsup = tokenizer.decode([i for i, m in zip(s.input_ids, s.loss_mask) if not m])
    assert "You are a helpful AI assistant named SmolLM" in unsup  # the template's auto system prompt
    assert "What is 2+2?" in unsup and "And 3+3?" in unsup
    assert unsup.count("<|im_start|>assistant\n") == 2  # role headers are never supervised
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    for t, (tok_id, m) in enumerate(zip(s.input_ids, s.loss_mask)):
        if m and tok_id == im_end:
            assert s.loss_mask[t + 1] == 0 and tokenizer.decode([s.input_ids[t + 1]]) == "\n"
    assert (
        s.input_ids
        == tokenizer(tokenizer.apply_chat_template(TWO_EXCHANGES, tokenize=False), add_special_tokens=False)[
            "input_ids"
        ]
    )


def test_render_with_system_and_batched_path_agree(tokenizer):
    msgs = [{"role": "system", "content": "Terse."}] + TWO_EXCHANGES
    s = render(tokenizer, msgs, max_length=4096)
    assert "SmolLM" not in tokenizer.decode(s.input_ids)
    assert supervised_text(tokenizer, s) == "It is 4." + IM_END + " Six,\nof course. " + IM_END
    many = list(render_many(tokenizer, [("a", msgs), ("b", TWO_EXCHANGES)], max_length=4096, batch_size=2))
    assert many[0].input_ids == s.input_ids and many[0].loss_mask == s.loss_mask
    assert many[1].loss_mask == render(tokenizer, TWO_EXCHANGES, max_length=4096).loss_mask


def test_template_filler_is_not_supervised(tokenizer):
    tok = copy.deepcopy(tokenizer)
    # Qwen3-style: the template injects an empty think block into every assistant turn.
    tok.chat_template = (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' }}"
        "{% if m['role'] == 'assistant' %}{{ '<think>\n\n</think>\n\n' }}{% endif %}"
        "{{ m['content'] + '<|im_end|>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    s = render(tok, TWO_EXCHANGES, max_length=4096)
    assert "<think>" in tok.decode(s.input_ids)
    assert supervised_text(tok, s) == "It is 4." + IM_END + " Six,\nof course. " + IM_END


def test_render_truncation(tokenizer):
    full = render(tokenizer, TWO_EXCHANGES, max_length=4096)
    first_sup = full.loss_mask.index(1)
    s = render(tokenizer, TWO_EXCHANGES, max_length=first_sup + 2)
    assert s.input_ids == full.input_ids[: first_sup + 2] and s.loss_mask == full.loss_mask[: first_sup + 2]
    assert sum(s.loss_mask) == 2
    assert render(tokenizer, TWO_EXCHANGES, max_length=first_sup) is None  # nothing supervised survives


def test_split_windows_cover_the_conversation(tokenizer):
    full = render(tokenizer, TWO_EXCHANGES, max_length=4096, conv_id="c")
    n = len(full.input_ids)
    # a window size that leaves the first window without a supervised token: it is dropped, the rest kept whole
    first_sup = full.loss_mask.index(1)
    w = split_windows(full, first_sup)
    assert first_sup < n and w and all(len(s.input_ids) <= first_sup and any(s.loss_mask) for s in w)
    assert w[0].conv_id == "c#1" and len({s.conv_id for s in w}) == len(w)
    starts = [int(s.conv_id.split("#")[1]) * first_sup for s in w]
    for s, start in zip(w, starts):
        assert s.input_ids == full.input_ids[start : start + first_sup]
        assert s.loss_mask == full.loss_mask[start : start + first_sup]
    # every supervised token of the conversation is in some window (none was in the dropped first one)
    assert sum(sum(s.loss_mask) for s in w) == sum(full.loss_mask)
    # windows at least as long as the sample: the sample itself
    one = split_windows(full, n)
    assert [(s.input_ids, s.loss_mask, s.conv_id) for s in one] == [(full.input_ids, full.loss_mask, "c")]
    # a last window of one token is dropped (nothing to predict from it)
    assert all(len(s.input_ids) >= 2 for s in split_windows(full, n - 1))


def test_source_id_names_the_conversation_of_a_window(tokenizer):
    from draftsmith.train.data.dataset import source_id

    full = render(tokenizer, TWO_EXCHANGES, max_length=4096, conv_id="J41#0dS_7")
    windows = split_windows(full, 8)
    assert len(windows) > 2 and {source_id(w.conv_id) for w in windows} == {"J41#0dS_7"}
    assert source_id("plain") == "plain" and source_id("a#b") == "a#b" and source_id("a#12") == "a"


def test_render_prompt_is_prefix_of_conversation(tokenizer):
    prompt = render_prompt(tokenizer, TWO_EXCHANGES[:1])
    full = render(tokenizer, TWO_EXCHANGES, max_length=4096)
    assert full.input_ids[: len(prompt)] == prompt
    assert tokenizer.decode(prompt).endswith("<|im_start|>assistant\n")
    assert full.loss_mask[len(prompt)] == 1 and not any(full.loss_mask[: len(prompt)])


# ---------------------------------------------------------------- draft vocab


def test_count_supervised():
    samples = [Sample([1, 2, 3, 3], [0, 1, 1, 1]), Sample([3, 0], [1, 0])]
    assert count_supervised(samples, 5).tolist() == [0, 0, 1, 3, 0]
    with pytest.raises(ValueError, match="outside"):
        count_supervised([Sample([9], [1])], 5)


def test_draft_vocab_consistency_pinned_and_ties():
    counts = torch.tensor([0, 5, 9, 5, 0, 1, 7, 5, 0, 0])
    dv = build_draft_vocab(counts, 4, pinned_ids=[8])
    # Most frequent: 2 (9), 6 (7), then the tie among 1, 3, 7 (5 each) goes to the lowest id; 8 is pinned.
    assert dv.draft_to_target.tolist() == [1, 2, 6, 8]
    assert torch.equal(torch.arange(4) + dv.d2t, dv.draft_to_target)
    assert dv.d2t.dtype == torch.int64 and dv.t2d.dtype == torch.bool
    assert int(dv.t2d.sum()) == 4 and bool(dv.t2d[dv.draft_to_target].all())
    assert dv.coverage(counts) == pytest.approx((5 + 9 + 7 + 0) / 32)
    assert dv.to_draft(torch.tensor([2, 8, 3])).tolist() == [1, 3, -1]
    with pytest.raises(ValueError):
        dv.to_draft([10])


def test_draft_vocab_full_fill_and_errors():
    counts = torch.tensor([0, 3, 0, 0, 2, 0])
    full = build_draft_vocab(counts, 6)
    assert full.d2t.tolist() == [0] * 6 and bool(full.t2d.all()) and full.coverage(counts) == 1.0
    filled = build_draft_vocab(counts, 4)  # only 2 ids ever occur: fill with the lowest unseen ids
    assert filled.draft_to_target.tolist() == [0, 1, 2, 4]
    with pytest.raises(ValueError, match="> 0"):
        build_draft_vocab(counts, 0)
    with pytest.raises(ValueError, match="outside"):
        build_draft_vocab(counts, 3, pinned_ids=[6])
    report = coverage_report(counts, [1, 2, 6])
    assert report == [(1, pytest.approx(0.6)), (2, 1.0), (6, 1.0)]


# ---------------------------------------------------------------- batching


def test_make_batches_cover_cap_and_determinism():
    rng = random.Random(0)
    lengths = [rng.randint(1, 512) for _ in range(1000)]
    batches = make_batches(lengths, max_tokens=2048, max_batch_size=16, seed=3, epoch=0)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(len(lengths)))
    assert all(len(b) * max(lengths[i] for i in b) <= 2048 and len(b) <= 16 for b in batches)
    assert batches == make_batches(lengths, 2048, 16, seed=3, epoch=0)
    assert batches != make_batches(lengths, 2048, 16, seed=3, epoch=1)
    padded = sum(len(b) * max(lengths[i] for i in b) for b in batches)
    assert padded < 1.15 * sum(lengths)  # bucketing keeps padding small
    with pytest.raises(ValueError, match="longer than max_tokens"):
        make_batches([10, 5000], 2048, 16, seed=0, epoch=0)


def test_collate_right_pads():
    out = collate([Sample([5, 6, 7], [0, 1, 1]), Sample([8], [1])], pad_id=2)
    assert out["input_ids"].tolist() == [[5, 6, 7], [8, 2, 2]]
    assert out["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert out["loss_mask"].dtype == torch.float32 and out["loss_mask"].tolist() == [[0, 1, 1], [1, 0, 0]]
    assert out["input_ids"].dtype == torch.long and out["attention_mask"].dtype == torch.long


# ---------------------------------------------------------------- prepare_data


def _data_cfg(path, **kw):
    base = dict(path=str(path), num_conversations=None, heldout=4, max_length=256, seed=0, overflow="truncate")
    return SimpleNamespace(**{**base, **kw})


def test_prepare_data_cache_and_heldout(tmp_path, tokenizer):
    recs = [
        sharegpt(
            i,
            ("human", f"Question number {i}?"),
            ("gpt", f"Answer {i}. " * (1 + i % 7)),
            ("human", "More?"),
            ("gpt", "No more."),
        )
        for i in range(30)
    ]
    src = tmp_path / "d.json"
    src.write_text(json.dumps(recs))
    cache = tmp_path / "cache"
    cfg = _data_cfg(src)
    a = prepare_data(cfg, tokenizer, cache)
    assert a.stats["cache_hit"] is False and len(list((cache / "data").glob("*.pt"))) == 1
    train_ids = {s.conv_id for s in a.train}
    held_ids = {s.conv_id for s in a.heldout}
    assert len(held_ids) == 4 and len(train_ids) == 26 and not train_ids & held_ids
    assert {p["id"] for p in a.heldout_prompts} == held_ids
    p0 = a.heldout_prompts[0]
    assert [m["role"] for m in p0["messages"]] == ["user"] and p0["reference"].startswith("Answer ")
    assert torch.equal(a.counts, count_supervised(a.train, len(tokenizer)))
    assert all(len(s.input_ids) <= 256 for s in a.train) and a.stats["render"]["train"]["truncated"] == 0

    b = prepare_data(cfg, tokenizer, cache)
    assert b.stats["cache_hit"] is True
    assert [(s.input_ids, s.loss_mask, s.conv_id) for s in b.train] == [
        (s.input_ids, s.loss_mask, s.conv_id) for s in a.train
    ]
    assert [(s.input_ids, s.loss_mask) for s in b.heldout] == [(s.input_ids, s.loss_mask) for s in a.heldout]
    assert b.heldout_prompts == a.heldout_prompts and torch.equal(b.counts, a.counts)

    c = prepare_data(_data_cfg(src, max_length=48), tokenizer, cache)
    assert c.stats["cache_hit"] is False and len(list((cache / "data").glob("*.pt"))) == 2
    assert all(len(s.input_ids) <= 48 for s in c.train) and c.stats["render"]["train"]["truncated"] > 0

    # Split instead of truncated: the same conversations, no training token lost, the held-out samples unchanged.
    s = prepare_data(_data_cfg(src, max_length=48, overflow="split"), tokenizer, cache)
    assert s.stats["cache_hit"] is False and len(list((cache / "data").glob("*.pt"))) == 3
    tally = s.stats["render"]["train"]
    assert tally["truncated"] == c.stats["render"]["train"]["truncated"] and tally["extra_windows"] > 0
    assert all(len(x.input_ids) <= 48 for x in s.train) and len(s.train) == len(c.train) + tally["extra_windows"]
    assert s.stats["train_tokens"] > c.stats["train_tokens"]
    assert {x.conv_id.split("#")[0] for x in s.train} == {x.conv_id for x in c.train}
    assert [(x.input_ids, x.loss_mask) for x in s.heldout] == [(x.input_ids, x.loss_mask) for x in c.heldout]
    assert sum(sum(x.loss_mask) for x in s.train) > sum(sum(x.loss_mask) for x in c.train)

    # Fewer training conversations: the held-out set does not move.
    d = prepare_data(_data_cfg(src, num_conversations=10), tokenizer, None)
    assert {s.conv_id for s in d.heldout} == held_ids and len(d.train) == 10


def test_prepare_data_also_adds_training_conversations_never_held_out_ones(tmp_path, tokenizer):
    """data.also: another source's conversations join training; held-out comes from data.path alone, and an `also`
    conversation whose id data.path holds out (the target's answer to a held-out prompt) is left out."""
    src, more = tmp_path / "src.jsonl", tmp_path / "answers.jsonl"
    write_jsonl(src, [sharegpt(i, ("human", f"Question {i}?"), ("gpt", f"Answer {i}.")) for i in range(30)])
    answers = [sharegpt(i, ("human", f"Question {i}?"), ("gpt", f"Another answer to {i}, longer.")) for i in range(30)]
    write_jsonl(more, answers + [sharegpt(99, ("human", "New?"), ("gpt", "Yes."))])
    cache = tmp_path / "cache"
    plain = prepare_data(_data_cfg(src), tokenizer, cache)
    mixed = prepare_data(_data_cfg(src, also=[str(more)]), tokenizer, cache)
    assert mixed.stats["cache_hit"] is False and len(list((cache / "data").glob("*.pt"))) == 2  # keyed apart
    held = {s.conv_id for s in plain.heldout}
    assert [(s.input_ids, s.loss_mask) for s in mixed.heldout] == [(s.input_ids, s.loss_mask) for s in plain.heldout]
    assert mixed.heldout_prompts == plain.heldout_prompts
    assert mixed.stats["also"][0]["kept"] == 27 and mixed.stats["also"][0]["held_out_ids"] == 4
    assert len(mixed.train) == len(plain.train) + 27 and not {s.conv_id for s in mixed.train} & held
    assert [s.input_ids for s in mixed.train[: len(plain.train)]] == [s.input_ids for s in plain.train]
    assert int(mixed.counts.sum()) > int(plain.counts.sum())
    again = prepare_data(_data_cfg(src, also=[str(more)]), tokenizer, cache)
    assert again.stats["cache_hit"] is True and len(again.train) == len(mixed.train)
