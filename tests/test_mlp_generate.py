"""Stage-2 generation: the target's own continuations (HF and vLLM backends agree) and the on-disk cache."""

import pytest
import torch

from draftsmith.generate import cache_key, cached_generate, generate

PROMPTS = [[1, 422, 1520, 314, 253], [1, 3437, 30], [1, 9, 8, 7, 6, 5, 4]]


def greedy_reference(model, prompt, n):
    """Plain greedy decoding, one full forward per token."""
    ids = list(prompt)
    for _ in range(n):
        with torch.no_grad():
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def test_hf_generate_is_the_targets_greedy_continuation(tiny_target_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_target_dir, dtype=torch.float32).eval()
    outs = generate(str(tiny_target_dir), PROMPTS, max_tokens=6, temperature=0.0, backend="hf", batch_size=2)
    assert outs == [greedy_reference(model, p, 6) for p in PROMPTS]
    a = generate(str(tiny_target_dir), PROMPTS, max_tokens=6, temperature=1.0, seed=3, backend="hf")
    b = generate(str(tiny_target_dir), PROMPTS, max_tokens=6, temperature=1.0, seed=3, backend="hf")
    assert a == b and a != outs  # sampled: reproducible per seed, and not the greedy path
    with pytest.raises(ValueError, match="at least one token"):
        generate(str(tiny_target_dir), [[]], 4, backend="hf")


def test_cached_generate_reuses_and_keys_on_settings(tiny_target_dir, tmp_path):
    said = []
    first = cached_generate(str(tiny_target_dir), PROMPTS, 5, 0.0, 0, tmp_path, backend="hf", log=said.append)
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1 and not list(tmp_path.glob(".tmp-*"))
    again = cached_generate(str(tiny_target_dir), PROMPTS, 5, 0.0, 0, tmp_path, backend="hf", log=said.append)
    assert again == first and "from cache" in said[-1]
    assert cache_key(str(tiny_target_dir), PROMPTS, 5, 0.0, 0, "hf") != cache_key(
        str(tiny_target_dir), PROMPTS, 5, 0.7, 0, "hf"
    )
    files[0].write_text("{not json")  # a damaged cache is regenerated, not trusted
    assert cached_generate(str(tiny_target_dir), PROMPTS, 5, 0.0, 0, tmp_path, backend="hf", log=said.append) == first


@pytest.mark.slow
def test_vllm_generate_equals_hf_greedy(tiny_target_dir):
    hf = generate(str(tiny_target_dir), PROMPTS, max_tokens=8, temperature=0.0, backend="hf")
    vl = generate(str(tiny_target_dir), PROMPTS, max_tokens=8, temperature=0.0, backend="vllm")
    assert vl == hf


def test_the_engine_process_beats_while_a_batch_runs(capsys):
    """The generation child emits the tokens generated so far every few seconds, whether or not a request has
    finished (a batch of 256-token answers finishes none for minutes), and stops when told."""
    import time
    from types import SimpleNamespace

    from draftsmith.serve.runner import heartbeat, parse_event

    counter = {"n": 0}

    class Engine:
        def get_metrics(self):
            counter["n"] += 7
            return [
                SimpleNamespace(name="vllm:generation_tokens", value=counter["n"]),
                SimpleNamespace(name="x", value=1),
            ]

    stop = heartbeat(Engine(), 0.01)
    time.sleep(0.2)
    stop.set()
    time.sleep(0.05)
    beats = [e for e in map(parse_event, capsys.readouterr().out.splitlines()) if e is not None]
    tokens = [b["tokens"] for b in beats if b["event"] == "heartbeat"]
    assert len(tokens) >= 3 and tokens == sorted(tokens) and tokens[0] % 7 == 0
    time.sleep(0.05)
    assert capsys.readouterr().out == ""  # stopped


@pytest.mark.slow
def test_vllm_generation_reports_tokens_as_it_goes(tiny_target_dir, monkeypatch):
    import draftsmith.generate as gen

    monkeypatch.setattr(gen, "HEARTBEAT_S", 0.01)
    seen: list[int] = []
    outs = [
        ids
        for _, batch, _ in gen.iter_vllm(str(tiny_target_dir), PROMPTS, 64, 0.0, 0, on_tokens=seen.append)
        for ids in batch
    ]
    assert seen and seen == sorted(seen) and seen[-1] <= sum(map(len, outs))


def test_events_survive_log_lines_written_beside_them(capsys):
    """vLLM's stats line once landed between a heartbeat and its newline and the parent's JSON read failed, ending a
    regeneration: an event is written in one call, and read wherever it sits in a line, whatever text is glued to
    it; a line with no event, or a broken one, is a log line."""
    import json
    import threading

    from draftsmith.serve.runner import EVENT, emit, parse_event

    ev = {"event": "heartbeat", "tokens": 18331}
    stats = "(MainProcess pid=1) INFO [loggers.py:335] Engine 000: Avg generation throughput: 171.3 tokens/s"
    assert parse_event(EVENT + json.dumps(ev) + stats + "\n") == ev
    assert parse_event("INFO half a log line " + EVENT + json.dumps(ev) + "\n") == ev
    assert parse_event(stats + "\n") is None and parse_event(EVENT + '{"event": "outp\n') is None

    def emitter(tag):
        for i in range(300):
            emit("outputs", tag=tag, i=i, token_ids=[[i] * 50])

    def logger():
        for i in range(600):
            print("INFO engine stats", i)  # two writes: the text, then its newline

    threads = [threading.Thread(target=emitter, args=(t,)) for t in "ab"] + [threading.Thread(target=logger)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = [e for e in map(parse_event, capsys.readouterr().out.splitlines()) if e is not None]
    assert sorted((e["tag"], e["i"]) for e in got) == sorted((t, i) for t in "ab" for i in range(300))
    assert all(e["token_ids"] == [[e["i"]] * 50] for e in got)
