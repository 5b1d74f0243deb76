"""The one training loop: batch -> target features (no grad) -> head objective (EAGLE-3 TTT unroll | MLP speculator
per-head CE, train/objective.py) -> loss -> backward -> clip -> step -> log."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import DistributedType
from omegaconf import OmegaConf
from tqdm.auto import tqdm

from draftsmith.errors import ConfigError, DraftsmithError, Interrupted
from draftsmith.train.checkpoint import Position, resolve_checkpoint, restore_run_state, save_run_state, trim_metrics
from draftsmith.train.data.dataset import collate, epoch_batches, make_batches
from draftsmith.train.features.sources import build_feature_source, heldout_feature_source
from draftsmith.train.objective import build_objective
from draftsmith.train.optim import build_optimizer
from draftsmith.train.sharded import full_model_state, full_optimizer_state, gathered, is_sharded, load_full_state


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
        print(
            "\nCtrl-C: saving a checkpoint after this step, then stopping (Ctrl-C again stops at once)",
            file=sys.stderr,
            flush=True,
        )

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


@torch.no_grad()
def evaluate(cfg, head, target, samples, device, autocast, features=None) -> dict:
    """Per-step accuracy and simulated acceptance length on held-out samples (no grad, fixed order).

    Args:
        features: a FeatureSource over the held-out samples' stored features (offline); None runs the target.
    """
    head.eval()
    objective = build_objective(cfg.head)
    model = objective.wrap(head)
    sums = {"acc": None, "n": None, "loss": 0.0, "accept": 0.0, "rows": 0.0}
    order = make_batches(
        [len(s.input_ids) for s in samples], cfg.data.max_tokens_per_batch, cfg.data.max_batch_size, 0, 0
    )
    for idx in order[: cfg.eval_batches]:
        batch = {k: v.to(device) for k, v in collate([samples[i] for i in idx], target.pad_id).items()}
        feats = features(idx, batch) if features else objective.features(target, head, batch, eval=True)
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
    return {
        "eval/acc": accs,
        "eval/loss": sums["loss"] / max(1, len(order[: cfg.eval_batches])),
        "eval/sim_accept_len": 1 + sums["accept"] / max(sums["rows"], 1),
    }


UNBOUNDED = sys.maxsize  # total_steps with optim.epochs=null and only the clock: the schedule follows the clock alone


def total_steps(cfg, data, per_epoch: int, world: int) -> int:
    """Optimizer steps the lr schedule spans: max_steps, else the token budget, else epochs over the data, else
    (optim.epochs=null, the clock alone) UNBOUNDED, and the cosine follows optim.max_minutes.

    A token budget (supervised tokens over all ranks) becomes steps through the mean supervised tokens of a
    batch; the run also stops at the budget itself, so the schedule ends where training does.
    """
    if cfg.optim.max_steps:
        return cfg.optim.max_steps
    if cfg.optim.max_tokens:
        # what a step counts against the budget: its supervised tokens, every real one under data.supervise=all
        every_row = cfg.data.supervise == "all"
        tokens = sum(len(s.input_ids) if every_row else sum(s.loss_mask) for s in data.train)
        per_batch = tokens / max(1, len(epoch_batches(data, cfg, 0, 0, 1)))
        return max(1, math.ceil(cfg.optim.max_tokens / (per_batch * world * cfg.optim.grad_accum)))
    if cfg.optim.epochs is None:
        return UNBOUNDED
    return per_epoch * cfg.optim.epochs


@dataclass
class StepFigures:
    """One optimizer step's logged figures, each a share of the global mean: summed over the micro-batches, then
    over the ranks in one collective, with each rank's clock and Ctrl-C flag (so every rank stops together)."""

    loss: torch.Tensor  # []
    losses: torch.Tensor  # [K] per TTT step (EAGLE-3) / head (MLP speculator)
    accs: torch.Tensor  # [K] top-1 accuracy, same order
    clock_s: float = 0.0  # after the reduce: the ranks' summed clocks
    stop: float = 0.0  # after the reduce: how many ranks saw Ctrl-C

    @classmethod
    def of(cls, out) -> "StepFigures":
        return cls(
            out.loss.detach().float(),
            torch.stack([x.float() for x in out.losses]),
            torch.stack([a.float() for a in out.accs]),
        )

    def __add__(self, other: "StepFigures") -> "StepFigures":
        return StepFigures(self.loss + other.loss, self.losses + other.losses, self.accs + other.accs)

    def reduce(self, accelerator, clock_s: float, stop: bool) -> "StepFigures":
        K = len(self.losses)
        flat = torch.cat([self.loss[None], self.losses, self.accs, self.loss.new_tensor([clock_s, float(stop)])])
        t = accelerator.reduce(flat, "sum")  # [1 + 2K + 2]
        return StepFigures(t[0], t[1 : 1 + K], t[1 + K : 1 + 2 * K], float(t[-2]), float(t[-1]))


