"""Shipped regenerated answers (draftsmith/shipped.py): taken only where the target's sha256, the pool's settings, the
generator and each record's prompt all match; anything else is generated. The package's own pools are intact and
were made for the target `prepare_smollm2` builds here."""

import hashlib
import json
import lzma

import pytest

import draftsmith.shipped as shipped
import draftsmith.train.data.regenerate as regen_mod


def _source(path, n):
    path.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "messages": [{"role": "user", "content": f"Name a colour, please ({i})."}]})
            + "\n"
            for i in range(n)
        )
    )


@pytest.fixture
def shipped_pool(tmp_path, monkeypatch, tiny_target_dir):
    """A shipped pool for the tiny target: answers to q0..q3, q2's prompt different from the source's."""
    src = tmp_path / "src.jsonl"
    _source(src, 6)
    records = [
        {
            "id": f"q{i}",
            "messages": [
                {"role": "user", "content": f"Name a colour, please ({i})." if i != 2 else "Another question."},
                {"role": "assistant", "content": f"shipped answer {i}"},
            ],
            "answer_tokens": 3,
            "finish_reason": "stop",
        }
        for i in range(4)
    ]
    text = "".join(json.dumps(r) + "\n" for r in records).encode()
    root = tmp_path / "regen"
    root.mkdir()
    (root / "pool.jsonl.xz").write_bytes(lzma.compress(text))
    entry = {
        "file": "pool.jsonl.xz",
        "settings": {"source": str(src), "max_tokens": 5, "temperature": 0.0, "seed": 0, "max_prompt_tokens": 1024},
        "generator": {"backend": "hf"},
        "target_sha256": shipped.target_fingerprint(tiny_target_dir),
        "sha256": hashlib.sha256(text).hexdigest(),
    }
    (root / "pools.json").write_text(json.dumps({"pools": [entry]}))
    monkeypatch.setattr(shipped, "ROOT", root)
    shipped._records.cache_clear()
    monkeypatch.setattr(regen_mod, "resolve_backend", lambda backend: "hf")  # the HF target: fast, no engine
    yield src, root, entry
    shipped._records.cache_clear()


def _answers(out):
    return {r["id"]: r["messages"][-1]["content"] for r in map(json.loads, out.read_text().splitlines())}


def test_matching_answers_are_taken_and_the_rest_generated(shipped_pool, tiny_target_dir, tmp_path):
    src, _, _ = shipped_pool
    out = tmp_path / "out.jsonl"
    stats = regen_mod.regenerate(str(tiny_target_dir), str(src), str(out), 6, max_tokens=5)
    got = _answers(out)
    assert {i: got[i] for i in ("q0", "q1", "q3")} == {f"q{i}": f"shipped answer {i}" for i in (0, 1, 3)}
    assert not got["q2"].startswith("shipped")  # its prompt differs: generated here
    assert stats["generated"] == 3 and set(got) == {f"q{i}" for i in range(6)}


@pytest.mark.parametrize(
    "change",
    [
        {"target_sha256": "0" * 64},  # another checkpoint or conversion
        {"settings": {"max_tokens": 6}},  # another length cap
        {"generator": {"backend": "vllm", "vllm": "0.32.0", "dtype": "float32"}},  # not what answers here
    ],
    ids=["target", "settings", "generator"],
)
def test_any_mismatch_regenerates_everything(shipped_pool, tiny_target_dir, tmp_path, change):
    src, root, entry = shipped_pool
    changed = {**entry, **{k: {**entry[k], **v} if isinstance(v, dict) else v for k, v in change.items()}}
    if "generator" in change:
        changed["generator"] = change["generator"]
    (root / "pools.json").write_text(json.dumps({"pools": [changed]}))
    out = tmp_path / "out.jsonl"
    stats = regen_mod.regenerate(str(tiny_target_dir), str(src), str(out), 6, max_tokens=5)
    assert stats["generated"] == 6 and not any(a.startswith("shipped") for a in _answers(out).values())


def test_a_damaged_pool_is_refused(shipped_pool, tiny_target_dir, tmp_path):
    src, root, entry = shipped_pool
    (root / "pool.jsonl.xz").write_bytes(lzma.compress(b'{"id": "q0", "messages": []}\n'))
    with pytest.raises(RuntimeError, match="sha256 differs"):
        regen_mod.regenerate(str(tiny_target_dir), str(src), str(tmp_path / "out.jsonl"), 6, max_tokens=5)


@pytest.mark.parametrize(
    "pool, asked, takes",
    [
        ("pycode:stdlib", "pycode:stdlib:300", True),  # a budgeted quickstart asks part of the stdlib pool
        ("pycode:site-packages:1200", "pycode:site-packages:50", True),
        ("pycode:stdlib", "pycode:site-packages:300", False),  # another root: other prompts
        ("sharegpt", "pycode:stdlib", False),
        ("sharegpt", "sharegpt", True),
        ("doctask:summarize", "doctask:summarize:100", True),  # the long-document sets ask part of theirs too
        ("doctask:summarize", "doctask:qa:100", False),
        ("pycode:stdlib", "doctask:stdlib", False),
    ],
)
def test_a_code_pool_answers_part_of_its_source(pool, asked, takes):
    assert shipped.same_source(pool, asked) is takes


