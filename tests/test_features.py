"""Feature sources (online vs kept in memory), the token-budget schedule, and target regeneration."""

import json

import pytest
import torch
from test_train import conversations, run_train

from draftsmith.train.data.dataset import collate
from draftsmith.train.data.render import Sample
from draftsmith.train.features.sources import FeatureSource
from draftsmith.train.target import Target


def test_memory_features_equal_online_and_skip_the_target(tiny_model):
    target = Target(tiny_model, aux_layer_ids=[1, 3, 4])
    g = torch.Generator().manual_seed(0)
    samples = [
        Sample(torch.randint(3, 128, (n,), generator=g).tolist(), [0] * 4 + [1] * (n - 4)) for n in (9, 17, 5, 12, 20)
    ]
    vocab = torch.arange(0, 128, 2)
    online, memory = FeatureSource(target, vocab, "online"), FeatureSource(target, vocab, "memory")
    for order in ([0, 1, 2], [3, 1, 4], [2, 0, 1]):  # later batches mix stored and new samples
        batch = collate([samples[i] for i in order], target.pad_id)
        a, b = online(order, batch), memory(order, batch)
        real = batch["attention_mask"].bool()  # padding rows hold zeros in memory mode, anything online
        for x, y in ((a.aux, b.aux), (a.last, b.last), (a.logits, b.logits)):
            torch.testing.assert_close(x[real], y[real], rtol=1e-5, atol=1e-5)
    lengths = sum(len(s.input_ids) for s in samples)
    assert memory.computed_tokens == lengths  # each sample ran through the target exactly once
    assert online.computed_tokens > lengths
    assert set(memory.store) == {0, 1, 2, 3, 4}
    with pytest.raises(ValueError, match="data.features"):
        FeatureSource(target, vocab, "disk")


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "chats.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in conversations(40)))
    return path


