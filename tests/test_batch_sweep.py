"""The batch-size axis of `draftsmith eval acceptance` and the k schedule made from it (fast; a served sweep in the
slow tier)."""

import json

import pytest
import torch

from draftsmith.eval.acceptance_report import format_sweep, plot_sweep
from draftsmith.eval.schedule import main as schedule_main
from draftsmith.eval.schedule import make_schedule
from draftsmith.serve.recipe import ScheduleError, check_schedule, read_schedule


def test_check_schedule_refuses_what_vllm_would_read_otherwise():
    assert check_schedule([[5, 16, 0], [1, 4, 3]], 3) == [[1, 4, 3], [5, 16, 0]]  # sorted
    assert check_schedule([[1, 4, 3], [5, 16, 0]], 3, max_num_seqs=64) == [[1, 4, 3], [5, 64, 0]]
    cases = {
        "gap": ([[1, 4, 3], [6, 16, 2]], "batch sizes 5..5 are in no range"),
        "overlap": ([[1, 8, 3], [5, 16, 2]], "batch sizes 5..8 are in two ranges"),
        "start": ([[2, 16, 3]], "batch sizes 1..1 are in no range"),
        "k above": ([[1, 16, 5]], "k=5 for batch sizes 1..16 is outside 0..3"),
        "reversed": ([[4, 1, 3]], "range 4..1"),
        "shape": ([[1, 16]], "is not \\[first, last, k\\]"),
        "empty": ([], "non-empty list"),
    }
    for schedule, why in cases.values():
        with pytest.raises(ScheduleError, match=why):
            check_schedule(schedule, 3)


def test_read_schedule_from_json_or_file(tmp_path):
    assert read_schedule("[[1, 4, 3], [5, 16, 0]]") == [[1, 4, 3], [5, 16, 0]]
    f = tmp_path / "schedule.json"
    f.write_text(json.dumps({"num_speculative_tokens_per_batch_size": [[1, 8, 2]]}))
    assert read_schedule(str(f)) == [[1, 8, 2]]
    with pytest.raises(ScheduleError, match="not JSON"):
        read_schedule("1-4:3")


def sweep_result(k, speedups: dict[int, float], path="chat.jsonl"):
    """An acceptance.json with a sweep: the head `h` at the given speed-ups over none per batch size."""
    entries = []
    for b, x in speedups.items():
        row = {
            "status": "ok",
            "speedup_vs_none": x,
            "tokens_per_target_step": 1.8,
            "output_tokens_per_s": 10 * x,
            "match_vs_none": 1.0,
        }
        none = {
            "status": "ok",
            "speedup_vs_none": 1.0,
            "tokens_per_target_step": 1.0,
            "output_tokens_per_s": 10.0,
            "match_vs_none": None,
        }
        entries.append({"batch_size": b, "methods": {"none": none, "h": row}})
    return {
        "k": k,
        "sweep": entries,
        "engine": {"k_schedule": None},
        "num_prompts": 4,
        "prompts_file": path,
        "max_tokens": 16,
        "temperature": 0.0,
    }


def test_schedule_speculates_only_where_it_wins():
    chat = sweep_result(3, {1: 1.6, 4: 1.2, 8: 0.95, 16: 0.8})
    mt = sweep_result(3, {1: 1.4, 4: 1.05, 8: 0.9, 16: 0.7})
    schedule, evidence = make_schedule([chat, mt], "h")
    assert schedule == [[1, 4, 3], [5, 256, 0]]
    assert [e["k"] for e in evidence] == [3, 3, 0, 0]
    assert evidence[1]["speedup_by_k"]["3"] == pytest.approx((1.2 * 1.05) ** 0.5, abs=1e-3)
    # with k=1 measured too, each batch size takes the faster k
    k1 = sweep_result(1, {1: 1.3, 4: 1.25, 8: 1.1, 16: 0.9})
    schedule, _ = make_schedule([sweep_result(3, {1: 1.6, 4: 1.2, 8: 0.95, 16: 0.8}), k1], "h")
    assert schedule == [[1, 1, 3], [2, 8, 1], [9, 256, 0]]
    with pytest.raises(ValueError, match="no method 'other'"):
        make_schedule([chat], "other")
    with pytest.raises(ValueError, match="no batch-size sweep"):
        make_schedule([{"k": 3, "engine": {}}], "h")


