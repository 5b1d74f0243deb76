"""`draftsmith adapt`: fit a trained head to the traffic it serves, and promote it only when it wins.

    draftsmith adapt outputs/eagle3_smollm2 --traffic requests.jsonl --minutes 15 --out exported/mine
    draftsmith adapt --forget outputs/eagle3_smollm2-adapt     # delete the traffic and all that was made from it

HEAD is a training run (its output_dir, or one of its checkpoints). The traffic (draftsmith/traffic.py: OpenAI
requests, a messages JSONL, a vLLM request log) is read into unique prompts; a slice chosen by hash is held out; the
target answers the rest (regeneration, resumable); training continues from HEAD's weights as a new run (its own
optimizer state, lr x --lr-scale, the clock at --minutes) on those answers plus a replayed share of HEAD's own data
(--replay, never its held-out conversations); its features are extracted once before the clock. Then the adapted head
and HEAD are served side by side (vLLM, or the reference decoder with --judge reference, which counts the same
tokens) on the traffic's held-out slice, on HEAD's held-out prompts and on MT-Bench. The adapted head is exported to
--out only if it serves more tokens per target step than HEAD on the traffic (--min-gain) and loses at most
--tolerance on every other workload; otherwise --out is left as it was and the report says why.

Everything stays under --work (default: <HEAD>-adapt): the traffic's prompts, the target's answers, the run, the
judge's outputs, report.md / report.png (no prompt text unless --show-prompts). `--forget WORK` deletes it and the
cached data and features made from the traffic. Exit status: 0 promoted, 3 judged and not promoted, else an error.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

from draftsmith.adapt_report import write_report
from draftsmith.adapt_work import RECORD, check_claimable, claim, forget
from draftsmith.argtypes import positive_float, positive_int
from draftsmith.errors import ConfigError, DataError
from draftsmith.train.config import hydra_value

NOT_PROMOTED = 3
WORKLOADS = ("traffic", "chat", "mtbench")


# ---------------------------------------------------------------- HEAD and the run config


def head_run(head: str) -> tuple[Path, Path, dict]:
    """(run dir, checkpoint, saved config) of HEAD: a training run's output_dir or one of its checkpoints."""
    from draftsmith.train.checkpoint import read_run_config, resolve_checkpoint

    path = Path(head)
    if (path / "draftsmith.json").is_file():
        raise ConfigError(
            f"{path} is an exported head: adapt continues training, so it needs the run it was exported from (the "
            "training output_dir, holding config.yaml and checkpoints/)"
        )
    ckpt = resolve_checkpoint(path)
    run = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else path
    config = run / "config.yaml"
    if not config.is_file():
        raise ConfigError(f"{run}: no config.yaml beside its checkpoints; adapt needs the run's saved config")
    return run, ckpt, read_run_config(config)


def saved_overrides(saved: dict, skip: tuple[str, ...] = ()) -> list[str]:
    """`key=value` overrides that rebuild a saved run config (every leaf the current schema knows)."""
    from omegaconf import OmegaConf

    from draftsmith.train.config import compose_config

    base = compose_config([])
    out = []

    def walk(prefix: str, node) -> None:
        if isinstance(node, dict) and (not prefix or OmegaConf.is_dict(OmegaConf.select(base, prefix))):
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
            return
        if prefix in skip or OmegaConf.select(base, prefix, default="__absent__") == "__absent__":
            return  # a key this version does not have (an older run), or one adapt sets itself
        out.append(f"{prefix}={hydra_value(node)}")

    walk("", saved)
    return out


def replay_entries(saved: dict, run: Path, n_traffic: int, share: float) -> tuple[list, int]:
    """data.also entries replaying HEAD's data so that ~`share` of the adapted run's conversations are HEAD's (each
    source scaled alike, its first conversations), and how many that is."""
    if share <= 0:
        return [], 0
    stats_path = run / "data_stats.json"
    stats = json.loads(stats_path.read_text()) if stats_path.is_file() else {}
    data = saved["data"]
    extras = [({"path": e} if isinstance(e, str) else dict(e)) for e in data.get("also") or []]
    also_kept = [a.get("kept") or 0 for a in stats.get("also", [])]
    # data_stats counts every training conversation; data.path's own are those the data.also sources did not add
    counts = [(stats.get("train_conversations") or 0) - sum(also_kept), *also_kept]
    if len(counts) != len(extras) + 1 or sum(counts) <= 0 or min(counts) < 0:
        raise ConfigError(f"{stats_path}: cannot tell how many conversations HEAD trained on from each source")
    total = sum(counts)
    want = min(total, round(n_traffic * share / (1 - share)))
    frac = want / total
    sources = [{"path": data["path"]}] + extras
    out, n = [], 0
    for src, c in zip(sources, counts):
        take = int(round(c * frac))
        if take >= 1:
            # a regen: source's first `take` conversations, or a file's; HEAD's held-out ones go by data.exclude_ids
            out.append({**src, "num_conversations": take})
            n += take
    return out, n


