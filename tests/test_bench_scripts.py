"""The MLP speculator's bench harnesses build their runs from the preset: with DRY=1 each prints its commands; every
training run composes and validates, its budget is the clock the harness names (no epoch, token or step cap of its
own), every override it adds is named in its header, and every `draftsmith` command is accepted by its own parser."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import shlex
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from test_readme import Parsed, parse_only  # noqa: F401 - the fixture

from draftsmith.cli import VERBS
from draftsmith.train.config import compose_config, validate_config

ROOT = Path(__file__).resolve().parent.parent
# script -> the training clock each of its runs must end on (minutes): the harness's default, or the preset's own
SCRIPTS = {
    "mlp_levers.sh": {6.0},
    "mlp_optim.sh": {6.0},
    "mlp_stage2.sh": {3.0, 6.0},  # the 1+2 arm's two halves
    "mlp_hour.sh": {60},
    "quickstart_lever.sh": {16.2},  # without a quickstart's plan.json: the 2026-12-01 slow record's minutes
    "convert_finetune.sh": {10},
    "dflash_equal_minutes.sh": {12},
}
# the preset each harness's runs start from (mlp_smollm2 where not named)
PRESET_OF = {
    "quickstart_lever.sh": ("eagle3_smollm2",),
    "convert_finetune.sh": ("eagle3_smollm2",),
    "dflash_equal_minutes.sh": ("dflash_smollm2", "eagle3_smollm2", "peagle_smollm2"),  # one run of each
}
# harnesses that train nothing (they serve what a run made), with the arguments after OUT
SERVE_ONLY = {"quickstart_reserve.sh": ["QS_OUT"], "dflash_per_second.sh": ["QS_OUT"]}
ARGS_BEFORE_OUT = {**SERVE_ONLY, "quickstart_lever.sh": ["QS_OUT"], "convert_finetune.sh": ["RUN"]}
NOT_OVERRIDES = {"conf", "output_dir", "resume"}  # which preset, where, and resume=auto: no setting of the run


def dry_run(script: str, out: Path, **knobs: str) -> list[list[str]]:
    env = {**os.environ, "DRY": "1", **knobs}
    args = [str(out / a) for a in ARGS_BEFORE_OUT.get(script, [])] + [str(out)]
    p = subprocess.run(
        ["bash", str(ROOT / "bench" / script), *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300
    )
    assert p.returncode == 0, p.stderr
    return [shlex.split(line[2:]) for line in p.stdout.splitlines() if line.startswith("+ ")]


def header(script: str) -> str:
    lines = (ROOT / "bench" / script).read_text().splitlines()[1:]
    return "\n".join(line for line in lines[: next(i for i, x in enumerate(lines) if not x.startswith("#"))])


# a harness's A/B knobs (environment variables), each run once more with them set
KNOBS = {"mlp_hour.sh": {"CONVERSATIONS": "8000", "ALSO": "[regen:pycode:stdlib]", "BATCH1": "0"}}


@pytest.mark.parametrize("script,knobs", [(s, {}) for s in sorted(SCRIPTS)] + sorted(KNOBS.items()))
def test_its_runs_are_the_preset_with_the_overrides_it_names(script, knobs, tmp_path):
    runs = [argv[2:] for argv in dry_run(script, tmp_path, **knobs) if argv[:2] == ["python", "train/run.py"]]
    assert runs, f"{script} trains nothing"
    named = header(script)
    for overrides in runs:
        assert any(f"conf={p}" in overrides for p in PRESET_OF.get(script, ("mlp_smollm2",))), overrides
        cfg = compose_config(overrides)
        validate_config(cfg)
        o = cfg.optim
        assert o.max_minutes in SCRIPTS[script] and (o.max_tokens, o.max_steps, o.epochs) == (None, None, None), (
            f"{script}: {overrides}: the clock must be the only budget"
        )
        for key in {x.split("=", 1)[0] for x in overrides} - NOT_OVERRIDES:
            assert re.search(rf"(?<![\w.]){re.escape(key)}\b", named), f"{script}: `{key}` is not named in its header"


@pytest.mark.parametrize("script", sorted(SCRIPTS) + sorted(SERVE_ONLY))
def test_its_draftsmith_commands_parse(script, tmp_path, parse_only):  # noqa: F811
    commands = [argv[1:] for argv in dry_run(script, tmp_path) if argv[0] == "draftsmith"]
    assert any(argv[:2] == ["eval", "acceptance"] for argv in commands), f"{script} serves nothing"
    for argv in commands:
        module, _, function = VERBS[argv[0]][0].partition(":")
        main = getattr(importlib.import_module(module), function or "main")
        with pytest.raises(Parsed):
            main(argv[1:])


def test_a_lever_arm_is_the_quickstarts_own_training_run_plus_the_arm(tmp_path, parse_only):  # noqa: F811
    """quickstart_lever.sh rebuilds the quickstart's training command from its plan.json (its family's preset, turns,
    code share, re-planned minutes, its own extra overrides) and adds the arm's overrides, nothing else."""
    from draftsmith.quickstart.plan import Plan, save_plan

    qs = tmp_path / "QS_OUT"
    plan = Plan(45.0, 2558, False, 16.6, 16, ["chat", "mtbench", "code"], heldout=64, code_prompts=1059,
                replanned={"train_minutes": 19.5, "serve": 100.0, "serve_tok_s": 90.0})  # fmt: skip
    save_plan(qs, {"family": "dflash", "overrides": ["head.anchors=32"]}, plan)
    commands = dry_run("quickstart_lever.sh", tmp_path, CODE="8", METHODS="none")
    [train] = [a[2:] for a in commands if a[:2] == ["python", "train/run.py"]]
    arm = ["head.anchors=32", "data.max_tokens_per_batch=1024", "optim.lr=3e-3"]
    expected = plan.overrides(tmp_path / "b1024", arm, "dflash_smollm2")
    assert sorted(train) == sorted(shlex.split(x)[0] for x in expected)  # (the printed line, split as bash would)
    assert compose_config(expected).optim.max_minutes == 19.5

    def lever(*arms: str, **env: str) -> subprocess.CompletedProcess:  # the harness on QS_OUT, DRY=1
        argv = ["bash", "bench/quickstart_lever.sh", str(qs), str(tmp_path), *arms]
        return subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "DRY": "1", **env},
                              timeout=300)  # fmt: skip

    def trainings(p: subprocess.CompletedProcess) -> list[list[str]]:
        assert p.returncode == 0, p.stderr
        return [shlex.split(x[2:])[2:] for x in p.stdout.splitlines() if x.startswith("+ python train/run.py")]

    p = lever("acceptance", "output", "out3")
    lines = p.stdout.splitlines()
    trains = trainings(p)
    assert [set(a) - set(train) for a in trains] == [
        {"head.slot_weights=acceptance", f"output_dir={tmp_path}/acceptance"},
        {"head.init=output", f"output_dir={tmp_path}/output"},
        {"head.init=output", "head.freeze_lm_head=true", "head.feature_loss=3.0", f"output_dir={tmp_path}/out3"},
    ]
    [chat] = [shlex.split(x[2:]) for x in lines if x.startswith("+ draftsmith eval acceptance")][:1]
    assert f"acceptance={tmp_path}/acceptance/exported" in chat and f"output={tmp_path}/output/exported" in chat
    served = [a for a in commands if a[:3] == ["draftsmith", "eval", "acceptance"]]
    assert [Path(a[a.index("--out") + 1]).name for a in served] == ["served_chat", "served_mtbench", "served_code"]
    for argv in served:
        assert argv[argv.index("--methods") + 1] == "none" and f"dflash={qs}/exported" in argv
    # a family arm: the same plan (turns, code share, minutes, the quickstart's overrides) under that family's preset
    [eagle3] = trainings(lever("eagle3"))
    expected = plan.overrides(tmp_path / "eagle3", ["head.anchors=32"], "eagle3_smollm2")
    assert sorted(eagle3) == sorted(shlex.split(x)[0] for x in expected)
    assert "conf=eagle3_smollm2" in eagle3 and not any(w.startswith("family=") for w in eagle3)
    # a data arm: the same plan with long-document prompts added to its data (plan.doc_prompts), served on Spec-Bench's
    # categories too
    p = lever("doc", DOC="30", SPEC_BENCH="4", SPEC_BENCH_CATEGORIES="summarization rag", CHAT="0", MT="0")
    [doc] = trainings(p)
    expected = replace(plan, doc_prompts=30).overrides(tmp_path / "doc", ["head.anchors=32"], "dflash_smollm2")
    assert sorted(doc) == sorted(shlex.split(x)[0] for x in expected)
    also = compose_config(expected).data.also
    assert [(e.path, e.num_conversations) for e in also] == [
        ("regen:pycode:stdlib", 1059), ("regen:doctask:summarize", 15), ("regen:doctask:qa", 15)
    ]  # fmt: skip
    served = [shlex.split(x[2:]) for x in p.stdout.splitlines() if x.startswith("+ draftsmith eval acceptance")]
    assert [(a[a.index("--category") + 1], a[a.index("--num-prompts") + 1]) for a in served] == [
        ("summarization", "4"), ("rag", "4")
    ]  # fmt: skip
    assert all(f"doc={tmp_path}/doc/exported" in a for a in served)
    assert all(a[a.index("--prompts") + 1].endswith("shared/data/spec_bench_questions.jsonl") for a in served)
    bad = lever("nope")
    assert bad.returncode == 2 and "unknown arm nope" in bad.stderr