def global_counts(objective, batches: list[dict], accelerator) -> torch.Tensor:
    """[K + 1]: positions scored per step/head and supervised tokens, summed over micro-batches and ranks.

    Each step's loss is the mean over every supervised token of the global batch (all ranks, all micro-batches),
    not a mean of per-rank means: ranks see different token counts.
    """
    local = torch.stack(
        [torch.cat([objective.supervised_counts(b["loss_mask"]), b["loss_mask"].sum()[None]]) for b in batches]
    ).sum(0)  # [K + 1]
    return accelerator.reduce(local, "sum")


def forward_backward(
    model, objective, features, micro: list[list[int]], batches: list[dict], counts, accelerator, world: int
) -> StepFigures:
    """Gradients of one optimizer step, accumulated over its micro-batches (gradient sync on the last only)."""
    figures = None
    for j, (idx, batch) in enumerate(zip(micro, batches)):
        feats = features(idx, batch)  # no grad: the target is frozen; logits only over what the objective needs
        sync = contextlib.nullcontext() if j == len(micro) - 1 else accelerator.no_sync(model)
        with sync:
            with accelerator.autocast():
                out = objective(model, feats, batch, denoms=counts[:-1])
            # DDP/FSDP average gradients over ranks; each rank's loss is its share of the global mean
            accelerator.backward(out.loss * world)
        figures = StepFigures.of(out) if figures is None else figures + StepFigures.of(out)
    return figures


@torch.no_grad()
def calibrate_fc_input(head, features, data, cfg, accelerator, pad_id: int) -> None:
    """head.fc_outlier_ratio: fc's input channel RMS over the first batch of every rank, then the head's scale."""
    if is_sharded(accelerator):
        raise ConfigError("head.fc_outlier_ratio needs the whole head on every rank: use DDP or one process")
    idx = epoch_batches(data, cfg, 0, accelerator.process_index, accelerator.num_processes)[0]
    batch = {k: v.to(accelerator.device) for k, v in collate([data.train[i] for i in idx], pad_id).items()}
    x = head.fc_input(features(idx, batch).aux.to(head.fc.weight.dtype))  # [B, T, 3·Ht]
    rows = batch["attention_mask"].bool()
    sq, n = x[rows].float().pow(2).sum(0), rows.sum().float()
    rms = head.calibrate_fc_input(accelerator.reduce(sq, "sum"), accelerator.reduce(n, "sum"))
    scaled = (head.fc_in_scale < 1).nonzero().flatten().tolist()
    print0(
        accelerator,
        f"fc input: {len(scaled)} channel(s) above {head.config.fc_outlier_ratio:g}x the median RMS "
        f"{rms.median().item():.2f} scaled to it: " + ", ".join(f"{c} (RMS {rms[c].item():.0f})" for c in scaled[:8]),
    )