def adapt_overrides(args, saved: dict, run: Path, ckpt: Path, work: Path, n_train: int) -> tuple[list[str], int]:
    """The adapted run: HEAD's config, continued from its checkpoint on the traffic's answers plus the replay."""
    skip = (
        "output_dir",
        "resume",
        "overwrite",
        "run_name",
        "head.init_from",
        "data.path",
        "data.also",
        "data.num_conversations",
        "data.heldout",
        "data.features_dir",
        "data.exclude_ids",
    )
    replay, n_replay = replay_entries(saved, run, n_train, args.replay)
    optim = saved.get("optim", {})
    lr = float(optim.get("lr", 1e-4)) * args.lr_scale
    overrides = saved_overrides(saved, skip) + [
        f"output_dir={hydra_value(str(work / 'run'))}",
        "resume=auto",
        "run_name=adapt",
        f"head.init_from={hydra_value(str(ckpt))}",
        f"data.path={hydra_value(str(work / 'traffic_answers.jsonl'))}",
        "data.num_conversations=null",
        # a few of the traffic's answers for the run's own held-out eval (the judge uses the held-out slice)
        f"data.heldout={max(1, min(32, n_train // 10))}",
        f"data.also={hydra_value(replay)}",
        f"data.exclude_ids={hydra_value(str(work / 'head_heldout.jsonl'))}",
        "data.features_dir=null",
        f"optim.lr={lr!r}",
        f"optim.warmup_steps={min(int(optim.get('warmup_steps') or 0), 10)}",
        f"optim.max_minutes={args.minutes!r}",
        "optim.epochs=null",
        "optim.max_tokens=null",
        "optim.max_steps=null",
    ]
    return overrides + list(args.overrides), n_replay


# ---------------------------------------------------------------- judging


def judge_vllm(args, target: str, files: dict[str, Path], heads: dict[str, str], out: Path) -> dict[str, dict]:
    """Per workload: tokens per target step (and the rest of the served figures) of every method, from vLLM."""
    from draftsmith.eval.acceptance import run_acceptance
    from draftsmith.eval.acceptance_report import format_table

    methods = ["none"] + (["ngram", "suffix"] if args.baselines else [])
    results = {}
    for w, f in files.items():
        print(f"\n--- judge: {w} ---", flush=True)
        r = run_acceptance(
            target,
            str(f),
            methods,
            heads,
            k=args.k,
            max_tokens=args.max_tokens,
            num_prompts=args.num_prompts,
            out_dir=str(out / w),
            batch_size=8,
        )
        print(format_table(r), flush=True)
        results[w] = {
            name: {
                "status": m.get("status"),
                "tokens_per_target_step": m.get("tokens_per_target_step"),
                "output_tokens_per_s": m.get("output_tokens_per_s"),
                "match_vs_none": m.get("match_vs_none"),
                "per_position_acceptance": m.get("per_position_acceptance"),
            }
            for name, m in r["methods"].items()
        }
    return results