def test_dflash_per_second_sweeps_each_k_against_none_in_the_same_run(tmp_path):
    """dflash_per_second.sh: the run exported at each k, every (k, workload) served with none at the batch sizes asked,
    ngram and suffix (and other families' heads) at the first k only; the schedule and the breakdown read every run."""
    commands = dry_run("dflash_per_second.sh", tmp_path, K="3 5 7", SIZES="1,4", OTHERS="eagle3=/x/e3 peagle=/x/pe",
                       REPEATS="2")  # fmt: skip
    exports = [a for a in commands if a[1] == "export"]
    assert [a[a.index("--k") + 1] for a in exports] == ["3", "5", "7"]
    served = [a for a in commands if a[1:3] == ["eval", "acceptance"]]
    names = [Path(a[a.index("--out") + 1]).name for a in served]
    assert names == ["chat_k3", "code_k3", "chat_k5", "code_k5", "chat_k7", "code_k7"]
    for argv, name in zip(served, names):
        k = name.split("_k")[1]
        assert argv[argv.index("--k") + 1] == k and argv[argv.index("--batch-sizes") + 1] == "1,4"
        assert f"dflash={tmp_path}/dflash_k{k}" in argv
        first = k == "3"
        assert argv[argv.index("--methods") + 1] == ("none,ngram,suffix" if first else "none")
        assert ("eagle3=/x/e3" in argv) == ("peagle=/x/pe" in argv) == first
        assert argv[argv.index("--repeats") + 1] == "2"
    [schedule] = [a for a in commands if a[1:3] == ["eval", "schedule"]]
    assert [Path(x).name for x in schedule[schedule.index("dflash") + 1 : schedule.index("--out")]] == names
    [breakdown] = [a for a in commands if a[:2] == ["python", "bench/step_breakdown.py"]]
    assert [Path(breakdown[i + 1]).name for i, x in enumerate(breakdown) if x == "--eval"] == names


