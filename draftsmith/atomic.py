"""Atomic writes: build beside the final place, fsync, rename into place. A crash leaves the old version or the new
one, never half of either."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename in `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_file(final: str | os.PathLike, durable: bool = True) -> Iterator[Path]:
    """Yield a temporary path beside `final` to write; on success it is fsynced and renamed over `final`.
    durable=False skips the fsyncs: readers still see the old or the new file, never half, but a power cut may
    lose the write (for telemetry rewritten many times a second, never for data or checkpoints)."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".tmp-{final.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.touch(exist_ok=False)  # the umask's permissions, like any file the user writes (mkstemp would give 0600)
    try:
        yield tmp
        if durable:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, final)
        if durable:
            fsync_dir(final.parent)
    finally:
        if tmp.exists():
            tmp.unlink()


def atomic_write(path: str | os.PathLike, data: bytes, durable: bool = True) -> None:
    """Replace `path` with `data` atomically."""
    with atomic_file(path, durable) as tmp:
        tmp.write_bytes(data)


def atomic_write_json(path: str | os.PathLike, obj, indent: int | None = 1, durable: bool = True) -> None:
    atomic_write(path, (json.dumps(obj, indent=indent) + "\n").encode(), durable)


@contextmanager
def atomic_dir(final: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory; on success it replaces `final` (a crash leaves the old one intact)."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
    try:
        yield tmp
        readable(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def readable(root: Path) -> None:
    """Give `root` and everything in it the umask's permissions, as mkdir and open would (mkdtemp makes 0700, which a
    server running as another user cannot read)."""
    mask = os.umask(0)
    os.umask(mask)
    for path in [root, *root.rglob("*")]:
        if not path.is_symlink():
            os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)
