"""Errors a user can act on, and the one handler every entry point uses to print them.

A `DraftsmithError` says what is wrong (naming the key, file, record or directory) and what to do about it.
`handle_errors` prints it as one paragraph on stderr, with no traceback; `--debug`, `DRAFTSMITH_DEBUG=1` or
`HYDRA_FULL_ERROR=1` re-raise instead, for the full stack. Ctrl-C and a full disk get the same treatment.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Callable

# errno values that mean "no room to write": a full disk, a quota, a per-process file size limit
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
# the same, as torch's zip writer ("file write failed") and safetensors ("os error 28") report it
_NO_SPACE_TEXT = ("No space left on device", "Disk quota exceeded", "File too large", "file write failed")


class DraftsmithError(Exception):
    """A problem with the user's input, files or environment, described in one paragraph with what to do."""

    exit_code = 1


class ConfigError(DraftsmithError, ValueError):
    """A config key or command-line argument whose value cannot work (the message names the key)."""

    exit_code = 2


class DataError(DraftsmithError, ValueError):
    """Bad input data; the message names the file and the record."""


class Interrupted(DraftsmithError):
    """Ctrl-C, handled where the work could stop cleanly (the message says what was saved)."""

    exit_code = 130


class DiskFullError(DraftsmithError, OSError):
    """No room to write: what was being written is left out, everything finished before it is kept."""


def debug_requested(argv: list[str] | None = None) -> bool:
    """Whether the user asked for full tracebacks (`--debug`, DRAFTSMITH_DEBUG=1 or HYDRA_FULL_ERROR=1)."""
    env = any(os.environ.get(k, "") not in ("", "0") for k in ("DRAFTSMITH_DEBUG", "HYDRA_FULL_ERROR"))
    return env or bool(argv and "--debug" in argv)


def is_disk_full(e: BaseException) -> bool:
    """Out of room to write: an OSError's errno, or the text torch's and safetensors' writers put it in."""
    if isinstance(e, OSError) and e.errno in _NO_SPACE:
        return True
    text = str(e)
    return any(s in text for s in _NO_SPACE_TEXT)


def free_space(path) -> str:
    """Free bytes on the file system holding `path` (or its nearest existing parent), for messages."""
    import shutil
    from pathlib import Path

    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        free = shutil.disk_usage(p).free
    except OSError:
        return "unknown"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if free < 1024 or unit == "TiB":
            return f"{free:.0f} {unit}" if unit == "B" else f"{free:.1f} {unit}"
        free /= 1024
    return "unknown"


INTERRUPTED = (
    "interrupted (Ctrl-C). Everything finished before it is kept (checkpoints, feature shards, "
    "regenerated answers); run the same command again to continue (training: add resume=auto)."
)


def handle_errors(prog: str, fn: Callable[[], int | None], argv: list[str] | None = None) -> int:
    """Run `fn`; print a project error, Ctrl-C or a full disk as one message and return an exit status."""
    if debug_requested(argv):
        return int(fn() or 0)
    try:
        return int(fn() or 0)
    except DraftsmithError as e:
        print(f"{prog}: {'' if isinstance(e, Interrupted) else 'error: '}{e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"\n{prog}: {INTERRUPTED}", file=sys.stderr)
        return 130
    except Exception as e:
        if not is_disk_full(e):
            raise
        where = getattr(e, "filename", None) or "the output directory"
        print(
            f"{prog}: error: no room to write {where} ({e}); free space there ({free_space(where)} free now) and run "
            "the same command again: everything finished before it is kept.",
            file=sys.stderr,
        )
        return 1