def test_reserve_serves_code_and_each_spec_bench_category_on_request(tmp_path, parse_only):  # noqa: F811
    """quickstart_reserve.sh: CODE=N adds HumanEval, SPEC_BENCH=N one run per Spec-Bench task category (N of each,
    `--category`), a count of 0 leaves a workload out; every command parses."""
    commands = dry_run("quickstart_reserve.sh", tmp_path, SPEC_BENCH="4", CODE="8", SPEC_BENCH_FILE="/x/sb.jsonl")
    outs = {Path(a[a.index("--out") + 1]).name: a for a in commands}
    five = ["translation", "summarization", "qa", "math_reasoning", "rag"]
    assert list(outs) == ["chat", "mtbench", "code", *(f"specbench_{c}" for c in five)]
    for c in five:
        argv = outs[f"specbench_{c}"]
        assert (argv[argv.index("--category") + 1], argv[argv.index("--num-prompts") + 1]) == (c, "4")
        assert argv[argv.index("--prompts") + 1] == "/x/sb.jsonl"
    assert outs["code"][outs["code"].index("--num-prompts") + 1] == "8" and "--category" not in outs["code"]
    args = [str(tmp_path / "QS_OUT"), str(tmp_path), "0", "0"]
    p = subprocess.run(["bash", "bench/quickstart_reserve.sh", *args], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "DRY": "1", "SPEC_BENCH": "2"}, timeout=300)  # fmt: skip
    assert p.returncode == 0, p.stderr
    served = [line for line in p.stdout.splitlines() if line.startswith("+ ")]
    assert len(served) == 5 and all("--category" in line for line in served)
    for argv in commands:
        module, _, function = VERBS[argv[1]][0].partition(":")
        with pytest.raises(Parsed):
            getattr(importlib.import_module(module), function or "main")(argv[2:])


