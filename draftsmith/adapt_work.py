"""What `draftsmith adapt` owns, and `draftsmith adapt --forget`, which deletes only that.

A work directory is adapt's when adapt created it (or found it empty) and wrote its owner file there: a random token,
which the run's record (`adapt.json`) repeats. `--forget WORK` deletes WORK only when both files are there and agree,
and beyond WORK only the cache entries the record lists that lie directly under draftsmith's own cache root
(`<cache>/features/*`, `<cache>/data/*`: the features and prepared data made from the traffic). Anything else — a
directory holding someone's `adapt.json`, a listed path outside those roots, a symbolic link out of them — is refused
before anything is deleted, naming the path. `--dry-run` lists what would go.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from pathlib import Path

from draftsmith.errors import ConfigError

RECORD = "adapt.json"  # in WORK: what this adapt run did, and what --forget deletes
OWNER = ".draftsmith-adapt"  # in WORK: {"token"} written when adapt made WORK; RECORD's "owner" repeats it
CACHE_KINDS = ("features", "data")  # the cache folders whose entries an adapted run makes from the traffic


def _read_json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def check_claimable(work: Path) -> None:
    """Refuse a WORK that adapt did not make and that holds files (adapt and --forget would treat them as its own)."""
    if work.exists() and not work.is_dir():
        raise ConfigError(f"--work {work} is a file; adapt needs a directory of its own (a new path)")
    if work.is_dir() and any(work.iterdir()) and owner_token(work) is None:
        older = (
            " (its adapt.json may be an older draftsmith's, which marked nothing)" if (work / RECORD).exists() else ""
        )
        raise ConfigError(
            f"--work {work} holds files that draftsmith adapt did not make (no {OWNER} in it){older}: adapt keeps "
            "the traffic, the target's answers and its run there, and --forget deletes the directory whole. Pick a "
            "new or empty directory (--work DIR)."
        )


def claim(work: Path) -> str:
    """WORK made (or found empty) and marked as adapt's; the owner token (an earlier adapt run's, if WORK is one)."""
    check_claimable(work)
    token = owner_token(work)
    if token is None:
        work.mkdir(parents=True, exist_ok=True)
        token = secrets.token_hex(16)
        from draftsmith.atomic import atomic_write_json

        atomic_write_json(work / OWNER, {"token": token})
    return token


def owner_token(work: Path) -> str | None:
    owner = _read_json(work / OWNER)
    token = owner.get("token") if owner else None
    return token if isinstance(token, str) and token else None


def forgettable(work: Path) -> list[Path]:
    """The paths --forget WORK would delete (WORK last); ConfigError naming the first it cannot prove is adapt's."""
    from draftsmith.assets import cache_dir

    record = _read_json(work / RECORD)
    token = owner_token(work)
    if not work.is_dir() or record is None or token is None or record.get("owner") != token:
        what = "no adapt.json" if record is None else f"no {OWNER} matching its adapt.json"
        raise ConfigError(
            f"{work}: not a work directory draftsmith adapt made ({what}); nothing deleted. --forget deletes only "
            "what adapt made and recorded; delete anything else yourself."
        )
    real_work = work.resolve()
    roots = [(cache_dir() / kind).resolve() for kind in CACHE_KINDS]
    listed = record.get("private_paths", [])
    if not isinstance(listed, list):
        raise ConfigError(f"{work / RECORD}: private_paths is not a list; nothing deleted")
    out = []
    for p in listed:
        path = Path(str(p))
        real = path.resolve()
        if real == real_work or real_work in real.parents:
            continue  # inside WORK: goes with it
        if path.is_symlink() or real.parent not in roots:
            raise ConfigError(
                f"{work / RECORD} lists {path}, which is not a cache entry of draftsmith's under "
                f"{' or '.join(map(str, roots))}: --forget refuses it and deletes nothing. Delete it yourself if it "
                "is yours to delete."
            )
        if path.exists():
            out.append(path)
    return [*out, work]


def forget(work: Path, dry_run: bool = False) -> int:
    """Delete WORK and every cache entry made from its traffic (prepared data, features), after proving each is
    adapt's; with dry_run only list them."""
    paths = forgettable(Path(work))
    for p in paths:
        what = (
            "the traffic, the target's answers, the run, the judge's outputs"
            if p == paths[-1]
            else "made from the traffic"
        )
        if dry_run:
            print(f"adapt: would delete {p} ({what})")
            continue
        if p.is_dir():
            shutil.rmtree(p)
        else:
            os.unlink(p)
        print(f"adapt: deleted {p} ({what})")
    return 0
