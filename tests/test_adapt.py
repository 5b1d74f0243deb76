"""`draftsmith adapt`: traffic files, the adapted run's data and config, the promotion rule, and the whole loop on a
tiny target (the reference decoder judges here; the slow tier judges in vLLM)."""

import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_train import conversations, data_file, run_train  # noqa: F401  (data_file: the module-scoped fixture)

from draftsmith.adapt import decide, replay_entries, saved_overrides
from draftsmith.errors import ConfigError, DataError
from draftsmith.traffic import prompt_id, read_traffic, split_heldout
from draftsmith.train.config import hydra_value


def write_lines(path: Path, lines) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def user(text):
    return {"role": "user", "content": text}


# ---------------------------------------------------------------- traffic files


def test_every_request_shape_reads_as_its_prompt(tmp_path):
    history = [
        {"role": "developer", "content": "be brief"},
        user("first question"),
        {"role": "assistant", "content": "an answer"},
        user("second question"),
        {"role": "assistant", "content": "a logged answer the target will replace"},
    ]
    f = write_lines(
        tmp_path / "t.jsonl",
        [
            {"model": "m", "messages": [user("chat request")], "max_tokens": 64},
            {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [user("batch")]}},
            {"prompt": ["completion one", "completion two"]},
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "parts "}, {"type": "text", "text": "joined"}],
                    }
                ]
            },
            {"conversations": [{"from": "human", "value": "sharegpt"}, {"from": "gpt", "value": "x"}]},
            {"messages": history},
            {"model": "m", "messages": [user("chat request")]},  # the same prompt again
        ],
    )
    t = read_traffic(f)
    got = [p["messages"] for p in t.prompts]
    assert got == [
        [user("chat request")],
        [user("batch")],
        [user("completion one")],
        [user("completion two")],
        [user("parts joined")],
        [user("sharegpt")],
        [{"role": "system", "content": "be brief"}, *history[1:4]],  # up to the last user turn, history kept
    ]
    assert t.records == 8 and t.duplicates == 1 and not t.problems
    assert [p["id"] for p in t.prompts] == [prompt_id(m) for m in got]
    assert t.prompts[-1]["where"] == f"{f}:6"


def test_a_vllm_log_reads_its_request_bodies(tmp_path):
    body = {"messages": [user("from the log")], "model": "m", "temperature": 0.0}
    f = write_lines(
        tmp_path / "vllm.log",
        [
            "INFO 11-28 10:00:00 [api_server.py:1] vLLM API server version 0.32.0",
            f"DEBUG 11-28 10:00:01 [request_logger.py:75] Request chatcmpl-1 JSON body: {json.dumps(body)}",
            "INFO 11-28 10:00:01 [request_logger.py:66] Received request chatcmpl-1: params: SamplingParams(n=1)",
            f"DEBUG 11-28 10:00:02 [request_logger.py:75] Request chatcmpl-2 JSON body: {json.dumps(body)[:25]}",
        ],
    )
    with pytest.raises(DataError) as e:
        read_traffic(f)
    assert f"{f}:4: a request body cut short" in str(e.value)
    t = read_traffic(f, skip_invalid=True)
    assert [p["messages"] for p in t.prompts] == [[user("from the log")]] and t.log_lines_without_body == 2

    # a log without request bodies is a log, not 1 bad JSON record: it says how to start vLLM so it logs them
    info_only = write_lines(tmp_path / "info.log", ["INFO Received request chatcmpl-1: params: SamplingParams(n=1)"])
    with pytest.raises(DataError, match="none with a request body.*--enable-log-requests --log-level DEBUG"):
        read_traffic(info_only)
    with pytest.raises(DataError, match="not JSON"):  # text that is neither JSON nor a log: a bad line, named
        read_traffic(write_lines(tmp_path / "notes.txt", ["Received request chatcmpl-1: params"]))


