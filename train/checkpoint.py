"""Atomic, resumable checkpoints: head weights + config, optimizer, scheduler, data position, RNG.

Layout: <run>/checkpoints/step_00000123/{head.safetensors, head.json, trainer.pt, sha256.json}. Each is written
into a temporary directory and renamed into place, so a crash mid-write leaves the previous one. sha256.json records
each file's sha256; every read (resume, export, eval) checks it, and the head's weights must be finite, so bytes
changed on disk are refused naming the checkpoint instead of training or serving NaN.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from dataclasses import MISSING, dataclass, fields
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from draftsmith.atomic import atomic_dir, atomic_write
from draftsmith.errors import ConfigError, DraftsmithError, FilesystemError, fs_errno, fs_message


class CheckpointError(DraftsmithError, ValueError):
    """A checkpoint that cannot be used here: unreadable (truncated, corrupt) or made for another target/head."""


CHECKSUMS = "sha256.json"
CHECKED_FILES = ("head.safetensors", "head.json", "trainer.pt")


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def verify_file(path: Path) -> None:
    """Refuse a checkpoint file whose bytes differ from the sha256 recorded when it was saved (a checkpoint written
    before checksums has none to check)."""
    record = path.parent / CHECKSUMS
    if not record.is_file():
        return
    try:
        want = json.loads(record.read_text()).get(path.name)
    except (OSError, ValueError) as e:
        raise _unreadable(record, e) from None
    if want and file_sha256(path) != want:
        raise _unreadable(path, ValueError("its sha256 differs from the one recorded when it was saved"))


def verify_checkpoint(ckpt: str | os.PathLike) -> Path:
    """Check a checkpoint before a run resumes from it (its files' sha256, finite weights); returns its directory."""
    ckpt = resolve_checkpoint(ckpt)
    for name in CHECKED_FILES:
        if (ckpt / name).is_file():
            verify_file(ckpt / name)
    load_head(ckpt)  # readable, finite
    return ckpt


def nonfinite(tensors: dict[str, torch.Tensor]) -> list[str]:
    """Names of the floating tensors holding NaN or inf."""
    return [k for k, v in tensors.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """Finished checkpoints, oldest first (a write killed midway is a `.tmp-*` dir and never listed)."""
    root = Path(run_dir) / "checkpoints"
    return sorted(p for p in root.glob("step_*") if p.is_dir()) if root.exists() else []


def missing_files(ckpt: Path, resume: bool = False) -> list[str]:
    """The files a checkpoint directory lacks (a copy cut short, a file deleted by hand): an export needs the head's
    two, a resume the trainer state too."""
    need = CHECKED_FILES if resume else CHECKED_FILES[:2]
    return [n for n in need if not (ckpt / n).is_file()]


def newest_intact(run_dir: Path, resume: bool = False) -> tuple[Path | None, list[Path]]:
    """(the newest checkpoint holding every file it needs, the newer ones that do not)."""
    found = checkpoints(run_dir)
    broken = []
    for ckpt in reversed(found):
        if not missing_files(ckpt, resume):
            return ckpt, broken
        broken.insert(0, ckpt)
    return None, broken


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A checkpoint dir, or a run dir (its latest checkpoint); CheckpointError naming what is missing otherwise (an
    incomplete newest checkpoint names the newest intact one)."""
    path = Path(path)
    if (path / "head.safetensors").exists():
        return path
    found = checkpoints(path)
    if not found:
        raise CheckpointError(_no_checkpoint(path))
    if missing_files(found[-1]):
        intact, _ = newest_intact(path)
        raise CheckpointError(_incomplete(found[-1], intact))
    return found[-1]


def _incomplete(ckpt: Path, intact: Path | None) -> str:
    lacks = ", ".join(missing_files(ckpt, resume=True))
    if intact is None:
        return f"{ckpt}, the run's only or newest checkpoint, is incomplete (no {lacks}) and no earlier one is intact"
    return (
        f"{ckpt}, the run's newest checkpoint, is incomplete (no {lacks}). The newest intact one is {intact}: export "
        f"it by that path (draftsmith export --format vllm {intact} OUT), or continue training from it with "
        "resume=auto (which sets the incomplete one aside and says so)."
    )


def _no_checkpoint(path: Path) -> str:
    """Why `path` is not a checkpoint, and what to give instead (one paragraph)."""
    want = "a checkpoint directory (RUN/checkpoints/step_N, holding head.safetensors) or a run's output_dir"
    if not path.exists():
        return f"{path} does not exist: expected {want}. Check the path."
    if not path.is_dir():
        return f"{path} is a file: expected {want}."
    if (path / "config.json").is_file() and (path / "model.safetensors").is_file():
        return (
            f"{path} is an exported head (config.json + model.safetensors), not a training checkpoint: it is "
            f"already exported; serve it as it is (--head NAME={path}), or export from the run it came from."
        )
    empty = " (its checkpoints/ has no finished step_* yet)" if (path / "checkpoints").is_dir() else ""
    return (
        f"{path} holds no checkpoint: neither head.safetensors (a checkpoint directory) nor "
        f"checkpoints/step_* (a run directory){empty}. Is this the run's output_dir? A run saves its first "
        f"checkpoint at save_every steps, so one stopped before then has none: run it again (a lower "
        f"save_every saves sooner)."
    )


def check_run_dir(run_dir: Path, resume: str | None, overwrite: bool) -> tuple[str | None, str | None]:
    """Check `run_dir` before a run writes into it, writing nothing; returns (the `resume` to use, what must be
    cleared before the run writes: None, "metrics" or "run").

    A fresh run into a directory holding an earlier run's checkpoints or metrics would append to its
    metrics.jsonl, prune its own new checkpoints in favour of the old run's higher step numbers and leave an
    export shipping the old head: refused, unless `overwrite` (which clears them, but only once the run's data,
    target and features are known good: `clear_run_dir`). `resume=auto` with no checkpoint yet (a run killed before
    its first save) starts from step 0 and drops the unsaved steps' metrics.
    """
    found = checkpoints(run_dir)
    metrics = run_dir / "metrics.jsonl"
    if resume == "auto" and not found:
        return None, "metrics" if metrics.exists() else None
    if resume == "auto" and missing_files(found[-1], resume=True):
        intact, _ = newest_intact(run_dir, resume=True)
        if intact is None:
            raise CheckpointError(_incomplete(found[-1], None) + ": start over with overwrite=true")
        return str(intact), "incomplete"  # clear_run_dir sets the newer, incomplete ones aside
    if resume is not None or not (found or metrics.exists()):
        return resume, None
    if not overwrite:
        raise ConfigError(
            f"output_dir {run_dir} already holds a run ({_what(run_dir)}). Continue it with resume=auto, "
            f"start over with overwrite=true (deletes its checkpoints and metrics), or train into "
            f"another directory (run_name=NAME or output_dir=DIR)."
        )
    return None, "run"


def _what(run_dir: Path) -> str:
    found = checkpoints(run_dir)
    return (
        (f"{len(found)} checkpoint(s) up to {found[-1].name}" if found else "no checkpoint")
        + " and "
        + ("a metrics.jsonl" if (run_dir / "metrics.jsonl").exists() else "no metrics.jsonl")
    )


def clear_run_dir(run_dir: Path, clear: str | None, log=print) -> None:
    """Clear what `check_run_dir` said must go, under the run's lock, just before the run writes."""
    if clear == "metrics":
        log(f"resume=auto: {run_dir} has no checkpoint yet; starting from step 0 (its unsaved metrics dropped)")
        (run_dir / "metrics.jsonl").unlink(missing_ok=True)
    elif clear == "incomplete":
        intact, broken = newest_intact(run_dir, resume=True)
        for ckpt in broken:  # kept, not deleted, under a name `checkpoints()` does not list
            aside = ckpt.with_name(f"incomplete-{ckpt.name}")
            ckpt.rename(aside)
            log(f"resume=auto: {ckpt.name} lacked {', '.join(missing_files(aside, resume=True))}; set aside as {aside}")
    elif clear == "run":
        log(f"overwrite=true: deleting the earlier run in {run_dir} ({_what(run_dir)})")
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
        (run_dir / "metrics.jsonl").unlink(missing_ok=True)


def trim_metrics(path: Path, step: int) -> int:
    """Keep the metrics lines of steps <= `step` (the checkpoint resumed from); returns how many were dropped.

    A kill after a checkpoint leaves lines for steps the resumed run does again (and maybe a torn last line):
    without this the log would hold those steps twice.
    """
    if not path.exists():
        return 0
    kept, dropped = [], 0
    for line in path.read_bytes().splitlines(keepends=True):
        try:
            row = json.loads(line)
            ok = line.endswith(b"\n") and row.get("step", 0) <= step
        except ValueError:  # a line torn by the kill
            ok = False
        if ok:
            kept.append(line)
        else:
            dropped += 1
    if dropped:
        atomic_write(path, b"".join(kept))
    return dropped


def save_checkpoint(run_dir, step: int, head_state: dict, head_meta: dict, trainer_state: dict, keep: int) -> Path:
    final = Path(run_dir) / "checkpoints" / f"step_{step:08d}"
    try:
        with atomic_dir(final) as tmp:
            save_file({k: v.detach().cpu().contiguous() for k, v in head_state.items()}, tmp / "head.safetensors")
            (tmp / "head.json").write_text(json.dumps(head_meta, indent=2) + "\n")
            torch.save(trainer_state, tmp / "trainer.pt")
            sums = {name: file_sha256(tmp / name) for name in CHECKED_FILES}
            (tmp / CHECKSUMS).write_text(json.dumps(sums, indent=1) + "\n")
    except Exception as e:  # safetensors and torch wrap the OSError in their own types
        code = fs_errno(e)
        if code is None:
            raise
        kept = checkpoints(run_dir)
        raise FilesystemError(
            fs_message(code, final, "write checkpoint")
            + " Nothing of this checkpoint was kept"
            + (f"; the previous one, {kept[-1]}, is intact" if kept else "")
            + ": continue with resume=auto."
        ) from None
    for old in checkpoints(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old)
    return final


def _unreadable(path: Path, e: Exception) -> CheckpointError:
    older = [p.name for p in checkpoints(path.parent.parent.parent) if p != path.parent]  # run/checkpoints/step_N/file
    hint = f"; older checkpoints: {', '.join(older[-3:])} (pass one as resume=DIR)" if older else ""
    return CheckpointError(f"{path}: unreadable checkpoint file, truncated or corrupt ({type(e).__name__}: {e}){hint}")


def load_head(ckpt: str | os.PathLike) -> tuple[dict, dict[str, torch.Tensor]]:
    """(head.json meta, tensors) from a checkpoint or run dir."""
    ckpt = resolve_checkpoint(ckpt)
    verify_file(ckpt / "head.json")
    try:
        meta = json.loads((ckpt / "head.json").read_text())
    except (OSError, ValueError) as e:
        raise _unreadable(ckpt / "head.json", e) from None
    verify_file(ckpt / "head.safetensors")
    try:
        tensors = load_file(ckpt / "head.safetensors")
    except Exception as e:  # safetensors raises its own error type for a bad header or short file
        raise _unreadable(ckpt / "head.safetensors", e) from None
    bad = nonfinite(tensors)
    if bad:
        raise _unreadable(ckpt / "head.safetensors", ValueError(f"NaN or inf in {', '.join(bad[:4])}"))
    return meta, tensors


def load_trainer_state(ckpt: str | os.PathLike) -> dict:
    path = resolve_checkpoint(ckpt) / "trainer.pt"
    verify_file(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # zip/pickle errors of a truncated file
        raise _unreadable(path, e) from None


@dataclass
class Position:
    """Where a run stands: what a checkpoint stores besides the weights, and what the loop advances."""

    step: int = 0
    epoch: int = 0
    cursor: int = 0  # optimizer steps taken in this epoch
    tokens: int = 0  # supervised tokens so far, over all ranks
    elapsed_s: float = 0.0  # training seconds before this process started (they count against optim.max_minutes)


def save_run_state(
    run_dir,
    pos: Position,
    weights: dict,
    family: str,
    head_config: dict,
    metrics: dict,
    optimizer_state: dict,
    scheduler,
    global_batch: int,
    elapsed_s: float,
    config: dict,
    keep: int,
) -> Path:
    """One checkpoint of a training run: the head (+ its config and last metrics) and everything resume needs.
    `optimizer_state`: the optimizer's whole state (`optimizer.state_dict()`, or a sharded head's gathered one)."""
    meta = {"family": family, "config": head_config, "step": pos.step, "tokens": pos.tokens, "metrics": metrics}
    if config.get("fast_bf16") is not None:  # the precision decision a resumed run keeps (recorded_fast_bf16)
        meta["fast_bf16"] = config["fast_bf16"]
    trainer = {
        "optimizer": optimizer_state,
        "scheduler": scheduler.state_dict(),
        "step": pos.step,
        "epoch": pos.epoch,
        "cursor": pos.cursor,
        "tokens": pos.tokens,
        "rng": rng_state(),
        "global_batch": global_batch,
        "elapsed_s": elapsed_s,
        "config": config,
    }
    return save_checkpoint(run_dir, pos.step, weights, meta, trainer, keep)


def recorded_fast_bf16(run_dir: Path, resume: str | None) -> tuple[bool, Path] | None:
    """(fast_bf16, checkpoint) as recorded by the checkpoint `resume` will continue from; None when there is none
    yet, it predates the record, or it cannot be read (the resume itself then reports why)."""
    if not resume:
        return None
    try:  # the checkpoint start_session will resolve: a run dir's latest, or the one named
        ckpt = resolve_checkpoint(run_dir if resume == "auto" else resume)
        value = json.loads((ckpt / "head.json").read_text()).get("fast_bf16")
    except (CheckpointError, OSError, ValueError):
        return None
    return None if value is None else (bool(value), ckpt)


def restore_run_state(ckpt: Path, head, optimizer, scheduler, world: int, accum: int, load_sharded=None) -> Position:
    """Load head weights, optimizer, scheduler and RNG from `ckpt`, refusing one made for another head, draft
    vocab or global batch; returns where the run stood. `load_sharded(weights, optimizer_state)`: how a sharded
    (FSDP) head takes its whole weights and optimizer state; None for a head every rank holds whole."""
    state = load_trainer_state(ckpt)
    group = state.get("global_batch", world * accum)
    if group != world * accum:  # the data position counts optimizer steps of `group` micro-batches
        raise CheckpointError(
            f"{ckpt} was trained with {group} micro-batches per optimizer step (processes x "
            f"optim.grad_accum); this run has {world} x {accum}: set optim.grad_accum={group // world}"
            if group % world == 0
            else f"{ckpt}: global batch {group} is not divisible by {world} processes"
        )
    meta, weights = load_head(ckpt)
    check_same_head(meta, head.config.to_dict(), ckpt, defaults=field_defaults(type(head.config)))
    if "d2t" in weights and not torch.equal(weights["d2t"].to(head.d2t.device), head.d2t):
        # the target logits the features give are over this run's draft vocab; the checkpoint's head is not
        raise CheckpointError(
            f"{ckpt}: its draft vocab differs from the one this run built from the data "
            f"(data.path, data.num_conversations or head.draft_vocab_size changed)"
        )
    from draftsmith.train.sharded import sharded_layout

    if sharded_layout(state["optimizer"]) != (load_sharded is not None):
        saved, now = ("FSDP", "DDP or one process") if load_sharded is None else ("DDP or one process", "FSDP")
        raise CheckpointError(
            f"{ckpt} was saved by a run under {saved}; this run uses {now}: resume it under the layout that "
            f"saved it (its optimizer state is keyed differently), or start a new run with head.init_from={ckpt}"
        )
    if load_sharded is not None:
        unknown = set(weights) - set(head.state_dict())
        assert not unknown, unknown
        load_sharded(weights, state["optimizer"])
    else:
        frozen_or_tied = set(head.state_dict()) - set(head.trainable_state_dict())  # e.g. embed_tokens, tied stages
        missing = head.load_state_dict(weights, strict=False)
        assert set(missing.missing_keys) <= frozen_or_tied and not missing.unexpected_keys, missing
        optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    return Position(state["step"], state["epoch"], state["cursor"], state["tokens"], state.get("elapsed_s", 0.0))


def field_defaults(config_type) -> dict:
    """A head config dataclass's field defaults: what a checkpoint written before a field existed was built with."""
    return {f.name: f.default for f in fields(config_type) if f.default is not MISSING}


def check_same_head(meta: dict, config: dict, ckpt, defaults: dict | None = None) -> None:
    """Refuse a checkpoint whose head was built for another target or shape (names every differing field; a field
    the checkpoint does not record counts as its value in `defaults`)."""
    ignore = {"target", "ttt_steps"}  # provenance; the unroll depth may change between runs
    theirs, ours = {**(defaults or {}), **meta.get("config", {})}, config
    diff = {
        k: (theirs.get(k), ours.get(k))
        for k in sorted(set(theirs) | set(ours) - ignore)
        if k not in ignore and theirs.get(k) != ours.get(k)
    }
    for k in ("num_hidden_layers", "model_type"):  # the target it was trained against
        a, b = theirs.get("target", {}).get(k), ours.get("target", {}).get(k)
        if a is not None and b is not None and a != b:
            diff[f"target.{k}"] = (a, b)
    if diff:
        raise CheckpointError(
            f"{ckpt}: this {meta.get('family', '?')} head was trained for another target or head "
            f"shape: " + ", ".join(f"{k} checkpoint={a!r} here={b!r}" for k, (a, b) in diff.items())
        )


def check_head_fits_target(config: dict, target_config, where, family: str) -> None:
    """Refuse to pair a head with a target it was not made for (before a shape error deep inside torch).

    `config` is a head config: training's, or one read back from an exported dir; a size it lacks is not checked.
    What must fit is the family's own `target_problems` (train/heads/families.py)."""
    from draftsmith.train.heads import families

    problems = families.get(family).target_problems(config, target_config)
    if problems:
        trained_on = (config.get("target") or {}).get("name_or_path") or "another target"
        raise CheckpointError(
            f"{where}: this head was trained for {trained_on}, not this target: "
            + ", ".join(problems)
            + ". Pair it with the target it was made for."
        )


def read_head(path: str | os.PathLike):
    """(family, config dict, tensors under the checkpoint keys, training metrics) of a head: a checkpoint or run
    dir (head.json) or an exported dir (draftsmith.json; its family's `read_export`, metrics {}).

    A head that records no family is EAGLE-3 (the only family before MLP speculators)."""
    from draftsmith.train.heads import families

    path = Path(path)
    if (path / "draftsmith.json").is_file():
        recorded = json.loads((path / "draftsmith.json").read_text()).get("family", families.UNRECORDED)
        family = families.get(recorded, where=path / "draftsmith.json")
        config, state = family.read_export(path)
        return family, config, state, {}
    meta, state = load_head(path)
    family = families.get(meta.get("family", families.UNRECORDED), where=resolve_checkpoint(path) / "head.json")
    return family, meta["config"], state, meta.get("metrics") or {}


def head_digest(family: str, config: dict, state: dict[str, torch.Tensor]) -> str:
    """sha1 of the head as `read_head` gives it (family, config, every tensor's name, dtype, shape and bytes): the
    head the fit runs, whether it came from an export or a run dir's latest checkpoint among others kept."""
    h = hashlib.sha1(json.dumps([family, config], sort_keys=True, default=str).encode())
    for name in sorted(state):
        t = state[name].detach().contiguous().reshape(-1)
        h.update(f"{name}:{t.dtype}:{tuple(state[name].shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def head_digest_of(path: str | os.PathLike) -> str:
    """`head_digest` of the head at `path` (an export, a checkpoint or a run dir's latest)."""
    family, config, state, _ = read_head(path)
    return head_digest(family.name, config, state)


def read_run_config(path: Path) -> dict:
    """A run's saved config.yaml as a dict; CheckpointError naming the file when it is not a YAML mapping (edited by
    hand, cut short)."""
    import yaml

    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        problem = getattr(e, "problem", None) or getattr(e, "strerror", None) or str(e).splitlines()[0]
        raise CheckpointError(
            f"{path}: the run's saved config cannot be read ({problem}{at}). It is written by the run itself; "
            "restore it from the run's .yaml it was edited from, or re-run training to rewrite it."
        ) from None
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: the run's saved config is not a mapping of keys (a {type(config).__name__})")
    return config


def training_data(path: str | os.PathLike) -> dict | None:
    """What a head trained on, as `{"data": data.path, "conversations": data.num_conversations}` (None: all of it):
    an exported head's record (`trained_on` in draftsmith.json), or the config.yaml of the run a checkpoint (or
    run dir) belongs to; None when neither says. Training reads the first `conversations` of `data`, so the
    conversations after them are ones the head never saw (fit-hybrid's default)."""

    path = Path(path)
    if (path / "draftsmith.json").is_file():
        return json.loads((path / "draftsmith.json").read_text()).get("trained_on")
    try:
        ckpt = resolve_checkpoint(path)
    except CheckpointError:
        return None
    config = ckpt.parent.parent / "config.yaml"  # RUN/checkpoints/step_N -> RUN/config.yaml
    if not config.is_file():
        return None
    data = read_run_config(config).get("data") or {}
    if not data.get("path"):
        return None
    return {"data": str(data["path"]), "conversations": data.get("num_conversations")}


def head_from_state(family, config: dict, state: dict[str, torch.Tensor], where):
    """The family's module built from `config` with `state` loaded (fp32); every tensor it trains must be there.

    Tensors it does not save (a frozen borrowed embedding, tied stages' copies) may be absent; see `attach_target`."""
    head = family.module(family.config(**config))
    state = {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
    missing, unexpected = head.load_state_dict(state, strict=False)
    not_saved = set(head.state_dict()) - set(head.trainable_state_dict())
    if set(missing) - not_saved or unexpected:
        raise CheckpointError(
            f"{where}: the {family.name} head's tensors do not fit its config (missing "
            f"{sorted(set(missing) - not_saved)}, unexpected {sorted(unexpected)})"
        )
    return head
