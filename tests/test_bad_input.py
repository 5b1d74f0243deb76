"""Fuzz: garbage through the data pipeline never raises anything but DataError, and every good record survives."""

import json
import random
import warnings

import pytest

from draftsmith.train.data import DataError, ReadStats, prepare_data, read_conversations
from draftsmith.train.data.conversations import split_heldout


def good(i: int, rng: random.Random) -> dict:
    answer = "A plain answer. " * rng.randint(1, 4)
    if i == 3:
        answer = "A very long answer that will be truncated. " * 2000  # over-long: truncated, still trained on
    if rng.random() < 0.5:
        return {
            "id": f"good{i}",
            "conversations": [{"from": "human", "value": f"Question {i}?"}, {"from": "gpt", "value": answer}],
        }
    return {
        "id": f"good{i}",
        "messages": [
            {"role": "system", "content": "Be kind."},
            {"role": "user", "content": f"Q{i}"},
            {"role": "assistant", "content": answer},
        ],
    }


def garbage(i: int, rng: random.Random) -> bytes:
    """One JSONL line that holds no usable conversation (never a good record's id)."""
    gid = f"bad{i}"
    junk = [
        lambda: bytes(rng.randrange(256) for _ in range(rng.randint(1, 80))).replace(b"\n", b" "),  # random bytes
        lambda: json.dumps(good(i, rng))[: rng.randint(1, 40)].encode(),  # truncated JSON
        lambda: json.dumps(rng.choice([[1, 2], 3, "text", None, True, 1.5, [{"id": gid}]])).encode(),  # not an object
        lambda: json.dumps({"id": gid}).encode(),  # missing keys
        lambda: json.dumps({"id": gid, "conversations": rng.choice([None, 5, "hi", {"a": 1}])}).encode(),  # wrong types
        lambda: json.dumps({"id": gid, "conversations": [1, "x", None]}).encode(),
        lambda: json.dumps(
            {
                "id": gid,
                "messages": [{"role": {"nested": ["junk"]}, "content": "hi"}, {"role": "assistant", "content": "yo"}],
            }
        ).encode(),  # unhashable role
        lambda: json.dumps({"id": gid, "messages": [{"role": ["user"], "content": "hi"}]}).encode(),
        lambda: json.dumps(
            {
                "id": gid,
                "messages": [
                    {"role": "user", "content": {"text": [1, {"x": None}]}},
                    {"role": "assistant", "content": "ok"},
                ],
            }
        ).encode(),  # nested content
        lambda: json.dumps(
            {"id": gid, "messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": "ok"}]}
        ).encode(),  # empty string
        lambda: json.dumps(
            {"id": gid, "messages": [{"role": "user", "content": "only a question"}]}
        ).encode(),  # no answer
        lambda: json.dumps(
            {"id": gid, "messages": [{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]}
        ).encode(),  # order, no user
        lambda: json.dumps({"id": gid, "conversations": [{"from": "wizard", "value": "x"}]}).encode(),  # unknown role
        lambda: b'{"id": "' + gid.encode() + b'", "messages": [{"role": "user", "content": "\xff\xfe"}]}',  # non-UTF-8
        lambda: json.dumps(
            {"id": gid, "messages": [{"role": "user", "content": "\ud800 lone"}, {"role": "assistant", "content": "x"}]}
        ).encode(),  # surrogate
        lambda: json.dumps(
            {"id": gid, "messages": [{"role": "user", "content": "x" * 300_000}]}
        ).encode(),  # huge, no answer
        lambda: ("[" * rng.randint(1, 3000)).encode(),  # deep nesting
        lambda: json.dumps({"id": gid, "messages": [{"content": "no role"}, {"role": "assistant"}]}).encode(),
    ]
    return rng.choice(junk)()


