"""Where an export may be written: OUT is replaced as a whole, so refuse any OUT whose loss the user did not ask for.

Refused, before anything is written: an OUT that is a file or a symbolic link, an OUT that is or contains the
checkpoint being exported (even with --force: export must never delete its own source), and an existing non-empty
OUT that is not a previous export (unless --force). A previous export (a draft-head config.json and only the files
an export writes) is replaced without asking, so `draftsmith export RUN OUT` can be run again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

from draftsmith.errors import ConfigError

# what export writes (mask_embedding.pt: a DFlash head's learned mask slot input, as vLLM reads it)
EXPORT_FILES = {"config.json", "model.safetensors", "draftsmith.json", "draft_vocab.safetensors", "mask_embedding.pt"}
# what is fitted or measured for an exported head and kept beside it: the hybrid policy (eval fit-hybrid) and the k
# schedule (eval schedule). A re-export of the same head carries them over; of another head, drops them.
FITTED_FILES = ("hybrid.json", "schedule.json")


def _is_head_config(config: dict) -> bool:
    """A config.json of an exported draft head: speculators, native EAGLE-3, DFlash or MLP speculator."""
    archs = config.get("architectures") or []
    return (
        "speculators_model_type" in config
        or config.get("model_type") == "mlp_speculator"
        or any("eagle3" in str(a).lower() or "dflash" in str(a).lower() for a in archs)
    )


def is_previous_export(path: str | os.PathLike) -> bool:
    """A directory that an export wrote: a draft-head config.json and nothing an export does not write."""
    path = Path(path)
    try:
        names = {p.name for p in path.iterdir()}
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    files_only = all((path / n).is_file() and not (path / n).is_symlink() for n in names)
    allowed = EXPORT_FILES | set(FITTED_FILES)
    return isinstance(config, dict) and _is_head_config(config) and names <= allowed and files_only


def carry_fitted(old: Path, new: Path, log=print) -> list[str]:
    """Copy what was fitted for the head in `old` (a previous export about to be replaced) into `new` when `new`
    holds the same head (equal weights and config); say what is dropped otherwise. Returns the names carried."""
    import shutil

    from draftsmith.train.checkpoint import head_digest_of

    found = [n for n in FITTED_FILES if (old / n).is_file()]
    if not found:
        return []
    try:
        same = head_digest_of(old) == head_digest_of(new)
    except Exception:  # an unreadable old export (an older layout, damaged): nothing of it can be vouched for
        same = False
    if not same:
        log(
            f"export: {', '.join(found)} in {old} dropped: they were fitted for the head exported there before, not "
            "this one (refit: draftsmith eval fit-hybrid / eval schedule)"
        )
        return []
    for name in found:
        shutil.copy2(old / name, new / name)
    log(f"export: kept {', '.join(found)} (the same head as before)")
    return found


def _paths(source) -> list[Path]:
    if source is None:
        return []
    if isinstance(source, (str, os.PathLike)):
        return [Path(source)]
    return [Path(s) for s in source if s is not None]


def _listing(path: Path, n: int = 5) -> str:
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def _check_not_source(sources: list[Path], out: Path) -> None:
    """Refuse an OUT that is, or contains, a source directory (compared as resolved real paths)."""
    real_out = Path(os.path.realpath(out))
    for src in sources:
        real_src = Path(os.path.realpath(src))
        if real_src != real_out and real_out not in real_src.parents:
            continue
        what = "is the directory being exported" if real_src == real_out else f"contains {src}, the one being exported"
        raise ConfigError(
            f"export destination {out} {what}: the export replaces OUT as a whole, which would delete the head "
            f"being exported. Pick a directory outside it, e.g. exported/{real_src.name}; --force does not "
            f"override this."
        )


def check_export_destination(
    source: str | os.PathLike | Iterable | None, out: str | os.PathLike, force: bool = False
) -> None:
    """Refuse an OUT whose replacement would lose something (see the module docstring); returns if OUT is safe."""
    out = Path(out)
    if out.is_symlink():  # atomic_dir cannot replace a link, and the user may mean the directory behind it
        raise ConfigError(
            f"export destination {out} is a symbolic link (to {os.readlink(out)}); give the "
            f"directory itself or a new path."
        )
    if out.exists() and not out.is_dir():
        raise ConfigError(
            f"export destination {out} is a file; pick a directory (a new path, or a previous "
            f"export to replace): the export writes config.json and model.safetensors into it."
        )
    parent = out.absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(
            f"export destination {out}: {parent} is a file, so no directory can be made there; pick another path."
        )
    _check_not_source(_paths(source), out)
    if force or not out.is_dir() or not any(out.iterdir()) or is_previous_export(out):
        return
    raise ConfigError(
        f"export destination {out} is a non-empty directory that is not a previous export (it holds "
        f"{_listing(out)}): the export replaces OUT as a whole, which would delete those files. Pick a new or "
        f"empty directory, or add --force to replace {out} and everything in it."
    )
