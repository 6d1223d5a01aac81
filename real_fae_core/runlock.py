"""One writer per output: an exclusive, self-describing lock on a run directory or file.

Two processes writing the same run directory interleave answers of two
different runs and both exit 0. Every command that writes a run or output
directory (``fae run``, ``fae pave``, ``fae probe``, ``fae neurons``,
``real-data enhance`` and its cache, ``real-train``, ``real-demo`` and its
``build-base``) holds a :class:`RunLock`
for its whole lifetime; a second writer stops at once with one line naming the
holder (command, pid, host, start time).

The lock is ``fcntl.flock`` on a small file (``<dir>/.lock`` for a directory,
``<file>.lock`` beside a file). The kernel releases it when the holder dies,
however it dies, so the lock of a dead process is simply taken over by the
next writer: no stale-lock heuristics. The file itself stays (it only carries
the last holder's description) and is harmless. ``flock`` needs a local or
lock-aware file system; on NFS mounts without lock support it degrades to no
lock (documented in docs/runs.md).
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import time
from pathlib import Path

from real_fae_core.errors import UserError

try:  # POSIX only; elsewhere the lock degrades to a no-op
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".lock"


def lock_path_for(target: str | os.PathLike, *, is_dir: bool | None = None) -> Path:
    """``<dir>/.lock`` for a directory, ``<file>.lock`` beside a file."""
    target = Path(target)
    if is_dir is None:
        is_dir = target.is_dir()
    return target / LOCK_NAME if is_dir else target.with_name(target.name + ".lock")


def describe_holder(path: str | os.PathLike) -> str:
    """'command (pid N on host H, since T)' from a lock file, or a fallback."""
    try:
        info = json.loads(Path(path).read_text(encoding="utf-8"))
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(info["started"])))
        return f"{info.get('command', 'another process')} (pid {info['pid']} on host {info['host']}, since {started})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process (holder unknown)"


class RunLock:
    """Exclusive lock on ``target`` (a directory or a file) for this process.

    ``RunLock(run_dir, "fae run").acquire()`` or ``with RunLock(...):``.
    Raises :class:`UserError` naming the holder when another live process has it.
    ``enabled=False`` makes it a no-op (non-main ranks of a distributed run,
    whose main rank holds the lock).
    """

    def __init__(self, target: str | os.PathLike, command: str, *, is_dir: bool | None = None,
                 enabled: bool = True):
        self.target = Path(target)
        self.command = command
        self.path = lock_path_for(self.target, is_dir=is_dir)
        self.enabled = enabled and fcntl is not None
        self._fd: int | None = None

    def acquire(self) -> "RunLock":
        """Take the lock (itself, for chaining); a lock already held or disabled is a no-op.
        Raises :class:`UserError` naming the holder when another process has it; a file system without locks
        runs unlocked, with a warning."""
        if not self.enabled or self._fd is not None:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise UserError(
                    f"{self.target} is in use by {describe_holder(self.path)}; wait for it to finish, "
                    "or write to another output"
                ) from None
            if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP):  # file system without locks
                print(f"warning: {self.path}: file system does not support locks; running unlocked",
                      file=sys.stderr)
                return self
            raise
        info = {"command": self.command, "pid": os.getpid(), "host": socket.gethostname(),
                "started": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode("utf-8"), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Let the next writer in (a no-op when not held); the lock file stays, describing the last holder."""
        if self._fd is None:
            return
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            os.close(self._fd)
            self._fd = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock now (False when disabled or on a file system without locks)."""
        return self._fd is not None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
