"""Served acceptance: prompt files, metric arithmetic and the table (fast); real vLLM runs (slow)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from draftsmith.eval.acceptance import run_acceptance
from draftsmith.eval.acceptance_report import format_table
from draftsmith.eval.acceptance_rows import acceptance_metrics, compare_outputs, tokens_per_step
from draftsmith.eval.cli import main as eval_main
from draftsmith.eval.methods import speculative_config
from draftsmith.eval.prompts import PromptFileError, first_turns, load_prompts, render_prompts
from draftsmith.serve.recipe import head_method
from draftsmith.serve.runner import counter_delta, read_spec_counters

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def write_jsonl(path: Path, lines: list) -> Path:
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


# ---------------------------------------------------------------- prompts


def test_load_prompts_every_shape(tmp_path):
    f = write_jsonl(
        tmp_path / "p.jsonl",
        [
            {
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "a reference answer, dropped"},
                ]
            },
            {"prompt": "Say hello."},
            "",  # blank lines are skipped
            {"question_id": 81, "category": "writing", "turns": ["first turn", "second turn"]},
            {"question": "What is 2+2?", "answer": "4"},
        ],
    )
    ps = load_prompts(f)
    assert [p["messages"] for p in ps] == [
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        [{"role": "user", "content": "Say hello."}],
        [{"role": "user", "content": "first turn"}],
        [{"role": "user", "content": "What is 2+2?"}],
    ]
    assert ps[2]["id"] == 81 and ps[2]["category"] == "writing" and ps[2]["line"] == 4
    assert len(load_prompts(f, limit=2)) == 2


@pytest.mark.parametrize(
    "bad, why",
    [
        ("{not json", "not valid JSON"),
        ('["a list"]', "expected a JSON object"),
        ('{"text": "no known key"}', "expected one of the keys"),
        ('{"messages": [{"role": "robot", "content": "x"}]}', "messages[0]"),
        ('{"messages": [{"role": "assistant", "content": "only an answer"}]}', "no user turn"),
        ('{"turns": []}', "'turns' must be"),
        ('{"prompt": ""}', "'prompt' must be"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, bad, why):
    f = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "fine"}, {"question": "fine"}, bad])
    with pytest.raises(PromptFileError) as e:
        load_prompts(f)
    assert f"{f}:3:" in str(e.value) and why in str(e.value)


def test_missing_and_empty_prompt_files(tmp_path):
    with pytest.raises(PromptFileError, match="no such prompt file"):
        load_prompts(tmp_path / "nope.jsonl")
    with pytest.raises(PromptFileError, match="no prompts"):
        load_prompts(write_jsonl(tmp_path / "empty.jsonl", [""]))


def test_first_turns_read_training_data_and_prompt_files(tmp_path):
    """fit-hybrid's --data: what training reads (a ShareGPT .json array, ShareGPT-style JSON lines) or a prompt
    JSONL; each gives the first user turn (after a system message), counted as training counts conversations."""
    sharegpt = [
        {
            "id": "a",
            "conversations": [
                {"from": "human", "value": "Q1"},
                {"from": "gpt", "value": "A1"},
                {"from": "human", "value": "Q2"},
                {"from": "gpt", "value": "A2"},
            ],
        },
        {"id": "junk", "conversations": [{"from": "human", "value": "no answer"}]},  # training skips it
        {
            "id": "b",
            "conversations": [
                {"from": "system", "value": "S"},
                {"from": "human", "value": "Q3"},
                {"from": "gpt", "value": "A3"},
            ],
        },
    ]
    array = tmp_path / "sharegpt.json"
    array.write_text(json.dumps(sharegpt))
    lines = write_jsonl(tmp_path / "sharegpt.jsonl", [json.dumps(r) for r in sharegpt])
    want = [
        [{"role": "user", "content": "Q1"}],
        [{"role": "system", "content": "S"}, {"role": "user", "content": "Q3"}],
    ]
    for path in (array, lines):
        assert [r["messages"] for r in first_turns(str(path))] == want
        assert [r["messages"] for r in first_turns(str(path), 1)] == want[:1]
    chat = [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1"},
        {"role": "user", "content": "Q2"},
    ]
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [json.dumps({"messages": chat}), json.dumps({"prompt": "P"})])
    assert [r["messages"] for r in first_turns(str(prompts))] == [chat[:1], [{"role": "user", "content": "P"}]]
    embedded = list(first_turns("sharegpt", 2))  # the embedded ShareGPT file, as the preset's data reads it
    assert [r["id"] for r in embedded][0] == "QWJhYvA_0" and all(len(r["messages"]) == 1 for r in embedded)
    with pytest.raises(PromptFileError, match="prompts.jsonl:2"):
        list(first_turns(str(write_jsonl(tmp_path / "prompts.jsonl", [json.dumps({"prompt": "P"}), "{oops"]))))


@pytest.mark.parametrize("name, n", [("spec_bench_questions.jsonl", 480), ("gsm8k_test.jsonl", 1319)])
def test_shared_benchmark_files_load(name, n):
    path = SHARED_DATA / name
    if not path.is_file():
        pytest.skip(f"{path} not present")
    ps = load_prompts(path)
    assert len(ps) == n and all(p["messages"][-1]["role"] == "user" for p in ps)


def test_prompts_by_category_take_n_of_each_and_name_what_a_file_has(tmp_path):
    """--category: N prompts of each named category, in file order; a category the file lacks lists the ones it
    has (Spec-Bench's are checked where shared/data holds it)."""
    rows = [json.dumps({"turns": [f"{c}{i}"], "category": c}) for i in range(3) for c in ("qa", "rag", "writing")]
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    got = load_prompts(path, 2, ["rag", "qa"])
    assert [p["messages"][0]["content"] for p in got] == ["qa0", "rag0", "qa1", "rag1"]
    assert len(load_prompts(path, None, ["writing"])) == 3
    with pytest.raises(PromptFileError, match=r"p.jsonl: no prompts of category math; its categories: qa \(3\)"):
        load_prompts(path, 2, ["qa", "math"])
    untagged = write_jsonl(tmp_path / "u.jsonl", [json.dumps({"prompt": "P"})])
    with pytest.raises(PromptFileError, match=r"category qa; its categories: \(no category field\) \(1\)"):
        load_prompts(untagged, 1, ["qa"])
    spec_bench = SHARED_DATA / "spec_bench_questions.jsonl"
    if spec_bench.is_file():
        five = ["translation", "summarization", "qa", "math_reasoning", "rag"]
        got = load_prompts(spec_bench, 4, five)
        assert sorted(p["category"] for p in got) == sorted(five * 4)


def test_render_uses_chat_template_without_extra_bos(tokenizer):
    messages = [{"role": "user", "content": "Hello there"}]
    (ids,) = render_prompts(tokenizer, [{"messages": messages}])
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>assistant\n")
    assert tokenizer.decode(ids) == text  # exactly the template: no special token added in front


# ---------------------------------------------------------------- metrics


def test_acceptance_metrics_from_counters():
    m = acceptance_metrics(
        {"num_drafts": 10, "num_draft_tokens": 30, "num_accepted_tokens": 12, "num_accepted_tokens_per_pos": [6, 4, 2]}
    )
    assert m["acceptance_rate"] == pytest.approx(0.4)
    assert m["mean_acceptance_length"] == pytest.approx(2.2)  # 1 + 12/10
    assert m["per_position_acceptance"] == pytest.approx([0.6, 0.4, 0.2])
    # no speculation at all vs. a speculative engine that never drafted
    assert acceptance_metrics({}) == {
        "acceptance_rate": None,
        "mean_acceptance_length": None,
        "per_position_acceptance": None,
    }
    idle = acceptance_metrics(
        {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "num_accepted_tokens_per_pos": [0, 0, 0]}
    )
    assert idle["mean_acceptance_length"] == 1.0 and idle["acceptance_rate"] is None
    assert tokens_per_step(100, 40) == pytest.approx(100 / 60)
    assert tokens_per_step(50, 0) == 1.0


def test_counters_sum_labels_and_difference():
    metrics = [
        SimpleNamespace(name="vllm:spec_decode_num_drafts", value=7, labels={"engine": "0"}),
        SimpleNamespace(name="vllm:spec_decode_num_drafts", value=3, labels={"engine": "1"}),
        SimpleNamespace(name="vllm:spec_decode_num_draft_tokens", value=30, labels={}),
        SimpleNamespace(name="vllm:spec_decode_num_accepted_tokens", value=12, labels={}),
        SimpleNamespace(name="vllm:spec_decode_num_accepted_tokens_per_pos", values=[5, 3, 1], labels={"engine": "0"}),
        SimpleNamespace(name="vllm:spec_decode_num_accepted_tokens_per_pos", values=[1, 1, 1], labels={"engine": "1"}),
        SimpleNamespace(name="vllm:num_requests_running", value=1, labels={}),
    ]
    after = read_spec_counters(SimpleNamespace(get_metrics=lambda: metrics))
    assert after == {
        "num_drafts": 10,
        "num_draft_tokens": 30,
        "num_accepted_tokens": 12,
        "num_accepted_tokens_per_pos": [6, 4, 2],
    }
    before = {
        "num_drafts": 2,
        "num_draft_tokens": 6,
        "num_accepted_tokens": 2,
        "num_accepted_tokens_per_pos": [1, 1, 0],
    }
    assert counter_delta(after, before) == {
        "num_drafts": 8,
        "num_draft_tokens": 24,
        "num_accepted_tokens": 10,
        "num_accepted_tokens_per_pos": [5, 3, 2],
    }
    assert counter_delta(after, {}) == after


def test_compare_outputs():
    share, mism = compare_outputs([[1, 2, 3], [4, 5], [7, 8, 9]], [[1, 2, 3], [4, 6], [7, 8]])
    assert share == pytest.approx(1 / 3)
    assert mism == [
        {"prompt": 1, "first_diff_at": 1, "len": 2, "len_ref": 2},
        {"prompt": 2, "first_diff_at": 2, "len": 3, "len_ref": 2},
    ]


def test_speculative_configs(tmp_path):
    assert speculative_config("none", 3, {}, 2, 5) is None
    assert speculative_config("ngram", 3, {}, 2, 5) == {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 5,
    }
    assert speculative_config("suffix", 4, {}, 2, 5) == {"method": "suffix", "num_speculative_tokens": 4}
    head = tmp_path / "head"
    head.mkdir()
    (head / "config.json").write_text(json.dumps({"speculators_model_type": "eagle3"}))
    assert speculative_config("mine", 3, {"mine": str(head)}, 2, 5) == {
        "method": "eagle3",
        "model": str(head.resolve()),
        "num_speculative_tokens": 3,
    }
    (head / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))  # native dialect
    assert head_method(str(head)) == "eagle3"
    with pytest.raises(FileNotFoundError, match="no config.json"):
        head_method(str(tmp_path))


