"""Train a draft head with Hydra + accelerate.

draftsmith train conf=eagle3_smollm2                                 # from any directory
accelerate launch train/run.py conf=eagle3_smollm2
accelerate launch train/run.py conf=eagle3_llama8b head.ttt_steps=3 data.max_length=1024
python train/run.py conf=eagle3_smollm2 optim.max_minutes=5 resume=auto
python train/run.py conf=eagle3_llama8b dry_run=true dry_run_processes=8   # per-rank memory, no weights
python train/run.py -m conf=eagle3_smollm2 optim.lr=1e-3,2e-3             # a sweep: one run per value
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

from draftsmith.train.config import conf_dir, register_configs

register_configs()
CONF_DIR = str(conf_dir())  # package data: works from any directory, editable install or not


def git_sha() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=CONF_DIR).stdout.strip()
    except OSError:
        return "unknown"


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> dict:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from draftsmith.errors import handle_errors

    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode == RunMode.MULTIRUN:  # each job of a sweep in its own directory: <output_dir>/<job number>
        with open_dict(cfg):
            cfg.output_dir = hydra_cfg.runtime.output_dir
        overrides = " ".join(hydra_cfg.overrides.task)
        print(f"multirun job {hydra_cfg.job.num}: {overrides} -> output_dir={cfg.output_dir}", flush=True)
    result: dict = {}

    def go() -> None:
        result.update(run(cfg))

    # a project error, Ctrl-C or a full disk: one message (Hydra would print a 15-40 line traceback around it)
    code = handle_errors("train", go)
    if code:
        sys.exit(code)
    return result


def run(cfg: DictConfig) -> dict:
    import torch
    from accelerate import Accelerator, PartialState

    from draftsmith.lock import acquire_dir
    from draftsmith.train.build import build_head, build_run, init_dir, pin_fast_bf16, probe_fast_bf16
    from draftsmith.train.checkpoint import check_run_dir, clear_run_dir, recorded_fast_bf16, verify_checkpoint
    from draftsmith.train.config import validate_config
    from draftsmith.train.loop import print0, train
    from draftsmith.train.sharded import use_fsdp_on_cpu

    validate_config(cfg)
    if cfg.dry_run:  # shapes only: no weights, no data, no accelerator
        from draftsmith.train.memory import report

        print(report(cfg, cfg.dry_run_processes))
        return {}
    mp = cfg.mixed_precision
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    run_dir = Path(cfg.output_dir)
    # one precision decision per run, kept by every resume of it (the probe is timed, so a re-probe may differ)
    recorded = recorded_fast_bf16(run_dir, cfg.resume)
    if cfg.fast_bf16 is not None:
        fast, source = bool(cfg.fast_bf16), "fast_bf16 set"
    elif recorded is not None:
        fast, source = recorded[0], f"recorded in {recorded[1]}"
    else:
        fast, source = probe_fast_bf16(device), "timed probe"
        state = PartialState()  # the process group, before the Accelerator that takes the decision
        if state.num_processes > 1:  # each rank timed its own probe: every rank takes rank 0's answer
            import torch.distributed as dist

            vote = torch.tensor([int(fast)], device=state.device)
            dist.broadcast(vote, src=0)
            fast, source = bool(vote.item()), "rank 0's timed probe"
    pin_fast_bf16(fast)
    with open_dict(cfg):
        cfg.fast_bf16 = fast
    accelerator = Accelerator(mixed_precision=("bf16" if fast else "no") if mp == "auto" else mp)
    torch.manual_seed(cfg.seed)
    log = functools.partial(print0, accelerator)
    if use_fsdp_on_cpu(accelerator):
        log(
            f"FSDP2 on CPU (gloo): the head's weights, gradients and optimizer state sharded over "
            f"{accelerator.num_processes} processes"
        )
    speed = "faster" if fast else "not faster"
    log(f"precision: bf16 kernels {speed} here ({source}); autocast {accelerator.mixed_precision}")
    if recorded is not None and recorded[0] != fast:
        log(f"warning: fast_bf16={fast} differs from {recorded[0]} recorded in {recorded[1]}: not an exact resume")
    main_proc = accelerator.is_main_process
    # nothing is written or deleted before the data, target and features are known good: a refused run leaves no
    # trace, and overwrite=true deletes the earlier run only then
    resume, clear = check_run_dir(run_dir, cfg.resume, cfg.overwrite)
    if clear == "incomplete":
        log(f"resume=auto: the newest checkpoint is incomplete; continuing from {resume}, the newest intact one")
    if resume:  # a corrupt checkpoint is refused here, naming it, before anything is written
        verify_checkpoint(run_dir if resume == "auto" else resume)
    if main_proc and run_dir.is_dir():  # an earlier run's directory: no second process may touch it from here on
        acquire_dir(run_dir, f"training into {run_dir}")
    if resume != cfg.resume:
        with open_dict(cfg):
            cfg.resume = resume
    # features from disk or from a producer process: the target's decoder layers stay off this rank (init=target
    # copies its last layer)
    ends_only = cfg.data.features in ("offline", "stream") and cfg.head.init != "target"
    staging = Path(tempfile.mkdtemp(prefix="draftsmith-run-")) if main_proc else None  # data_stats, held-out prompts
    try:
        t0 = time.time()
        target, tokenizer, data, vocab = build_run(cfg, accelerator.device, staging, log=log, ends_only=ends_only)
        prepared = {"data_s": round(time.time() - t0, 1)}  # this invocation's, before the clock
        target = ensure_features(cfg, target, tokenizer, data, vocab, accelerator, ends_only, log)
        prepared["features_s"] = round(time.time() - t0 - prepared["data_s"], 1)
        if main_proc:
            acquire_dir(run_dir, f"training into {run_dir}")
            clear_run_dir(run_dir, clear, log)
            for f in staging.iterdir():
                shutil.move(f, run_dir / f.name)
            (run_dir / "provenance.txt").write_text(f"git {git_sha()}\ncommand {' '.join(sys.argv)}\n")
            (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
            (run_dir / "prepare_seconds.json").write_text(json.dumps(prepared) + "\n")  # the quickstart's stage split
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    accelerator.wait_for_everyone()  # no rank writes into the run dir before the main process has cleared it
    if cfg.prepare_only:
        log(f"prepare_only: data and features ready, held-out prompts in {run_dir}; resume=auto trains")
        return {}
    head = build_head(cfg.head, target, vocab)
    if cfg.head.get("init_from"):
        fresh = init_dir(cfg.head) is None
        log(f"head: {'a fresh head' if fresh else 'weights'} from head.init_from={cfg.head.init_from}")
    head.config.target["name_or_path"] = tokenizer.name_or_path  # the target's resolved local dir or hub id
    tracker = None
    if accelerator.is_main_process and cfg.wandb.get("mode", "disabled") != "disabled":
        import wandb

        tracker = wandb.init(
            project=cfg.wandb.get("project", "draftsmith"),
            name=cfg.run_name,
            dir=str(run_dir),
            mode=cfg.wandb["mode"],
            config=OmegaConf.to_container(cfg, resolve=True),
        )
    result = train(cfg, head, target, data, accelerator, tracker)
    if tracker:
        tracker.finish()
    return result


def ensure_features(cfg, target, tokenizer, data, vocab, accelerator, ends_only: bool, log):
    """data.features=offline: the run's features extracted once into the cache (or the given features_dir); returns
    the target to train against (the whole one when the held-out features are missing)."""
    if cfg.data.features != "offline":
        return target
    from draftsmith.train.build import build_target
    from draftsmith.train.features.shards import HELDOUT_DIR
    from draftsmith.train.features.sources import ensure_offline_features, features_complete

    if not cfg.data.get("features_dir"):

        def load_whole():  # only when something is left to extract
            log("features: loading the whole target to extract them")
            return build_target(cfg.target, accelerator.device)[0]

        with open_dict(cfg):
            cfg.data.features_dir = ensure_offline_features(
                cfg, target, tokenizer, data, vocab, accelerator, log=log, load_whole=load_whole
            )
    held = Path(cfg.data.features_dir) / HELDOUT_DIR
    if ends_only and data.heldout and not features_complete(held, data.heldout):
        log(
            f"features: {held} does not hold this run's held-out features (extracted before they were stored?): "
            f"loading the whole target for held-out eval; `draftsmith extract --out {cfg.data.features_dir} "
            f"<the same overrides>` adds them"
        )
        target = build_target(cfg.target, accelerator.device)[0]
    return target


def cli(argv: list[str], prog: str = "draftsmith train") -> int:
    """`draftsmith train KEY=VALUE ...`: the same run as `python train/run.py KEY=VALUE ...`.

    Our own --help (presets, groups, the keys set most, from the schema) and our own check of the overrides (a
    mistyped key or a missing preset: one paragraph naming the closest, exit 2) come before Hydra's."""
    from draftsmith.errors import handle_errors
    from draftsmith.train.usage import check_overrides, usage

    if "-h" in argv or "--help" in argv:
        print(usage())
        return 0
    code = handle_errors("train", lambda: check_overrides(argv))
    if code:
        return code
    sys.argv = [prog, *argv]  # Hydra reads its overrides from sys.argv
    main()
    return 0


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:], sys.argv[0]))
