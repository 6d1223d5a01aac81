"""The families file of `real-data families` read strictly: one ``{"id": str, "family": str}`` per line, or one
JSON object ``{id: family}``. `fae compare` (:func:`load_families`) and the study read it here.

Bad input is one line naming the file, the line and the field: an id or family that is not a non-empty string
(a list, a number), and an id given twice with two families (the same family twice is harmless and kept once).
A study's families must also cover it (:func:`check_covers`): every unit in a family, each claim in one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Sequence

from real_fae_core.errors import UserError
from real_fae_core.jsonl import RecordError, iter_jsonl_lines


def _text(value, where: str, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise UserError(f"{where}: field '{name}': must be a non-empty string, got {json.dumps(value)[:60]}")
    return value


def read_families(path: str | Path) -> dict[str, tuple[str, int]]:
    """id -> (family, line number); the JSON-object form has every id on line 1."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: families file not found")
    try:
        whole = json.loads(path.read_bytes(), object_pairs_hook=list)
    except (ValueError, RecursionError):
        whole = None
    out: dict[str, tuple[str, int]] = {}

    def add(fid, fam, line: int) -> None:
        where = f"{path}:{line}"
        fid, fam = _text(fid, where, "id"), _text(fam, where, "family")
        if fid in out and out[fid][0] != fam:
            raise UserError(f"{where}: field 'id': {fid!r} is given family {fam!r} here and {out[fid][0]!r} on "
                            f"line {out[fid][1]}: one family per id")
        out.setdefault(fid, (fam, line))

    if isinstance(whole, list) and all(isinstance(p, tuple) for p in whole) \
            and not {"id", "family"} & {k for k, _ in whole}:  # one JSON object {id: family}, else one JSONL line
        for k, v in whole:
            add(k, v, 1)
        return out
    for line_no, obj in iter_jsonl_lines(path):
        if isinstance(obj, RecordError):
            raise UserError(f"{path}:{line_no}: {obj.reason}; expected a JSON object "
                            "{id: family} or JSONL lines {\"id\": ..., \"family\": ...}")
        if not isinstance(obj, dict) or "id" not in obj or "family" not in obj:
            raise UserError(f"{path}:{line_no}: expected an object with 'id' and 'family' fields")
        add(obj["id"], obj["family"], line_no)
    return out


def check_known(path: str | Path, families: dict[str, tuple[str, int]], known: set[str], what: str) -> None:
    """Refuse the first id (in line order) that is not in ``known``: another dataset's or pools' file."""
    for fid, (_, line) in sorted(families.items(), key=lambda kv: kv[1][1]):
        if fid not in known:
            raise UserError(f"{path}:{line}: field 'id': {fid!r} is no unit of {what} (another dataset's or "
                            "another pools' families file?)")


def check_covers(families: dict[str, tuple[str, str, int]], units: Iterable[tuple[str, str, str]],
                 files: Sequence[str | Path]) -> None:
    """Refuse families that leave a unit out or split one claim's units (its pools) across families.

    ``families``: id -> (family, file, line), the files merged; ``units``: (unit id, claim id, where it is
    asked), every unit of the study. A unit no file names would be resampled on its own, apart from the twins
    and the other pools of its claim it is correlated with (a missed pool of `real-data retrieve` is one when
    the file was built from the records alone), and a claim split across families would be resampled in
    pieces: either narrows the intervals, so each is one line naming the file, the line and the unit."""
    first: dict[str, tuple[str, str]] = {}
    for uid, claim, where in units:
        if uid not in families:
            raise UserError(f"{', '.join(map(str, files))}: unit {uid!r} of {where} is in no family: a families "
                            "file must cover every pool the study asks (build it with `real-data families` over "
                            "the pools' records.jsonl, whose misses.jsonl it reads too)")
        fam, path, line = families[uid]
        other = first.setdefault(claim, (uid, fam))
        if other[1] != fam:
            o_fam, o_path, o_line = families[other[0]]
            raise UserError(f"{path}:{line}: field 'family': unit {uid!r} of claim {claim!r} is in family {fam!r}, "
                            f"its unit {other[0]!r} ({o_path}:{o_line}) in {o_fam!r}: a claim's pools are one "
                            "family")


def load_families(path: str | Path) -> dict[str, str]:
    """Family map from a JSON object ``{id: family}`` or JSONL ``{"id": ..., "family": ...}`` lines (strict:
    :func:`read_families`)."""
    return {fid: fam for fid, (fam, _) in read_families(path).items()}
