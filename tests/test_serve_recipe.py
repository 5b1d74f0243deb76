"""`draftsmith serve` without a server (fast): what vLLM is told for an export (method, k, hybrid, schedule), the
refusals that come before any engine starts (a policy for another head or k, a vLLM outside the tested range, the
plugin left out), what re-exporting keeps, and the permissions of what export writes."""

from __future__ import annotations

import json
import os
import stat

import pytest
from conftest import save_beside, skip_policy
from test_export_refusals import make_run, tiny_target

from draftsmith.cli import main as cli
from draftsmith.errors import ConfigError
from draftsmith.serve import compat, metrics
from draftsmith.serve.policy import HybridPolicies
from draftsmith.serve.recipe import plan


@pytest.fixture
def exported(tmp_path):
    target = tiny_target(tmp_path / "target")
    run = make_run(tmp_path / "run", target)
    out = tmp_path / "exported"
    assert cli(["export", "--format", "vllm", str(run), str(out), "--target", str(target)]) == 0
    return run, out, target


def test_the_recipe_serves_the_exports_k_or_the_policys(exported, capsys):
    run, out, target = exported
    alone = plan(out)
    assert (alone.k, alone.hybrid, alone.method, alone.target) == (2, False, "eagle3", str(target))  # TTT depth 2
    assert alone.llm_kwargs() == {
        "speculative_config": {"method": "eagle3", "model": str(out.resolve()), "num_speculative_tokens": 2}
    }
    save_beside(skip_policy(0.5), out)  # fitted at k=3
    hybrid = plan(out)
    assert hybrid.hybrid and hybrid.k == 3 and "hybrid.json" in hybrid.k_from
    assert hybrid.speculative_config["num_speculative_tokens"] == 3
    assert hybrid.additional_config["draftsmith_hybrid"]["policy"] == str(out.resolve())
    assert plan(out, hybrid=False).k == 2
    with pytest.raises(ConfigError, match="was fitted at k=3"):
        plan(out, k=5)
    line = hybrid.vllm_serve_command()
    assert line.startswith(f"vllm serve {target} ") and "--speculative-config" in line and "--additional-config" in line
    (out / "schedule.json").write_text(json.dumps({"num_speculative_tokens_per_batch_size": [[1, 4, 3], [5, 8, 0]]}))
    assert plan(out).speculative_config["num_speculative_tokens_per_batch_size"] == [[1, 4, 3], [5, 8, 0]]

    assert cli(["serve", str(out), "--print-only"]) == 0
    printed = capsys.readouterr().out
    assert "k=3 (the k hybrid.json was fitted at)" in printed and "vllm serve" in printed and "LLM(model=" in printed


def test_a_policy_for_other_weights_is_refused_before_any_engine(exported, capsys):
    run, out, target = exported
    save_beside(skip_policy(0.5), out)
    policies = HybridPolicies.load(out)
    policies.policies[0].fitted_on["head"] = "f" * 40
    policies.save(out)
    assert cli(["serve", str(out), "--print-only"]) == 2
    err = capsys.readouterr().err
    assert "was fitted for another head" in err and "draftsmith eval fit-hybrid" in err and "Traceback" not in err
    assert cli(["serve", str(out), "--print-only", "--no-hybrid"]) == 0  # the head alone is still servable
    (out / "hybrid.json").unlink()
    assert cli(["serve", str(out), "--print-only", "--hybrid"]) == 2
    assert "no hybrid.json beside the head" in capsys.readouterr().err


def test_the_plugin_left_out_is_refused_for_the_hybrid(exported, capsys, monkeypatch):
    run, out, target = exported
    save_beside(skip_policy(0.5), out)
    monkeypatch.setenv("VLLM_PLUGINS", "someone_elses")
    assert cli(["serve", str(out), "--print-only"]) == 2
    assert "leaves out draftsmith_mlp_speculator" in capsys.readouterr().err
    assert cli(["serve", str(out), "--print-only", "--no-hybrid"]) == 0  # plain EAGLE-3 needs no plugin