@dataclass
class Session:
    """Everything one training run holds between steps: the prepared head, its optimizer and schedule, the feature
    sources, the data position; `train` drives it step by step."""

    cfg: Any
    accelerator: Any
    target: Any
    data: Any
    model: torch.nn.Module  # the objective-wrapped head accelerate prepared (one forward call)
    raw: torch.nn.Module  # the head itself
    objective: Any
    optimizer: Any
    scheduler: Any
    clock: dict  # {"time_frac": share of optim.max_minutes used}, read by the schedule
    features: Any  # the training batches' FeatureSource
    heldout: Any  # the held-out samples' FeatureSource, or None (eval runs the target)
    total: int  # optimizer steps planned
    trainable: list  # the head's trainable parameters (clipped together)
    pos: Position = field(default_factory=Position)
    tracker: Any = None
    start: float = 0.0  # time.time() at step 0 of the run (earlier sessions' seconds included)

    @property
    def world(self) -> int:
        return self.accelerator.num_processes

    @property
    def accum(self) -> int:
        return self.cfg.optim.grad_accum

    def batches(self, epoch: int) -> list[list[int]]:
        """This rank's micro-batches of `epoch` (sample indices), in order."""
        return epoch_batches(self.data, self.cfg, epoch, self.accelerator.process_index, self.world)

    def step(self, micro: list[list[int]], stop_requested: bool) -> tuple[StepFigures, Any, int]:
        """One optimizer step over the micro-batches `micro`: (its figures reduced over ranks, the gradient norm
        before clipping, supervised tokens over all ranks). Advances the lr schedule."""
        cfg, device, pad = self.cfg, self.accelerator.device, self.target.pad_id
        collated = [
            {k: v.to(device) for k, v in collate([self.data.train[i] for i in idx], pad).items()} for idx in micro
        ]
        if cfg.data.supervise == "all":  # prompt rows too: the target's distribution is known everywhere
            for b in collated:
                b["loss_mask"] = b["attention_mask"].to(b["loss_mask"].dtype)
        counts = global_counts(self.objective, collated, self.accelerator)  # [K + 1]
        self.optimizer.zero_grad(set_to_none=True)
        figures = forward_backward(
            self.model, self.objective, self.features, micro, collated, counts, self.accelerator, self.world
        )
        figures = figures.reduce(self.accelerator, time.time() - self.start, stop_requested)
        if not torch.isfinite(figures.loss):
            ids = [self.data.train[i].conv_id for idx in micro for i in idx]
            raise NonFiniteLoss(
                f"loss is {figures.loss.item()} at step {self.pos.step} (epoch {self.pos.epoch}, batch "
                f"{self.pos.cursor}, conversations on rank {self.accelerator.process_index}: {ids[:8]}); weights "
                f"not updated, last good checkpoint kept in {cfg.output_dir}/checkpoints"
            )
        grad_norm = self.accelerator.clip_grad_norm_(self.trainable, cfg.optim.grad_clip)
        self.optimizer.step()
        if cfg.optim.max_minutes:
            self.clock["time_frac"] = figures.clock_s / self.world / (60 * cfg.optim.max_minutes)
        self.scheduler.step()
        return figures, grad_norm, int(counts[-1])

    def metrics(self, figures: StepFigures, grad_norm, elapsed: float) -> dict:
        pos = self.pos
        return {
            "step": pos.step,
            "epoch": pos.epoch,
            "tokens": pos.tokens,
            "loss": figures.loss.item(),
            "lr": self.scheduler.get_last_lr()[0],
            "grad_norm": None if grad_norm is None else float(grad_norm),
            "acc": [round(a.item(), 4) for a in figures.accs],
            "losses": [round(x.item(), 4) for x in figures.losses],
            "tok_per_s": pos.tokens / max(elapsed, 1e-9),
            "elapsed_s": elapsed,
            "target_tokens": self.features.computed_tokens,
        }

    def evaluate(self) -> dict:
        if not self.data.heldout:
            return {}
        a = self.accelerator
        with gathered(self.model):  # a sharded head is called whole, outside its wrapped forward
            out = evaluate(self.cfg, self.raw, self.target, self.data.heldout, a.device, a.autocast, self.heldout)
        print0(
            a,
            f"\n[eval step {self.pos.step}] acc per step {[round(x, 3) for x in out.get('eval/acc', [])]}, "
            f"simulated accept length {out.get('eval/sim_accept_len', 0):.3f}",
        )
        return out

    def save(self, metrics: dict) -> None:
        """A checkpoint at this step boundary (a collective: every rank calls it)."""
        a = self.accelerator
        a.wait_for_everyone()
        weights = self.raw.trainable_state_dict()
        optimizer_state = None
        if is_sharded(a):
            # a sharded head: gather the full tensors (a collective, so every rank calls it); keys gain "head."
            fsdp = a.distributed_type == DistributedType.FSDP
            full = full_model_state(self.model) if fsdp else a.get_state_dict(self.model)
            weights = {k: full["head." + k] for k in weights} if a.is_main_process else {}
            if fsdp:  # the optimizer's shards too: an exact resume
                optimizer_state = full_optimizer_state(self.model, self.optimizer)
        if a.is_main_process:
            save_run_state(
                Path(self.cfg.output_dir),
                self.pos,
                weights,
                self.objective.family,
                self.raw.config.to_dict(),
                metrics,
                self.optimizer.state_dict() if optimizer_state is None else optimizer_state,
                self.scheduler,
                self.world * self.accum,
                time.time() - self.start,
                OmegaConf.to_container(self.cfg, resolve=True),
                self.cfg.keep_checkpoints,
            )

    def log(self, record: dict) -> None:
        if self.accelerator.is_main_process:
            with open(Path(self.cfg.output_dir) / "metrics.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")
            if self.tracker:
                self.tracker.log(record, step=self.pos.step)


