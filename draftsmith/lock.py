"""One process at a time per directory: an advisory lock for run, feature and export directories.

The lock is `fcntl.flock` on a small file that names its holder (pid, host, command, start time). The kernel drops
it when the holder exits however it exits (Ctrl-C, a crash, kill -9), so a lock file left behind is never stale: the
next process takes it over. A second process on the same directory is refused with the holder named. The file is
created only when the process is about to write there, so a refused run leaves nothing behind, and removed when the
holder exits normally (`release`, run at exit), so a finished run leaves none either. Removing a lock file while
another process waits to open it is safe: whoever locks a file checks that it is still the one at the path.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

from draftsmith.errors import ConfigError

LOCK_NAME = ".draftsmith.lock"
_held: dict[str, int] = {}  # lock path -> fd, kept open for the life of the process
_owner = os.getpid()  # a forked child inherits _held but holds nothing: it never removes its parent's lock files


def acquire(lock_path: str | os.PathLike, what: str) -> Path:
    """Take the lock at `lock_path` for `what` (e.g. "training into outputs/x"), or raise ConfigError naming the
    process that holds it. Idempotent within one process."""
    path = Path(lock_path).absolute()
    if str(path) in _held:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            break
        if _same_file(fd, path):
            return _hold(fd, path, what)
        os.close(fd)  # its holder released it and removed the file between our open and our lock: open the new one
    holder = _read(fd)
    os.close(fd)
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("since", 0)))
    what, pid, host = holder.get("what", "another draftsmith process"), holder.get("pid", "?"), holder.get("host")
    raise ConfigError(
        f"{path.parent} is in use: {what} (pid {pid} on {host or '?'}, since {since}: "
        f"{holder.get('command', '?')}). Wait for it to finish, stop it, or use another directory; two processes "
        f"writing one directory would interleave their files."
    )


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def _hold(fd: int, path: Path, what: str) -> Path:
    info = {
        "what": what,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": time.time(),
        "command": " ".join(sys.argv)[:300],
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
    global _owner
    if not _held:
        _owner = os.getpid()
        atexit.register(release_all)
    _held[str(path)] = fd
    return path


def release(lock_path: str | os.PathLike) -> None:
    """Remove the lock file this process holds at `lock_path` and drop the lock (nothing if not held here)."""
    path = Path(lock_path).absolute()
    fd = _held.pop(str(path), None)
    if fd is None or os.getpid() != _owner:
        return
    if _same_file(fd, path):  # still ours: remove it while locked, so no other process holds a removed file
        path.unlink(missing_ok=True)
    os.close(fd)


def release_all() -> None:
    """Release every lock this process holds (run at exit)."""
    for path in list(_held):
        release(path)


def acquire_dir(directory: str | os.PathLike, what: str) -> Path:
    """The lock of a run or features directory: a file inside it."""
    return acquire(Path(directory) / LOCK_NAME, what)


def acquire_beside(target: str | os.PathLike, what: str) -> Path:
    """The lock of a directory that is replaced as a whole (an export): a hidden file beside it."""
    target = Path(target).absolute()
    return acquire(target.parent / f".{target.name}{LOCK_NAME}", what)


def _read(fd: int) -> dict:
    try:
        return json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        return {}
