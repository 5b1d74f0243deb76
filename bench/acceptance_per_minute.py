"""Acceptance per training minute: train one EAGLE-3 head per lever on the embedded default, serve them all.

    python bench/acceptance_per_minute.py --out bench/results/apm --tokens 150000 \\
        --levers baseline,output,vocab4096,regen --regen-data regen.jsonl --curve regen+memory

Every lever is a set of Hydra overrides on top of `conf=eagle3_smollm2`. `baseline` pins the settings
the preset shipped with before these levers existed (raw ShareGPT answers, random init, 8,192-token
draft vocab, features recomputed every batch), so the comparison means the same thing after the preset
changes; `preset` is the preset as it is now. Levers combine with `+` (`regen+memory`).

Lever `offline` trains from features extracted once before the clock starts (bf16): from --features-dir (written
by `draftsmith extract`), else the training run extracts them into the draftsmith cache itself, once per target
and data, and logs the time (data preparation, like `regen`; not a training minute):

    python bench/acceptance_per_minute.py --out bench/results/apm --minutes 60 --tokens 4000000 \
        --levers preset,preset+conv2000+offline --curve preset+conv2000+offline --curve-every 400

Budgets: `--tokens` trains every lever on the same number of supervised tokens (quality per token; the
lr schedule spans exactly that budget), `--minutes` bounds wall time (quality per minute; throughput
levers show up here; given alone, it trains until the clock and the lr schedule ends with it, however many epochs
that takes). Training tok/s is printed per lever, measured in this run.

An A/B at equal minutes on a 2-core machine, one command (two levers trained at once on one core each, then
served on the held-out chat prompts and on MT-Bench and HumanEval):

    python bench/acceptance_per_minute.py --out bench/results/ab --minutes 60 --tokens 4000000 \
        --levers preset,preset+wd0.2 --side-by-side --num-prompts 64 --workloads mtbench,code

Then one `draftsmith eval acceptance` run serves no speculation, ngram, suffix and every head on the
same held-out prompts (the baseline run's held-out split; a head whose training data contains one of
them is refused). `--curve LEVER[,LEVER...]` checkpoints and evaluates those levers every --curve-every steps,
serves their intermediate checkpoints (one per --curve-min-gap minutes) and plots served and simulated τ against
training minutes (curve.png); bench.md also lists each curve lever's simulated τ at every evaluated step (an
equal-step comparison beside the equal-minute one). Finished runs are reused, so a re-run only serves.
Writes bench.json and bench.md under --out; not a test: figures depend on the machine. Before committing a record
under bench/results, `python bench/store_results.py` stores its prompt files once by hash.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# the preset before the levers: what `baseline` pins
BASELINE = [
    "data.path=sharegpt",
    "data.also=[]",
    "data.num_conversations=3000",
    "data.features=online",
    "head.init=random",
    "head.draft_vocab_size=8192",
    "head.ttt_steps=3",
    "optim.lr=1e-3",
]
LEVERS = {
    "baseline": ("preset before the levers: raw answers, random init, vocab 8192, online features", []),
    "preset": ("conf=eagle3_smollm2 as it is now", None),
    "output": ("warm start: target's final norm + lm_head rows", ["head.init=output"]),
    "target": ("warm start: also the target's last layer, fc = top aux state", ["head.init=target"]),
    "vocab4096": ("draft vocab 4,096", ["head.draft_vocab_size=4096"]),
    "vocab16k": ("draft vocab 16,384", ["head.draft_vocab_size=16384"]),
    "regen": ("the target's own answers (draftsmith regenerate)", ["data.path={regen}", "data.num_conversations=null"]),
    "memory": ("features kept in memory, reused across epochs", ["data.features=memory"]),
    "lr2e-3": ("peak lr 2e-3", ["optim.lr=2e-3"]),
    "lr3e-3": ("peak lr 3e-3", ["optim.lr=3e-3"]),
    "prompts": ("prompt rows supervised too (the target's distribution on user turns)", ["data.supervise=all"]),
    "ttt5": ("TTT depth 5", ["head.ttt_steps=5"]),
    "conv2000": (
        "twice the regenerated data: 2,000 first turns (1,830 kept)",
        ["data.path=regen:sharegpt", "data.num_conversations=2000", "data.heldout=128"],
    ),
    "conv4000": (
        "twice the preset's regenerated data: 4,000 first turns (3,738 asked; prompts over 1,024 tokens skipped)",
        ["data.path=regen:sharegpt", "data.num_conversations=4000", "data.heldout=128"],
    ),
    "conv8000": (
        "twice the preset's first turns: 8,000 (prompts over 1,024 tokens skipped)",
        ["data.path=regen:sharegpt", "data.num_conversations=8000", "data.heldout=128"],
    ),
    "turns2": (
        "the second user turn too, asked after the target's own first answer (data.regen_turns=2)",
        ["data.regen_turns=2"],
    ),
    "offline": (
        "features extracted once before training (draftsmith extract; every training minute head-only)",
        ["data.features=offline", "data.features_dtype=bf16", "data.features_dir={features}"],
    ),
    "ttt2": ("TTT depth 2", ["head.ttt_steps=2"]),
    "split": (
        "conversations over data.max_length cut into windows of max_length tokens, not truncated",
        ["data.overflow=split"],
    ),
    "ttt3": ("TTT depth 3 (the draft's third token trained on its own inputs too)", ["head.ttt_steps=3"]),
    # issue 16's equal-data budget (with --epochs 2): the 200 ShareGPT conversations a peer trainer was compared on
    "eq200": (
        "200 ShareGPT conversations, length 512, TTT 3, draft vocab 8,192, features extracted once",
        [
            "data.path=sharegpt",
            "data.num_conversations=200",
            "data.heldout=64",
            "data.max_length=512",
            "head.ttt_steps=3",
            "head.draft_vocab_size=8192",
            "data.features=offline",
            "data.features_dtype=bf16",
        ],
    ),
    "own": (
        "the target's own answers to the same 200 conversations' first turns (eq200's split kept)",
        ["data.path=regen:{eqsource}", "data.num_conversations=null"],
    ),
    "layers2": ("two draft decoder layers (the second a plain Llama layer on H)", ["head.num_layers=2"]),
    "ffn3072": ("twice the draft layer's MLP width (intermediate 3,072)", ["head.intermediate_size=3072"]),
    "nbfc": ("RMSNorm over the aux states before fc (vLLM norm_before_fc)", ["head.norm_before_fc=true"]),
    "fcnorm": ("RMSNorm per aux state before fc (vLLM fc_norm)", ["head.fc_norm=true"]),
    "outlier8": (
        "fc input channels above 8x the median RMS scaled to the median (folded into fc on export)",
        ["head.fc_outlier_ratio=8"],
    ),
    "muon": ("Muon on the hidden matrices, AdamW on lm_head and norms", ["optim.name=muon"]),
    "argmax": ("cross-entropy on the target's greedy token", ["head.loss=argmax"]),
    "top8": ("cross-entropy on the target's top-8 tokens, renormalised", ["head.loss=topk", "head.loss_topk=8"]),
    "bs512": ("512-token batches (twice the optimizer steps)", ["data.max_tokens_per_batch=512"]),
    "bs2048": ("2,048-token batches", ["data.max_tokens_per_batch=2048"]),
    "lr1e-3": ("peak lr 1e-3", ["optim.lr=1e-3"]),
    "lr4e-3": ("peak lr 4e-3", ["optim.lr=4e-3"]),
    "lr6e-3": ("peak lr 6e-3", ["optim.lr=6e-3"]),
    "ns3": ("Muon with 3 Newton-Schulz iterations instead of 5 (~12 % more steps per minute)", ["optim.ns_steps=3"]),
    "wd0.1": ("decoupled weight decay 0.1 on every parameter", ["optim.weight_decay=0.1"]),
    "wd0.2": ("decoupled weight decay 0.2 on every parameter", ["optim.weight_decay=0.2"]),
    "wd0.05": ("decoupled weight decay 0.05 on every parameter", ["optim.weight_decay=0.05"]),
    "wd0.3": ("decoupled weight decay 0.3 on every parameter", ["optim.weight_decay=0.3"]),
    "wd0.4": ("decoupled weight decay 0.4 on every parameter", ["optim.weight_decay=0.4"]),
    # which target layer feeds the head's top aux state (id k = the residual stream entering decoder layer k)
    **{
        f"aux{k}": (
            f"top aux state taken entering decoder layer {k} (aux ids 2, 15, {k}){why}",
            [f"target.aux_layer_ids=[2,15,{k}]"],
        )
        for k, why in {
            29: ": the last layer",
            27: ": vLLM's default, the preset until 2026-11-27",
            24: ": the preset for a session on 2026-11-27",
            21: ": the preset since a later session on 2026-11-27",
        }.items()
    },
    "decaymat": ("weight decay on the matrices only (lm_head too), not the norm weights", ["optim.decay=matrices"]),
    "decayhid": ("weight decay on the hidden matrices only, not lm_head or norms", ["optim.decay=hidden"]),
    "ep4": ("4 epochs (with --epochs 2: twice the passes, about Muon's minutes)", ["optim.epochs=4"]),
    "decay1": ("TTT step weights 1, 1, 1", ["head.ttt_decay=1.0"]),
    "decay0.5": ("TTT step weights 1, 0.5, 0.25", ["head.ttt_decay=0.5"]),
    "initout": ("warm start from the target's norm + lm_head rows", ["head.init=output"]),
    "inittarget": ("warm start from the target's last layer too", ["head.init=target"]),
}


def served(spec: str) -> str:
    """The method name a lever's head is served under (file-safe: `+` becomes `_`)."""
    return spec.replace("+", "_")