def _metrics(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_memory_mode_trains_like_online_and_token_budget_stops(tiny_target_dir, data_file, tmp_path):
    common = ("optim.max_steps=16",)  # about two epochs of the 28 training conversations
    run_train(tiny_target_dir, data_file, tmp_path / "online", *common)
    run_train(tiny_target_dir, data_file, tmp_path / "memory", *common, "data.features=memory")
    on = [r for r in _metrics(tmp_path / "online") if "loss" in r]
    mem = [r for r in _metrics(tmp_path / "memory") if "loss" in r]
    assert len(on) == len(mem) == 16 and max(r["epoch"] for r in mem) >= 1
    torch.testing.assert_close(
        torch.tensor([r["loss"] for r in mem]), torch.tensor([r["loss"] for r in on]), rtol=1e-4, atol=1e-4
    )
    # memory mode ran the target over each sample once; online over every batch of every epoch
    assert mem[-1]["target_tokens"] < on[-1]["target_tokens"]
    first_epoch = max(r["target_tokens"] for r in mem if r["epoch"] == 0)
    assert mem[-1]["target_tokens"] == first_epoch

    # a supervised-token budget stops the run at the budget, and the schedule ends there
    budget = on[5]["tokens"]
    run_train(tiny_target_dir, data_file, tmp_path / "budget", "optim.max_steps=null", f"optim.max_tokens={budget}")
    got = [r for r in _metrics(tmp_path / "budget") if "loss" in r]
    assert got[-1]["tokens"] >= budget > got[-2]["tokens"]
    assert got[-1]["lr"] < got[len(got) // 2]["lr"]  # cosine decayed over the budget, not over some other length


def _write_source(path, n):
    path.write_text(
        "".join(
            json.dumps(
                {
                    "id": f"q{i}",
                    "conversations": [
                        {"from": "human", "value": f"Name a colour, please ({i})."},
                        {"from": "gpt", "value": "An original answer the target never wrote."},
                    ],
                }
            )
            + "\n"
            for i in range(n)
        )
    )


def test_regenerate_with_hf_resumes_without_duplicates(tiny_target_dir, tmp_path):
    from draftsmith.train.data.conversations import read_conversations
    from draftsmith.train.data.regenerate import regenerate

    src, out = tmp_path / "src.jsonl", tmp_path / "regen.jsonl"
    _write_source(src, 6)
    first = regenerate(
        str(tiny_target_dir), str(src), str(out), num_conversations=4, max_tokens=6, batch_size=3, backend="hf"
    )
    assert first["generated"] == 4 and first["new_tokens"] > 0
    lines = out.read_text().splitlines()
    # a kill mid-append leaves a torn line: it is dropped and that prompt regenerated, nothing duplicated
    out.write_text("\n".join(lines[:2]) + "\n" + lines[2][: len(lines[2]) // 2])
    again = regenerate(
        str(tiny_target_dir), str(src), str(out), num_conversations=6, max_tokens=6, batch_size=3, backend="hf"
    )
    assert again["resumed_with"] == 2 and again["generated"] == 4
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted(r["id"] for r in recs) == [f"q{i}" for i in range(6)]
    assert all(r["messages"][-1]["content"] != "An original answer the target never wrote." for r in recs)
    assert all(r["messages"][0]["content"].startswith("Name a colour") for r in recs)
    # the output is a dataset the pipeline reads; answers with no text are skipped there, with a count
    kept = list(read_conversations(str(out)))
    assert len(kept) == sum(1 for r in recs if r["messages"][-1]["content"])
    with pytest.raises(ValueError, match="other settings"):
        regenerate(str(tiny_target_dir), str(src), str(out), max_tokens=7, backend="hf")


def test_regenerate_answers_a_prompts_only_file(tiny_target_dir, tmp_path, monkeypatch):
    """A file of prompts with no answers (e.g. the questions a deployment sees) is regenerated like a dataset; a file
    with no user turn at all is refused with its name and what was skipped, before any model loads."""
    from draftsmith.errors import ConfigError
    from draftsmith.train.data.conversations import read_conversations
    from draftsmith.train.data.regenerate import regenerate

    src, out = tmp_path / "prompts.jsonl", tmp_path / "regen.jsonl"
    src.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": f"Name colour number {i}."}]}) + "\n"
            for i in range(3)
        )
    )
    stats = regenerate(str(tiny_target_dir), str(src), str(out), max_tokens=5, batch_size=2, backend="hf")
    assert stats["generated"] == 3
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["id"] for r in recs] == ["p0", "p1", "p2"]
    assert all([m["role"] for m in r["messages"]] == ["user", "assistant"] for r in recs)
    assert len(list(read_conversations(str(out)))) == sum(1 for r in recs if r["messages"][-1]["content"])
    # the same file named relative to another directory is the same pool: resumed, nothing asked again
    monkeypatch.chdir(tmp_path)
    again = regenerate(str(tiny_target_dir), "prompts.jsonl", "regen.jsonl", max_tokens=5, batch_size=2, backend="hf")
    assert again["resumed_with"] == 3 and again["generated"] == 0
    with pytest.raises(ConfigError, match="other settings"):  # another file is not
        regenerate(str(tiny_target_dir), str(out), "regen.jsonl", max_tokens=5, backend="hf")
    empty = tmp_path / "system_only.jsonl"
    empty.write_text(json.dumps({"id": "s", "messages": [{"role": "system", "content": "Hi."}]}) + "\n")
    with pytest.raises(ConfigError, match=r"(?s)system_only\.jsonl: no user turn to answer.*no user turn=1"):
        regenerate(str(tiny_target_dir), str(empty), str(tmp_path / "never.jsonl"), backend="hf")


def test_regen_pool_grows_with_num_conversations(tiny_target_dir, tmp_path, monkeypatch):
    """Raising data.num_conversations re-answers only the new first turns; each size reads its own view, so a
    smaller size's data (and held-out split) is byte-identical however many larger sizes were made since."""
    from omegaconf import OmegaConf

    import draftsmith.train.data.regenerate as regen_mod
    from draftsmith.train.build import regenerated_path

    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(regen_mod, "resolve_backend", lambda backend: "hf")  # the HF target: fast, no engine
    calls = []
    real = regen_mod.regenerate
    monkeypatch.setattr(regen_mod, "regenerate", lambda *a, **kw: calls.append(real(*a, **kw)) or calls[-1])
    src = tmp_path / "src.jsonl"
    _write_source(src, 7)

    def view(n):
        cfg = OmegaConf.create(
            {"path": f"regen:{src}", "num_conversations": n, "regen_max_tokens": 5, "regen_temperature": 0.0, "seed": 0}
        )
        return regenerated_path(cfg, str(tiny_target_dir))

    small = view(3)
    small_bytes = open(small, "rb").read()
    assert [json.loads(x)["id"] for x in small_bytes.splitlines()] == ["q0", "q1", "q2"]
    big = view(6)
    assert [c["generated"] for c in calls] == [3, 3] and calls[1]["resumed_with"] == 3  # only q3..q5 were new
    assert [json.loads(x)["id"] for x in open(big).read().splitlines()] == [f"q{i}" for i in range(6)]
    assert open(big).read().startswith(small_bytes.decode())  # the same answers, not re-generated ones
    assert view(3) == small and open(small, "rb").read() == small_bytes and len(calls) == 2  # cached: no call
    everything = view(None)
    assert calls[-1]["generated"] == 1 and len(open(everything).read().splitlines()) == 7


def test_data_also_regen_trains_on_source_and_target_answers(tiny_target_dir, tmp_path, monkeypatch):
    """data.also=[regen:SOURCE] beside data.path=SOURCE: the source's text and the target's own answers to the same
    conversations, the held-out split SOURCE's, and no answer to a held-out prompt in training."""
    from pathlib import Path

    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    import draftsmith.train.data.regenerate as regen_mod
    from draftsmith.train.build import resolve_data_cfg
    from draftsmith.train.data.dataset import prepare_data, source_id

    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(regen_mod, "resolve_backend", lambda backend: "hf")  # the HF target: fast, no engine
    src = tmp_path / "src.jsonl"
    _write_source(src, 8)
    base = {"path": str(src), "num_conversations": 4, "heldout": 2, "max_length": 64, "seed": 0}
    base |= {"regen_max_tokens": 5, "regen_temperature": 0.0, "overflow": "truncate"}
    cfg = resolve_data_cfg(OmegaConf.create({**base, "also": [f"regen:{src}"]}), str(tiny_target_dir))
    assert cfg.path == str(src) and Path(cfg.also[0]).parent == tmp_path / "cache" / "regen"  # its cached view
    tok = AutoTokenizer.from_pretrained(tiny_target_dir)
    plain = prepare_data(OmegaConf.create(base), tok, None)
    both = prepare_data(cfg, tok, None)
    held = {s.conv_id for s in plain.heldout}
    assert {s.conv_id for s in both.heldout} == held and len(held) == 2
    assert not {source_id(s.conv_id) for s in both.train} & held and len(plain.train) == 4
    raw = [s for s in both.train if "An original answer" in tok.decode(s.input_ids)]
    answered = [s for s in both.train if "An original answer" not in tok.decode(s.input_ids)]
    assert [s.input_ids for s in raw] == [s.input_ids for s in plain.train]  # the source's text, once each
    assert {s.conv_id for s in plain.train} <= {s.conv_id for s in answered}  # every one answered by the target


def test_data_also_mapping_entry_makes_its_set_with_its_own_settings(tiny_target_dir, tmp_path, monkeypatch):
    """data.also=[regen:pycode:..., {path: regen:pycode:..., regen_temperature: 1.0, seed: 3}]: the same code prompts
    answered twice, greedy and sampled, each set its own cached view; data.'s settings stay as they were."""
    from omegaconf import OmegaConf

    import draftsmith.train.data.code_prompts as cp
    import draftsmith.train.data.regenerate as regen_mod
    from draftsmith.train.build import resolve_data_cfg
    from draftsmith.train.data.conversations import read_conversations

    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(regen_mod, "resolve_backend", lambda backend: "hf")
    calls = []
    real = regen_mod.regenerate
    monkeypatch.setattr(regen_mod, "regenerate", lambda *a, **kw: calls.append(a) or real(*a, **kw))
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "m.py").write_text(
        "".join(f'def f{i}(x):\n    """Function {i}.\n\n    Returns x.\n    """\n    return x\n\n\n' for i in range(4))
    )
    monkeypatch.setattr(cp, "root_dir", lambda name: lib)
    src = tmp_path / "src.jsonl"
    _write_source(src, 4)
    base = {"path": str(src), "num_conversations": 2, "heldout": 1, "max_length": 64, "seed": 0}
    base |= {"regen_max_tokens": 4, "regen_temperature": 0.0, "overflow": "truncate"}
    also = ["regen:pycode:stdlib:3", {"path": "regen:pycode:stdlib:3", "regen_temperature": 1.0, "seed": 3}]
    cfg = resolve_data_cfg(OmegaConf.create({**base, "also": also}), str(tiny_target_dir))
    greedy, sampled = cfg.also
    assert greedy != sampled and cfg.seed == 0 and cfg.regen_temperature == 0.0
    # regenerate(target, source, pool, n, max_tokens, temperature, seed): each set asked with its own settings
    assert [(c[1], c[5], c[6]) for c in calls] == [("pycode:stdlib:3", 0.0, 0), ("pycode:stdlib:3", 1.0, 3)]
    for view in (greedy, sampled):
        convs = list(read_conversations(view))
        assert len(convs) == 3 and all(c.id.startswith("stdlib:m.f") for c in convs)
        assert all([m["role"] for m in c.messages] == ["user", "assistant"] for c in convs)


