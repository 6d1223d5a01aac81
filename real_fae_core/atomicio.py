"""Atomic writes: a file or directory appears under its final name only when complete.

Everything is written to a temporary name in the same directory (same file
system, so the final ``os.replace`` is atomic) and the temporary is removed
when writing fails: a full or read-only disk, Ctrl-C, a bug. Nothing partial
that looks complete is ever left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO, Any, Iterator


def _temp_name(path: Path) -> str:
    return f".{path.name}.{os.getpid()}."


def _naming(exc: OSError, path: Path) -> OSError:
    """The same OS error, naming the path the user asked for rather than our temporary."""
    try:
        return type(exc)(exc.errno, exc.strerror or str(exc), str(path))
    except TypeError:  # an OSError subclass with another signature
        return exc


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _default_mode(path: str | os.PathLike, is_dir: bool) -> None:
    """Give a temporary the mode a plain ``open``/``mkdir`` would have (mkstemp uses 0600)."""
    os.chmod(path, (0o777 if is_dir else 0o666) & ~_umask())


@contextlib.contextmanager
def _renamed_into_place(path: Path, suffix: str) -> Iterator[Path]:
    """A temporary file beside ``path`` (``.NAME.PID.*SUFFIX``), renamed to ``path`` when the body succeeds."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=_temp_name(path), suffix=suffix)
    except OSError as exc:
        raise _naming(exc, path) from None
    try:
        os.close(fd)
        _default_mode(tmp, is_dir=False)
        yield Path(tmp)
        with open(tmp, "rb") as fh:  # durable before it gets the final name
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and (exc.filename is None or str(exc.filename) == tmp):
            raise _naming(exc, path) from None
        raise


def atomic_file(path: str | os.PathLike) -> contextlib.AbstractContextManager[Path]:
    """A temporary path beside ``path``, renamed to ``path`` once the body wrote it.

    For writers that take a file name (``safetensors.save_file``,
    ``Figure.savefig``, ``torch.save``); the temporary ends in ``path``'s
    suffix (``.tmp.png``), so a writer that picks its format from the name
    picks the same one.
    """
    path = Path(path)
    return _renamed_into_place(path, ".tmp" + path.suffix)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """``open(path, mode)`` that renames a temporary file into place on success."""
    if "w" not in mode:
        raise ValueError("atomic_open writes whole files: mode must contain 'w'")
    with _renamed_into_place(Path(path), ".tmp") as tmp, \
            open(tmp, mode, encoding=None if "b" in mode else encoding) as fh:
        yield fh


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """``text`` as the whole of ``path`` (UTF-8), atomically: a kill or a full disk leaves the old file or none."""
    with atomic_open(path, "w") as fh:
        fh.write(text)


def atomic_write_json(path: str | os.PathLike, obj: Any, *, ensure_ascii: bool = True,
                      sort_keys: bool = False) -> None:
    """``obj`` as indented JSON (``json.dumps(obj, indent=2)``) plus a final newline."""
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=ensure_ascii, sort_keys=sort_keys) + "\n")


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, *, replace: bool = False) -> Iterator[Path]:
    """A temporary directory beside ``path``, renamed to ``path`` on success.

    ``path`` may already exist as an empty directory; with ``replace=True`` an
    existing non-empty one is swapped out only after the new one is complete.
    """
    path = Path(path)
    parent = path.parent
    parent.mkdir(parents=True, exist_ok=True)
    try:
        tmp = Path(tempfile.mkdtemp(dir=parent, prefix=_temp_name(path), suffix=".tmp"))
    except OSError as exc:
        raise _naming(exc, path) from None
    try:
        _default_mode(tmp, is_dir=True)
        yield tmp
        if path.is_dir() and any(path.iterdir()):
            if not replace:
                raise FileExistsError(17, "directory is not empty", str(path))
            old = Path(tempfile.mkdtemp(dir=parent, prefix=_temp_name(path), suffix=".old"))
            try:
                os.replace(path, old)
            except BaseException:
                with contextlib.suppress(OSError):
                    old.rmdir()
                raise
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            if path.is_dir():
                path.rmdir()
            os.replace(tmp, path)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError) and (exc.filename is None or str(exc.filename).startswith(str(tmp))):
            raise _naming(exc, path) from None
        raise
