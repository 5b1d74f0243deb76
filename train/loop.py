"""The one training loop: batch -> target features (no grad) -> head objective (EAGLE-3 TTT unroll | MLP speculator
per-head CE, train/objective.py) -> loss -> backward -> clip -> step -> log."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf
from tqdm.auto import tqdm

from draftsmith.train.checkpoint import (load_head, load_trainer_state, resolve_checkpoint, rng_state, save_checkpoint,
                                         set_rng_state)
from draftsmith.train.data.dataset import collate, make_batches
from draftsmith.train.features import FeatureSource
from draftsmith.train.objective import build_objective


class NonFiniteLoss(RuntimeError):
    """The loss went NaN/inf; the last good checkpoint is kept."""


def print0(accelerator, *args) -> None:
    if accelerator.is_main_process:
        print(*args, flush=True)


def lr_lambda(step: int, warmup: int, total: int, min_ratio: float, time_frac: float = 0.0) -> float:
    """Linear warmup then cosine decay to min_ratio, as a multiplier of the peak lr.

    Progress is the larger of the steps done (of `total`, from max_steps / max_tokens / epochs) and the
    wall-clock budget used (`time_frac`, 0 without optim.max_minutes), so the cosine ends where the run
    does whichever budget binds. Without a time budget it depends on the step alone (exact resume).
    """
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, max((step - warmup) / max(1, total - warmup), time_frac))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def epoch_batches(data, cfg, epoch: int, rank: int, world: int) -> list[list[int]]:
    """This rank's batches (sample indices) for one epoch; deterministic in (seed, epoch)."""
    lengths = [len(s.input_ids) for s in data.train]
    batches = make_batches(lengths, cfg.data.max_tokens_per_batch, cfg.data.max_batch_size, cfg.data.seed, epoch)
    usable = len(batches) // world * world  # every rank takes the same number of steps
    return batches[rank:usable:world]


@torch.no_grad()
def evaluate(cfg, head, target, samples, device, autocast) -> dict:
    """Per-step accuracy and simulated acceptance length on held-out samples (no grad, fixed order)."""
    head.eval()
    objective = build_objective(cfg.head)
    model = objective.wrap(head)
    sums = {"acc": None, "n": None, "loss": 0.0, "accept": 0.0, "rows": 0.0}
    order = make_batches([len(s.input_ids) for s in samples], cfg.data.max_tokens_per_batch, cfg.data.max_batch_size, 0, 0)
    for idx in order[: cfg.eval_batches]:
        batch = {k: v.to(device) for k, v in collate([samples[i] for i in idx], target.pad_id).items()}
        feats = objective.features(target, head, batch, eval=True)
        with autocast():
            out = objective(model, feats, batch, eval=True)
        if sums["acc"] is None:
            sums["acc"], sums["n"] = [0.0] * len(out.accs), [0.0] * len(out.accs)
        for k in range(len(out.accs)):
            sums["acc"][k] += float(out.accs[k] * out.counts[k])
            sums["n"][k] += float(out.counts[k])
        sums["loss"] += float(out.loss)
        sums["accept"] += float(out.accept_len)
        sums["rows"] += float(out.rows)
    head.train()
    accs = [a / max(n, 1) for a, n in zip(sums["acc"] or [], sums["n"] or [])]
    return {"eval/acc": accs, "eval/loss": sums["loss"] / max(1, len(order[: cfg.eval_batches])),
            "eval/sim_accept_len": 1 + sums["accept"] / max(sums["rows"], 1)}


def total_steps(cfg, data, per_epoch: int, world: int) -> int:
    """Optimizer steps the lr schedule spans: max_steps, else the token budget, else epochs over the data.

    A token budget (supervised tokens over all ranks) becomes steps through the mean supervised tokens of a
    batch; the run also stops at the budget itself, so the schedule ends where training does.
    """
    if cfg.optim.max_steps:
        return cfg.optim.max_steps
    if cfg.optim.max_tokens:
        per_batch = sum(sum(s.loss_mask) for s in data.train) / max(1, len(epoch_batches(data, cfg, 0, 0, 1)))
        return max(1, math.ceil(cfg.optim.max_tokens / (per_batch * world)))
    return per_epoch * cfg.optim.epochs


