"""The one training loop: batch -> target features (no grad) -> head objective (EAGLE-3 TTT unroll | MLP speculator
per-head CE, train/objective.py) -> loss -> backward -> clip -> step -> log."""

from __future__ import annotations

import contextlib
import json
import math
import signal
import sys
import threading
import time
from pathlib import Path

import torch
from accelerate.utils import DistributedType
from omegaconf import OmegaConf
from tqdm.auto import tqdm

from draftsmith.errors import DraftsmithError, Interrupted
from draftsmith.errors import ConfigError
from draftsmith.train.checkpoint import (CheckpointError, check_same_head, load_head, load_trainer_state,
                                         resolve_checkpoint, rng_state, save_checkpoint, set_rng_state,
                                         trim_metrics)
from draftsmith.train.data.dataset import collate, make_batches
from draftsmith.train.features import build_feature_source
from draftsmith.train.objective import build_objective


class NonFiniteLoss(DraftsmithError, RuntimeError):
    """The loss went NaN/inf; the last good checkpoint is kept."""


class StopOnInterrupt:
    """Ctrl-C during training finishes the step, saves a checkpoint and stops; a second Ctrl-C stops at once.

    The flag is summed over ranks with the step's other figures, so every rank stops after the same step.
    """

    def __init__(self):
        self.requested = False
        self._previous = None

    def _handler(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print("\nCtrl-C: saving a checkpoint after this step, then stopping (Ctrl-C again stops at once)",
              file=sys.stderr, flush=True)

    def __enter__(self) -> "StopOnInterrupt":
        if threading.current_thread() is threading.main_thread():  # signal handlers live on the main thread only
            self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


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
    """This rank's micro-batches (sample indices) for one epoch, `optim.grad_accum` per optimizer step.

    Optimizer step s consumes the epoch's micro-batches [s*G, (s+1)*G), G = world * grad_accum, and rank r
    takes every world-th of them: the global batch depends on G only, so 2 ranks x 1 micro-batch train the
    same steps as 1 rank x 2 micro-batches. Deterministic in (seed, epoch).
    """
    lengths = [len(s.input_ids) for s in data.train]
    batches = make_batches(lengths, cfg.data.max_tokens_per_batch, cfg.data.max_batch_size, cfg.data.seed, epoch)
    group = world * cfg.optim.grad_accum
    usable = len(batches) // group * group  # every rank takes the same number of steps
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
        return max(1, math.ceil(cfg.optim.max_tokens / (per_batch * world * cfg.optim.grad_accum)))
    return per_epoch * cfg.optim.epochs


def train(cfg, head, target, data, accelerator, tracker=None) -> dict:
    """Train `head` on `data` against the frozen `target`; returns the final eval metrics."""
    run_dir = Path(cfg.output_dir)
    device = accelerator.device
    target.to(device)
    params = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.optim.lr, betas=tuple(cfg.optim.betas), weight_decay=cfg.optim.weight_decay)
    world, accum = accelerator.num_processes, cfg.optim.grad_accum
    if accum < 1:
        raise ConfigError(f"optim.grad_accum={accum}: must be >= 1")
    if cfg.data.supervise not in ("assistant", "all"):
        raise ConfigError(f"data.supervise={cfg.data.supervise!r}: expected assistant | all")
    per_epoch = len(epoch_batches(data, cfg, 0, accelerator.process_index, world)) // accum
    if per_epoch == 0:
        raise ConfigError(f"no training batches: {len(data.train)} samples for {world} processes x {accum} micro-batches")
    total = total_steps(cfg, data, per_epoch, accelerator.num_processes)
    clock = {"time_frac": 0.0}  # share of optim.max_minutes used, read by the schedule
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_lambda(s, cfg.optim.warmup_steps, total, cfg.optim.min_lr_ratio, clock["time_frac"]))
    objective = build_objective(cfg.head)  # the head family's features and loss (EAGLE-3 TTT | MLP per-head CE)
    if accelerator.state.deepspeed_plugin is not None:
        # DeepSpeed steps inside backward, so it cannot see our micro-batch groups; batches are token-bucketed,
        # so its micro-batch size (used only for its throughput log) is nominal
        if accum > 1:
            raise ConfigError("optim.grad_accum > 1 is not supported under DeepSpeed; use more processes or ddp/fsdp")
        accelerator.state.deepspeed_plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = 1
    model, optimizer = accelerator.prepare(objective.wrap(head), optimizer)
    raw = accelerator.unwrap_model(model).head
    features = build_feature_source(cfg, target, objective.vocab_ids(raw), data, objective.family, accelerator)

    step, epoch, cursor, tokens, prior_s = 0, 0, 0, 0, 0.0
    if cfg.resume:
        ckpt = resolve_checkpoint(run_dir if cfg.resume == "auto" else cfg.resume)
        state = load_trainer_state(ckpt)
        group = state.get("global_batch", world * accum)
        if group != world * accum:  # the data position counts optimizer steps of `group` micro-batches
            raise CheckpointError(f"{ckpt} was trained with {group} micro-batches per optimizer step (processes x "
                             f"optim.grad_accum); this run has {world} x {accum}: set optim.grad_accum={group // world}"
                             if group % world == 0 else f"{ckpt}: global batch {group} is not divisible by {world} processes")
        meta, weights = load_head(ckpt)
        check_same_head(meta, raw.config.to_dict(), ckpt)
        if "d2t" in weights and not torch.equal(weights["d2t"].to(raw.d2t.device), raw.d2t):
            # the target logits the features give are over this run's draft vocab; the checkpoint's head is not
            raise CheckpointError(f"{ckpt}: its draft vocab differs from the one this run built from the data "
                                  f"(data.path, data.num_conversations or head.draft_vocab_size changed)")
        missing = raw.load_state_dict(weights, strict=False)
        frozen_or_tied = set(raw.state_dict()) - set(raw.trainable_state_dict())  # e.g. embed_tokens, tied stages
        assert set(missing.missing_keys) <= frozen_or_tied and not missing.unexpected_keys, missing
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        step, epoch, cursor, tokens = state["step"], state["epoch"], state["cursor"], state["tokens"]
        prior_s = state.get("elapsed_s", 0.0)  # training time before the resume counts against max_minutes
        set_rng_state(state["rng"])
        if accelerator.is_main_process:  # lines a kill left past the checkpoint (steps redone now), a torn one
            trim_metrics(run_dir / "metrics.jsonl", step)
        print0(accelerator, f"resumed from {ckpt} at step {step} (epoch {epoch}, batch {cursor})")

    def save(metrics: dict) -> None:
        accelerator.wait_for_everyone()
        weights = raw.trainable_state_dict()
        if accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED):
            # a sharded head: gather the full tensors (a collective, so every rank calls it); keys gain "head."
            full = accelerator.get_state_dict(model)
            weights = {k: full["head." + k] for k in weights} if accelerator.is_main_process else {}
        if accelerator.is_main_process:
            meta = {"family": objective.family, "config": raw.config.to_dict(), "step": step, "tokens": tokens, "metrics": metrics}
            trainer = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "step": step,
                       "epoch": epoch, "cursor": cursor, "tokens": tokens, "rng": rng_state(), "global_batch": world * accum,
                       "elapsed_s": time.time() - start,
                       "config": OmegaConf.to_container(cfg, resolve=True)}
            save_checkpoint(run_dir, step, weights, meta, trainer, cfg.keep_checkpoints)

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
    done, interrupted, first_step = step >= total, False, step
    with bar, StopOnInterrupt() as stop:  # the bar closes (ends its line) before any error prints
        while not done:
            batches = epoch_batches(data, cfg, epoch, accelerator.process_index, world)
            while cursor < len(batches) // accum and not done:
                micro = batches[cursor * accum:(cursor + 1) * accum]
                collated = [{k: v.to(device) for k, v in collate([data.train[i] for i in idx], target.pad_id).items()}
                            for idx in micro]
                if cfg.data.supervise == "all":  # prompt rows too: the target's distribution is known at every position
                    for b in collated:
                        b["loss_mask"] = b["attention_mask"].to(b["loss_mask"].dtype)
                # Each step's loss is the mean over every supervised token of the global batch (all ranks, all
                # micro-batches), not a mean of per-rank means: ranks see different token counts.
                local = torch.stack([torch.cat([objective.supervised_counts(b["loss_mask"]), b["loss_mask"].sum()[None]])
                                     for b in collated]).sum(0)  # [K + 1]: scored positions per step/head, supervised tokens
                counts = accelerator.reduce(local, "sum")
                optimizer.zero_grad(set_to_none=True)
                sums = None
                for j, (idx, batch) in enumerate(zip(micro, collated)):
                    # no grad: the target is frozen; logits only over what the objective needs (draft vocab | none)
                    feats = features(idx, batch)
                    sync = contextlib.nullcontext() if j == accum - 1 else accelerator.no_sync(model)
                    with sync:
                        with accelerator.autocast():
                            out = objective(model, feats, batch, denoms=counts[:-1])
                        # DDP/FSDP average gradients over ranks; each rank's loss is its share of the global mean
                        accelerator.backward(out.loss * world)
                    part = torch.stack([out.loss.detach().float(), *[x.float() for x in out.losses],
                                        *[a.float() for a in out.accs]])  # [1 + 2K], each a share of the global mean
                    sums = part if sums is None else sums + part
                # one collective for the logged figures, the clock and Ctrl-C, so every rank takes the same stop decision
                clock_and_stop = torch.tensor([time.time() - start, float(stop.requested)], device=sums.device)
                totals = accelerator.reduce(torch.cat([sums, clock_and_stop]), "sum")
                loss, K = totals[0], (len(totals) - 3) // 2
                if not torch.isfinite(loss):
                    ids = [data.train[i].conv_id for idx in micro for i in idx]
                    raise NonFiniteLoss(f"loss is {loss.item()} at step {step} (epoch {epoch}, batch {cursor}, "
                                        f"conversations on rank {accelerator.process_index}: {ids[:8]}); weights not updated, "
                                        f"last good checkpoint kept in {run_dir}/checkpoints")
                grad_norm = accelerator.clip_grad_norm_(params, cfg.optim.grad_clip)
                optimizer.step()
                elapsed = float(totals[-2]) / world  # the ranks' mean clock: identical on every rank
                interrupted = bool(totals[-1] > 0)
                if cfg.optim.max_minutes:
                    clock["time_frac"] = elapsed / (60 * cfg.optim.max_minutes)
                scheduler.step()
                step, cursor = step + 1, cursor + 1
                tokens += int(counts[-1])  # supervised tokens over all ranks
                last_step = done = (step >= total or (deadline is not None and start + elapsed >= deadline)
                                    or (cfg.optim.max_tokens is not None and tokens >= cfg.optim.max_tokens) or interrupted)
                if step % cfg.log_every == 0 or last_step:
                    metrics = {"step": step, "epoch": epoch, "tokens": tokens, "loss": loss.item(),
                               "lr": scheduler.get_last_lr()[0], "grad_norm": None if grad_norm is None else float(grad_norm),
                               "acc": [round(a.item(), 4) for a in totals[1 + K:1 + 2 * K]],
                               "losses": [round(x.item(), 4) for x in totals[1:1 + K]], "tok_per_s": tokens / max(elapsed, 1e-9),
                               "elapsed_s": elapsed, "target_tokens": features.computed_tokens}
                    bar.set_postfix(loss=f"{metrics['loss']:.3f}", acc0=f"{metrics['acc'][0]:.3f}", tok_s=f"{metrics['tok_per_s']:.0f}")
                    log(metrics)
                if (cfg.eval_every and step % cfg.eval_every == 0) or (last_step and not interrupted):
                    last_eval = evaluate(cfg, raw, target, data.heldout, device, accelerator.autocast) if data.heldout else {}
                    print0(accelerator, f"\n[eval step {step}] acc per step {[round(a, 3) for a in last_eval.get('eval/acc', [])]}, "
                                        f"simulated accept length {last_eval.get('eval/sim_accept_len', 0):.3f}")
                    log({"step": step, **last_eval})
                if (cfg.save_every and step % cfg.save_every == 0) or last_step:
                    save({**metrics, **last_eval})
                if deadline is not None and step > first_step:  # the clock may bind before the step budget: show that
                    rate = (step - first_step) / max(elapsed - prior_s, 1e-9)  # steps per second this session
                    bar.total = max(step, min(total, step + int(rate * max(0.0, deadline - start - elapsed))))
                bar.update(1)
            if cursor >= len(batches) // accum:
                epoch, cursor = epoch + 1, 0
    bar.close()
    if interrupted:
        features.close()
        raise Interrupted(f"interrupted (Ctrl-C) at step {step}: checkpoint saved in {run_dir}/checkpoints; "
                          f"continue exactly from it with resume=auto (same command).")
    features.close()  # stream: stop the producer, empty its buffer
    return {**metrics, **last_eval}