def test_fuzzed_jsonl_keeps_every_good_record_and_only_raises_dataerror(tmp_path, tokenizer):
    rng = random.Random(20261122)
    lines, good_ids, n_bad = [], set(), 0
    for i in range(300):
        if rng.random() < 0.3:
            rec = good(i, rng)
            good_ids.add(rec["id"])
            lines.append(json.dumps(rec).encode())
        else:
            lines.append(garbage(i, rng))
            n_bad += 1
    path = tmp_path / "fuzz.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")

    stats = ReadStats()
    convs = list(read_conversations(str(path), stats=stats))
    assert {c.id for c in convs} == good_ids  # all good records, and nothing made of garbage
    assert sum(stats.skipped.values()) == n_bad and stats.kept == len(good_ids)
    assert all(str(path) in e and "line" in e for e in stats.examples)  # each names the file and the line

    from types import SimpleNamespace

    cfg = SimpleNamespace(path=str(path), num_conversations=None, heldout=0, max_length=256, seed=0)
    data = prepare_data(cfg, tokenizer, cache_dir=None)
    assert {s.conv_id for s in data.train} == good_ids  # every good record rendered and kept
    assert data.stats["render"]["train"]["truncated"] == 1  # the over-long one, truncated not dropped
    assert f"skipped {n_bad}" in data.stats["read"]


@pytest.mark.parametrize("seed", range(6))
def test_corrupted_json_array_raises_only_dataerror(tmp_path, seed):
    rng = random.Random(seed)
    recs = [good(i, rng) for i in range(12)]
    raw = bytearray(json.dumps(recs, indent=1).encode())
    for _ in range(rng.randint(1, 6)):  # flip, insert or delete bytes
        pos = rng.randrange(len(raw))
        op = rng.choice(["flip", "insert", "delete"])
        if op == "flip":
            raw[pos] = rng.randrange(256)
        elif op == "insert":
            raw[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        else:
            del raw[pos : pos + rng.randint(1, 8)]
    if rng.random() < 0.5:
        raw = raw[: rng.randrange(1, len(raw))]  # and maybe truncated
    path = tmp_path / "corrupt.json"
    path.write_bytes(bytes(raw))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            stats = ReadStats()
            convs = list(read_conversations(str(path), stats=stats))
        except DataError as e:
            assert str(path) in str(e)  # the message names the file
            return
    assert {c.id for c in convs} <= {r["id"] for r in recs} | {c.id for c in convs if c.id.startswith("sha1:")}
    split_heldout(convs, 2, 0)  # whatever survives is usable downstream


def test_fatal_problems_stop_before_training(tmp_path, tokenizer):
    from types import SimpleNamespace

    only_junk = tmp_path / "junk.jsonl"
    only_junk.write_bytes(b'{"id": 1}\n\xff\xfe\n[1, 2]\n')
    cfg = SimpleNamespace(path=str(only_junk), num_conversations=None, heldout=0, max_length=256, seed=0)
    with pytest.raises(
        DataError,
        match=r"(?s)junk.jsonl: no training conversations left.*skipped 3.*junk.jsonl:line 2: non-UTF-8 bytes",
    ):
        prepare_data(cfg, tokenizer, cache_dir=None)
    with pytest.raises(DataError, match="no such file"):
        prepare_data(SimpleNamespace(**{**vars(cfg), "path": str(tmp_path / "missing.jsonl")}), tokenizer, None)


def test_tokenizer_that_is_not_the_targets_stops_before_data_prep(tmp_path, tokenizer):
    from omegaconf import OmegaConf

    from draftsmith.train.build import build_data_and_vocab

    cfg = OmegaConf.create(
        {
            "target": {"name_or_path": "some-128-token-model", "vocab_size": 128},
            "data": {"path": str(tmp_path / "never_read.jsonl")},
            "head": {"draft_vocab_size": 64},
        }
    )
    with pytest.raises(DataError, match=r"has 49152 tokens but the target 'some-128-token-model' has 128 embeddings"):
        build_data_and_vocab(cfg, tokenizer, tmp_path / "run")
