"""`real-data families --records FILE --output FAMILIES.jsonl`: claim families for `fae compare --families`.

A paired bootstrap that resamples related claims independently understates
the uncertainty, so the score-accounting paper resamples *families* (SPEC §10):
records joined by a normalized exact match, a numeric or negation mutation, a
shared cited document or a flagged near duplicate among the claim's top-50
BM25 neighbours, and, always, the units of one claim (records ``<claim>:<doc>``
or with a ``claim_id`` field: SciFact's abstracts of one claim). The rules are
in :mod:`data_prep.retrieval.families`; each can be switched off here to see
what it contributes.

Records of `real-data retrieve` come with a misses file (``misses.jsonl``
beside them, or ``--misses``): its pools (SUPPORT/REFUTE pools without a
complete gold group) are not valid records, yet `fae study` asks them as units
like the records, so they get families too, by the same rules. Without them a
claim's missed pool would be a family of its own apart from its twins, and a
bootstrap over a study would resample it independently of them.

Writes ``FAMILIES.jsonl``, one ``{"id": record id, "family": family id}`` line
per record in record-id order (the family id is its smallest record id), the
form ``fae compare --families`` reads whatever the ids are, and beside it
``FAMILIES.jsonl.summary.json``: the number of families, their size
distribution, and per kind of link the record pairs it links and the merges it
made. Both files appear only when complete; rerunning on the same records, in
any line order, writes the same bytes. Records of `real-data retrieve` without their misses
file are refused (one line), as `fae study` refuses pools without it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

from real_fae_core.atomicio import atomic_open
from real_fae_core.command import CommandConfig, CommandResult, option
from real_fae_core.errors import UserError
from real_fae_core.outputs import claim_file
from real_fae_core.jsonl import RecordError, iter_jsonl_lines
from data_prep.records import ClaimRecord, load_records_or_fail
from real_fae_core.labels import NOT_ENOUGH_INFO
from data_prep.retrieval.families import (
    EDGE_KINDS,
    SHARED_DOCS,
    FamilyOptions,
    MAX_NEIGHBOURS,
    FamilyResult,
    build_families,
    size_distribution,
)


@dataclasses.dataclass
class FamiliesConfig(CommandConfig):
    """`real-data families`: the family of every record, for resampling whole families."""

    records: str = option(help="claim records JSONL (from real-data convert or retrieve)")
    output: str = option(help="families JSONL to write ({\"id\", \"family\"} lines; a summary beside it as "
                              "OUTPUT.summary.json)")
    misses: str | None = option(None, help="misses file of `real-data retrieve`, whose pools `fae study` asks "
                                           "too (default: misses.jsonl beside --records when the records are "
                                           "retrieve's)")
    no_exact: bool = option(False, help="do not join normalized exact matches")
    no_numeric: bool = option(False, help="do not join claims that differ only in numbers")
    no_negation: bool = option(False, help="do not join claims that differ only in negation words (not, no, never, "
                                           "n't, without...)")
    # Checked in run(), not by argparse `choices`: a wrong value is then one line, for a Python caller too.
    shared_docs: str = option("cited", metavar="{" + ",".join(SHARED_DOCS) + "}",  # a name in SHARED_DOCS
                              help="join records citing a common document: cited (a cited_docs field, else the "
                                   "pool's docs), gold (the docs of gold evidence sentences) or off (default cited)")
    no_near_duplicates: bool = option(False, help="do not join near duplicates among each claim's BM25 neighbours")
    neighbours: int = option(50, min=1, max=MAX_NEIGHBOURS,
                             help=f"BM25 neighbours of each claim checked for near duplicates, 1 to {MAX_NEIGHBOURS} "
                                  "(default 50)")
    jaccard: float = option(0.7, min=0.0, max=1.0, help="a neighbour is a near duplicate when the token-set Jaccard "
                                                        "similarity is at least this, in [0, 1] (default 0.7)")
    unit_separator: str = option(":", help="record ids CLAIM<SEP>DOC are units of claim CLAIM and always share a "
                                           "family (a claim_id field takes precedence; '' turns the rule off; "
                                           "default ':')")

def check_config(config: FamiliesConfig) -> FamilyOptions:
    """The options of the rules, after the checks that need no records."""
    if config.shared_docs not in SHARED_DOCS:
        raise UserError(f"--shared-docs {config.shared_docs!r}: unknown; choose from {', '.join(SHARED_DOCS)}")
    if math.isnan(config.jaccard):
        raise UserError("--jaccard: must be a number in [0, 1], got nan")
    if os.path.abspath(config.output) == os.path.abspath(config.records):
        raise UserError(f"--output {config.output!r} is the records file; give another path")
    if Path(config.output).is_dir():
        raise UserError(f"--output {config.output!r} is a directory; give a file path")
    claim_file(config.output, "real-data families", inputs=[config.records, config.misses])
    return FamilyOptions(exact=not config.no_exact, numeric=not config.no_numeric, negation=not config.no_negation,
                         shared_docs=config.shared_docs, near_duplicates=not config.no_near_duplicates,
                         neighbours=config.neighbours, jaccard=config.jaccard,
                         unit_separator=config.unit_separator)


def link_field_problem(record: ClaimRecord) -> tuple[str, str] | None:
    """``(field, reason)`` when an optional field the rules read has the wrong type."""
    claim_id = record.extra.get("claim_id")
    if "claim_id" in record.extra and not (isinstance(claim_id, str) and claim_id):
        return "claim_id", f"must be a non-empty string, got {json.dumps(claim_id)[:60]}"
    cited = record.extra.get("cited_docs")
    if "cited_docs" in record.extra and not (isinstance(cited, list) and all(isinstance(d, str) for d in cited)):
        return "cited_docs", f"must be a list of document ids (strings), got {json.dumps(cited)[:60]}"
    retrieval = record.extra.get("retrieval")
    missed = retrieval.get("gold_missed", []) if isinstance(retrieval, dict) else []
    if not (isinstance(missed, list) and all(isinstance(g, list) and all(
            isinstance(i, list) and i and isinstance(i[0], str) for i in g) for g in missed)):
        return "retrieval.gold_missed", "must be a list of gold groups of [doc, sentence index]"
    return None


def line_of(path: str, record_id: str) -> int | None:
    """The line of ``record_id`` in an already validated records file."""
    for lineno, obj in iter_jsonl_lines(path):
        if isinstance(obj, dict) and str(obj.get("id")) == record_id:
            return lineno
    return None


def load(path: str) -> list[ClaimRecord]:
    """The records, or one error naming the file, the line and the field."""
    records = load_records_or_fail(path)
    if not records:
        raise UserError(f"{path}: no records, so there are no families")
    for rec in records:
        problem = link_field_problem(rec)
        if problem:
            raise RecordError(problem[1], field=problem[0], path=path, line=line_of(path, rec.id), record_id=rec.id)
    return records


def misses_path(config: FamiliesConfig, records: list[ClaimRecord]) -> str | None:
    """The misses file to read: ``--misses``, else ``misses.jsonl`` beside records of `real-data retrieve`
    (None for other records). Retrieve's records without it are refused: their missed pools, which the study
    asks, would each fall outside every family."""
    if config.misses:
        if not Path(config.misses).is_file():
            raise UserError(f"--misses {config.misses}: file not found")
        return config.misses
    if not any(isinstance(r.extra.get("retrieval"), dict) for r in records):
        return None
    beside = Path(config.records).parent / "misses.jsonl"
    if not beside.is_file():
        raise UserError(f"--records {config.records}: records of `real-data retrieve` without misses.jsonl beside "
                        "them: the missed pools `fae study` asks would have no family; give --misses FILE")
    return str(beside)


def load_missed_pools(path: str, known: set[str]) -> list[ClaimRecord]:
    """The pools of a misses file as records (bad input: one line naming file, line and field).

    A missed pool is a SUPPORT/REFUTE pool without a complete gold group, so it is no valid record as it stands;
    the rules read neither its label nor (it has none) its evidence, only its id, claim, ``claim_id``,
    ``cited_docs`` and ``retrieval.gold_missed``, so it is read with the label NOT_ENOUGH_INFO."""
    out: list[ClaimRecord] = []
    for lineno, obj in iter_jsonl_lines(path):
        if isinstance(obj, RecordError):
            raise obj.located(path, lineno)
        pools = obj.get("pools", []) if isinstance(obj, dict) else None
        if not isinstance(pools, list):
            raise RecordError("must be a list of pools", field="pools", path=path, line=lineno)
        for pool in pools:
            try:
                rec = ClaimRecord.from_dict({**pool, "label": NOT_ENOUGH_INFO} if isinstance(pool, dict)
                                            and not pool.get("evidence") else pool)
            except RecordError as exc:
                raise exc.located(path, lineno) from None
            problem = link_field_problem(rec)
            if problem:
                raise RecordError(problem[1], field=problem[0], path=path, line=lineno, record_id=rec.id)
            if rec.id in known:
                raise RecordError(f"duplicate id {rec.id!r} (a record or another missed pool has it)", field="id",
                                  path=path, line=lineno, record_id=rec.id)
            known.add(rec.id)
            out.append(rec)
    return out


def summary_of(result: FamilyResult, config: FamiliesConfig, options: FamilyOptions,
               misses: str | None = None, n_missed: int = 0) -> dict:
    """The families' .summary.json: inputs, family count and sizes, the options, merges per kind of link and
    the near-duplicate pairs found."""
    sizes = size_distribution(result.families)
    return {
        "records_file": os.path.abspath(config.records),
        "misses_file": os.path.abspath(misses) if misses else None,
        "n_missed_pools": n_missed,
        "n_records": len(result.families),
        "n_families": len(set(result.families.values())),
        "largest_family": max(int(s) for s in sizes),
        "family_sizes": sizes,
        "options": dataclasses.asdict(options),
        "links": {kind: {"pairs": result.pairs[kind], "merges": result.merges[kind]}
                  for kind in EDGE_KINDS if kind in result.pairs},
        "near_duplicates": [{"a": a, "b": b, "jaccard": sim} for a, b, sim in result.near_duplicates],
    }


def write(output: str, families: dict[str, str], summary: dict) -> None:
    """Both files under their final names only when both are complete."""
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(output) as fam, atomic_open(output + ".summary.json") as summ:
        for rid in sorted(families):
            fam.write(json.dumps({"id": rid, "family": families[rid]}, ensure_ascii=False) + "\n")
        summ.write(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")


def run(config: FamiliesConfig) -> CommandResult:
    """`real-data families` as a function: the claim-to-family file and its .summary.json (``summary``)."""
    options = check_config(config)
    records = load(config.records)
    misses = misses_path(config, records)
    missed = load_missed_pools(misses, {r.id for r in records}) if misses else []
    result = build_families(records + missed, options)
    summary = summary_of(result, config, options, misses, len(missed))
    write(config.output, result.families, summary)
    links = ", ".join(f"{k} {v['merges']}" for k, v in summary["links"].items())
    pools = f" (with {len(missed)} missed pools)" if misses else ""
    print(f"{config.output}: {summary['n_records']} records{pools} in {summary['n_families']} families "
          f"(largest {summary['largest_family']}); merges by link: {links}")
    print(f"  summary: {config.output}.summary.json")
    return CommandResult(outputs={"families": config.output, "summary": config.output + ".summary.json"},
                         summary=summary)