def test_seeded_regen_pool_is_used_as_is(tiny_target_dir, tmp_path, monkeypatch):
    """A pool written where regen_pool_path points (what bench/seed_regen_pool.py does on a fresh machine) is the
    run's data: a fresh cache seeded with another cache's pool generates nothing and gives the same view, byte for
    byte."""
    from omegaconf import OmegaConf

    import draftsmith.train.data.regenerate as regen_mod
    from draftsmith.train.build import regen_pool_path, regenerated_path

    monkeypatch.setattr(regen_mod, "resolve_backend", lambda backend: "hf")
    calls = []
    real = regen_mod.regenerate
    monkeypatch.setattr(regen_mod, "regenerate", lambda *a, **kw: calls.append(real(*a, **kw)) or calls[-1])
    src = tmp_path / "src.jsonl"
    _write_source(src, 3)
    cfg = OmegaConf.create(
        {"path": f"regen:{src}", "num_conversations": 3, "regen_max_tokens": 5, "regen_temperature": 0.0, "seed": 0}
    )
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "made"))
    made = open(regenerated_path(cfg, str(tiny_target_dir)), "rb").read()
    pool = regen_pool_path(cfg, str(tiny_target_dir))
    assert calls[-1]["generated"] == 3 and pool.is_file()

    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "fresh"))
    seeded = regen_pool_path(cfg, str(tiny_target_dir))
    assert seeded != pool and not seeded.exists()
    seeded.parent.mkdir(parents=True)
    seeded.write_bytes(pool.read_bytes())
    assert open(regenerated_path(cfg, str(tiny_target_dir)), "rb").read() == made
    assert len(calls) == 2 and calls[-1]["generated"] == 0 and calls[-1]["resumed_with"] == 3


