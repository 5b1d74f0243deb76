"""`draftsmith quickstart`'s stages, run in order (see the package's docstring): the command line, the children it
starts (data and features, training), serving, and the hybrid's fit."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from draftsmith.argtypes import positive_float, positive_int
from draftsmith.quickstart import __doc__ as USAGE
from draftsmith.quickstart.plan import (
    DEFAULT_BUDGET,
    EXPORT_S,
    HYBRID_FAMILIES,
    HYBRID_FIT,
    PRESETS,
    SERVE_BATCH,
    SERVE_METHODS,
    SERVE_TOK_S,
    TRAIN_OVERHEAD_S,
    BudgetTooSmall,
    Plan,
    load_or_plan,
    make_plan,
    probe,
    replan_training,
    save_plan,
)
from draftsmith.quickstart.report import fmt_min, machine_line, print_plan, write_summary


@dataclass
class Stages:
    """Wall time per stage, printed as a banner around each."""

    spent: dict[str, float] = field(default_factory=dict)

    def run(self, name: str, title: str, fn):
        print(f"\n=== {title} ===", flush=True)
        start = time.time()
        try:
            return fn()
        finally:
            self.spent[name] = round(time.time() - start, 1)
            print(f"=== {name}: {fmt_min(self.spent[name])} ===", flush=True)


def run_child(cmd: list[str]) -> int:
    """Run `cmd` and return its exit status, leaving Ctrl-C to it.

    The terminal sends Ctrl-C to both processes. Training answers it by finishing its step and saving a checkpoint,
    but subprocess.run would kill it 0.25 s after our own KeyboardInterrupt. So this process ignores SIGINT while it
    waits, and the child gets the default handler back before it starts (an ignored SIGINT is inherited).
    """
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return subprocess.run(cmd, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)).returncode
    finally:
        signal.signal(signal.SIGINT, previous)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line, with --hybrid resolved to True or False (its default follows --family)."""
    p = argparse.ArgumentParser(
        prog="draftsmith quickstart", description=USAGE, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", default="outputs/quickstart", help="run directory (default: outputs/quickstart)")
    p.add_argument(
        "--budget",
        type=positive_float,
        default=DEFAULT_BUDGET,
        help=f"minutes for everything after set-up (default {DEFAULT_BUDGET:g}); the plan fits data, training and "
        "serving into it from a probe of this machine",
    )
    p.add_argument("--full", action="store_true", help="the preset as measured (4,000 turns + code sets, 60 min)")
    p.add_argument("--plan-only", action="store_true", help="probe this machine, print the plan and stop")
    p.add_argument(
        "--family",
        choices=sorted(PRESETS),
        default="eagle3",
        help="the head: eagle3 (default, drafts step by step), peagle (all k drafts in one forward), dflash (a block "
        "drafter: the block in one non-causal forward over the target's states) or mlp (the MLP speculator: no "
        "attention, no KV cache); "
        f"presets {', '.join(f'{k}: {v}' for k, v in PRESETS.items())}",
    )
    p.add_argument(
        "--hybrid",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"fit the head's hybrid policy (the head, suffix and ngram chosen per step; eval fit-hybrid on "
        f"{HYBRID_FIT} ShareGPT first turns it never trained on) and serve hybrid(HEAD) beside the head; its fit and "
        f"serving come out of the budget. On by default for --family {' and '.join(HYBRID_FAMILIES)} (the only "
        "configuration that beat the best training-free method on every machine class measured, the slow AVX2 one "
        "included); --no-hybrid serves the head alone and gives the fit's minutes to training",
    )
    p.add_argument(
        "--num-prompts", type=positive_int, default=32, help="prompts served per workload and method (default 32)"
    )
    p.add_argument("--max-tokens", type=positive_int, default=128, help="tokens generated per prompt (default 128)")
    p.add_argument("--k", type=positive_int, default=3, help="speculative tokens per step when serving (default 3)")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for training, e.g. head.ttt_steps=3")
    args = p.parse_args(argv)
    if args.hybrid is None:  # the default: the hybrid wherever draftsmith.serve.hybrid serves the family
        args.hybrid = args.family in HYBRID_FAMILIES
    elif args.hybrid and args.family not in HYBRID_FAMILIES:
        p.error(f"--hybrid serves an EAGLE-3 head or an MLP speculator with suffix and ngram; not --family "
                f"{args.family} (draftsmith.serve.hybrid serves those two)")  # fmt: skip
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    os.environ.setdefault("WANDB_MODE", "offline")
    n = 8 if args.hybrid else 7  # stages
    out = Path(args.out).resolve()
    stages = Stages()
    total = time.time()

    from draftsmith.assets import prepare_smollm2

    target = str(stages.run("prepare", f"1/{n} prepare target", prepare_smollm2))
    print(f"target: {target}")
    preset = PRESETS[args.family]
    rates = stages.run("probe", f"2/{n} probe this machine", lambda: probe(target, preset))
    key = {k: getattr(args, k) for k in ("budget", "full", "num_prompts", "max_tokens", "overrides")}
    if args.family != "eagle3":  # (plans written before --family existed stay valid for eagle3)
        key["family"] = args.family
    if args.hybrid:  # (and those written before --hybrid, without it)
        key["hybrid"] = True

    def new_plan() -> Plan:
        spent = sum(stages.spent.values())
        return make_plan(
            args.budget, rates, spent, args.num_prompts, args.max_tokens, args.full, args.hybrid, preset
        )  # fmt: skip

    try:
        plan = new_plan() if args.plan_only else load_or_plan(out, key, new_plan)
    except BudgetTooSmall as e:  # the probe's figures first: they are why the budget is too small here
        print(machine_line(rates), flush=True)
        print(f"draftsmith quickstart: {e}", file=sys.stderr)
        return 2
    print_plan(plan, rates, stages.spent)
    if args.plan_only:
        return 0

    from draftsmith.train.config import compose_config, validate_config

    overrides = plan.overrides(out, args.overrides, preset)
    validate_config(compose_config(overrides))  # a bad override fails here, before anything is prepared
    # data and extraction are one child (train/run.py prepare_only=true: the run's data, its features cached, its
    # held-out prompts), training another (the same overrides, the re-planned clock); each records how long its data
    # and features took, so the summary can split them
    prepare = [sys.executable, "-m", "draftsmith.train.run", *overrides, "prepare_only=true"]
    print("\n" + " ".join(prepare[1:]), flush=True)
    (out / "prepare_seconds.json").unlink(missing_ok=True)
    code = stages.run(
        "data+extract", f"3/{n} data and features (train/run.py prepare_only=true)", lambda: run_child(prepare)
    )
    split_child_stages(stages, "data+extract", out / "prepare_seconds.json")
    if code:  # the child printed its own one-paragraph error (or the Ctrl-C note) above
        print(f"draftsmith quickstart: data and features stopped (exit status {code}); re-run the same command "
              "to continue (finished shards are kept)", file=sys.stderr)  # fmt: skip
        return code

    def serve(heads: dict[str, str], hybrids: tuple[str, ...] = ()) -> dict:
        from draftsmith.eval.acceptance import run_acceptance
        from draftsmith.eval.acceptance_report import format_table
        from draftsmith.eval.prompts import mtbench_file, write_humaneval_prompts

        files = {"chat": out / "heldout_prompts.jsonl", "mtbench": mtbench_file()}
        if "code" in plan.workloads:  # HumanEval as a prompts file, once
            files["code"] = write_humaneval_prompts(out / "humaneval_prompts.jsonl")
        results = {}
        for w in plan.workloads:
            print(f"\n--- {w} ---", flush=True)
            results[w] = run_acceptance(
                target,
                str(files[w]),
                list(SERVE_METHODS),
                heads,
                k=args.k,
                max_tokens=args.max_tokens,
                num_prompts=plan.num_prompts,
                out_dir=str(out / "acceptance" / w),
                batch_size=SERVE_BATCH,
                hybrids=hybrids,
                reuse_baselines=True,  # the head's run takes the baselines served before training
            )
            print(format_table(results[w]), flush=True)
        return results

    # the training-free methods first: they need no head, and what they take here sets the training clock
    baselines = stages.run(
        "baselines", f"4/{n} ngram, suffix and no speculation in vLLM (before training)", lambda: serve({})
    )
    if plan.replanned is None:
        plan.replanned = replan_training(plan, baselines, stages.spent["baselines"], time.time() - total)
        save_plan(out, key, plan)
        if plan.budget_min is not None:
            r = plan.replanned
            measured = f"served {r['serve_tok_s']:.0f} tok/s (planned {SERVE_TOK_S:g}); " if r["serve_tok_s"] else ""
            eta = time.time() - total + r["train_minutes"] * 60 + TRAIN_OVERHEAD_S + EXPORT_S + r["serve"]
            print(
                f"re-plan: {measured}the head's serving estimated at {fmt_min(r['serve'])} (planned "
                f"{fmt_min(plan.stages['serve'])}): {r['train_minutes']:g} training minutes (planned "
                f"{plan.train_minutes:g}), ETA +{fmt_min(eta)}",
                flush=True,
            )
    cmd = [sys.executable, "-m", "draftsmith.train.run", *plan.overrides(out, args.overrides, preset)]
    print("\n" + " ".join(cmd[1:]), flush=True)
    (out / "prepare_seconds.json").unlink(missing_ok=True)
    code = stages.run("train", f"5/{n} training (train/run.py)", lambda: run_child(cmd))
    split_child_stages(stages, "train", out / "prepare_seconds.json")  # reading the data and checking the features
    if code:  # training printed its own one-paragraph error (or the Ctrl-C note) above
        print(
            f"draftsmith quickstart: training stopped (exit status {code}); re-run the same command to continue "
            "from its last checkpoint",
            file=sys.stderr,
        )
        return code

    exported = out / "exported"

    def export() -> int:
        from draftsmith.cli import main as cli

        # recorded at the k it is measured and its hybrid fitted at, so `draftsmith serve` serves that k
        return cli(["export", "--format", "vllm", str(out), str(exported), "--k", str(args.k)])

    if stages.run("export", f"6/{n} export for vLLM", export) != 0:
        return 1
    fitted = None
    if plan.hybrid:
        title = f"7/{n} the hybrid policy (eval fit-hybrid)"
        fitted = stages.run("hybrid", title, lambda: fit_hybrid(out, target, args))
    hybrids = (args.family,) if fitted else ()
    results = stages.run(
        "serve",
        f"{n}/{n} the head{' and its hybrid' if hybrids else ''} in vLLM (the baselines' results reused)",
        lambda: serve({args.family: str(exported)}, hybrids),
    )
    spent_total = round(time.time() - total, 1)
    summary = write_summary(out, plan, rates, stages.spent, spent_total, results, args.family, fitted, tuple(argv))
    print("\n=== summary ===")
    print(summary["headline"])
    tr = summary["train"]
    print(
        f"\ntraining: {tr['tokens']:,} supervised tokens in {tr['steps']} steps at {tr['tok_per_s']:.0f} tok/s; "
        f"held-out per-step accuracy {[round(a, 3) for a in tr['eval_acc_per_step']]}"
    )
    print("planned / spent per stage: " + ", ".join(summary["stage_line"]))
    verdict = "within" if plan.budget_min is None or spent_total <= 60 * plan.budget_min else "OVER"
    budget = "" if plan.budget_min is None else f" of the {plan.budget_min:g}-minute budget ({verdict})"
    print(f"total {fmt_min(spent_total)}{budget}; results: {out}/quickstart.json")
    what = "the head with its hybrid" if fitted else "the head"
    print(f"serve {what} as measured (vLLM's OpenAI server, k={args.k}): draftsmith serve {exported}")
    return 0


def fit_hybrid(out: Path, target: str, args) -> dict | None:
    """--hybrid's fit on HYBRID_FIT first turns after the trained ones (the served chat prompts excluded), answered at
    the served length; the policy lands in the exported head's hybrid.json. None (and the head served alone) when it
    fails: the head is trained by then, and its table is still worth having."""
    from draftsmith.eval.hybrid import fit_hybrid as fit

    try:
        policy, _ = fit(
            target,
            out / "exported",
            None,
            num_conversations=HYBRID_FIT,
            max_tokens=args.max_tokens,
            k=args.k,
            exclude=out / "heldout_prompts.jsonl",
            records_path=out / "hybrid_records.json",  # a re-run refits from them without a forward pass
        )
    except Exception as e:  # noqa: BLE001 - reported, then the head is served alone
        print(f"draftsmith quickstart: the hybrid's fit failed ({type(e).__name__}: {e}); serving the head alone",
              file=sys.stderr)  # fmt: skip
        return None
    return {k: policy.fitted_on[k] for k in ("data", "skip", "conversations", "positions", "tokens_per_step")}


def split_child_stages(stages: Stages, child: str, marks: Path) -> None:
    """Split a train/run.py child's wall time from the marks it wrote: "data+extract" (prepare_only) into data and
    extract (its start-up counted with extraction), "train" into training and its own reading of the data and check
    of the features (added to data and extract)."""
    wall = stages.spent.pop(child)
    m = json.loads(marks.read_text()) if marks.is_file() else {}
    data, extract = m.get("data_s", 0.0), m.get("features_s", 0.0)
    if child == "data+extract":
        stages.spent.update({"data": round(data, 1), "extract": round(wall - data, 1)})
        return
    for name, seconds in (("data", data), ("extract", extract)):
        stages.spent[name] = round(stages.spent.get(name, 0.0) + seconds, 1)
    stages.spent["train"] = round(wall - data - extract, 1)
