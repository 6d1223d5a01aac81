"""A study directory written by hand (study.json, units.jsonl, responses.jsonl), for the study report's tests."""

from __future__ import annotations

import json
from pathlib import Path

from fae.study.interfaces import INVALID

S, R = "SUPPORT", "REFUTE"


def write_study(path: Path, *, dataset="fever", model="m", seeds=(1103, 2207), pools="p1", drop=0) -> Path:
    """A complete study directory of 12 one-claim units whose answers follow a fixed rule."""
    path.mkdir(parents=True)
    budgets, formats = [256, 2048], ["codes", "labels"]
    cfg = {"dataset": dataset, "model": model, "pools_sha256": pools, "seeds": list(seeds), "budgets": budgets,
           "formats": formats, "sources": [0, 1], "missed_relevant": {}, "notes": []}
    (path / "study.json").write_text(json.dumps(cfg))
    units = [{"id": f"u{i}", "claim_id": f"c{i}", "gold_label": S if i % 2 else R, "groups": [[0]],
              "submitted": {"256": [[0] if i % 3 else [1], [0]], "2048": [[0], [0]]}} for i in range(12)]
    (path / "units.jsonl").write_text("".join(json.dumps(u) + "\n" for u in units))
    lines = [dict(row, answer=u["gold_label"] if (int(u["id"][1:]) + row["replicate"] + row["source"]) % 4
                  else INVALID) for u, row in _primary_rows(units, budgets, formats, seeds)][drop:]
    (path / "responses.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def _primary_rows(units, budgets, formats, seeds):
    """(unit, the response row's keys) for every primary condition of every unit, in `fae study`'s order."""
    for u in units:
        for s in (0, 1):
            for b in budgets:
                for f in formats:
                    for r in range(len(seeds) + 1):
                        yield u, {"unit": u["id"], "kind": "primary", "source": s, "budget": b, "format": f,
                                  "replicate": r, "control": None, "variant": None}


def write_grid(path: Path, units: list[dict], raw, *, dataset="fever", model="m", seeds=(1103, 2207),
               budgets=(256, 2048), formats=("codes", "labels"), missed=None, shown=None, finish=None,
               max_new_tokens=None) -> Path:
    """A study directory of the given units whose raw response texts are ``raw(unit id, source, budget, format,
    replicate)``; each saved answer is the strict reading of its text, as `fae study` saves it. ``shown(unit,
    source, budget)``: the evidence ids each line says the model saw (with the unit's submitted ids, as `fae
    study` writes both); ``finish(unit id, source, budget, format, replicate)``: each line's finish reason;
    ``max_new_tokens``: study.json's generation limit."""
    from fae.study.interfaces import answer_format

    path.mkdir(parents=True)
    cfg = {"dataset": dataset, "model": model, "pools_sha256": "p1", "seeds": list(seeds), "budgets": list(budgets),
           "formats": list(formats), "sources": [0, 1], "missed_relevant": missed or {}, "notes": []}
    if max_new_tokens is not None:
        cfg["max_new_tokens"] = max_new_tokens
    (path / "study.json").write_text(json.dumps(cfg))
    (path / "units.jsonl").write_text("".join(json.dumps(u) + "\n" for u in units))
    lines = []
    for u, row in _primary_rows(units, budgets, formats, seeds):
        key = (u["id"], row["source"], row["budget"], row["format"], row["replicate"])
        text = raw(*key)
        if shown is not None:
            row = dict(row, shown=shown(u, row["source"], row["budget"]),
                       submitted=u["submitted"][str(row["budget"])][row["source"]])
        if finish is not None:
            row = dict(row, finish_reason=finish(*key))
        lines.append(dict(row, response=text, answer=answer_format(row["format"]).parse(text, dataset)))
    (path / "responses.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path