def test_schedule_cli_and_sweep_table(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    result = sweep_result(3, {1: 1.5, 8: 0.9})
    (run / "acceptance.json").write_text(json.dumps(result))
    out = tmp_path / "schedule.json"
    assert schedule_main([str(run), "--head", "h", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["num_speculative_tokens_per_batch_size"] == [[1, 1, 3], [2, 256, 0]]
    assert "batch   8: k=3: 0.90x -> k=0" in capsys.readouterr().out
    assert schedule_main([str(tmp_path / "nothing"), "--head", "h", "--out", str(out)]) == 2
    table = format_sweep(result)
    assert "| h | 1.80, 15.0, **1.50x** | 1.80, 9.0, **0.90x** | 1.00 |" in table
    plot_sweep(result, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000


def _cell(tok_s: float, accepted: int, outputs=((1, 2, 3),)) -> dict:
    """One served round of a sweep cell as the engine process reports it (100 tokens at tok_s)."""
    return {
        "generated_tokens": 100,
        "generation_s": 100 / tok_s,
        "draft_s": 0.5,
        "draft_calls": 50,
        "process_s": 9.0,
        "counters": {"num_drafts": 50, "num_accepted_tokens": accepted, "num_accepted_tokens_per_pos": [accepted, 0]},
        "counters_at_start": {},
        "output_token_ids": [list(o) for o in outputs],
        "prompt_tokens": 10,
        "engine_start_s": 1.0,
        "import_s": 1.0,
        "torch_threads": 1,
        "result_file": "r.json",
    }


def test_repeats_pair_each_round_with_no_speculation_in_the_same_round():
    """The machine slows down in round 2 for both methods: the per-round ratios stay 1.1x and 1.2x, and the cell's
    figure is their median, not the ratio of means a drifting machine would bias."""
    from draftsmith.eval.acceptance_rows import merge_rounds, rows_at

    none = merge_rounds([_cell(100, 0), _cell(50, 0), _cell(100, 0)])
    head = merge_rounds([_cell(110, 20), _cell(60, 20), _cell(120, 20)])
    assert none["rounds_tok_s"] == pytest.approx([100, 50, 100])
    assert head["generated_tokens"] == 300 and head["draft_calls"] == 150
    assert head["counters"] == {"num_drafts": 150, "num_accepted_tokens": 60, "num_accepted_tokens_per_pos": [60, 0]}
    assert head["round_mismatches"] == []
    children = {"none": {**none, "sweep": [none]}, "h": {**head, "sweep": [head]}}
    rows = rows_at(0, ["none", "h"], children, {"none": None, "h": {"method": "eagle3"}}, 0.0)
    assert rows["h"]["speedup_rounds"] == pytest.approx([1.1, 1.2, 1.2])
    assert rows["h"]["speedup_vs_none"] == pytest.approx(1.2)
    assert rows["h"]["output_tokens_per_s"] == pytest.approx(300 / (100 / 110 + 100 / 60 + 100 / 120))
    assert rows["h"]["tokens_per_target_step"] == pytest.approx(300 / 240)
    # a round whose outputs differ from the first is named
    odd = merge_rounds([_cell(100, 0), _cell(100, 0, outputs=((1, 2, 4),))])
    assert odd["round_mismatches"] == [2]
    assert merge_rounds([none]) is none


def test_bad_sweep_arguments_are_refused_before_any_engine(tmp_path):
    from draftsmith.eval.acceptance import run_acceptance

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    common = dict(k=3, max_tokens=4, num_prompts=None, out_dir=str(tmp_path / "o"))
    with pytest.raises(ValueError, match="above the engine's max_num_seqs=8"):
        run_acceptance("smollm2", str(prompts), ["none"], {}, batch_sizes=[1, 16], max_num_seqs=8, **common)
    with pytest.raises(ValueError, match="distinct integers >= 1"):
        run_acceptance("smollm2", str(prompts), ["none"], {}, batch_sizes=[0, 4], **common)
    with pytest.raises(ValueError, match="give batch sizes too"):
        run_acceptance("smollm2", str(prompts), ["none"], {}, repeats=3, **common)
    with pytest.raises(ValueError, match="an integer >= 1"):
        run_acceptance("smollm2", str(prompts), ["none"], {}, batch_sizes=[4], repeats=0, **common)
    with pytest.raises(ScheduleError, match="in no range"):
        run_acceptance("smollm2", str(prompts), ["none"], {}, k_schedule=[[2, 4, 3]], **common)
    with pytest.raises(ValueError, match="k schedules for \\['other'\\], which are not heads"):
        run_acceptance("smollm2", str(prompts), ["none"], {}, k_schedule={"other": [[1, 4, 3]]}, **common)
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_served_sweep_and_schedule_on_tiny_target(tiny_target_dir, tmp_path):
    """A fresh engine per method, batch size and round; a P-EAGLE head's schedule with k = 0 at batch 2 and up is
    accepted by vLLM and drafts nothing there; greedy outputs equal no speculation's at every batch size and round."""
    import sys

    import torch
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from test_vllm_contract import make_head

    from draftsmith.eval.acceptance import run_acceptance
    from draftsmith.export.vllm import export_eagle3

    model = AutoModelForCausalLM.from_pretrained(tiny_target_dir, dtype=torch.float32).eval()
    head = make_head(model, parallel_drafting=True, mask_token_id=2)
    exported = export_eagle3(
        head.trainable_state_dict(),
        head.config,
        tmp_path / "p",
        verifier=str(tiny_target_dir),
        k=3,
        target_config=model.config,
    )
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Count to {n}: one two three"}) + "\n" for n in range(4)))
    # one sweep, 8 engines (each ~30 s here): no speculation and the head with a schedule, 2 batch sizes, 2 rounds
    sched = run_acceptance(
        str(tiny_target_dir),
        str(prompts),
        ["none"],
        {"p": str(exported)},
        out_dir=str(tmp_path / "sched"),
        k_schedule=[[1, 1, 3], [2, 4, 0]],
        repeats=2,
        k=3,
        max_tokens=12,
        num_prompts=None,
        batch_sizes=[1, 2],
        max_num_seqs=4,
    )
    assert [s["batch_size"] for s in sched["sweep"]] == [1, 2]
    assert (tmp_path / "sched" / "sweep.md").is_file()
    assert (tmp_path / "sched" / "plots" / "speedup_vs_batch.png").is_file()
    assert sched["methods"]["p"]["speculative_config"]["parallel_drafting"] is True
    one, two = (s["methods"]["p"] for s in sched["sweep"])
    for row in (one, two):
        assert row["status"] == "ok" and row["speedup_vs_none"] > 0, row
    assert len(one["speedup_rounds"]) == 2 and (tmp_path / "sched" / "runs" / "p.bs2.r2.result.json").is_file()
    assert one["speculative_config"]["num_speculative_tokens_per_batch_size"] == [[1, 1, 3], [2, 4, 0]]
    assert one["counters"]["num_drafts"] > 0 and one["match_vs_none"] == 1.0
    # batch 2: k = 0 while both requests run (a request finishing early leaves a batch of 1, which drafts)
    assert two["counters"]["num_drafts"] < one["counters"]["num_drafts"] and two["match_vs_none"] == 1.0


def test_each_heads_draft_vocab_coverage_of_the_targets_outputs_is_reported(tmp_path):
    """A head's row carries the share of no speculation's output tokens its exported t2d holds (a token outside is a
    sure rejection); a method without a draft vocab gets none, and the markdown names each head's share."""
    from safetensors.torch import save_file

    from draftsmith.eval.acceptance_report import format_table
    from draftsmith.eval.acceptance_rows import rows_at

    t2d = torch.zeros(8, dtype=torch.bool)
    t2d[[1, 2, 5]] = True
    head, full = tmp_path / "head", tmp_path / "full"
    head.mkdir(), full.mkdir()
    save_file({"d2t": torch.tensor([1, 1, 3]), "t2d": t2d}, str(head / "model.safetensors"))
    save_file({"fc.weight": torch.zeros(2, 2)}, str(full / "model.safetensors"))  # drafts over the whole vocab
    outputs = ((1, 2, 3), (4, 5))  # 3 of these 5 tokens are in the head's draft vocab
    cell = _cell(100, 0, outputs=outputs)
    children = {n: {**cell, "sweep": [cell]} for n in ("none", "ngram", "h", "f")}
    spec = {"none": None, "ngram": {"method": "ngram"}, "h": {"method": "eagle3", "model": str(head)},
            "f": {"method": "eagle3", "model": str(full)}}  # fmt: skip
    rows = rows_at(0, list(children), children, spec, 0.0)
    assert rows["h"]["draft_vocab_coverage"] == pytest.approx(3 / 5)
    assert [n for n in rows if "draft_vocab_coverage" in rows[n]] == ["h"]
    result = {"k": 3, "num_prompts": 2, "prompts_file": "p.jsonl", "max_tokens": 4, "temperature": 0.0,
              "target": "t", "versions": {}, "methods": rows}  # fmt: skip
    assert format_table(result).splitlines()[-1].endswith("sure rejection): h 60.0%")