def judge_reference(args, target: str, files: dict[str, Path], heads: dict[str, str], out: Path) -> dict[str, dict]:
    """The same figures from the in-process reference decoder (its accepted counts equal vLLM's; no served tok/s)."""
    import torch
    from transformers import AutoTokenizer

    from draftsmith.eval.prompts import load_prompts, render_prompts
    from draftsmith.eval.reference_decoder import NoDrafter, decode_prompts, generation_stop_ids, load_head_drafter
    from draftsmith.train.target import Target

    torch.set_grad_enabled(False)
    tokenizer = AutoTokenizer.from_pretrained(target)
    model = Target.from_pretrained(target, _aux_ids(heads))
    stop = generation_stop_ids(tokenizer, target)  # the eos ids vLLM stops on
    drafters = {"none": NoDrafter()}
    drafters.update({n: load_head_drafter(n, d, model)[0] for n, d in heads.items()})
    results = {}
    for w, f in files.items():
        prompts = render_prompts(tokenizer, load_prompts(f, args.num_prompts))
        outputs, results[w] = {}, {}
        for name, drafter in drafters.items():
            outputs[name], summary = decode_prompts(model, drafter, prompts, args.k, args.max_tokens, stop_ids=stop)
            results[w][name] = {
                "status": "ok",
                "tokens_per_target_step": summary["tokens_per_target_step"],
                "output_tokens_per_s": summary["output_tokens_per_s"],
                "match_vs_none": None if name == "none" else float(outputs[name] == outputs["none"]),
                "per_position_acceptance": summary["per_position_acceptance"],
            }
        print(f"judge ({w}): " + ", ".join(f"{n} {r['tokens_per_target_step']:.3f}" for n, r in results[w].items()))
    (out / "reference.json").parent.mkdir(parents=True, exist_ok=True)
    (out / "reference.json").write_text(json.dumps(results, indent=2))
    return results


def _aux_ids(heads: dict[str, str]) -> list[int]:
    from draftsmith.train.checkpoint import read_head

    _, config, _, _ = read_head(next(iter(heads.values())))
    return list(config.get("aux_layer_ids") or [])


def decide(results: dict[str, dict], min_gain: float, tolerance: float) -> tuple[bool, dict, list[str]]:
    """(promote?, adapted/current tokens per target step per workload, the reasons it is not promoted).

    Promoted when the adapted head serves more than `min_gain` x HEAD's tokens per step on the traffic, at least
    (1 - tolerance) x on every other workload, and every greedy output equal to no speculation's."""
    gains, why = {}, []
    for w, methods in results.items():
        a, c = methods.get("adapted", {}), methods.get("current", {})
        if a.get("status") != "ok" or c.get("status") != "ok":
            why.append(f"{w}: a head did not serve (adapted {a.get('status')}, current {c.get('status')})")
            continue
        gains[w] = a["tokens_per_target_step"] / c["tokens_per_target_step"]
        if a.get("match_vs_none") is not None and a["match_vs_none"] < 1.0:
            why.append(f"{w}: {1 - a['match_vs_none']:.0%} of the adapted head's outputs differ from no speculation's")
    if "traffic" not in gains:
        why.append("traffic: no figure to judge by")
    elif gains["traffic"] <= min_gain:
        why.append(f"traffic: {gains['traffic']:.3f}x HEAD's tokens per step, not above --min-gain {min_gain:g}")
    for w, g in gains.items():
        if w != "traffic" and g < 1 - tolerance:
            why.append(f"{w}: {g:.3f}x HEAD's tokens per step, below 1 - --tolerance = {1 - tolerance:g}")
    return not why, gains, why


def promote(candidate: Path, out: Path, report: Path) -> Path | None:
    """Put `candidate` at `out`; an export already there moves to `<out>.previous` (returned). Whole or nothing: the
    new one is copied beside it first, then the two renames."""
    out = out.resolve()
    staging = out.with_name(out.name + ".incoming")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(candidate, staging)
    shutil.copy2(report, staging / "adapt_report.md")
    previous = None
    if out.exists():
        previous = out.with_name(out.name + ".previous")
        shutil.rmtree(previous, ignore_errors=True)
        out.rename(previous)
    staging.rename(out)
    return previous


# ---------------------------------------------------------------- forget


def traffic_sha1(prompts: list[dict]) -> str:
    return hashlib.sha1("\n".join(p["id"] for p in prompts).encode()).hexdigest()


def continue_record(work: Path, record: dict) -> dict:
    """`record` for WORK, keeping the cache entries an earlier run there recorded; refused when that run adapted
    another checkpoint or other traffic (its answers and run would mix in)."""
    path = work / RECORD
    if not path.is_file():
        return record
    old = json.loads(path.read_text())
    for key, what in (("checkpoint", "checkpoint"), ("traffic_sha1", "traffic")):
        if old.get(key) and old[key] != record[key]:
            raise ConfigError(
                f"{work} holds an adapt run of another {what} ({old.get(what)}); use another --work, or delete "
                f"that one first (draftsmith adapt --forget {work})"
            )
    return {**old, **record, "private_paths": old.get("private_paths", [])}


