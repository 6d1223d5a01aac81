"""A run's fingerprint: the settings and inputs that make its answers its answers.

A command that appends answers to a directory and resumes there (``fae run``, its shards and ``fae merge``,
``fae pave``, ``fae study``, an Inspect log read as a run) records its fingerprint in a JSON file beside the
answers (``config.json``, ``study.json``) and, on the next start in that directory, checks it against the
fingerprint of the new command: resuming under other settings would mix the answers of two runs in one file.
:class:`RunFingerprint` is that write and that check, once:

- ``keys``: the record's keys that change the answers (every other key, such as the command line itself or
  the package versions, is recorded but never compared);
- :meth:`RunFingerprint.write`: the record, written atomically (:mod:`real_fae_core.atomicio`);
- :meth:`RunFingerprint.check`: the stored record, after comparing its keys with the new record's; every
  difference is named in one line, worded by the command (its refusal), and nothing is written;
- :data:`COMPATIBILITY_DEFAULTS`: for each command, the value a key had in the runs made by an older version
  that did not record it. A run made before an option existed behaved as the option's old behaviour, so it
  resumes under that behaviour only, and readers of old runs (reports, comparisons) read the same value.

The files keep their keys: a run written by any earlier version reads, resumes and reports as before.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from real_fae_core.atomicio import atomic_write_json
from real_fae_core.errors import UserError

# For each command, the value of a fingerprint key in the runs an older version made without recording it.
# Every entry is a compatibility default: it says what such a run did, so it resumes only under the same
# behaviour and its readers see that behaviour; a key recorded since the command's first version has none.
COMPATIBILITY_DEFAULTS: dict[str, dict[str, Any]] = {
    "fae run": {
        # The arms came one by one: the control arm, the gold-only pools and --line-ids first, the cited-only
        # pools and the size sweep later. A run made before an arm existed did not ask it (its reports say
        # "n/a" for it) and numbered lines by their record ids.
        "control": "none",
        "control_seed": None,
        "gold_only": False,
        "cited_only": False,
        "size_sweep": False,
        "sweep_seed": None,
        "line_ids": "original",
        # Runs made before --constrained-decoding existed decoded without a schema.
        "constrained_decoding": False,
    },
    "fae pave": {
        # Samples made before --line-ids existed showed the record ids.
        "line_ids": "original",
        # Made before the flags existed: off (no schema, one prefill per sample).
        "constrained_decoding": False,
        "prefill_once": False,
    },
    # study.json has recorded every key of its fingerprint since the first `fae study`.
    "fae study": {},
}


@dataclasses.dataclass(frozen=True)
class Difference:
    """One fingerprint key whose stored value is not the new one. ``recorded``: the stored record holds the key
    (or a compatibility default gives it)."""

    key: str
    old: Any
    new: Any
    recorded: bool = True

    def __str__(self) -> str:
        return f"{self.key}: {self.old!r} -> {self.new!r}"


# (the stored record, the new record) -> True where the new record extends the stored one (a claim set that
# only grows keeps every finished answer valid)
Extends = Callable[[Mapping[str, Any], Mapping[str, Any]], bool]


@dataclasses.dataclass(frozen=True)
class RunFingerprint:
    """The fingerprint of one command's runs: the keys compared and the file they are stored in. Two tests may
    let a key differ: ``equal`` (key -> test on the two records) where another key decides for it (an adapter's
    path, where its content hash is compared), ``extends`` (a resume only, never two shards of one run) where
    the new record extends the stored one."""

    command: str
    keys: tuple[str, ...]
    file: str = "config.json"
    equal: Mapping[str, Extends] = dataclasses.field(default_factory=dict)
    extends: Mapping[str, Extends] = dataclasses.field(default_factory=dict)

    @property
    def defaults(self) -> dict[str, Any]:
        """This command's compatibility defaults (:data:`COMPATIBILITY_DEFAULTS`)."""
        return COMPATIBILITY_DEFAULTS.get(self.command, {})

    def upgraded(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """``record`` with the compatibility default of every key it lacks (a record of an older version read
        as today's); the keys it holds are kept as they are."""
        return {**{k: v for k, v in self.defaults.items() if k not in record}, **record}

    def of(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """The fingerprint of ``record``: its value of each key (compatibility defaults filled, None if absent)."""
        up = self.upgraded(record)
        return {k: up.get(k) for k in self.keys}

    def differences(self, old: Mapping[str, Any], new: Mapping[str, Any], *,
                    resume: bool = True) -> list[Difference]:
        """The keys whose values differ between the stored record ``old`` and the new one, in key order;
        ``resume`` False (two shards of one run): every key exactly, none may extend the other."""
        old_up, new_up = self.upgraded(old), self.upgraded(new)
        out = []
        for k in self.keys:
            if old_up.get(k) == new_up.get(k) or (k in self.equal and self.equal[k](old_up, new_up)):
                continue
            if resume and k in self.extends and self.extends[k](old_up, new_up):
                continue
            out.append(Difference(k, old_up.get(k), new_up.get(k), k in old_up))
        return out

    def path(self, directory: str | os.PathLike) -> Path:
        """Where the fingerprint of a run in ``directory`` lives: ``directory``/``file`` (it may not exist yet)."""
        return Path(directory) / self.file

    def write(self, directory: str | os.PathLike, record: Mapping[str, Any]) -> None:
        """``record`` as ``directory``/``file``, atomically (a kill leaves the old file or the new one)."""
        atomic_write_json(self.path(directory), dict(record), ensure_ascii=False)

    def read(self, directory: str | os.PathLike, *, advice: str = "use a fresh --output") -> dict | None:
        """The stored record (None where the file is missing); a file that is not a JSON mapping is one line
        ending in ``advice``."""
        path = self.path(directory)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except UnicodeDecodeError as exc:
            raise UserError(f"{path}: not valid JSON ({exc}); {advice}") from None
        try:
            old = json.loads(text)
        except ValueError as exc:
            raise UserError(f"{path}: not valid JSON ({exc}); {advice}") from None
        if not isinstance(old, dict):
            raise UserError(f"{path}: not a mapping of settings; {advice}")
        return old

    def check(self, directory: str | os.PathLike, new: Mapping[str, Any],
              refusal: Callable[[Sequence[Difference]], str], *, advice: str = "use a fresh --output",
              stored: Mapping[str, Any] | None = None) -> dict | None:
        """The stored record of ``directory`` (compatibility defaults filled), after checking that its
        fingerprint is the one of ``new``; None where nothing is stored. Any difference is a UserError:
        ``refusal(differences)``, the command's one line naming them. ``stored``: the record already read."""
        old = stored if stored is not None else self.read(directory, advice=advice)
        if old is None:
            return None
        diffs = self.differences(old, new)
        if diffs:
            raise UserError(refusal(diffs))
        return self.upgraded(old)