def test_bad_traffic_names_the_file_and_record(tmp_path):
    with pytest.raises(DataError, match="empty"):
        read_traffic(write_lines(tmp_path / "empty.jsonl", []))
    with pytest.raises(DataError, match="no such file"):
        read_traffic(tmp_path / "missing.jsonl")
    f = write_lines(
        tmp_path / "bad.jsonl",
        [
            {"messages": [user("fine")]},
            "{not json",
            {"messages": [{"role": "system", "content": "only a system prompt"}]},
            {"messages": [user("   ")]},
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            {"prompt": [1, 2, 3]},
            {"messages": [user("x " * 50)]},
            {"something": "else"},
        ],
    )
    count = lambda messages: len(messages[-1]["content"].split())  # noqa: E731  (a stand-in for the template)
    with pytest.raises(DataError) as e:
        read_traffic(f, count, max_prompt_tokens=20)
    lines = str(e.value).splitlines()
    assert lines[0] == f"{f}: 7 bad records; fix them, or pass --skip-invalid to adapt on the rest:"
    one = write_lines(tmp_path / "one.jsonl", [{"messages": [user("fine")]}, "{not json"])
    with pytest.raises(DataError, match=f"{one}: 1 bad record; fix them"):
        read_traffic(one)
    assert [x.split(": ", 1)[0].strip() for x in lines[1:]] == [f"{f}:{n}" for n in (2, 3, 4, 5, 6, 7, 8)]
    assert "not JSON" in lines[1] and "no user message with text" in lines[2] and "no user message" in lines[3]
    assert (
        "not text (image_url)" in lines[4] and "token ids" in lines[5] and "50 tokens, over the limit of 20" in lines[6]
    )
    t = read_traffic(f, count, max_prompt_tokens=20, skip_invalid=True)
    assert [p["messages"] for p in t.prompts] == [[user("fine")]] and len(t.problems) == 7


def test_the_heldout_slice_is_chosen_by_hash_not_by_order():
    prompts = [{"id": prompt_id([user(f"q{i}")]), "messages": [user(f"q{i}")]} for i in range(50)]
    train, held = split_heldout(prompts, 10)
    shuffled = random.Random(0).sample(prompts, len(prompts))
    train2, held2 = split_heldout(shuffled, 10)
    assert len(held) == 10 and len(train) == 40
    assert {p["id"] for p in held} == {p["id"] for p in held2} and not {p["id"] for p in train} & {
        p["id"] for p in held
    }
    rank = sorted(prompts, key=lambda p: hashlib.sha1(f"adapt:{p['id']}".encode()).hexdigest())
    assert {p["id"] for p in held} == {p["id"] for p in rank[:10]}


# ---------------------------------------------------------------- the adapted run's config and data


def test_saved_overrides_rebuild_a_run_config():
    from omegaconf import OmegaConf

    from draftsmith.train.config import compose_config

    cfg = compose_config(
        ["conf=eagle3_smollm2", "optim.lr=0.00123", "data.max_length=777", "target.aux_layer_ids=[1,2,3]"]
    )
    saved = OmegaConf.to_container(cfg, resolve=True)
    saved["data"]["features_dir"] = "/some/where's:odd"  # quotes and colons survive
    rebuilt = OmegaConf.to_container(compose_config(saved_overrides(saved)), resolve=True)
    assert rebuilt == saved
    assert saved["data"]["also"][2] == {"path": "regen:pycode:stdlib", "regen_temperature": 0.7, "seed": 1}
    # a key an older run saved that this version no longer has is left out, not an error
    saved["data"]["retired_key"] = 1
    assert not any(o.startswith("data.retired_key") for o in saved_overrides(saved))
    assert hydra_value({"a": [1, None, True, "x'y"]}) == "{a:[1,null,true,'x\\'y']}"