def start_session(cfg, head, target, data, accelerator, tracker=None) -> Session:
    """Optimizer, schedule, accelerate, feature sources, and the run's state restored when resuming."""
    run_dir = Path(cfg.output_dir)
    target.to(accelerator.device)
    optimizer = build_optimizer(cfg.optim, head, accelerator.distributed_type.name)
    world, accum, rank = accelerator.num_processes, cfg.optim.grad_accum, accelerator.process_index
    per_epoch = len(epoch_batches(data, cfg, 0, rank, world)) // accum
    if per_epoch == 0:
        raise ConfigError(
            f"no training batches: {len(data.train)} samples for {world} processes x {accum} "
            f"micro-batches (lower optim.grad_accum or data.max_tokens_per_batch)"
        )
    total = total_steps(cfg, data, per_epoch, world)
    clock = {"time_frac": 0.0}  # share of optim.max_minutes used, read by the schedule
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_lambda(s, cfg.optim.warmup_steps, total, cfg.optim.min_lr_ratio, clock["time_frac"])
    )
    objective = build_objective(cfg.head)  # the head family's features and loss (EAGLE-3 TTT | MLP per-head CE)
    if accelerator.state.deepspeed_plugin is not None:
        # DeepSpeed steps inside backward, so it cannot see our micro-batch groups; batches are token-bucketed,
        # so its micro-batch size (used only for its throughput log) is nominal
        if accum > 1:
            raise ConfigError("optim.grad_accum > 1 is not supported under DeepSpeed; use more processes or ddp/fsdp")
        accelerator.state.deepspeed_plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = 1
    model, optimizer = accelerator.prepare(objective.wrap(head), optimizer)
    raw = accelerator.unwrap_model(model).head
    trainable = [p for p in raw.parameters() if p.requires_grad]  # FSDP replaces the parameters with shards
    features = build_feature_source(cfg, target, objective.vocab_ids(raw), data, objective.family, accelerator)
    # offline: eval from disk too; stream: from the producer process
    heldout = heldout_feature_source(cfg, target, objective.vocab_ids(raw), data, features)
    s = Session(
        cfg, accelerator, target, data, model, raw, objective, optimizer, scheduler, clock, features, heldout, total,
        trainable, tracker=tracker,
    )  # fmt: skip
    if cfg.resume:
        ckpt = resolve_checkpoint(run_dir if cfg.resume == "auto" else cfg.resume)
        sharded = None
        if accelerator.distributed_type == DistributedType.FSDP:
            sharded = functools.partial(load_full_state, model, optimizer, "head.")
        s.pos = restore_run_state(ckpt, raw, optimizer, scheduler, world, accum, load_sharded=sharded)
        if accelerator.is_main_process:  # lines a kill left past the checkpoint (steps redone now), a torn one
            trim_metrics(run_dir / "metrics.jsonl", s.pos.step)
        print0(accelerator, f"resumed from {ckpt} at step {s.pos.step} (epoch {s.pos.epoch}, batch {s.pos.cursor})")
    if getattr(raw.config, "fc_outlier_ratio", 0) and s.pos.step == 0:
        calibrate_fc_input(raw, features, data, cfg, accelerator, target.pad_id)
    return s


