"""Atomic, resumable checkpoints: head weights + config, optimizer, scheduler, data position, RNG.

Layout: <run>/checkpoints/step_00000123/{head.safetensors, head.json, trainer.pt}. Each is written
into a temporary directory and renamed into place, so a crash mid-write leaves the previous one.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from draftsmith.atomic import atomic_dir


class CheckpointError(ValueError):
    """A checkpoint that cannot be used here: unreadable (truncated, corrupt) or made for another target/head."""


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


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A checkpoint dir, or a run dir (its latest checkpoint)."""
    path = Path(path)
    if (path / "head.safetensors").exists():
        return path
    found = checkpoints(path)
    if not found:
        raise FileNotFoundError(f"no checkpoint in {path} (expected head.safetensors or checkpoints/step_*)")
    return found[-1]


def save_checkpoint(run_dir, step: int, head_state: dict, head_meta: dict, trainer_state: dict, keep: int) -> Path:
    final = Path(run_dir) / "checkpoints" / f"step_{step:08d}"
    with atomic_dir(final) as tmp:
        save_file({k: v.detach().cpu().contiguous() for k, v in head_state.items()}, tmp / "head.safetensors")
        (tmp / "head.json").write_text(json.dumps(head_meta, indent=2) + "\n")
        torch.save(trainer_state, tmp / "trainer.pt")
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
    try:
        meta = json.loads((ckpt / "head.json").read_text())
    except (OSError, ValueError) as e:
        raise _unreadable(ckpt / "head.json", e) from None
    try:
        return meta, load_file(ckpt / "head.safetensors")
    except Exception as e:  # safetensors raises its own error type for a bad header or short file
        raise _unreadable(ckpt / "head.safetensors", e) from None


def load_trainer_state(ckpt: str | os.PathLike) -> dict:
    path = resolve_checkpoint(ckpt) / "trainer.pt"
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # zip/pickle errors of a truncated file
        raise _unreadable(path, e) from None


def check_same_head(meta: dict, config: dict, ckpt) -> None:
    """Refuse a checkpoint whose head was built for another target or shape (names every differing field)."""
    ignore = {"target", "ttt_steps"}  # provenance; the unroll depth may change between runs
    theirs, ours = meta.get("config", {}), config
    diff = {k: (theirs.get(k), ours.get(k)) for k in sorted(set(theirs) | set(ours) - ignore)
            if k not in ignore and theirs.get(k) != ours.get(k)}
    for k in ("num_hidden_layers", "model_type"):  # the target it was trained against
        a, b = theirs.get("target", {}).get(k), ours.get("target", {}).get(k)
        if a is not None and b is not None and a != b:
            diff[f"target.{k}"] = (a, b)
    if diff:
        raise CheckpointError(f"{ckpt}: this {meta.get('family', '?')} head was trained for another target or head "
                              f"shape: " + ", ".join(f"{k} checkpoint={a!r} here={b!r}" for k, (a, b) in diff.items()))


def check_head_fits_target(config: dict, target_config, where) -> None:
    """Refuse to pair a head with a target it was not made for (before a shape error deep inside torch)."""
    want = {"vocab_size": target_config.vocab_size}
    if "target_hidden_size" in config:  # EAGLE-3
        want["target_hidden_size"] = target_config.hidden_size
    if "emb_dim" in config:  # MLP speculator
        want["emb_dim"] = target_config.hidden_size
    diff = {k: (config.get(k), v) for k, v in want.items() if config.get(k) != v}
    bad_aux = [i for i in config.get("aux_layer_ids") or [] if not 0 <= i < target_config.num_hidden_layers]
    if diff or bad_aux:
        trained_on = (config.get("target") or {}).get("name_or_path") or "another target"
        raise CheckpointError(f"{where}: this head was trained for {trained_on}, not this target: "
                              + ", ".join([f"{k} head={a} target={b}" for k, (a, b) in diff.items()]
                                          + ([f"aux layers {bad_aux} beyond {target_config.num_hidden_layers}"] if bad_aux else [])))