def test_replay_scales_every_source_of_head(tmp_path):
    (tmp_path / "data_stats.json").write_text(json.dumps({"train_conversations": 1000, "also": [{"kept": 600}]}))
    saved = {"data": {"path": "regen:sharegpt", "also": [{"path": "regen:pycode:stdlib", "seed": 1}]}}
    entries, n = replay_entries(saved, tmp_path, n_traffic=200, share=0.5)  # 200 traffic : 200 replayed
    assert entries == [
        {"path": "regen:sharegpt", "num_conversations": 80},
        {"path": "regen:pycode:stdlib", "seed": 1, "num_conversations": 120},
    ]
    assert n == 200
    assert replay_entries(saved, tmp_path, 200, 0.0) == ([], 0)
    assert replay_entries(saved, tmp_path, 10_000, 0.9)[1] == 1000  # never more than HEAD had
    (tmp_path / "data_stats.json").write_text("{}")
    with pytest.raises(ConfigError, match="data_stats.json"):
        replay_entries(saved, tmp_path, 200, 0.5)


def test_also_takes_a_size_and_exclude_ids_keeps_conversations_out(tmp_path, tokenizer):
    from omegaconf import OmegaConf

    from draftsmith.train.config import DataConfig, compose_config, config_problems
    from draftsmith.train.data.dataset import prepare_data

    main = write_lines(tmp_path / "main.jsonl", conversations(12))
    extra = [dict(c, id=f"x{i}") for i, c in enumerate(conversations(10))]
    write_lines(tmp_path / "extra.jsonl", extra)
    excluded = write_lines(tmp_path / "held.jsonl", [{"id": "x1", "messages": []}, {"id": "c5"}])
    cfg = OmegaConf.merge(
        OmegaConf.structured(DataConfig),
        {
            "path": str(main),
            "heldout": 2,
            "max_length": 128,
            "also": [{"path": str(tmp_path / "extra.jsonl"), "num_conversations": 4}],
            "exclude_ids": str(excluded),
        },
    )
    data = prepare_data(cfg, tokenizer, None)
    held = {p["id"] for p in data.heldout_prompts}
    assert data.stats["also"][0]["kept"] == 3 and data.stats["also"][0]["excluded_ids"] == 1  # x0, x2, x3; not x1
    assert data.stats["train_conversations"] == 12 - 2 - (0 if "c5" in held else 1) + 3
    without = prepare_data(OmegaConf.merge(cfg, {"exclude_ids": None, "also": []}), tokenizer, None)
    assert without.stats["train_conversations"] == 10

    bad = compose_config(["data.also=[{path: data.jsonl, regen_temperature: 0.7}, {path: x, num_conversations: 0}]"])
    problems = "\n".join(config_problems(bad))
    assert "data.also[0].path=data.jsonl: regen_temperature make a regen:SOURCE set" in problems
    assert "data.also[1].num_conversations=0" in problems


def test_the_promotion_rule():
    def result(**per_workload):
        return {
            w: {
                "none": {"status": "ok", "tokens_per_target_step": 1.0},
                "current": {"status": "ok", "tokens_per_target_step": c},
                "adapted": {"status": "ok", "tokens_per_target_step": a, "match_vs_none": m},
            }
            for w, (c, a, m) in per_workload.items()
        }

    ok, gains, why = decide(result(traffic=(1.5, 1.8, 1.0), chat=(1.9, 1.86, 1.0)), 1.0, 0.03)
    assert ok and not why and gains == pytest.approx({"traffic": 1.2, "chat": 1.86 / 1.9})
    ok, _, why = decide(result(traffic=(1.5, 1.8, 1.0), chat=(1.9, 1.80, 1.0)), 1.0, 0.03)
    assert not ok and why == ["chat: 0.947x HEAD's tokens per step, below 1 - --tolerance = 0.97"]
    ok, _, why = decide(result(traffic=(1.5, 1.5, 1.0)), 1.0, 0.03)
    assert not ok and "not above --min-gain 1" in why[0]
    ok, _, why = decide(result(traffic=(1.5, 1.9, 0.9)), 1.0, 0.03)
    assert not ok and why == ["traffic: 10% of the adapted head's outputs differ from no speculation's"]
    failed = result(traffic=(1.5, 1.9, 1.0))
    failed["traffic"]["adapted"] = {"status": "failed"}
    assert not decide(failed, 1.0, 0.03)[0]