def train(cfg, head, target, data, accelerator, tracker=None) -> dict:
    """Train `head` on `data` against the frozen `target`; returns the final eval metrics."""
    run_dir = Path(cfg.output_dir)
    device = accelerator.device
    target.to(device)
    params = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.optim.lr, betas=tuple(cfg.optim.betas), weight_decay=cfg.optim.weight_decay)
    per_epoch = len(epoch_batches(data, cfg, 0, accelerator.process_index, accelerator.num_processes))
    if per_epoch == 0:
        raise ValueError(f"no training batches: {len(data.train)} samples for {accelerator.num_processes} processes")
    total = total_steps(cfg, data, per_epoch, accelerator.num_processes)
    clock = {"time_frac": 0.0}  # share of optim.max_minutes used, read by the schedule
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_lambda(s, cfg.optim.warmup_steps, total, cfg.optim.min_lr_ratio, clock["time_frac"]))
    objective = build_objective(cfg.head)  # the head family's features and loss (EAGLE-3 TTT | MLP per-head CE)
    model, optimizer = accelerator.prepare(objective.wrap(head), optimizer)
    raw = accelerator.unwrap_model(model).head
    features = FeatureSource(target, objective.vocab_ids(raw), cfg.data.features)

    step, epoch, cursor, tokens, prior_s = 0, 0, 0, 0, 0.0
    if cfg.resume:
        ckpt = resolve_checkpoint(run_dir if cfg.resume == "auto" else cfg.resume)
        state = load_trainer_state(ckpt)
        missing = raw.load_state_dict(load_head(ckpt)[1], strict=False)
        frozen_or_tied = set(raw.state_dict()) - set(raw.trainable_state_dict())  # e.g. embed_tokens, tied stages
        assert set(missing.missing_keys) <= frozen_or_tied and not missing.unexpected_keys, missing
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        step, epoch, cursor, tokens = state["step"], state["epoch"], state["cursor"], state["tokens"]
        prior_s = state.get("elapsed_s", 0.0)  # training time before the resume counts against max_minutes
        set_rng_state(state["rng"])
        print0(accelerator, f"resumed from {ckpt} at step {step} (epoch {epoch}, batch {cursor})")

    def save(metrics: dict) -> None:
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            meta = {"family": objective.family, "config": raw.config.to_dict(), "step": step, "tokens": tokens, "metrics": metrics}
            trainer = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "step": step,
                       "epoch": epoch, "cursor": cursor, "tokens": tokens, "rng": rng_state(),
                       "elapsed_s": time.time() - start,
                       "config": OmegaConf.to_container(cfg, resolve=True)}
            save_checkpoint(run_dir, step, raw.trainable_state_dict(), meta, trainer, cfg.keep_checkpoints)

    def log(record: dict) -> None:
        if accelerator.is_main_process:
            with open(run_dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")
            if tracker:
                tracker.log(record, step=step)

    start, metrics, last_eval = time.time() - prior_s, {}, {}
    deadline = start + 60 * cfg.optim.max_minutes if cfg.optim.max_minutes else None
    bar = tqdm(total=total, initial=step, desc="train", unit="step", disable=not accelerator.is_main_process, dynamic_ncols=True)
    model.train()
    done = step >= total
    while not done:
        batches = epoch_batches(data, cfg, epoch, accelerator.process_index, accelerator.num_processes)
        while cursor < len(batches) and not done:
            samples = [data.train[i] for i in batches[cursor]]
            batch = {k: v.to(device) for k, v in collate(samples, target.pad_id).items()}
            # no grad: the target is frozen; logits only over what the objective needs (draft vocab | none)
            feats = features(batches[cursor], batch)
            with accelerator.autocast():
                out = objective(model, feats, batch)
            if not torch.isfinite(out.loss):
                ids = [s.conv_id for s in samples]
                raise NonFiniteLoss(f"loss is {out.loss.item()} at step {step} (epoch {epoch}, batch {cursor}, "
                                    f"conversations {ids[:8]}); last good checkpoint kept in {run_dir}/checkpoints")
            optimizer.zero_grad(set_to_none=True)
            accelerator.backward(out.loss)
            grad_norm = accelerator.clip_grad_norm_(params, cfg.optim.grad_clip)
            optimizer.step()
            if cfg.optim.max_minutes:
                clock["time_frac"] = (time.time() - start) / (60 * cfg.optim.max_minutes)
            scheduler.step()
            step, cursor = step + 1, cursor + 1
            tokens += int(batch["loss_mask"].sum()) * accelerator.num_processes  # supervised tokens
            elapsed = time.time() - start
            last_step = done = (step >= total or (deadline is not None and time.time() >= deadline)
                                or (cfg.optim.max_tokens is not None and tokens >= cfg.optim.max_tokens))
            if step % cfg.log_every == 0 or last_step:
                metrics = {"step": step, "epoch": epoch, "tokens": tokens, "loss": out.loss.item(),
                           "lr": scheduler.get_last_lr()[0], "grad_norm": float(grad_norm),
                           "acc": [round(a.item(), 4) for a in out.accs],
                           "losses": [round(x.item(), 4) for x in out.losses], "tok_per_s": tokens / max(elapsed, 1e-9),
                           "elapsed_s": elapsed, "target_tokens": features.computed_tokens}
                bar.set_postfix(loss=f"{metrics['loss']:.3f}", acc0=f"{metrics['acc'][0]:.3f}", tok_s=f"{metrics['tok_per_s']:.0f}")
                log(metrics)
            if (cfg.eval_every and step % cfg.eval_every == 0) or last_step:
                last_eval = evaluate(cfg, raw, target, data.heldout, device, accelerator.autocast) if data.heldout else {}
                print0(accelerator, f"\n[eval step {step}] acc per step {[round(a, 3) for a in last_eval.get('eval/acc', [])]}, "
                                    f"simulated accept length {last_eval.get('eval/sim_accept_len', 0):.3f}")
                log({"step": step, **last_eval})
            if (cfg.save_every and step % cfg.save_every == 0) or last_step:
                save({**metrics, **last_eval})
            bar.update(1)
        if cursor >= len(batches):
            epoch, cursor = epoch + 1, 0
    bar.close()
    return {**metrics, **last_eval}