def test_the_stdlib_pool_answers_a_stdlib_subset(smollm2_dir):
    """`pycode:stdlib:N` (the budgeted quickstart's code set) finds the shipped stdlib pool, whose records hold its
    first N prompts."""
    settings = {
        "source": "pycode:stdlib:40",
        "max_tokens": 256,
        "temperature": 0.0,
        "seed": 0,
        "max_prompt_tokens": 1024,
    }
    name, answers = shipped.shipped_answers(smollm2_dir, settings, "vllm")
    assert name == "regen-smollm2-pycode-stdlib.jsonl.xz" and len(answers) == 1059


def test_the_package_pools_are_intact_and_keyed_to_the_prepared_target(smollm2_dir):
    pools = shipped.manifest()
    sources = {"sharegpt", "pycode:stdlib", "pycode:site-packages:1200", "doctask:summarize", "doctask:qa"}
    assert {p["settings"]["source"] for p in pools} == sources
    for p in pools:
        records = shipped._records(p["file"])  # checks the sha256
        assert len(records) == p["records"]
    # the conversion is deterministic: the target prepared here is the one the pools were made with
    assert {p["target_sha256"] for p in pools} == {shipped.target_fingerprint(smollm2_dir)}


@pytest.mark.slow  # reads every installed .py file: about a minute on 2 cores
def test_the_code_pools_ask_what_this_installation_asks():
    """Every answer of a shipped pycode: pool is taken on a fresh `make setup`: its prompts are the ones the source
    gives here, in full. A new dependency that reorders the source (as one seeded shuffle over site-packages did), or a
    new release of one (fonttools 4.69 documented a function before the set-up pinned every version in
    scripts/constraints.txt), fails here instead of costing every new user regeneration."""
    from draftsmith.train.data.code_prompts import pycode_records

    for pool in shipped.manifest():
        source = pool["settings"]["source"]
        if not source.startswith("pycode:"):
            continue
        live = {r["id"]: r["messages"] for r, _ in pycode_records(source)}
        records = shipped._records(pool["file"])
        stale = sorted(i for i, r in records.items() if live.get(i) != shipped.prompt_messages(r))
        missing = sorted(set(live) - set(records))
        assert not stale and not missing, (
            f"{pool['file']}: {len(stale)} of {len(records)} answers ask a prompt {source} no longer gives here "
            f"(e.g. {stale[:3]}), {len(missing)} of its prompts have no answer (e.g. {missing[:3]}); regenerate it"
        )


@pytest.mark.slow  # reads ShareGPT (126 MB) and renders 8,000 prompts: about half a minute
def test_the_sharegpt_pool_answers_every_first_turn_asked_here(tokenizer):
    """The ShareGPT pool answers exactly the first turns `regen:sharegpt` asks here for the extent its manifest names
    (`first_turns`), each with the prompt asked: so a fresh set-up generates nothing for any `data.num_conversations`
    up to that extent (two of the first 4,000 asked here were missing until 2026-12-05: a preset run on a fresh machine
    generated them)."""
    from draftsmith.train.data.regenerate import first_prompts

    (pool,) = [p for p in shipped.manifest() if p["settings"]["source"] == "sharegpt"]
    records = shipped._records(pool["file"])
    prompts, too_long = first_prompts("sharegpt", pool["first_turns"], tokenizer, pool["settings"]["max_prompt_tokens"])
    assert len(prompts) + too_long == pool["first_turns"]
    asked = {p["id"]: p["messages"] for p in prompts}
    missing = [i for i in asked if i not in records]
    extra = sorted(set(records) - set(asked))
    stale = [i for i, m in asked.items() if i in records and shipped.prompt_messages(records[i]) != m]
    assert not missing and not extra and not stale, f"missing {missing[:5]}, not asked {extra[:5]}, stale {stale[:5]}"


def test_the_document_pools_answer_every_prompt_asked_here(tokenizer):
    """The long-document pools answer exactly the prompts `regen:doctask:KIND` asks here for their extent (the
    quickstart's share asks at most that many), each with the prompt asked: a fresh set-up generates none of them."""
    from draftsmith.train.data.regenerate import first_prompts

    pools = [p for p in shipped.manifest() if p["settings"]["source"].startswith("doctask:")]
    assert len(pools) == 2
    for pool in pools:
        records = shipped._records(pool["file"])
        source, first = pool["settings"]["source"], pool["first_turns"]
        prompts, too_long = first_prompts(source, first, tokenizer, pool["settings"]["max_prompt_tokens"])
        assert len(prompts) + too_long == first
        asked = {p["id"]: p["messages"] for p in prompts}
        assert set(asked) == set(records), source
        assert all(shipped.prompt_messages(records[i]) == m for i, m in asked.items()), source