def test_init_from_continues_a_head_and_refuses_another_shape(tmp_path, tiny_target_dir, head_run):
    from omegaconf import open_dict

    from draftsmith.train.build import build_head, init_checkpoint
    from draftsmith.train.checkpoint import load_head, resolve_checkpoint
    from draftsmith.train.config import compose_config
    from draftsmith.train.data.vocab import vocab_from_d2t
    from draftsmith.train.heads import families
    from draftsmith.train.target import Target

    saved = yaml.safe_load((head_run / "config.yaml").read_text())
    cfg = compose_config(saved_overrides(saved) + [f"head.init_from={resolve_checkpoint(head_run)}"])
    target = Target.from_pretrained(str(tiny_target_dir), [1, 3, 4])
    _, state = init_checkpoint(cfg.head, families.get("eagle3"))
    head = build_head(cfg.head, target, vocab_from_d2t(state["d2t"], 49152))
    _, want = load_head(head_run)
    got = head.state_dict()
    assert all((got[k] == v).all() for k, v in want.items()) and set(want) <= set(got)
    with open_dict(cfg):
        cfg.head.num_layers = 2
    with pytest.raises(ConfigError, match="num_layers"):
        build_head(cfg.head, target, vocab_from_d2t(state["d2t"], 49152))
    with open_dict(cfg):
        cfg.head.family = "peagle"
    with pytest.raises(ConfigError, match="holds a 'eagle3' head, not peagle"):
        init_checkpoint(cfg.head, families.get("peagle"))


# ---------------------------------------------------------------- the whole loop on a tiny target


@pytest.fixture(scope="module")
def head_run(tiny_target_dir, data_file):  # noqa: F811
    """A tiny chat-trained head of tests/test_train.py (the whole vocab, so a random target's picks are draftable)."""
    out = data_file.parent / "head"
    run_train(tiny_target_dir, data_file, out, "head.draft_vocab_size=49152", "data.regen_max_tokens=24")
    return out


def code_traffic(path: Path, n: int = 40) -> Path:
    """Code-completion requests (the tiny head trained on chat), one repeated, one broken line."""
    lines = [
        {"model": "m", "messages": [user(f'Complete:\ndef f{i}(x):\n    """Return x times {i}."""\n')]}
        for i in range(n)
    ]
    return write_lines(path, [*lines, lines[3], "{broken"])


def adapt(head, traffic, out, work, *extra, judge="reference"):
    args = [sys.executable, "-m", "draftsmith.cli", "adapt", str(head), "--traffic", str(traffic), "--out", str(out)]
    args += ["--work", str(work), "--skip-invalid", "--regen-backend", "hf", "--judge", judge]
    args += ["--workloads", "traffic,chat", "--num-prompts", "3", "--max-tokens", "12", "--minutes", "1"]
    # HEAD trained on online features; its adapted run extracts its own, as the presets do
    args += [*extra, "data.features=offline", "optim.max_steps=16", "optim.max_minutes=null", "eval_every=8"]
    env = {**os.environ, "WANDB_MODE": "disabled", "DRAFTSMITH_CACHE": str(head.parent / "cache")}
    return subprocess.run(args, capture_output=True, text=True, timeout=900, env=env, cwd=head.parent)