def test_seed_regen_pool_also_puts_an_also_entrys_pool_where_its_settings_point(tmp_path, monkeypatch):
    """bench/seed_regen_pool.py --also I seeds the pool data.also[I] resolves to, with that entry's own settings (the
    preset's sampled stdlib set: T=0.7, seed 1), not data.path's."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from omegaconf import OmegaConf

    from draftsmith.train.build import regen_pool_path
    from draftsmith.train.config import compose_config

    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "cache"))
    root = Path(__file__).resolve().parent.parent
    pool = tmp_path / "t07.jsonl"
    pool.write_text('{"id": "stdlib:m.f", "messages": []}\n')
    over = ["conf=eagle3_smollm2", f"target.name_or_path={tmp_path / 'target'}"]
    env = dict(os.environ)
    script = [sys.executable, str(root / "bench" / "seed_regen_pool.py")]
    proc = subprocess.run([*script, "--also", "2", str(pool), *over], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    data = compose_config(over).data
    entry = OmegaConf.to_container(data.also[2])
    assert entry["regen_temperature"] == 0.7 and entry["seed"] == 1
    want = regen_pool_path(OmegaConf.merge(data, entry), str(tmp_path / "target"))
    greedy = regen_pool_path(OmegaConf.merge(data, {"path": entry["path"]}), str(tmp_path / "target"))
    assert want.read_bytes() == pool.read_bytes() and not greedy.exists()
    proc = subprocess.run([*script, "--also", "7", str(pool), *over], capture_output=True, text=True, env=env)
    assert proc.returncode != 0 and "--also 7: data.also has 3 entries" in proc.stderr


@pytest.mark.slow
def test_regenerate_with_vllm_equals_hf_greedy(tiny_target_dir, tmp_path):
    """Both backends give the target's greedy answer: the same token ids on a tiny fp32 target."""
    from draftsmith.train.data.regenerate import regenerate

    src = tmp_path / "src.jsonl"
    _write_source(src, 4)
    a, b = tmp_path / "vllm.jsonl", tmp_path / "hf.jsonl"
    made = regenerate(str(tiny_target_dir), str(src), str(a), max_tokens=8, batch_size=4, backend="vllm")
    regenerate(str(tiny_target_dir), str(src), str(b), max_tokens=8, batch_size=4, backend="hf")
    from draftsmith.generate import default_threads

    assert made["threads"] == default_threads() >= 1  # batched generation takes every core by default
    ra = {r["id"]: r for r in map(json.loads, a.read_text().splitlines())}
    rb = {r["id"]: r for r in map(json.loads, b.read_text().splitlines())}
    assert ra.keys() == rb.keys() == {f"q{i}" for i in range(4)}
    assert [ra[k]["messages"][-1] for k in ra] == [rb[k]["messages"][-1] for k in ra]
    assert all(ra[k]["answer_tokens"] == rb[k]["answer_tokens"] for k in ra)