def test_a_vllm_outside_the_tested_range_is_refused_in_one_paragraph(monkeypatch, exported, capsys):
    assert compat.version_problem("0.32.0") is None and compat.version_problem("0.32.3") is None
    for version in ("0.31.2", "0.33.0", "1.0.0", None):
        assert compat.version_problem(version), version
    monkeypatch.setattr(compat, "vllm_version", lambda: "0.33.1")
    monkeypatch.delenv(compat.ALLOW_ENV, raising=False)
    assert cli(["serve", str(exported[1]), "--print-only"]) == 2
    err = capsys.readouterr().err
    assert "vLLM 0.33.1 is outside the range draftsmith is tested with (0.32.0 <= v < 0.33.0)" in err
    assert err.count("\n") == 1 and "Traceback" not in err  # one paragraph
    monkeypatch.setenv(compat.ALLOW_ENV, "1")
    with pytest.warns(UserWarning, match="going on"):
        assert compat.check_vllm() == "0.33.1"
    # the plugin runs the same check in every engine process
    from draftsmith.serve.plugin import register

    monkeypatch.delenv(compat.ALLOW_ENV)
    with pytest.raises(compat.VllmCompatError, match="outside the range"):
        register()


def test_a_renamed_vllm_internal_is_named():
    assert compat.internal("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "propose_draft_token_ids")
    with pytest.raises(compat.VllmCompatError, match="GPUModelRunner has no propose_drafts, which draftsmith wraps"):
        compat.internal("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "propose_drafts")


def test_reexporting_the_same_head_keeps_its_policy_and_files_are_readable(exported, capsys):
    run, out, target = exported
    save_beside(skip_policy(0.5), out)
    (out / "schedule.json").write_text(json.dumps({"num_speculative_tokens_per_batch_size": [[1, 8, 2]]}))
    before = (out / "hybrid.json").read_bytes()
    os.umask(0o022)
    assert cli(["export", "--format", "vllm", str(run), str(out), "--target", str(target)]) == 0
    assert "kept hybrid.json, schedule.json" in capsys.readouterr().out
    assert (out / "hybrid.json").read_bytes() == before and plan(out).hybrid
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    assert {stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()} == {0o644}  # a server under another user reads it

    from safetensors.torch import load_file, save_file

    path = run / "checkpoints" / "step_00000004" / "head.safetensors"  # other weights into the same OUT
    state = load_file(path)
    state["fc.weight"] = state["fc.weight"] + 1.0
    save_file(state, path)
    assert cli(["export", "--format", "vllm", str(run), str(out), "--target", str(target)]) == 0
    assert "dropped: they were fitted for the head exported there before" in capsys.readouterr().out
    assert not (out / "hybrid.json").exists() and not (out / "schedule.json").exists()


def test_metrics_text_is_read_as_counters():
    text = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 12.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 7.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 1.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e9
vllm:generation_tokens_total{engine="0",model_name="m"} 40.0
draftsmith:hybrid_steps_total{source="head"} 6.0
draftsmith:hybrid_steps_total{source="suffix"} 4.0
draftsmith:hybrid_accepted_tokens_total{source="head"} 5.0
draftsmith:hybrid_head_skipped_steps_total 2.0
"""
    got = metrics.parse(text)
    assert got["spec"] == {
        "num_drafts": 10,
        "num_draft_tokens": 30,
        "num_accepted_tokens": 12,
        "num_accepted_tokens_per_pos": [7, 4, 1],
    }
    assert got["hybrid"]["head"] == {"steps": 6, "draft_tokens": 0, "accepted_tokens": 5}
    assert got["hybrid_head_skipped"] == 2 and got["generation_tokens"] == 40
    zero = metrics.parse(text.replace("10.0", "4.0"))
    assert metrics.delta(got, zero)["spec"]["num_drafts"] == 6