def train(cfg, head, target, data, accelerator, tracker=None) -> dict:
    """Train `head` on `data` against the frozen `target`; returns the final eval metrics."""
    s = start_session(cfg, head, target, data, accelerator, tracker)
    pos, metrics, last_eval = s.pos, {}, {}
    s.start = time.time() - pos.elapsed_s
    deadline = s.start + 60 * cfg.optim.max_minutes if cfg.optim.max_minutes else None
    bar = tqdm(
        total=None if s.total == UNBOUNDED else s.total, initial=pos.step, desc="train", unit="step",
        disable=not accelerator.is_main_process, dynamic_ncols=True,
    )  # fmt: skip
    s.model.train()
    ended = (  # a resumed run whose budget is already spent (a re-run of a finished command) takes no extra step
        pos.step >= s.total
        or (cfg.optim.max_minutes is not None and pos.elapsed_s >= 60 * cfg.optim.max_minutes)
        or (cfg.optim.max_tokens is not None and pos.tokens >= cfg.optim.max_tokens)
    )
    done, interrupted, first_step = ended, False, pos.step
    with bar, StopOnInterrupt() as stop:  # the bar closes (ends its line) before any error prints
        while not done:
            batches = s.batches(pos.epoch)
            while pos.cursor < len(batches) // s.accum and not done:
                figures, grad_norm, tokens = s.step(
                    batches[pos.cursor * s.accum : (pos.cursor + 1) * s.accum], stop.requested
                )
                elapsed = figures.clock_s / s.world  # the ranks' mean clock: identical on every rank
                interrupted = figures.stop > 0
                pos.step, pos.cursor, pos.tokens = pos.step + 1, pos.cursor + 1, pos.tokens + tokens
                last_step = done = (
                    pos.step >= s.total
                    or (deadline is not None and s.start + elapsed >= deadline)
                    or (cfg.optim.max_tokens is not None and pos.tokens >= cfg.optim.max_tokens)
                    or interrupted
                )
                if pos.step % cfg.log_every == 0 or last_step:
                    metrics = s.metrics(figures, grad_norm, elapsed)
                    bar.set_postfix(
                        loss=f"{metrics['loss']:.3f}", acc0=f"{metrics['acc'][0]:.3f}",
                        tok_s=f"{metrics['tok_per_s']:.0f}",
                    )  # fmt: skip
                    s.log(metrics)
                if (cfg.eval_every and pos.step % cfg.eval_every == 0) or (last_step and not interrupted):
                    last_eval = s.evaluate()
                    s.log({"step": pos.step, **last_eval})
                if (cfg.save_every and pos.step % cfg.save_every == 0) or last_step:
                    s.save({**metrics, **last_eval})
                if deadline is not None and pos.step > first_step:  # the clock may bind before the step budget
                    rate = (pos.step - first_step) / max(elapsed - pos.elapsed_s, 1e-9)  # steps/s this session
                    bar.total = max(
                        pos.step, min(s.total, pos.step + int(rate * max(0.0, deadline - s.start - elapsed)))
                    )
                bar.update(1)
            if pos.cursor >= len(batches) // s.accum:
                pos.epoch, pos.cursor = pos.epoch + 1, 0
    s.features.close()  # stream: stop the producer, empty its buffer
    if interrupted:
        raise Interrupted(
            f"interrupted (Ctrl-C) at step {pos.step}: checkpoint saved in {cfg.output_dir}/checkpoints; "
            f"continue exactly from it with resume=auto (same command)."
        )
    return {**metrics, **last_eval}