@pytest.mark.slow
def test_regen_data_path_generates_once_and_trains(tiny_target_dir, data_file, tmp_path, monkeypatch):
    """data.path=regen:SOURCE re-answers SOURCE with the target (vLLM here), caches it, and trains on it."""
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "cache"))
    args = (f"data.path=regen:{data_file}", "data.regen_max_tokens=12", "optim.max_steps=2", "eval_every=0")
    first = run_train(tiny_target_dir, data_file, tmp_path / "a", *args)
    assert "regenerate: 32 first turns" in first.stdout
    made = sorted((tmp_path / "cache" / "regen").glob("*.jsonl"))  # the answer pool and this size's view of it
    assert len(made) == 2 and [len(f.read_text().splitlines()) for f in made] == [32, 32]
    answers = [json.loads(x)["messages"][-1]["content"] for x in made[0].read_text().splitlines()]
    assert not any("remarkable" in a for a in answers)  # the source's answers were replaced
    second = run_train(tiny_target_dir, data_file, tmp_path / "b", *args)
    assert "regenerate:" not in second.stdout  # cached: the target is not asked again


def test_stream_disk_count_tolerates_a_shard_deleted_while_counting(tmp_path, monkeypatch):
    """The producer counts its directory while the training rank deletes shards it has read: a file listed and
    then gone no longer counts (it used to kill the producer with FileNotFoundError)."""
    from pathlib import Path

    from draftsmith.train.features.stream import _dir_bytes

    class DeletedAfterListing(type(tmp_path)):  # a regular file when listed, gone by the time it is measured
        def is_file(self):
            return True

        def stat(self, **kw):
            raise FileNotFoundError(2, "No such file or directory", str(self))

    (tmp_path / "kept.safetensors").write_bytes(b"x" * 10)
    (tmp_path / "sub").mkdir()
    gone = DeletedAfterListing(tmp_path / "read-and-deleted.safetensors")
    listed = [tmp_path / "kept.safetensors", gone, tmp_path / "sub"]
    monkeypatch.setattr(Path, "iterdir", lambda self: iter(listed))
    assert _dir_bytes(tmp_path) == 10