def test_run_acceptance_rejects_bad_arguments(tmp_path):
    f = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "x"}])
    common = dict(target="unused", prompts_path=str(f), k=3, max_tokens=8, num_prompts=None, out_dir=str(tmp_path))
    with pytest.raises(ValueError, match="unknown methods"):
        run_acceptance(methods=["medusa"], heads={}, **common)
    with pytest.raises(ValueError, match="clash"):
        run_acceptance(methods=[], heads={"ngram": str(tmp_path)}, **common)
    with pytest.raises(TypeError, match="unknown engine settings"):
        run_acceptance(methods=["none"], heads={}, gpu_memory_utilization=0.5, **common)


def test_cli_reports_bad_prompt_file(tmp_path, capsys):
    f = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "ok"}, "{oops"])
    rc = eval_main(["acceptance", "--target", "unused", "--prompts", str(f), "--out", str(tmp_path / "o")])
    assert rc == 2 and f"{f}:2: not valid JSON" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        eval_main(["acceptance", "--target", "t", "--prompts", str(f), "--out", "o", "--head", "no-equals-sign"])
    with pytest.raises(SystemExit):
        eval_main(["acceptance", "--target", "t", "--prompts", str(f), "--out", "o", "--methods", "none,medusa"])


def fake_result() -> dict:
    ok = dict(status="ok", generated_tokens=256, generation_s=8.0, engine_start_s=4.2, output_tokens_per_s=32.0)
    return {
        "k": 3,
        "num_prompts": 2,
        "prompts_file": "/data/p.jsonl",
        "max_tokens": 128,
        "temperature": 0.0,
        "target": "/models/SmolLM2-135M-Instruct",
        "versions": {"vllm": "0.32.0"},
        "methods": {
            "none": {
                **ok,
                "mean_acceptance_length": None,
                "acceptance_rate": None,
                "per_position_acceptance": None,
                "tokens_per_target_step": 1.0,
                "speedup_vs_none": 1.0,
                "match_vs_none": None,
            },
            "ngram": {
                **ok,
                "mean_acceptance_length": 2.2,
                "acceptance_rate": 0.4,
                "per_position_acceptance": [0.6, 0.4, 0.2],
                "tokens_per_target_step": 1.5,
                "output_tokens_per_s": 40.0,
                "speedup_vs_none": 1.25,
                "match_vs_none": 1.0,
            },
            "mine": {"status": "failed", "error": "exit code 1: ValueError: bad | head"},
        },
    }