def equal_data_source(out: Path, n_train: int = 200, n_heldout: int = 64, seed: int = 0) -> Path:
    """eq200's conversations (its first `n_train` training ones and its `n_heldout` held-out ones, in source order)
    as a JSONL file, so that lever `own` re-answers exactly those: the held-out split of this file is eq200's
    (the smallest hashes of the window stay the smallest in any subset holding them)."""
    path = out / "eq200_source.jsonl"
    if path.is_file():
        return path
    from draftsmith.atomic import atomic_write
    from draftsmith.train.data.conversations import read_conversations, split_heldout
    from draftsmith.train.data.dataset import HELDOUT_WINDOW

    convs = list(read_conversations("sharegpt", limit=HELDOUT_WINDOW))
    _, held = split_heldout(convs, n_heldout, seed)
    held_ids = {c.id for c in held}
    keep = held_ids | set([c.id for c in convs if c.id not in held_ids][:n_train])
    lines = [json.dumps({"id": c.id, "messages": c.messages}) + "\n" for c in convs if c.id in keep]
    atomic_write(path, "".join(lines).encode())
    return path


EQSOURCE: dict = {}  # {"path": ...} once main() knows --out


IDS = re.compile(r"^ids(\d+(?:-\d+)+)$")  # lever idsA-B-C: any aux layer ids, e.g. ids2-12-24 or ids2-9-15-24
# lever alsoNAME (or alsoA-B: several): train on <--out>/data/NAME.jsonl too (data.also; made beside the run by its
# run.sh, not committed)
ALSO = re.compile(r"^also(\w+(?:-\w+)*)$")