def test_adapt_promotes_a_winner_and_never_a_loser(head_run, tmp_path):
    traffic = code_traffic(tmp_path / "traffic.jsonl")
    out, work = tmp_path / "exported", tmp_path / "work"
    proc = adapt(head_run, traffic, out, work)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"{traffic}:42: not JSON" in proc.stdout  # the broken line, named, and skipped
    summary = json.loads((work / "adapt_summary.json").read_text())
    t = summary["traffic"]
    assert (t["requests"], t["unique"], t["duplicates"], t["skipped"], t["heldout"]) == (42, 40, 1, 1, 8)
    judged = summary["judge"]["traffic"]
    assert judged["adapted"]["tokens_per_target_step"] > judged["current"]["tokens_per_target_step"]
    assert summary["promoted"] and summary["gains"]["traffic"] > 1.0
    assert json.loads((out / "config.json").read_text()) == json.loads((work / "candidate" / "config.json").read_text())
    assert "Verdict: promoted" in (out / "adapt_report.md").read_text()
    assert "Complete:" not in (work / "report.md").read_text()  # no prompt text without --show-prompts

    # the adapted run: HEAD's weights and vocab, the traffic's answers (not its held-out slice) + replay, HEAD's
    # held-out conversations kept out
    run_cfg = yaml.safe_load((work / "run" / "config.yaml").read_text())
    assert run_cfg["head"]["init_from"].startswith(str(head_run))
    assert run_cfg["data"]["exclude_ids"] == str(work / "head_heldout.jsonl")
    answered = {json.loads(x)["id"] for x in (work / "traffic_answers.jsonl").read_text().splitlines()}
    held = {json.loads(x)["id"] for x in (work / "traffic_heldout.jsonl").read_text().splitlines()}
    assert len(answered) == 32 and not answered & held
    trained = json.loads((head_run / "data_stats.json").read_text())["train_conversations"]
    replayed = min(trained, len(answered))  # --replay 0.5: as many of HEAD's as the traffic's
    assert run_cfg["data"]["also"] == [{"path": str(head_run.parent / "chats.jsonl"), "num_conversations": replayed}]

    # a run that fails (here: an override its config check refuses) promotes nothing and leaves the export as it is
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    proc = adapt(head_run, traffic, out, work, "optim.lr=-1")
    assert proc.returncode == 2 and "optim.lr" in proc.stderr, proc.stderr[-2000:]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before

    # judged again under a bar it cannot reach: not promoted, the export in place untouched
    proc = adapt(head_run, traffic, out, work, "--min-gain", "1000")
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "not promoted" in proc.stdout and "not above --min-gain 1000" in (work / "report.md").read_text()
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before and not (tmp_path / "exported.previous").exists()

    # other traffic into the same work dir would mix two runs' answers: refused before anything there changes
    other = code_traffic(tmp_path / "other.jsonl", n=12)
    other.write_text(other.read_text().replace("Complete:", "Finish:"))
    proc = adapt(head_run, other, out, work)
    assert proc.returncode == 2 and f"{work} holds an adapt run of another traffic" in proc.stderr, proc.stderr[-2000:]

    # --forget: the work dir and the cache entries made from the traffic are gone
    private = json.loads((work / "adapt.json").read_text())["private_paths"]
    assert len(private) == 2 and all(Path(p).exists() for p in private)  # its prepared data and its features
    env = {**os.environ, "DRAFTSMITH_CACHE": str(head_run.parent / "cache")}
    subprocess.run([sys.executable, "-m", "draftsmith.cli", "adapt", "--forget", str(work)], check=True, env=env)
    assert not work.exists() and not any(Path(p).exists() for p in private)


@pytest.mark.slow
def test_adapt_judged_in_vllm(head_run, tmp_path):
    """The same loop with the served judge: vLLM serves HEAD and the adapted head on the tiny target, every greedy
    output equal to no speculation's."""
    traffic = code_traffic(tmp_path / "traffic.jsonl")
    out, work = tmp_path / "exported", tmp_path / "work"
    proc = adapt(head_run, traffic, out, work, judge="vllm")
    assert proc.returncode in (0, 3), proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((work / "adapt_summary.json").read_text())
    for w in ("traffic", "chat"):
        methods = summary["judge"][w]
        assert {m["status"] for m in methods.values()} == {"ok"}
        assert methods["adapted"]["match_vs_none"] == 1.0 and methods["current"]["match_vs_none"] == 1.0
    assert summary["promoted"] == (proc.returncode == 0) == out.exists()
