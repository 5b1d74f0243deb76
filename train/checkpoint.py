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


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def checkpoints(run_dir: str | os.PathLike) -> list[Path]:
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


def load_head(ckpt: str | os.PathLike) -> tuple[dict, dict[str, torch.Tensor]]:
    """(head.json meta, tensors) from a checkpoint or run dir."""
    ckpt = resolve_checkpoint(ckpt)
    meta = json.loads((ckpt / "head.json").read_text())
    return meta, load_file(ckpt / "head.safetensors")


def load_trainer_state(ckpt: str | os.PathLike) -> dict:
    return torch.load(resolve_checkpoint(ckpt) / "trainer.pt", map_location="cpu", weights_only=False)