def lever(name: str) -> tuple[str, list[str]] | None:
    """(description, overrides) of one lever name; None for a name that is no lever."""
    m = IDS.match(name)
    if m:
        ids = m.group(1).split("-")
        return f"aux layer ids ({', '.join(ids)})", [f"target.aux_layer_ids=[{','.join(ids)}]"]
    m = ALSO.match(name)
    if m:
        files = [f"data/{n}.jsonl" for n in m.group(1).split("-")]
        return f"also the conversations of {', '.join(files)} (data.also)", [
            "data.also=[" + ",".join(f"'{{out}}/{f}'" for f in files) + "]"
        ]
    return LEVERS.get(name)


def overrides(spec: str, regen: str | None, features: str | None = None) -> list[str]:
    parts = spec.split("+")
    unknown = [p for p in parts if lever(p) is None]
    if unknown:
        known = ", ".join(LEVERS) + ", idsA-B-C (aux layer ids), alsoNAME or alsoA-B (data.also=[data/NAME.jsonl, ...])"
        raise SystemExit(f"unknown levers {unknown}; known: {known}")
    if "preset" in parts:  # the preset as shipped; with --regen-data its regen:sharegpt data is that file
        out = ["data.path=" + regen, "data.num_conversations=null"] if regen else []
    else:
        out = list(BASELINE)
    for p in parts:
        for o in lever(p)[1] or []:
            if "{regen}" in o:
                if not regen:
                    raise SystemExit(f"lever {p!r} needs --regen-data (make it with `draftsmith regenerate`)")
                o = o.format(regen=regen)
            if "{eqsource}" in o:
                o = o.format(eqsource=EQSOURCE["path"])
            if "{out}" in o:
                o = o.format(out=str(Path(EQSOURCE["path"]).parent))
            if "{features}" in o:
                if not features:  # train/run.py extracts into the cache, before its clock starts (once)
                    continue
                o = o.format(features=features)
            out.append(o)
    last = {o.split("=", 1)[0]: o for o in out}  # a later lever wins a key (Hydra refuses a key given twice)
    return [o for o in out if last[o.split("=", 1)[0]] is o]


