"""Train a draft head with Hydra + accelerate.

    accelerate launch train/run.py conf=eagle3_smollm2
    accelerate launch train/run.py conf=eagle3_llama8b head.ttt_steps=3 data.max_length=1024
    python train/run.py conf=eagle3_smollm2 optim.max_minutes=5 resume=auto
    python train/run.py conf=eagle3_llama8b dry_run=true dry_run_processes=8   # per-rank memory, no weights
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

from draftsmith.train.config import register_configs

register_configs()
CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")


def git_sha() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=CONF_DIR).stdout.strip()
    except OSError:
        return "unknown"


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> dict:
    from draftsmith.errors import handle_errors

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
    from accelerate import Accelerator
    from transformers import AutoTokenizer

    from draftsmith.train.build import build_data_and_vocab, build_head, build_target, fast_bf16
    from draftsmith.train.checkpoint import prepare_run_dir
    from draftsmith.train.config import validate_config
    from draftsmith.train.loop import print0, train

    validate_config(cfg)
    if cfg.dry_run:  # shapes only: no weights, no data, no accelerator
        from draftsmith.train.memory import report

        print(report(cfg, cfg.dry_run_processes))
        return {}
    mp = cfg.mixed_precision
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    accelerator = Accelerator(mixed_precision=("bf16" if fast_bf16(device) else "no") if mp == "auto" else mp)
    torch.manual_seed(cfg.seed)
    run_dir = Path(cfg.output_dir)
    # before anything is written: a fresh run never mixes with (or prunes) an earlier run's checkpoints
    resume = prepare_run_dir(run_dir, cfg.resume, cfg.overwrite, accelerator.is_main_process,
                             log=lambda *a: print0(accelerator, *a))
    if resume != cfg.resume:
        with open_dict(cfg):
            cfg.resume = resume

    def save_config() -> None:
        if accelerator.is_main_process:
            (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))

    if accelerator.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "provenance.txt").write_text(f"git {git_sha()}\ncommand {' '.join(sys.argv)}\n")
    save_config()
    target, target_path = build_target(cfg.target, accelerator.device)
    tokenizer = AutoTokenizer.from_pretrained(target_path)
    data, vocab = build_data_and_vocab(cfg, tokenizer, run_dir, log=lambda *a: print0(accelerator, *a))
    if cfg.head.family == "mlp_speculator" and cfg.head.stage == 2:  # the target's own continuations
        from draftsmith.assets import cache_dir
        from draftsmith.train.data.continuations import build_stage2_data

        data = build_stage2_data(cfg, data, target_path, cache_dir(), log=lambda *a: print0(accelerator, *a))
    if cfg.data.features == "offline" and not cfg.data.get("features_dir"):
        from draftsmith.train.features import ensure_offline_features

        with open_dict(cfg):
            cfg.data.features_dir = ensure_offline_features(cfg, target, tokenizer, data, vocab, accelerator,
                                                            log=lambda *a: print0(accelerator, *a))
        save_config()  # with the directory the run resolved
    head = build_head(cfg.head, target, vocab)
    head.config.target["name_or_path"] = target_path
    tracker = None
    if accelerator.is_main_process and cfg.wandb.get("mode", "disabled") != "disabled":
        import wandb

        tracker = wandb.init(project=cfg.wandb.get("project", "draftsmith"), name=cfg.run_name, dir=str(run_dir),
                             mode=cfg.wandb["mode"], config=OmegaConf.to_container(cfg, resolve=True))
    result = train(cfg, head, target, data, accelerator, tracker)
    if tracker:
        tracker.finish()
    return result


if __name__ == "__main__":
    main()
