"""Chat templates with reasoning and tool calls: what a draft head is trained on is what the model generates.

`data/qwen3_chat_template.jinja` is the chat template Qwen3 checkpoints ship (tokenizer_config.json), the thing under
test: thinking and non-thinking modes (`enable_thinking`, passed as vLLM's chat_template_kwargs are), reasoning it
renders only for the turns after the last user query, tool calls written after the answer, tool results as user
turns. It runs on the SmolLM2 tokenizer (the same ChatML special tokens); no Qwen3 vocabulary is needed to check
which characters are supervised.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftsmith.errors import DataError
from draftsmith.train.data.conversations import ReadStats, _convert
from draftsmith.train.data.render import (
    TemplateOptions,
    chat_text,
    render,
    render_prompt,
    set_template_options,
)

QWEN3 = (Path(__file__).parent / "data" / "qwen3_chat_template.jinja").read_text()


@pytest.fixture
def qwen3(smollm2_dir):
    """A fresh tokenizer per test (the template options live with the tokenizer object) with Qwen3's template."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    tok.chat_template = QWEN3
    return tok


def supervised(tok, sample) -> str:
    """The supervised tokens' text, runs joined by '¦' (a gap between runs is unsupervised text)."""
    runs, cur = [], []
    for i, m in zip(sample.input_ids, sample.loss_mask):
        if m:
            cur.append(i)
        elif cur:
            runs.append(tok.decode(cur))
            cur = []
    if cur:
        runs.append(tok.decode(cur))
    return "¦".join(runs)


def convert(record: dict):
    stats = ReadStats()
    conv = _convert(record, "test.jsonl:1", stats)
    assert conv is not None, stats.examples
    return conv.messages


def test_non_thinking_mode_supervises_the_answer_not_the_empty_think_block(qwen3):
    set_template_options(qwen3, TemplateOptions.of({"enable_thinking": False}))
    messages = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "It is 4."}]
    prompt = qwen3.decode(render_prompt(qwen3, messages[:1]))
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # what vLLM serves in this mode
    s = render(qwen3, messages, 512)
    # the template writes an empty think block into the answer's turn; the model never generates it
    assert "<think>\n\n</think>\n\n" in qwen3.decode(s.input_ids)
    assert supervised(qwen3, s) == "It is 4.<|im_end|>"


def test_thinking_mode_supervises_the_reasoning_the_model_generates(qwen3):
    record = {
        "messages": [
            {"role": "user", "content": "Name a prime."},
            {"role": "assistant", "content": "<think>\nSmall primes: 2, 3, 5.\n</think>\n\nThree."},
            {"role": "user", "content": "Another?"},
            {"role": "assistant", "content": "Seven.", "reasoning_content": "Skip 3 and 5; 7 is next."},
        ]
    }
    messages = convert(record)  # inline <think> moves to reasoning_content, as vLLM's reasoning parser returns it
    assert messages[1] == {"role": "assistant", "content": "Three.", "reasoning_content": "Small primes: 2, 3, 5."}
    s = render(qwen3, messages, 512)
    text = qwen3.decode(s.input_ids)
    # Qwen3 drops the reasoning of turns before the last user query; the last turn's is rendered
    assert "Small primes" not in text and "<think>\nSkip 3 and 5; 7 is next.\n</think>\n\nSeven." in text
    # the earlier answer: its text; the last: everything after "<|im_start|>assistant\n", <think> included
    assert supervised(qwen3, s) == "Three.<|im_end|>¦<think>\nSkip 3 and 5; 7 is next.\n</think>\n\nSeven.<|im_end|>"
    assert render_prompt(qwen3, messages[:3])[-3:] == qwen3("<|im_start|>assistant\n")["input_ids"][-3:]


def test_reasoning_drop_leaves_no_reasoning_and_supervises_only_answers(qwen3):
    set_template_options(qwen3, TemplateOptions.of({}, "drop"))
    messages = convert(
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "<think>hmm</think>Hello!"}]}
    )
    s = render(qwen3, messages, 512)
    assert "hmm" not in qwen3.decode(s.input_ids)
    assert supervised(qwen3, s) == "Hello!<|im_end|>"  # the template's empty think block stays unsupervised