def train_command(name: str, spec: str, args, run_dir: Path) -> list[str]:
    """The train/run.py command line (after the interpreter and script) that trains lever `spec` into run_dir."""
    ovr = overrides(spec, args.regen_data, args.features_dir)
    cmd = [
        "conf=eagle3_smollm2",
        f"run_name={name}",
        f"output_dir={run_dir}",
        "eval_every=0",
        "wandb.mode=disabled",
        *ovr,
        f"optim.max_tokens={args.tokens}" if args.tokens else "optim.max_tokens=null",
        f"optim.max_minutes={args.minutes}" if args.minutes else "optim.max_minutes=null",
        # --epochs, unless the lever sets its own (ep4); otherwise the preset's (none: --minutes alone trains until
        # the clock, --tokens until the cap, as the preset itself does)
        *(
            [f"optim.epochs={args.epochs}"]
            if args.epochs and not any(o.startswith("optim.epochs=") for o in ovr)
            else []
        ),
    ]
    if spec in args.curve:  # keep every checkpoint for the curve
        cmd += [
            f"save_every={args.curve_every}",
            f"eval_every={args.curve_every}",
            "eval_batches=8",
            "keep_checkpoints=1000",
        ]
    else:
        cmd += ["save_every=100000", "keep_checkpoints=1"]
    if (run_dir / "checkpoints").exists():
        cmd.append("resume=auto")
    return cmd


def train(name: str, spec: str, args, run_dir: Path, threads: int | None = None) -> None:
    if (run_dir / "done").is_file():
        print(f"[{name}] finished earlier: {run_dir}", flush=True)
        return
    cmd = [sys.executable, str(ROOT / "train" / "run.py"), *train_command(name, spec, args, run_dir)]
    print(f"[{name}] " + " ".join(cmd[2:]), flush=True)
    t0 = time.time()
    env = {**os.environ, **({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)} if threads else {})}
    with open(run_dir.parent / f"{run_dir.name}.log", "a") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, env=env)
    (run_dir / "done").write_text(f"{time.time() - t0:.0f}\n")