def test_format_table():
    md = format_table(fake_result())
    lines = md.splitlines()
    assert lines[0].startswith("k=3, 2 prompts from `p.jsonl`")
    assert lines[2].startswith("| method | τ | α | accept/pos |")
    assert "| none | — | — | — | 1.00 | 32.0 | 1.00 | ref | 256 | 8.0 | 4.2 |" in lines
    assert "| ngram | 2.20 | 0.40 | [0.60, 0.40, 0.20] | 1.50 | 40.0 | 1.25 | 1.00 | 256 | 8.0 | 4.2 |" in lines
    failed = [ln for ln in lines if ln.startswith("| mine |")][0]
    assert "failed: exit code 1: ValueError: bad \\| head" in failed
    assert len({ln.count("|") - ln.count("\\|") for ln in lines[2:]}) == 1  # every row has every column


# ---------------------------------------------------------------- real vLLM (slow)

REPETITIVE = [
    {"prompt": "Repeat this line three times: the quick brown fox jumps over the lazy dog."},
    {
        "messages": [
            {"role": "system", "content": "You copy text exactly."},
            {"role": "user", "content": "Copy: red green blue, red green blue, red green blue, red green blue."},
        ]
    },
    {"turns": ["List the numbers one, two, three, four, five, then list them again."]},
    {
        "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
        "How many clips did Natalia sell altogether in April and May?"
    },
]