def test_tool_calls_are_supervised_and_tool_results_are_not(qwen3):
    record = {
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}],
            },
            {"role": "tool", "content": '{"temp": 21}'},
            {"role": "assistant", "content": "It is 21 degrees."},
        ]
    }
    messages = convert(record)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    s = render(qwen3, messages, 512)
    got = supervised(qwen3, s)
    call, answer = got.split("¦")
    assert call == '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
    assert answer.endswith("It is 21 degrees.<|im_end|>") and '"temp"' not in got


def test_a_call_without_its_result_is_trimmed_and_tool_roles_are_checked():
    stats = ReadStats()
    conv = _convert(
        {
            "messages": [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"},
                {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
            ]
        },
        "x.jsonl:3",
        stats,
    )
    assert [m["role"] for m in conv.messages] == ["user", "assistant"]
    assert stats.trimmed["unanswered tool call"] == 1
    bad = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "", "tool_calls": [1]}]}
    assert _convert(bad, "x.jsonl:4", stats) is None and "x.jsonl:4: bad tool call" in stats.examples[-1]


def test_template_options_reach_the_prepared_data_cache_key(qwen3, tmp_path):
    from omegaconf import OmegaConf

    from draftsmith.train.data.dataset import cache_key

    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}))
    cfg = OmegaConf.create({"path": str(data), "max_length": 64, "num_conversations": None, "heldout": 0, "seed": 0})
    plain = cache_key(cfg, qwen3)
    set_template_options(qwen3, TemplateOptions.of({"enable_thinking": False}))
    assert cache_key(cfg, qwen3) != plain
    set_template_options(qwen3, TemplateOptions.of({}, "drop"))
    assert cache_key(cfg, qwen3) not in (plain,)


def test_a_template_that_drops_the_answers_is_one_clear_error(qwen3):
    qwen3.chat_template = (
        "{% for m in messages %}{% if m.role == 'user' %}<|im_start|>user\n{{ m.content }}<|im_end|>\n{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(DataError, match="does not appear verbatim in the rendered chat template"):
        render(qwen3, [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], 64)
    assert chat_text(qwen3, [{"role": "user", "content": "a"}]) == "<|im_start|>user\na<|im_end|>\n"


def test_regeneration_renders_the_mode_it_is_asked_for_and_records_it(tiny_target_dir, tmp_path):
    """`draftsmith regenerate --chat-template-kwargs`: prompts end as the deployment's do (Qwen3 non-thinking: the
    empty think block), every record says which mode answered it, and another mode is another pool."""
    import shutil

    from draftsmith.errors import ConfigError
    from draftsmith.train.data.regenerate import regenerate

    target = tmp_path / "qwen3ish"
    shutil.copytree(tiny_target_dir, target)
    cfg_path = target / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = QWEN3
    cfg_path.write_text(json.dumps(cfg))
    (target / "chat_template.jinja").unlink(missing_ok=True)  # the template file would win over the config's
    src, out = tmp_path / "src.jsonl", tmp_path / "regen.jsonl"
    src.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "messages": [{"role": "user", "content": f"Say {i}."}]}) + "\n" for i in range(3)
        )
    )
    off = {"enable_thinking": False}
    stats = regenerate(str(target), str(src), str(out), max_tokens=4, backend="hf", chat_template_kwargs=off)
    assert stats["generated"] == 3
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert all(r["chat_template_kwargs"] == off for r in recs)
    meta = json.loads((tmp_path / "regen.jsonl.meta.json").read_text())
    assert meta["chat_template_kwargs"] == off
    with pytest.raises(ConfigError, match="other settings"):  # thinking-mode answers never mix into this pool
        regenerate(str(target), str(src), str(out), max_tokens=4, backend="hf")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)
    set_template_options(tok, TemplateOptions.of(off))
    assert tok.decode(render_prompt(tok, recs[0]["messages"][:1])).endswith("<think>\n\n</think>\n\n")