def summary(run_dir: Path) -> dict:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in rows if "tok_per_s" in r][-1]
    ev = [r for r in rows if "eval/acc" in r][-1]
    return {
        "tokens": last["tokens"],
        "minutes": last["elapsed_s"] / 60,
        "tok_per_s": last["tok_per_s"],
        "epochs": last["epoch"] + 1,
        "sim_tau": ev["eval/sim_accept_len"],
        "heldout_acc": ev["eval/acc"],
    }


def export(ckpt: Path, out: Path) -> str:
    from draftsmith.cli import main as cli

    if not (out / "config.json").is_file():
        if cli(["export", "--format", "vllm", str(ckpt), str(out)]) != 0:
            raise SystemExit(f"export of {ckpt} failed")
    return str(out)


def check_no_leak(run_dir: Path, prompts: Path) -> None:
    """Refuse a head whose training conversations include a served prompt."""
    from omegaconf import OmegaConf

    from draftsmith.train.data.dataset import prepare_data, source_id

    cfg = OmegaConf.load(run_dir / "config.yaml")
    served = {json.loads(x)["id"] for x in prompts.read_text().splitlines()}
    from transformers import AutoTokenizer

    from draftsmith.assets import cache_dir, resolve_target
    from draftsmith.train.build import resolve_data_cfg

    tok = AutoTokenizer.from_pretrained(resolve_target(cfg.target.name_or_path))
    data = prepare_data(resolve_data_cfg(cfg.data, tok.name_or_path), tok, cache_dir())
    leaked = served & {source_id(s.conv_id) for s in data.train}
    if leaked:
        raise SystemExit(f"{run_dir}: {len(leaked)} served prompts are in its training data, e.g. {sorted(leaked)[:3]}")


def vocab_coverage(regen: str, sizes=(2048, 4096, 8192, 16384)) -> list[dict]:
    """Coverage of the target's own answers by a draft vocab of each size, built on one half of the
    regenerated answers and measured on the other (self-coverage would flatter small vocabularies)."""
    import torch
    from transformers import AutoTokenizer

    from draftsmith.assets import resolve_target
    from draftsmith.train.data.render import special_ids
    from draftsmith.train.data.vocab import build_draft_vocab

    tok = AutoTokenizer.from_pretrained(resolve_target("smollm2"))
    answers = [json.loads(x)["messages"][-1]["content"] for x in Path(regen).read_text().splitlines()]
    halves = []
    for part in (answers[0::2], answers[1::2]):
        c = torch.zeros(len(tok), dtype=torch.long)
        for text in part:
            c += torch.bincount(
                torch.tensor(tok(text, add_special_tokens=False)["input_ids"], dtype=torch.long), minlength=len(tok)
            )
        halves.append(c)
    pinned = sorted(special_ids(tok))
    return [
        {"size": n, "coverage": build_draft_vocab(halves[0], n, pinned_ids=pinned).coverage(halves[1])} for n in sizes
    ]


