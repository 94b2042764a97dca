"""One writer per run directory: an exclusive lock held while a command writes into it.

``kvaudit run``, ``audit`` and ``report`` write files of a run directory; two of them at once
would interleave records (every case twice) or lose a session from the manifest. Each takes
:func:`run_lock` first. The lock is an advisory ``flock`` on ``RUN/.kvaudit.lock``: the kernel
releases it when its process ends, however it ends, so a killed run never leaves a stale lock.
Readers (``gate``, ``plan``, ``compare``, ``export``) take no lock: every file they read is
replaced atomically or appended whole lines at a time.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from kvaudit.core.errors import KvauditError
from kvaudit.core.run_format import LOCK_FILE, WRITTEN_FILES

_HELD: set[str] = set()  # run directories whose lock this process holds


def check_run_files(run_dir: Path) -> None:
    """Refuse a run directory whose files are symbolic links or not regular files."""
    for name in WRITTEN_FILES:
        path = run_dir / name
        if path.is_symlink():
            raise KvauditError(f"{path}: is a symbolic link; kvaudit writes only regular files inside the "
                               "run directory (copy the target in, or use a new directory)")
        if path.exists() and not path.is_file():
            raise KvauditError(f"{path}: is not a regular file")


@contextlib.contextmanager
def run_lock(run_dir: str | os.PathLike, command: str, *, create: bool = False) -> Iterator[None]:
    """Hold ``run_dir``'s writer lock for the ``with`` body, or fail at once naming the holder.
    ``create``: make the directory if it is missing (``kvaudit run``); else a missing one is an error."""
    d = Path(run_dir)
    if d.exists() and not d.is_dir():
        raise KvauditError(f"{d}: is a file, not a run directory")
    if not d.exists() and not create:
        raise KvauditError(f"{d}: run directory not found")
    d.mkdir(parents=True, exist_ok=True)
    key = str(d.resolve())
    if key in _HELD:  # this process holds it already (``kvaudit run`` locks before loading the model)
        check_run_files(d)
        yield
        return
    path = d / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
            raise KvauditError(f"{d}: another kvaudit process is writing this run directory ({holder}); "
                               "wait for it to finish, or use another directory") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"kvaudit {command}, pid {os.getpid()}\n".encode(), 0)
        check_run_files(d)
        _HELD.add(key)
        try:
            yield
        finally:
            _HELD.discard(key)
    finally:
        os.close(fd)  # closing the descriptor releases the lock