def test_reserve_report_tabulates_every_workload_in_serving_order(tmp_path):
    """bench/reserve_report.py: one row per OUT/NAME/acceptance.json (chat, MT-Bench, code, then Spec-Bench's
    categories), the head and its hybrid over the better of ngram and suffix, a failed method named, outputs checked."""

    def served(name, steps, match=1.0, failed=()):
        methods = {m: {"status": "ok", "tokens_per_target_step": t, "speedup_vs_none": 1.0 / t if m != "none" else 1.0,
                       "match_vs_none": None if m == "none" else match} for m, t in steps.items()}  # fmt: skip
        methods |= {m: {"status": "failed", "error": "x"} for m in failed}
        (tmp_path / name).mkdir()
        (tmp_path / name / "acceptance.json").write_text(json.dumps({"num_prompts": 16, "methods": methods}))

    base = {"none": 1.0, "ngram": 1.5, "suffix": 1.6}
    served("specbench_rag", {**base, "eagle3": 1.2, "hybrid(eagle3)": 2.0})
    served("chat", {**base, "eagle3": 2.0, "hybrid(eagle3)": 2.4})
    served("specbench_qa", {**base, "eagle3": 1.8}, match=0.9375, failed=["hybrid(eagle3)"])
    spec = importlib.util.spec_from_file_location("reserve_report", ROOT / "bench" / "reserve_report.py")
    reserve_report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reserve_report)
    assert reserve_report.main([str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "reserve.json").read_text())
    assert list(rows) == ["chat", "specbench_qa", "specbench_rag"]
    assert rows["chat"]["over_best_training_free"] == {"eagle3": 1.25, "hybrid(eagle3)": 1.5}
    assert rows["specbench_rag"]["over_best_training_free"]["eagle3"] == 0.75
    assert rows["specbench_qa"]["failed"] == ["hybrid(eagle3)"] and not rows["specbench_qa"]["every_output_equal"]
    assert rows["chat"]["every_output_equal"]
    md = (tmp_path / "reserve.md").read_text().splitlines()
    assert md[2].startswith("| chat | 16 | 2.00 | 2.40 | 1.50 | 1.60 | 1.25x | 1.50x |")
    assert "| specbench_qa | 16 | 1.80 | - |" in md[3]


def test_mlp_hour_knobs_take_effect(tmp_path):
    commands = dry_run("mlp_hour.sh", tmp_path, CONVERSATIONS="8000", ALSO="[regen:pycode:stdlib]", BATCH1="0")
    (train,) = [argv[2:] for argv in commands if argv[:2] == ["python", "train/run.py"]]
    data = compose_config(train).data
    assert (data.num_conversations, list(data.also)) == (8000, ["regen:pycode:stdlib"])
    outs = [argv[argv.index("--out") + 1] for argv in commands if "--out" in argv]
    assert [Path(o).name for o in outs] == ["served_chat", "served_mtbench", "served_code"]  # no batch1_*
    default = dry_run("mlp_hour.sh", tmp_path)
    assert sum("--batch-sizes" in argv for argv in default) == 3


