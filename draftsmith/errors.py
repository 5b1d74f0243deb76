"""Errors a user can act on, and the one handler every entry point uses to print them.

A `DraftsmithError` says what is wrong (naming the key, file, record or directory) and what to do about it.
`handle_errors` prints it as one paragraph on stderr, with no traceback; `--debug`, `DRAFTSMITH_DEBUG=1` or
`HYDRA_FULL_ERROR=1` re-raise instead, for the full stack. Ctrl-C and a file system's refusal (read-only,
permission, size limit, full disk, quota) get the same treatment.
"""

from __future__ import annotations

import errno
import os
import re
import sys
from typing import Callable

# what a failed write or open on a file system means, and what to do: the one error path of every verb
FS_ERRORS = {
    errno.EROFS: ("the file system is read-only", "write somewhere writable instead (another output_dir / --out)"),
    errno.EACCES: ("permission denied", "pick a directory you may write, or change its permissions"),
    errno.EPERM: ("operation not permitted", "pick a directory you may write, or change its permissions"),
    errno.EFBIG: (
        "the file is larger than this process may write (a file-size limit: `ulimit -f`, or the file system's "
        "largest file)",
        "raise the limit (`ulimit -f unlimited`) or write to a file system that holds larger files",
    ),
    errno.ENOSPC: ("no space left on the device", "free space there"),
    errno.EDQUOT: ("the disk quota is used up", "free space within your quota, or write elsewhere"),
}


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


class FilesystemError(DraftsmithError, OSError):
    """A write the file system refused (read-only, permission, size limit, full, quota): the message names the
    path, what was being done and what the errno means; everything finished before it is kept."""


def debug_requested(argv: list[str] | None = None) -> bool:
    """Whether the user asked for full tracebacks (`--debug`, DRAFTSMITH_DEBUG=1 or HYDRA_FULL_ERROR=1)."""
    env = any(os.environ.get(k, "") not in ("", "0") for k in ("DRAFTSMITH_DEBUG", "HYDRA_FULL_ERROR"))
    return env or bool(argv and "--debug" in argv)


def fs_errno(e: BaseException) -> int | None:
    """The errno of a file-system failure in FS_ERRORS, also where a library hides it: safetensors puts it in its
    text ("os error 27"), torch's zip writer drops it ("unexpected pos", "file write failed"), so that one is
    diagnosed from the process's file-size limit and the free space left."""
    if isinstance(e, OSError) and e.errno in FS_ERRORS:
        return e.errno
    text = str(e)
    m = re.search(r"os error (\d+)", text)
    if m and int(m[1]) in FS_ERRORS:
        return int(m[1])
    if "inline_container" in text or "file write failed" in text:
        import resource

        if resource.getrlimit(resource.RLIMIT_FSIZE)[0] != resource.RLIM_INFINITY:
            return errno.EFBIG
        return errno.ENOSPC
    return None


def fs_message(code: int, path, doing: str) -> str:
    """One paragraph: the path, what was being done, what the errno means and what to do."""
    meaning, advice = FS_ERRORS[code]
    if code == errno.ENOSPC:
        meaning += f" ({free_space(path)} free there now)"
    return (
        f"could not {doing} {path}: {meaning} ({errno.errorcode.get(code, code)}). {advice[0].upper()}{advice[1:]} "
        "and run the same command again: everything finished before it is kept."
    )


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
        code = fs_errno(e)
        if code is None:
            raise
        where = getattr(e, "filename", None) or "the output directory"
        print(f"{prog}: error: {fs_message(code, where, 'write')}", file=sys.stderr)
        return 1