def private_paths(run_dir: Path) -> list[str]:
    """The cache entries the adapted run made from the traffic: its features and its prepared data."""
    from draftsmith.train.checkpoint import read_run_config

    cfg = read_run_config(run_dir / "config.yaml") if (run_dir / "config.yaml").is_file() else {}
    out = []
    features = ((cfg or {}).get("data") or {}).get("features_dir")
    if features:
        out.append(features)
    stats = json.loads((run_dir / "data_stats.json").read_text()) if (run_dir / "data_stats.json").is_file() else {}
    if stats.get("cache"):
        out.append(stats["cache"])
    return out


# ---------------------------------------------------------------- main


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="draftsmith adapt",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("head", nargs="?", help="the trained head: a training run's output_dir (or one of its checkpoints)")
    p.add_argument("--traffic", help="the requests: OpenAI chat/completions JSONL, a messages JSONL, or a vLLM log")
    p.add_argument(
        "--out",
        help="where the adapted head is exported, only if it wins (an export there is kept as "
        "<out>.previous when replaced; never touched when it loses)",
    )
    p.add_argument("--work", help="working directory (default: <HEAD>-adapt)")
    p.add_argument("--minutes", type=positive_float, default=15.0, help="training minutes on the clock (default 15)")
    p.add_argument(
        "--replay",
        type=float,
        default=0.5,
        help="share of the adapted run's conversations replayed from HEAD's own data (default 0.5)",
    )
    p.add_argument("--lr-scale", type=float, default=0.5, help="lr = HEAD's optim.lr x this (default 0.5)")
    p.add_argument("--heldout", type=int, default=64, help="traffic prompts held out for judging (at most 1/5)")
    p.add_argument(
        "--min-gain",
        type=float,
        default=1.0,
        help="promote only above this adapted / HEAD tokens per step on the traffic (default 1.0)",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=0.03,
        help="the largest loss allowed on HEAD's own held-out prompts and MT-Bench (default 0.03)",
    )
    p.add_argument(
        "--judge",
        choices=("vllm", "reference"),
        default="vllm",
        help="vllm (served, default) or reference (the in-process decoder: same counts, no vLLM)",
    )
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="judged on (default traffic,chat,mtbench)")
    p.add_argument("--baselines", action="store_true", help="also serve ngram and suffix (for the report)")
    p.add_argument("--num-prompts", type=positive_int, default=32, help="prompts judged per workload (default 32)")
    p.add_argument("--max-tokens", type=positive_int, default=128, help="tokens generated per prompt (default 128)")
    p.add_argument("--k", type=positive_int, default=3, help="speculative tokens per step (default 3)")
    p.add_argument(
        "--max-prompt-tokens",
        type=int,
        default=None,
        help="longest prompt kept (default: HEAD's data.max_length - data.regen_max_tokens)",
    )
    p.add_argument("--skip-invalid", action="store_true", help="read past bad traffic records (each is reported)")
    p.add_argument(
        "--regen-backend",
        choices=("auto", "vllm", "hf"),
        default="auto",
        help="what answers the traffic (default: vLLM when installed)",
    )
    p.add_argument("--show-prompts", action="store_true", help="quote held-out traffic prompts in the report")
    p.add_argument(
        "--forget",
        metavar="WORK",
        help="delete WORK and the cached data and features made from its traffic (only what adapt made: each path is "
        "checked first)",
    )
    p.add_argument("--dry-run", action="store_true", help="with --forget: list what would be deleted, delete nothing")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for the adapted run, e.g. optim.lr=1e-3")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_intermixed_args(argv)
    if args.forget:
        return forget(Path(args.forget), dry_run=args.dry_run)
    missing = [f for f, v in (("HEAD", args.head), ("--traffic", args.traffic), ("--out", args.out)) if not v]
    if missing:
        raise ConfigError(f"draftsmith adapt needs {', '.join(missing)} (draftsmith adapt --help)")
    if not 0 <= args.replay < 1 or args.minutes <= 0 or args.lr_scale <= 0 or not 0 <= args.tolerance < 1:
        raise ConfigError(
            f"--replay {args.replay} (0 <= r < 1), --minutes {args.minutes} (> 0), --lr-scale {args.lr_scale} (> 0), "
            f"--tolerance {args.tolerance} (0 <= t < 1)"
        )
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if "traffic" not in workloads or set(workloads) - set(WORKLOADS):
        raise ConfigError(f"--workloads {args.workloads}: traffic plus any of chat, mtbench")
    t_start = time.time()
    run, ckpt, saved = head_run(args.head)
    work = Path(args.work or f"{run.resolve()}-adapt")
    check_claimable(work)  # a WORK holding someone else's files is refused before anything is read or made
    spent: dict[str, float] = {}

    from transformers import AutoTokenizer

    from draftsmith.assets import resolve_target
    from draftsmith.atomic import atomic_write, atomic_write_json
    from draftsmith.traffic import problem_lines, read_traffic, split_heldout
    from draftsmith.train.data.render import render_prompt

    target = resolve_target(saved["target"]["name_or_path"])
    tokenizer = AutoTokenizer.from_pretrained(target)
    data = saved["data"]
    from draftsmith.train.build import apply_template_options, template_kwargs

    apply_template_options(tokenizer, data)  # the traffic renders as HEAD's deployment renders its prompts
    limit = args.max_prompt_tokens or max(1, int(data["max_length"]) - int(data.get("regen_max_tokens") or 256))
    traffic = read_traffic(
        args.traffic, lambda m: len(render_prompt(tokenizer, m)), limit, skip_invalid=args.skip_invalid
    )
    print(traffic.summary(), flush=True)
    if traffic.problems:
        print(problem_lines(traffic, "skipped (--skip-invalid)"), flush=True)
    if len(traffic.prompts) < 10:
        raise DataError(
            f"{args.traffic}: {len(traffic.prompts)} unique prompts; adapt needs at least 10 to train on "
            "and to judge by"
        )
    n_held = max(1, min(args.heldout, len(traffic.prompts) // 5))
    train_prompts, held = split_heldout(traffic.prompts, n_held)

    def jsonl(rows) -> bytes:
        return "".join(
            json.dumps({"id": p["id"], "messages": p["messages"]}, ensure_ascii=False) + "\n" for p in rows
        ).encode()

    record = {
        "head": str(run),
        "checkpoint": str(ckpt),
        "traffic": str(args.traffic),
        # what the work dir's answers and run were made from: a re-run continues them only for the same two
        "traffic_sha1": traffic_sha1(traffic.prompts),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "private_paths": [],
    }
    record = continue_record(work, record)  # refused here, before anything in WORK is rewritten
    record["owner"] = claim(work)  # WORK made (only now: a refused run leaves none) and marked as adapt's
    atomic_write(work / "traffic_train.jsonl", jsonl(train_prompts))
    atomic_write(work / "traffic_heldout.jsonl", jsonl(held))
    head_heldout = run / "heldout_prompts.jsonl"
    if head_heldout.is_file():
        shutil.copy2(head_heldout, work / "head_heldout.jsonl")
    else:
        (work / "head_heldout.jsonl").write_text("")
    atomic_write_json(work / RECORD, record)
    print(f"adapt: {len(train_prompts)} traffic prompts to train on, {len(held)} held out for judging; work dir {work}")

    # the target's answers to the traffic (resumable; kept in WORK only)
    from draftsmith.train.data.regenerate import regenerate

    t0 = time.time()
    regenerate(
        target,
        str(work / "traffic_train.jsonl"),
        str(work / "traffic_answers.jsonl"),
        max_tokens=int(data.get("regen_max_tokens") or 256),
        temperature=float(data.get("regen_temperature") or 0.0),
        seed=int(data.get("seed") or 0),
        max_prompt_tokens=limit,
        backend=args.regen_backend,
        last_turn=True,
        chat_template_kwargs=template_kwargs(data) or None,  # answered in HEAD's mode (Qwen3 thinking or not)
    )
    spent["answers"] = round(time.time() - t0, 1)

    # the adapted run: HEAD's config and weights, the traffic's answers + the replay, the clock at --minutes
    from draftsmith.quickstart.run import run_child
    from draftsmith.train.config import compose_config, validate_config

    overrides, n_replay = adapt_overrides(args, saved, run, ckpt, work, len(train_prompts))
    validate_config(compose_config(overrides))  # a bad override fails here, before training starts
    (work / "overrides.txt").write_text("\n".join(overrides) + "\n")
    print(
        f"adapt: replaying up to {n_replay} of HEAD's conversations (--replay {args.replay:g}); training for "
        f"{args.minutes:g} minutes from {ckpt}",
        flush=True,
    )
    t0 = time.time()
    code = run_child([sys.executable, "-m", "draftsmith.train.run", *overrides])
    spent["prepare+train"] = round(time.time() - t0, 1)
    record["private_paths"] = sorted(set(record["private_paths"]) | set(private_paths(work / "run")))
    atomic_write_json(work / RECORD, record)
    if code:
        print(
            f"draftsmith adapt: training stopped (exit status {code}); nothing was promoted and {args.out} is as "
            "it was. Run the same command again to continue from the last checkpoint.",
            file=sys.stderr,
        )
        return code

    # export both heads, then judge them side by side
    from draftsmith.cli import main as cli

    t0 = time.time()
    for src, dst in ((work / "run", work / "candidate"), (ckpt, work / "current")):
        shutil.rmtree(dst, ignore_errors=True)
        if cli(["export", "--format", "vllm", str(src), str(dst)]) != 0:
            raise DataError(f"adapt: exporting {src} failed (above); nothing was promoted")
    spent["export"] = round(time.time() - t0, 1)
    from draftsmith.eval.prompts import mtbench_file

    files = {"traffic": work / "traffic_heldout.jsonl"}
    if "chat" in workloads and (work / "head_heldout.jsonl").stat().st_size:
        files["chat"] = work / "head_heldout.jsonl"
    if "mtbench" in workloads:
        files["mtbench"] = mtbench_file()
    heads = {"current": str(work / "current"), "adapted": str(work / "candidate")}
    t0 = time.time()
    judge = judge_vllm if args.judge == "vllm" else judge_reference
    results = judge(args, target, files, heads, work / "judge")
    spent["judge"] = round(time.time() - t0, 1)
    ok, gains, why = decide(results, args.min_gain, args.tolerance)
    summary = {
        "head": str(run),
        "out": str(args.out),
        "traffic": {
            "file": str(args.traffic),
            "summary": traffic.summary(with_path=False),
            "requests": traffic.records,
            "unique": len(traffic.prompts),
            "duplicates": traffic.duplicates,
            "skipped": len(traffic.problems),
            "train": len(train_prompts),
            "heldout": len(held),
        },
        "replay_conversations": replayed(work / "run", n_replay),
        "minutes": args.minutes,
        "judge_backend": args.judge,
        "judge": results,
        "gains": gains,
        "min_gain": args.min_gain,
        "tolerance": args.tolerance,
        "promoted": ok,
        "why_not": why,
        "train": last_metrics(work / "run"),
        "seconds": {**spent, "total": round(time.time() - t_start, 1)},
    }
    report = write_report(work, summary, args.show_prompts, held)
    if ok:
        previous = promote(work / "candidate", Path(args.out), report)
        summary["previous"] = str(previous) if previous else None
    atomic_write_json(work / "adapt_summary.json", summary)
    print("\n" + report.read_text(), flush=True)
    if ok:
        kept = f"; the export that was there is now {previous}" if previous else ""
        print(f"adapt: promoted: the adapted head is at {args.out}{kept}")
        return 0
    print(f"adapt: not promoted; {args.out} is as it was. Report: {report}")
    return NOT_PROMOTED


def replayed(run_dir: Path, asked: int) -> int:
    """HEAD's conversations the adapted run trained on: those asked for, less HEAD's held-out and too-long ones."""
    path = run_dir / "data_stats.json"
    stats = json.loads(path.read_text()) if path.is_file() else {}
    return sum(a.get("kept", 0) for a in stats.get("also", [])) if "also" in stats else asked


def last_metrics(run_dir: Path) -> dict:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return {}
    log = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    last = [r for r in log if "tok_per_s" in r]
    evals = [r for r in log if "eval/acc" in r]
    out = {}
    if last:
        out.update(steps=last[-1]["step"], tokens=last[-1]["tokens"], tok_per_s=last[-1]["tok_per_s"])
    if evals:
        out.update(eval_acc_per_step=evals[-1]["eval/acc"], first_eval_acc_per_step=evals[0]["eval/acc"])
    return out