def serve_workloads(out: Path, heads: dict, workloads: list[str], n: int, args) -> tuple[dict, str]:
    """Every head beside none, ngram and suffix on the first `n` prompts of each bench workload (mtbench, code),
    one served run per workload; (summary, markdown table of tokens per target step). Writes
    out/bench_prompts/{summary.json, WORKLOAD/, workloads/WORKLOAD.jsonl}."""
    from draftsmith.eval.acceptance import run_acceptance
    from draftsmith.eval.prompts import load_workload

    root = out / "bench_prompts"
    sfile = root / "summary.json"
    summary = json.loads(sfile.read_text()) if sfile.exists() else {}
    keys = ("status", "mean_acceptance_length", "tokens_per_target_step", "per_position_acceptance",
            "output_tokens_per_s", "match_vs_none")  # fmt: skip
    for spec in workloads:
        name, records, _ = load_workload(spec, n, None)
        f = root / "workloads" / f"{name}.jsonl"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("".join(json.dumps(r) + "\n" for r in records))
        r = run_acceptance("smollm2", str(f), ["none", "ngram", "suffix"], heads, k=args.k,
                           max_tokens=args.max_tokens, num_prompts=n, out_dir=str(root / name),
                           batch_size=args.batch_size)  # fmt: skip
        summary[name] = {m: {k: row.get(k) for k in keys} for m, row in r["methods"].items()}
        sfile.write_text(json.dumps(summary, indent=1))
    methods = [*heads, "ngram", "suffix"]
    lines = ["| workload | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
    for name, rows in summary.items():
        cells = [f"{(rows.get(m) or {}).get('tokens_per_target_step') or 0:.2f}" for m in methods]
        lines.append(f"| {name} ({n} prompts) | " + " | ".join(cells) + " |")
    return summary, "tokens per target step on the bench prompts:\n\n" + "\n".join(lines)


def curve_points(run_dir: Path, every_min: float) -> list[tuple[float, Path, float | None]]:
    """(minutes, checkpoint, simulated τ) of the checkpoints kept, one per `every_min` minutes at most."""
    points, last = [], -1e9
    checkpoints = sorted((run_dir / "checkpoints").glob("step_*"))
    for ck in checkpoints:
        meta = json.loads((ck / "head.json").read_text())
        m = meta["metrics"].get("elapsed_s", 0) / 60
        if m - last >= every_min or ck == checkpoints[-1]:  # the final head always ends the curve
            points.append((m, ck, meta["metrics"].get("eval/sim_accept_len")))
            last = m
    return points


def eval_curve(run_dir: Path) -> dict[int, tuple[float, float]]:
    """{step: (minutes, simulated τ)} of every held-out evaluation in a run's metrics.jsonl."""
    out, elapsed = {}, 0.0
    for r in (json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()):
        elapsed = r.get("elapsed_s", elapsed)  # an eval row follows its step's training row (when one was logged)
        if "eval/acc" in r:
            out[r["step"]] = (elapsed / 60, r["eval/sim_accept_len"])
    return out


def sim_by_step(curves: dict[str, dict[int, tuple[float, float]]]) -> str:
    """A markdown table of held-out simulated τ per evaluated step, one column per lever (equal steps)."""
    steps = sorted({s for c in curves.values() for s in c})
    head = ["| step | " + " | ".join(curves) + " |", "|---|" + "---|" * len(curves)]
    lines = ["held-out simulated τ by step:", "", *head]
    for st in steps:
        cells = [f"{c[st][1]:.3f} ({c[st][0]:.0f} min)" if st in c else "—" for c in curves.values()]
        lines.append(f"| {st} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench/results/apm")
    ap.add_argument("--levers", default="baseline,output,vocab4096", help="comma list; combine with + (regen+memory)")
    ap.add_argument("--tokens", type=int, default=None, help="supervised tokens per lever (equal-token comparison)")
    ap.add_argument("--minutes", type=float, default=None, help="wall-clock bound per lever")
    ap.add_argument("--epochs", type=int, default=None, help="epochs over each lever's data (equal-data comparison)")
    ap.add_argument("--regen-data", default=None, help="JSONL from `draftsmith regenerate` (levers `regen`)")
    ap.add_argument(
        "--features-dir",
        default=None,
        help="features for lever `offline` (default: the run extracts them into the draftsmith cache "
        "before its clock starts, once per target and data)",
    )
    ap.add_argument(
        "--curve",
        default="",
        type=lambda v: [c for c in v.split(",") if c],
        help="levers (comma list) whose checkpoints make the τ-vs-minutes curves",
    )
    ap.add_argument("--curve-every", type=int, default=200, help="checkpoint every N steps in the curve run")
    ap.add_argument("--curve-min-gap", type=float, default=5.0, help="minutes between served curve points")
    ap.add_argument(
        "--curve-sim-only",
        action="store_true",
        help="curve levers: simulated τ at every evaluated step, but serve only their final heads",
    )
    ap.add_argument("--num-prompts", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument(
        "--batch-size",
        type=int,
        default=8,
        help="prompts per engine step while serving: acceptance is per request, so batching only speeds "
        "the bench up (tok/s are then batch throughput; use 1 for latency figures)",
    )
    ap.add_argument(
        "--side-by-side",
        action="store_true",
        help="train the levers at the same time, one process with one torch thread each (an A/B at equal "
        "minutes on a 2-core machine: two levers, one core each); runs already done are reused",
    )
    ap.add_argument(
        "--workloads",
        default="",
        help="also serve every head on these bench workloads (comma list: mtbench, code), one run per workload, "
        "--workload-prompts prompts each; figures in bench_prompts/summary.json",
    )
    ap.add_argument("--workload-prompts", type=int, default=40)
    ap.add_argument("--train-only", action="store_true")
    args = ap.parse_args()
    if not args.tokens and not args.minutes and not args.epochs:
        ap.error("give --tokens, --minutes and/or --epochs")
    os.environ.setdefault("WANDB_MODE", "disabled")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    EQSOURCE["path"] = str(out / "eq200_source.jsonl")
    if any("own" in s.split("+") for s in args.levers.split(",")):
        equal_data_source(out)
    specs = [s for s in args.levers.split(",") if s]
    specs += [c for c in args.curve if c not in specs]
    for s in specs:
        overrides(s, args.regen_data)  # fail on a bad lever before hours of training
    from draftsmith.eval.prompts import PromptFileError, load_workload

    workloads = [w for w in args.workloads.split(",") if w]
    for w in workloads:
        try:  # and on a workload that names no prompts (mtbench, code, NAME=FILE.jsonl)
            load_workload(w, 1, None)
        except PromptFileError as e:
            raise SystemExit(f"--workloads {w}: {e}") from None
    runs = {s: out / "runs" / s for s in specs}
    for s in specs:
        runs[s].mkdir(parents=True, exist_ok=True)
    if args.side_by_side:  # every lever at once, one torch thread each: equal minutes on equal shares of the cores
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(len(specs)) as pool:
            list(pool.map(lambda s: train(s, s, args, runs[s], threads=1), specs))
    else:
        for s in specs:
            train(s, s, args, runs[s])
    if args.train_only:
        return 0

    from draftsmith.assets import resolve_target
    from draftsmith.eval.acceptance import run_acceptance
    from draftsmith.eval.acceptance_report import format_table

    # served prompts: the raw-data split's held-out ids (a regenerated subset holds them out too: same seed,
    # and the smallest hashes of a superset stay the smallest in any subset); checked per head below
    prompts = out / "prompts.jsonl"
    if not prompts.is_file():
        src = runs.get("baseline", runs[specs[0]]) / "heldout_prompts.jsonl"
        prompts.write_text(src.read_text())
    heads, info = {}, {}
    for s in specs:
        check_no_leak(runs[s], prompts)
        heads[served(s)] = export(runs[s], out / "exported" / s)
        info[s] = {"overrides": overrides(s, args.regen_data, args.features_dir), **summary(runs[s])}
    curve = []
    for c in args.curve:
        points = curve_points(runs[c], args.curve_min_gap)[-1 if args.curve_sim_only else 0 :]
        for i, (m, ck, sim) in enumerate(points):
            name = served(c) if i == len(points) - 1 else f"{served(c)}-at-{m:.0f}min"  # the last is the lever's head
            if name not in heads:
                heads[name] = export(ck, out / "exported" / name)
            curve.append({"lever": c, "name": name, "minutes": m, "sim_tau": sim})
    coverage = vocab_coverage(args.regen_data) if args.regen_data else []
    if coverage:
        print(
            "draft vocab coverage of the target's own answers (held-out half): "
            + ", ".join(f"{c['size']}: {c['coverage']:.1%}" for c in coverage),
            flush=True,
        )
    result = run_acceptance(
        resolve_target("smollm2"),
        str(prompts),
        ["none", "ngram", "suffix"],
        heads,
        k=args.k,
        max_tokens=args.max_tokens,
        num_prompts=args.num_prompts,
        out_dir=str(out / "acceptance"),
        batch_size=args.batch_size,
    )
    rows = result["methods"]
    lines = [
        "| lever | what | tokens | train min | tok/s | epochs | sim τ | held-out acc | served τ | per position "
        "| tok/step |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in specs:
        r, i = rows[served(s)], info[s]
        pos = [round(x, 2) for x in (r.get("per_position_acceptance") or [])]
        desc = " + ".join(lever(p)[0] for p in s.split("+"))
        lines.append(
            f"| {s} | {desc} | {i['tokens']:,} | {i['minutes']:.1f} | {i['tok_per_s']:.0f} | {i['epochs']} | "
            f"{i['sim_tau']:.2f} | {[round(a, 3) for a in i['heldout_acc']]} | "
            f"{r.get('mean_acceptance_length') or 0:.2f} | {pos} | {r.get('tokens_per_target_step') or 0:.2f} |"
        )
    for b in ("ngram", "suffix", "none"):
        r = rows[b]
        pos = [round(x, 2) for x in (r.get("per_position_acceptance") or [])]
        tau = r.get("mean_acceptance_length")
        lines.append(
            f"| {b} | training-free | — | — | — | — | — | — | {f'{tau:.2f}' if tau else '—'} | {pos} | "
            f"{r.get('tokens_per_target_step') or 1:.2f} |"
        )
    for c in curve:
        c["served_tau"] = rows[c["name"]].get("mean_acceptance_length")
        c["tokens_per_step"] = rows[c["name"]].get("tokens_per_target_step")
    table = "\n".join(lines)
    if curve:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for cv in args.curve:
            pts = [c for c in curve if c["lever"] == cv]
            line = ax.plot([c["minutes"] for c in pts], [c["served_tau"] for c in pts], "o-", label=f"{cv} served τ")
            ax.plot(
                [c["minutes"] for c in pts],
                [c["sim_tau"] for c in pts],
                "s--",
                color=line[0].get_color(),
                label=f"{cv} simulated τ",
            )
        for b, style in (("ngram", ":"), ("suffix", "-.")):
            if rows[b].get("mean_acceptance_length"):
                ax.axhline(rows[b]["mean_acceptance_length"], ls=style, color="gray", label=f"{b} τ")
                ax.axhline(rows[b]["tokens_per_target_step"], ls=style, color="k", label=f"{b} tokens/step")
        ax.set_xlabel("training minutes")
        ax.set_ylabel(f"mean acceptance length τ (k={args.k})")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / "curve.png", dpi=120)
        for cv in args.curve:
            table += f"\n\ncurve ({cv}): " + ", ".join(
                f"{c['minutes']:.0f} min: served τ {c['served_tau'] or 0:.2f} (sim {c['sim_tau'] or 0:.2f})"
                for c in curve
                if c["lever"] == cv
            )
        table += "\n\n" + sim_by_step({c: eval_curve(runs[c]) for c in args.curve})
    bench = {}
    if workloads:
        final = {served(s): heads[served(s)] for s in specs}
        bench, bench_table = serve_workloads(out, final, workloads, args.workload_prompts, args)
        table += "\n\n" + bench_table
    (out / "bench.json").write_text(
        json.dumps(
            {
                "levers": info,
                "bench_prompts": bench,
                "curve": curve,
                "vocab_coverage": coverage,
                "args": vars(args),
                "acceptance": str(out / "acceptance" / "acceptance.json"),
            },
            indent=2,
        )
    )
    (out / "bench.md").write_text(table + "\n")
    from draftsmith.paths import make_portable

    make_portable(out)  # committed results name paths relative to the repo (home as ~), never this machine's
    print("\n" + format_table(result) + "\n\n" + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