@pytest.mark.slow
def test_served_acceptance_tiny_target(tiny_target_dir, tmp_path):
    prompts = write_jsonl(tmp_path / "p.jsonl", REPETITIVE)
    broken = tmp_path / "broken_head"  # a head vLLM cannot load: reported as failed, the others still run
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"speculators_model_type": "eagle3"}))
    out = tmp_path / "out"
    k = 3
    r = run_acceptance(
        str(tiny_target_dir),
        str(prompts),
        ["none", "ngram", "suffix"],
        {"broken": str(broken)},
        k=k,
        max_tokens=32,
        num_prompts=None,
        out_dir=str(out),
    )
    m = r["methods"]
    assert m["broken"]["status"] == "failed" and m["broken"]["error"]
    for name in ("none", "ngram", "suffix"):
        assert m[name]["status"] == "ok", m[name]
        assert m[name]["num_prompts"] == 4 and m[name]["generated_tokens"] > 0
        assert m[name]["generation_s"] > 0 and m[name]["engine_start_s"] > 0
    assert m["none"]["counters"] == {} and m["none"]["mean_acceptance_length"] is None
    for name in ("ngram", "suffix"):
        c = m[name]["counters"]
        assert c["num_drafts"] > 0, name  # the repetitive prompts give lookups something to find
        assert 0 <= c["num_accepted_tokens"] <= c["num_draft_tokens"] <= k * c["num_drafts"]
        assert sum(c["num_accepted_tokens_per_pos"]) == c["num_accepted_tokens"]
        pos = m[name]["per_position_acceptance"]
        assert len(pos) == k and all(a >= b for a, b in zip(pos, pos[1:]))  # a position needs the one before
        assert 1.0 <= m[name]["mean_acceptance_length"] <= k + 1
        # counted from the timed prompts only (the untimed warm-up request drafts too: counters_at_start).
        # Each draft is a decode step emitting 1 + its accepted tokens, prefill emits a prompt's first token,
        # and a request cut at max_tokens can drop up to k accepted tokens.
        assert c["num_drafts"] + c["num_accepted_tokens"] <= m[name]["generated_tokens"] - 4 + 4 * k
        assert m[name]["counters_at_start"]["num_drafts"] >= 0
        assert m[name]["match_vs_none"] is not None
    saved = json.loads((out / "acceptance.json").read_text())
    assert saved["methods"]["ngram"]["counters"] == m["ngram"]["counters"]
    assert saved["methods"]["ngram"]["speculative_config"]["method"] == "ngram"
    assert {"vllm", "torch", "transformers"} <= set(saved["versions"])
    assert saved["engine"]["enforce_eager"] is True and saved["engine"]["dtype"] == "float32"
    md = (out / "acceptance.md").read_text()
    assert "| ngram |" in md and "| broken | failed" in md

    # reuse_baselines (the quickstart: baselines before training, the head after): the identical jobs are taken from
    # runs/, not served again; a changed job is served anew
    again = run_acceptance(
        str(tiny_target_dir), str(prompts), ["none", "ngram", "suffix"], {}, k=k, max_tokens=32, num_prompts=None,
        out_dir=str(out), reuse_baselines=True,
    )  # fmt: skip
    for name in ("none", "ngram", "suffix"):
        a, b = again["methods"][name], m[name]
        assert (a["counters"], a["generation_s"], a["process_s"]) == (b["counters"], b["generation_s"], b["process_s"])
        assert a["match_vs_none"] == b["match_vs_none"]
    shorter = run_acceptance(
        str(tiny_target_dir), str(prompts), ["none"], {}, k=k, max_tokens=8, num_prompts=None, out_dir=str(out),
        reuse_baselines=True,
    )  # fmt: skip
    assert shorter["methods"]["none"]["generated_tokens"] <= 4 * 8 < m["none"]["generated_tokens"]