def test_regenerate_later_turns_follow_the_targets_own_answers(tiny_target_dir, tmp_path, monkeypatch):
    """--turns N asks turn r after the target's own answers to turns 1..r-1; the pool keeps one record per id (the
    last line wins), first answers equal a --turns 1 run's, and a view cuts records back to its regen_turns."""
    from omegaconf import OmegaConf

    import draftsmith.train.data.regenerate as regen_mod
    from draftsmith.train.build import regenerated_path
    from draftsmith.train.data.conversations import read_conversations
    from draftsmith.train.data.regenerate import load_done, regenerate, truncate_turns

    original = "An original answer the target never wrote."
    src, out = tmp_path / "src.jsonl", tmp_path / "regen.jsonl"
    convs = []
    for i, n in enumerate([1, 2, 3, 3]):  # user turns per conversation
        turns = []
        for t in range(n):
            ask = {"from": "human", "value": f"Turn {t + 1} of talk {i}: name a colour."}
            turns += [ask, {"from": "gpt", "value": original}]
        convs.append({"id": f"c{i}", "conversations": turns})
    src.write_text("".join(json.dumps(c) + "\n" for c in convs))

    one = regenerate(str(tiny_target_dir), str(src), str(out), max_tokens=4, backend="hf")
    firsts = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert one["generated"] == 4 and set(firsts) == {"c0", "c1", "c2", "c3"}

    # turn 2 of c1..c3, then a kill mid-append of turn 3: the torn line is dropped and only that answer redone
    two = regenerate(str(tiny_target_dir), str(src), str(out), max_tokens=4, backend="hf", turns=2)
    assert two["resumed_with"] == 4 and two["generated"] == 3
    after_two = out.read_text()
    three = regenerate(str(tiny_target_dir), str(src), str(out), max_tokens=4, backend="hf", turns=3, batch_size=1)
    assert three["generated"] == 2
    c2, c3 = out.read_text().splitlines()[2:]  # their 3-turn records: what turn 3 appended, c2's then c3's
    out.write_text(after_two + c2 + "\n" + c3[:10])  # killed while appending c3's
    again = regenerate(str(tiny_target_dir), str(src), str(out), max_tokens=4, backend="hf", turns=3)
    assert again["generated"] == 1 and out.read_text().splitlines()[2:] == [c2, c3]
    assert [c.id for c in read_conversations(str(out))] == ["c0", "c1", "c2", "c3"]  # a finished run: one line per id

    done = load_done(out)
    assert len(out.read_text().splitlines()) == 4  # one line per id after the rewrite, in first-seen order
    assert list(done) == ["c0", "c1", "c2", "c3"]
    for i, n in enumerate([1, 2, 3, 3]):
        rec = done[f"c{i}"]
        users = [m["content"] for m in rec["messages"] if m["role"] == "user"]
        answers = [m["content"] for m in rec["messages"] if m["role"] == "assistant"]
        assert users == [f"Turn {t + 1} of talk {i}: name a colour." for t in range(n)]
        assert len(answers) == n and original not in answers
        assert len(rec.get("later_turns", [])) == n - 1
        assert truncate_turns(rec, 1) == firsts[f"c{i}"]  # the first answer is the one a --turns 1 run wrote
        assert rec["messages"][0] == firsts[f"c{i}"]["messages"][0]

    # a later turn whose prompt (the target's earlier answers included) is over the cap is not asked
    capped = regenerate(
        str(tiny_target_dir),
        str(src),
        str(tmp_path / "capped.jsonl"),
        max_tokens=4,
        backend="hf",
        turns=3,
        max_prompt_tokens=len(firsts["c1"]["messages"][0]["content"]) + 30,
    )
    assert capped["later_too_long"] > 0

    # the training data's view: regen_turns answers per record, read like any dataset
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(regen_mod, "resolve_backend", lambda backend: "hf")

    def view(turns):
        cfg = OmegaConf.create(
            {
                "path": f"regen:{src}",
                "num_conversations": None,
                "regen_max_tokens": 4,
                "regen_temperature": 0.0,
                "seed": 0,
                "regen_turns": turns,
            }
        )
        return regenerated_path(cfg, str(tiny_target_dir))

    two_view, one_view = view(2), view(1)
    assert two_view != one_view
    per_conv = [sum(m["role"] == "assistant" for m in json.loads(x)["messages"]) for x in open(two_view)]
    assert per_conv == [1, 2, 2, 2]
    assert [sum(m["role"] == "assistant" for m in json.loads(x)["messages"]) for x in open(one_view)] == [1] * 4
    assert len(list(read_conversations(two_view))) == 4