def test_the_peer_ab_trains_both_sides_on_one_data_and_names_what_it_changes(tmp_path, parse_only):  # noqa: F811
    """bench/peer_speculators.py: our two arms are the preset with the same data, one on the clock and one on the
    peer's tokens; the peer reads the samples ours wrote and the hidden states its own tool wrote; every override and
    every CPU argument of the peer is named in its docstring; its draftsmith commands parse."""
    import sys

    p = subprocess.run(
        [sys.executable, "bench/peer_speculators.py", str(tmp_path), "--minutes", "7", "--dry-run"],
        capture_output=True, text=True, cwd=ROOT, timeout=300, env={**os.environ, "PEER_VENV": str(tmp_path / "venv")},
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    commands = [shlex.split(line[2:].removesuffix(" &")) for line in p.stdout.splitlines() if line.startswith("+ ")]
    runs = [argv[2:] for argv in commands if argv[1:2] == ["train/run.py"]]
    assert len(runs) == 2, runs
    text = (ROOT / "bench" / "peer_speculators.py").read_text()
    named = text[: text.index('"""', 3)]
    data = []
    for overrides in runs:
        overrides = [o.replace("PEER_TOKENS", "150000") for o in overrides]
        assert "conf=eagle3_smollm2" in overrides, overrides
        cfg = compose_config(overrides)
        validate_config(cfg)
        data.append(sorted(o for o in overrides if o.startswith("data.")))
        for key in {x.split("=", 1)[0] for x in overrides} - NOT_OVERRIDES:
            assert re.search(rf"(?<![\w.]){re.escape(key)}\b", named), f"`{key}` is not named in its docstring"
    assert data[0] == data[1]
    minutes, tokens = (compose_config([o.replace("PEER_TOKENS", "150000") for o in r]).optim for r in runs)
    assert (minutes.max_minutes, minutes.max_tokens) == (7, None)
    assert (tokens.max_minutes, tokens.max_tokens) == (None, 150000)
    # the peer: its samples are ours, its hidden states its own tool's, trained by the shim with the stated args
    samples = next(argv[-1] for argv in commands if argv[1:2] == ["bench/peer_data.py"])
    prepare = next(argv for argv in commands if "prepare-data" in argv)
    assert prepare[prepare.index("--data") + 1] == samples
    prepared = prepare[prepare.index("--output") + 1]
    trains = [argv for argv in commands if "train" in argv[2:4] and argv[1].endswith("peer_cpu_shim.py")]
    assert len(trains) == 2  # the timing call, then the run
    spec = importlib.util.spec_from_file_location("peer_speculators", ROOT / "bench" / "peer_speculators.py")
    harness = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(harness)
    PEER_CPU_ARGS = harness.PEER_CPU_ARGS
    for argv in trains:
        assert argv[argv.index("--data-path") + 1] == prepared
        assert " ".join(PEER_CPU_ARGS) in " ".join(argv)
    for flag in PEER_CPU_ARGS[::2]:
        assert flag in named, f"{flag} is not named in bench/peer_speculators.py's docstring"
    for argv in (a[1:] for a in commands if a[0] == "draftsmith"):
        module, _, function = VERBS[argv[0]][0].partition(":")
        with pytest.raises(Parsed):
            getattr(importlib.import_module(module), function or "main")(argv[1:])


def test_a_peer_lever_adds_its_overrides_and_nothing_else(tmp_path):
    """--lever NAME "OVERRIDES": two more arms, each our arm of the same budget with those overrides last; with
    --levers-only the evaluations serve the lever arms and the peer, not the preset's arms, into their own dirs."""
    import sys

    lever = ["head.ttt_steps=3", "optim.lr=1e-3"]
    p = subprocess.run(
        [sys.executable, "bench/peer_speculators.py", str(tmp_path), "--dry-run", "--levers-only",
         "--lever", "ttt3", " ".join(lever)],
        capture_output=True, text=True, cwd=ROOT, timeout=300, env={**os.environ, "PEER_VENV": str(tmp_path / "venv")},
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    commands = [shlex.split(line[2:].removesuffix(" &")) for line in p.stdout.splitlines() if line.startswith("+ ")]
    runs = {Path(o.split("=", 1)[1]).name: argv[2:] for argv in commands if argv[1:2] == ["train/run.py"]
            for o in argv if o.startswith("output_dir=")}  # fmt: skip
    assert set(runs) == {"ours_minutes", "ours_tokens", "ours_minutes_ttt3", "ours_tokens_ttt3"}
    for equal in ("minutes", "tokens"):
        base = [o for o in runs[f"ours_{equal}"] if not o.startswith("output_dir=")]
        assert [o for o in runs[f"ours_{equal}_ttt3"] if not o.startswith("output_dir=")] == base + lever
        validate_config(compose_config([o.replace("PEER_TOKENS", "150000") for o in runs[f"ours_{equal}_ttt3"]]))
    evals = [argv for argv in commands if argv[:3] == ["draftsmith", "eval", "acceptance"]]
    assert len(evals) == 3
    for argv in evals:
        heads = [argv[i + 1].split("=", 1)[0] for i, a in enumerate(argv) if a == "--head"]
        assert heads == ["ours_minutes_ttt3", "ours_tokens_ttt3", "peer"]
        assert Path(argv[argv.index("--out") + 1]).name.endswith("_levers")


def test_peer_code_prompts_give_both_sides_the_same_code_answers(tmp_path):
    """--code-prompts C: both of our arms train on the first C answers of the shipped stdlib code pool beside the
    chat turns (nothing else changes), and the peer's samples are written from the minutes arm, so it reads them too."""
    import sys

    def dry(*extra):
        p = subprocess.run(
            [sys.executable, "bench/peer_speculators.py", str(tmp_path), "--dry-run", *extra],
            capture_output=True, text=True, cwd=ROOT, timeout=300,
            env={**os.environ, "PEER_VENV": str(tmp_path / "venv")},
        )  # fmt: skip
        assert p.returncode == 0, p.stderr
        commands = [shlex.split(line[2:].removesuffix(" &")) for line in p.stdout.splitlines() if line.startswith("+ ")]
        runs = [[o.replace("PEER_TOKENS", "150000") for o in argv[2:]] for argv in commands
                if argv[1:2] == ["train/run.py"]]  # fmt: skip
        return commands, runs

    _, plain = dry()
    commands, coded = dry("--code-prompts", "300")
    assert len(coded) == 2
    for with_code, without in zip(coded, plain):
        cfg = compose_config(with_code)
        validate_config(cfg)
        assert [dict(a) for a in cfg.data.also] == [{"path": "regen:pycode:stdlib", "num_conversations": 300}]
        assert list(compose_config(without).data.also) == []
        assert [o for o in with_code if not o.startswith("data.also=")] == [
            o for o in without if not o.startswith("data.also=")
        ]
    samples_from = next(argv[2] for argv in commands if argv[1:2] == ["bench/peer_data.py"])
    assert Path(samples_from).name == "ours_minutes"


def test_the_peer_report_keeps_each_lever_run_set_aside(tmp_path):
    """A lever run whose eval dirs were set aside (eval_W_levers_NAME) before another --levers-only call stays in
    peer.json and peer.md as its own section beside the new run's, each with the arms it served over the peer."""
    import json

    def run_dir(name, tokens):
        (tmp_path / name).mkdir()
        log = [{"step": 9, "tokens": tokens, "elapsed_s": 60.0, "tok_per_s": 400.0},
               {"step": 9, "eval/acc": [0.3, 0.2], "eval/sim_accept_len": 1.4}]  # fmt: skip
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))

    def served(dirname, steps):
        (tmp_path / dirname).mkdir()
        methods = {m: {"status": "ok", "tokens_per_target_step": t, "match_vs_none": 1.0} for m, t in steps.items()}
        res = {"methods": methods, "num_prompts": 16, "k": 3}
        (tmp_path / dirname / "acceptance.json").write_text(json.dumps(res))

    (tmp_path / "peer").mkdir()
    (tmp_path / "peer" / "trained.json").write_text(
        json.dumps({"tokens": 100, "train_seconds": 60, "steps": 9, "version": "x"})
    )
    (tmp_path / "levers.json").write_text(json.dumps({"a": ["optim.lr=1e-3"], "b": ["head.ttt_steps=3"]}))
    for arm in ("ours_minutes_a", "ours_tokens_a", "ours_minutes_b", "ours_tokens_b"):
        run_dir(arm, 100)
    base = {"peer": 1.25, "ngram": 1.5, "suffix": 1.7}
    served("eval_chat_levers_a", {**base, "ours_minutes_a": 1.5, "ours_tokens_a": 1.375})
    served("eval_chat_levers", {**base, "ours_minutes_b": 1.4, "ours_tokens_b": 1.3})
    spec = importlib.util.spec_from_file_location("peer_report", ROOT / "bench" / "peer_report.py")
    peer_report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer_report)
    assert peer_report.main([str(tmp_path)]) == 0
    rep = json.loads((tmp_path / "peer.json").read_text())
    assert set(rep) == {"trained", "workloads", "levers", "levers_a"}
    assert rep["levers_a"]["chat"]["ours_minutes_a_over_peer"] == 1.2
    assert rep["levers"]["chat"]["ours_tokens_b_over_peer"] == 1.04 and "ours_minutes_a" not in rep["levers"]["chat"]
    md = (tmp_path / "peer.md").read_text()
    assert "levers a (their own run)" in md and "| chat | 1.50 | 1.38 | 1.25 | 1.50 | 1.70 | 1.20x, 1.10x |" in md
