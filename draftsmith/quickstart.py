"""`draftsmith quickstart`: the README's main job on the embedded default, end to end.

    prepare target (SmolLM2-135M-Instruct GGUF -> HF dir) -> the target re-answers 2,000 ShareGPT first turns
    (once, cached) -> render them with its chat template -> extract the target's features (once, cached) ->
    train an EAGLE-3 head with TTT for 60 minutes (train/run.py conf=eagle3_smollm2) -> export for vLLM ->
    served acceptance in real vLLM (trained head vs ngram, suffix, no speculation) on held-out prompts.

Each stage is the same command a user runs by hand; the stage wall times and the table land in
<out>/quickstart.json. Re-running resumes training from the last checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def stage(name: str, timings: dict):
    """Print a banner around one stage and record its wall time in `timings`."""
    print(f"\n=== {name} ===", flush=True)
    start = time.time()
    yield
    timings[name] = round(time.time() - start, 1)
    print(f"=== {name}: {timings[name]:.0f} s ===", flush=True)


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


def training_plan(overrides: list[str]) -> str:
    """What stage 2 will do with these overrides, for its banner (the data size and source the config says)."""
    from draftsmith.train.config import compose_config, validate_config
    from draftsmith.train.data.dataset import also_entries

    cfg = compose_config(overrides)
    validate_config(cfg)  # a bad override fails here, before the target is prepared or anything trains
    d, o = cfg.data, cfg.optim
    n = "all" if d.num_conversations is None else f"{d.num_conversations:,}"
    if str(d.path).startswith("regen:"):
        data = f"the target re-answers the first turns of {n} {d.path[len('regen:') :]} conversations, once, cached"
    else:
        data = f"{n} conversations from {d.path}"
    extra = [
        path + (f" at T={own['regen_temperature']:g}" if "regen_temperature" in own else "")
        for path, own in also_entries(d)
    ]
    if extra:
        data += "; plus " + ", ".join(extra) + " (data.also)"
    features = {
        "offline": "; its features are extracted once and cached",
        "memory": "; its features are kept in memory after first use",
    }.get(d.features, "")
    budget = f"{o.max_minutes:g} minutes" if o.max_minutes else f"{o.max_tokens:,} tokens" if o.max_tokens else "epochs"
    return f"{data}{features}; then TTT training for {budget}"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="draftsmith quickstart", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", default="outputs/quickstart", help="run directory (default: outputs/quickstart)")
    p.add_argument(
        "--minutes",
        type=float,
        default=None,
        help="wall-clock cap on training in minutes (default: the preset's 60; the lr schedule ends with it)",
    )
    p.add_argument("--num-prompts", type=int, default=32, help="held-out prompts served per method (default 32)")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens generated per prompt (default 128)")
    p.add_argument(
        "--k",
        type=int,
        default=3,
        help="speculative tokens per step when serving (default 3); the head trains as the preset says (TTT 2, "
        "which served k=3 better than TTT 3 did; override with head.ttt_steps=N)",
    )
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for training, e.g. head.ttt_steps=2")
    args = p.parse_args(argv)
    os.environ.setdefault("WANDB_MODE", "offline")
    out = Path(args.out).resolve()
    timings: dict[str, float] = {}
    total = time.time()

    with stage("1/4 prepare target", timings):
        from draftsmith.assets import prepare_smollm2

        target = prepare_smollm2()
        print(f"target: {target}")

    overrides = [
        "conf=eagle3_smollm2",
        f"output_dir={out}",
        *args.overrides,
        *([f"optim.max_minutes={args.minutes}"] if args.minutes else []),
        "resume=auto",
    ]  # a re-run continues from the last checkpoint (none yet: from step 0)
    with stage(f"2/4 train EAGLE-3 head ({training_plan(overrides)})", timings):
        cmd = [sys.executable, "-m", "draftsmith.train.run", *overrides]
        print(" ".join(cmd[1:]), flush=True)
        code = run_child(cmd)
        if code:  # training printed its own one-paragraph error (or the Ctrl-C note) above
            print(
                f"draftsmith quickstart: training stopped (exit status {code}); re-run `draftsmith quickstart` with "
                "the same options to continue from its last checkpoint",
                file=sys.stderr,
            )
            return code

    exported = out / "exported"
    with stage("3/4 export for vLLM", timings):
        from draftsmith.cli import main as cli

        if cli(["export", "--format", "vllm", str(out), str(exported)]) != 0:
            return 1

    with stage("4/4 served acceptance in vLLM", timings):
        from draftsmith.eval.acceptance import format_table, run_acceptance

        result = run_acceptance(
            str(target),
            str(out / "heldout_prompts.jsonl"),
            ["none", "ngram", "suffix"],
            {"eagle3": str(exported)},
            k=args.k,
            max_tokens=args.max_tokens,
            num_prompts=args.num_prompts,
            out_dir=str(out / "acceptance"),
        )

    timings["total"] = round(time.time() - total, 1)
    train_log = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in train_log if "tok_per_s" in r][-1]
    last_eval = [r for r in train_log if "eval/acc" in r][-1]
    summary = {
        "stage_seconds": timings,
        "train": {
            "steps": last["step"],
            "tokens": last["tokens"],
            "tok_per_s": last["tok_per_s"],
            "eval_acc_per_step": last_eval["eval/acc"],
            "eval_sim_accept_len": last_eval["eval/sim_accept_len"],
        },
        "acceptance": str(out / "acceptance" / "acceptance.json"),
    }
    (out / "quickstart.json").write_text(json.dumps(summary, indent=2) + "\n")
    print("\n" + format_table(result))
    print(
        f"\ntraining: {last['tokens']} supervised tokens in {last['step']} steps at {last['tok_per_s']:.0f} tok/s; "
        f"held-out per-step accuracy {[round(a, 3) for a in last_eval['eval/acc']]}"
    )
    print("stage wall times (s): " + ", ".join(f"{k} {v:.0f}" for k, v in timings.items()))
    print(f"results: {out}/quickstart.json, {out}/acceptance/acceptance.md")
    return 0
