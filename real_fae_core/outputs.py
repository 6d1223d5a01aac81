"""The one guard every command runs on what it writes (docs/errors.md, "Outputs").

A command names its output, its inputs and whether ``--overwrite`` was given;
:func:`claim_dir` (a folder) or :func:`claim_file` (a file) refuses, with one
:class:`~real_fae_core.errors.UserError` line (exit 2) and before anything is
read or written:

* an output that is the current directory or a parent of it (``--output .``);
* an output equal to an input, inside an input folder, or containing an input
  (``--output`` a parent of ``--corpus``): replacing it would delete the input;
* a non-empty folder the command did not write: no marker file ``.real-fae-output``
  naming the command (see :data:`MARKER`) and not recognised as the output of an
  earlier version (``legacy``); ``--overwrite`` does not change that;
* with ``--overwrite``, an earlier output of the command that now also holds files
  the command did not write (``notes.txt``): they are named, nothing is deleted;
* without ``--overwrite``, an earlier output that a replacing command would replace.

A folder the guard accepts is marked (:meth:`Output.mark`) when the command
writes it, with the command's name and the files it wrote, so a later run
(and ``--overwrite``) knows exactly what it may replace.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

from real_fae_core.atomicio import atomic_write_json
from real_fae_core.errors import UserError

MARKER = ".real-fae-output"
# Entries that do not make a folder "non-empty": the marker, a run lock, our temporaries.
_LOCK = ".lock"

Legacy = Callable[[Path, Sequence[str]], bool]
# Folders an outer command claimed (real-demo) and whose own stages write into them (fae report, probe-report).
_DELEGATED: set[Path] = set()


def _resolved(path: str | os.PathLike) -> Path:
    return Path(os.path.expanduser(os.fspath(path))).resolve()


def _ours(name: str) -> bool:
    """The marker, a lock file, or a temporary of :mod:`real_fae_core.atomicio` (``.NAME.PID.*.tmp``)."""
    return name in (MARKER, _LOCK) or (name.startswith(".") and name.endswith((".tmp", ".old"))
                                       and name.count(".") >= 3)


def entries(folder: str | os.PathLike) -> list[str]:
    """The names in ``folder`` that count (not the marker, a lock or a temporary), sorted; none if it is missing."""
    try:
        return sorted(n for n in os.listdir(folder) if not _ours(n))
    except (FileNotFoundError, NotADirectoryError):
        return []


def read_marker(folder: str | os.PathLike) -> dict | None:
    """The marker of ``folder`` (``{"command": ..., "files": [...]}``), or None when it has none."""
    path = Path(folder) / MARKER
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {"command": None, "files": []}
    if not isinstance(data, dict):
        return {"command": None, "files": []}
    files = data.get("files")
    return {"command": data.get("command"), "files": [str(f) for f in files] if isinstance(files, list) else []}


def only_names(*names: str, needs: Iterable[str] = ()) -> Legacy:
    """A ``legacy`` test: every entry is one of ``names`` (files an earlier version wrote), and ``needs`` are there."""
    allowed, required = set(names), set(needs)

    def test(_folder: Path, found: Sequence[str]) -> bool:
        return bool(found) and set(found) <= allowed and required <= set(found)

    return test


def any_of(*names: str) -> Legacy:
    """A ``legacy`` test: at least one of ``names`` is in the folder (a run directory that can resume)."""
    def test(_folder: Path, found: Sequence[str]) -> bool:
        return any(n in found for n in names)

    return test


_MODEL_FILES = ("config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json", "*.bin",
                "*.bin.index.json", "tokenizer*", "special_tokens_map.json", "added_tokens.json", "vocab.*",
                "merges.txt", "chat_template.*", "README.md", "import_info.json")


def model_folder(extra: Iterable[str] = ()) -> Legacy:
    """A ``legacy`` test for a saved model (``save_pretrained``): ``config.json`` and model, tokenizer and
    card files only (``extra``: more names the command writes)."""
    patterns = (*_MODEL_FILES, *extra)

    def test(_folder: Path, found: Sequence[str]) -> bool:
        return "config.json" in found and all(any(fnmatch.fnmatch(n, p) for p in patterns) for n in found)

    return test


def delegate(folder: str | os.PathLike) -> None:
    """Let the commands an outer command runs write their files into ``folder`` itself, which the outer command
    already claimed (``real-demo``: its ``fae report`` goes beside the runs it reads); they leave no marker there."""
    _DELEGATED.add(_resolved(folder))


def _flat(inputs) -> Iterator:
    """The paths of ``inputs``, a list option's values (``--families A B``) among them one by one."""
    for given in inputs:
        if isinstance(given, (list, tuple)):
            yield from _flat(given)
        else:
            yield given


def check_inputs(output: str | os.PathLike, inputs: Iterable[str | os.PathLike | None], *,
                 flag: str = "--output", allow_inside: bool = False) -> None:
    """Refuse an output that is the current directory or one of its parents, equal to an input, containing
    an input, or (unless ``allow_inside``) inside an input folder."""
    out = _resolved(output)
    cwd = _resolved(os.curdir)
    if out == cwd or out in cwd.parents:
        what = "the current directory" if out == cwd else "a parent of the current directory"
        raise UserError(f"{flag} {output}: is {what}; give a new folder for the output")
    for given in _flat(inputs):
        if given is None or given == "":
            continue
        src = _resolved(given)
        if out == src:
            raise UserError(f"{flag} {output}: is the input {given}; give another path")
        if out in src.parents:
            raise UserError(f"{flag} {output}: contains the input {given}; give a path that holds no input")
        if src in out.parents and not allow_inside:
            raise UserError(f"{flag} {output}: is inside the input {given}; give a path outside it")


@dataclasses.dataclass
class Output:
    """An output the guard accepted: where, for which command, and what was there before."""

    path: Path
    command: str
    earlier: bool = False  # an earlier output of the command is there (marked, or an earlier version's)
    files: tuple[str, ...] = ()  # what the marker says the command wrote (empty for an earlier version's)
    delegated: bool = False  # a folder an outer command claimed (:func:`delegate`): no marker of ours

    def mark(self, folder: str | os.PathLike | None = None, files: Iterable[str] | None = None) -> None:
        """Write the marker into ``folder`` (default the output; a temporary folder that becomes it): the
        command and the files it wrote (default every entry there now, plus those marked before)."""
        folder = Path(self.path if folder is None else folder)
        folder.mkdir(parents=True, exist_ok=True)
        if self.delegated:
            return
        names = set(entries(folder) if files is None else files)
        if folder == self.path:
            names |= set(self.files)
        self.files = tuple(sorted(names))
        atomic_write_json(folder / MARKER, {"command": self.command, "files": list(self.files)})


def claim_dir(output: str | os.PathLike, command: str, *, inputs: Iterable[str | os.PathLike | None] = (),
              overwrite: bool | None = None, legacy: Legacy | None = None, flag: str = "--output",
              allow_inside: bool = False) -> Output:
    """Check an output folder before anything is read or written (module docstring).

    ``overwrite`` None: the command writes its files into the folder and rewrites them on the next run (or
    resumes); True/False: the command replaces the whole folder, and an earlier output is replaced only
    with ``--overwrite``. ``legacy(folder, entries)`` says whether an unmarked folder is this command's
    output from before the marker existed.
    """
    path = Path(output)
    if _resolved(path) in _DELEGATED and overwrite is None:
        return Output(path=path, command=command, earlier=True, delegated=True)
    check_inputs(output, inputs, flag=flag, allow_inside=allow_inside)
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag} {output}: is a file; give a folder")
    found = entries(path)
    marker = read_marker(path) if path.is_dir() else None
    if marker is not None and marker["command"] != command:
        if not found:  # another command's marker on an empty folder (it stopped before writing): free
            marker = None
        else:
            other = marker["command"] or "an unknown command"
            raise UserError(f"{flag} {output}: is an output of {other}, not of {command}; "
                            f"give a new or empty folder")
    earlier = marker is not None or (bool(found) and legacy is not None and legacy(path, found))
    if found and not earlier:
        raise UserError(f"{flag} {output}: is a non-empty folder that {command} did not write (no {MARKER}); "
                        f"give a new or empty folder (nothing was deleted)")
    if overwrite is not None and found:
        if not overwrite:
            raise UserError(f"{flag} {output}: is not empty (pass --overwrite to replace it; it holds an earlier "
                            f"output of {command})")
        if marker is not None:
            foreign = [n for n in found if n not in marker["files"]]
            if foreign:
                shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
                raise UserError(f"{flag} {output}: --overwrite would delete files {command} did not write ({shown}); "
                                f"move them out or give another folder (nothing was deleted)")
    return Output(path=path, command=command, earlier=earlier, files=tuple(marker["files"] if marker else ()))


def claim_file(output: str | os.PathLike, command: str, *, inputs: Iterable[str | os.PathLike | None] = (),
               overwrite: bool | None = None, owned: Callable[[Path], bool] | None = None,
               flag: str = "--output") -> Output:
    """Check an output file: not a folder, not an input, not inside or containing one (module docstring).

    ``overwrite`` None: the command rewrites the file on every run; True/False: an existing file is replaced
    only with ``--overwrite``, and only when ``owned(path)`` says the command wrote it.
    """
    check_inputs(output, inputs, flag=flag)
    path = Path(output)
    if path.is_dir():
        raise UserError(f"{flag} {output}: is a folder; give the file to write")
    earlier = path.exists()
    if overwrite is not None and earlier:
        if owned is not None and not owned(path):
            raise UserError(f"{flag} {output}: is a file {command} did not write; give another path "
                            f"(nothing was deleted)")
        if not overwrite:
            raise UserError(f"{flag} {output}: exists (pass --overwrite to replace it)")
    return Output(path=path, command=command, earlier=earlier)
