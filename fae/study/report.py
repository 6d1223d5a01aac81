"""`fae study-report`: the numbers of one or more `fae study` directories (SPEC §10), as JSON, markdown and a figure.

One panel per dataset x model: S_ab, E0 and E1 per condition, D_format and D_context with their
family x seed bootstrap intervals (Bonferroni over the primary family of every panel given), seed-sign
counts, the budget crossing in both orders, the product/covariance split at each budget, the E0 share of
identical valid answers, answer accuracy and invalid rate, the greedy controls; then the decision rule
over all panels. Then the secondary inference of the paper's §6 and appendices, each part marked as such:
the exploratory family (E1, E_avg, endpoints and source gain under both factors) and the post-hoc family
(crossed-budget components, the input-scoring interaction, the direct E1 - E0 changes), each at its own
Bonferroni level with its own draws, and each batch's own endpoints beside the pooled interval; the lenient
re-reading of every response as a sensitivity table, INVALID responses cut off at the generation limit and
claim-condition observations with an INVALID response; the eligibility profiles of each dataset's sources
on the submitted and on the shown evidence, and the post-hoc group where source 1 adds eligibility; the
per-claim partition by identical valid answers. The numbers are :mod:`fae.study.analysis`'s; this module
reads, checks and writes.
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from real_fae_core.atomicio import atomic_file, atomic_write_json, atomic_write_text
from real_fae_core.command import CommandConfig, CommandResult, option
from real_fae_core.errors import UserError
from real_fae_core.modelref import portable_name
from real_fae_core.outputs import claim_dir, only_names
from fae.comparison.families_file import check_covers, check_known, read_families
from fae.intervals import MAX_DRAWS
from fae.study import analysis
from fae.study.responses import STUDY, UNITS, finished_responses, read_responses
from fae.study.grid import control_conditions, key_of, primary_conditions
from fae.study.interfaces import INVALID, answer_format

REPORT_JSON, REPORT_MD, FIGURE = "study_report.json", "study_report.md", "contrasts.png"


@dataclasses.dataclass
class StudyReportConfig(CommandConfig):
    """`fae study-report`: scores, contrasts, intervals and controls of study directories."""

    studies: list[str] = option(positional=True, metavar="STUDY_DIR", help="`fae study` output directories (any "
                                "models, any datasets; one directory per dataset x model)")
    output: str = option(help="directory for study_report.json, study_report.md, contrasts.png")
    families: list[str] | None = option(None, metavar="FILE", help="family files of `real-data families` ({id, "
                                        "family} lines), together covering every studied unit, each claim in one "
                                        "family (without: each claim is its own)")
    draws: int = option(analysis.DRAWS, min=1, max=MAX_DRAWS,
                        help=f"bootstrap draws, 1 to {MAX_DRAWS} (default {analysis.DRAWS}, the paper's)")
    seed: int = option(analysis.BOOTSTRAP_SEED, min=0,
                       help=f"NumPy PCG64 seed of the bootstrap (default {analysis.BOOTSTRAP_SEED}, the paper's); the "
                            "secondary families' batch seeds derive from it")
    exploratory_draws: int = option(analysis.SECONDARY_DRAWS, min=1, max=MAX_DRAWS,
                                    help=f"draws of the exploratory family (secondary), 1 to {MAX_DRAWS} (default "
                                    f"{analysis.SECONDARY_DRAWS}, the paper's), in batches of "
                                    f"{analysis.SECONDARY_BATCH_DRAWS}")
    post_hoc_draws: int = option(analysis.SECONDARY_DRAWS, min=1, max=MAX_DRAWS,
                                 help=f"draws of the post-hoc family (secondary), 1 to {MAX_DRAWS} (default "
                                 f"{analysis.SECONDARY_DRAWS}, the paper's), in batches of "
                                 f"{analysis.SECONDARY_BATCH_DRAWS}")


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path.parent}: no {path.name}; not a `fae study` directory") from None
    except ValueError as exc:
        raise UserError(f"{path}: not valid JSON ({exc})") from None


def load_study(path: str | Path) -> dict:
    """study.json, units and responses (``responses.jsonl``, or gzipped as committed) of a study directory;
    incomplete or unfinished ones are refused. The model is named portably (study.json's ``model_name``, else
    :func:`real_fae_core.modelref.portable_name`), so a report says which model, not where it sat on one machine."""
    path = Path(path)
    cfg = _json(path / STUDY)
    if "shard" in cfg:
        raise UserError(f"{path} is one shard of a study; run `fae study` without --shard on the study "
                        "directory to join the shards")
    units = [json.loads(x) for x in (path / UNITS).read_text(encoding="utf-8").splitlines() if x.strip()]
    responses = finished_responses(path)
    numbered = read_responses(responses, numbered=True)
    check_planned(responses, cfg, units, numbered)
    lines = [x for _, x in numbered]
    analysis.metric_of(cfg.get("dataset", "?"))
    models = sorted({str(cfg.get("model"))} | {str(x["model"]) for x in lines if "model" in x})
    if len(models) > 1:
        raise UserError(f"{path} mixes models {', '.join(models)}: one study directory is one model")
    cfg = {**cfg, "model": str(cfg.get("model_name") or portable_name(str(cfg.get("model"))))}
    return {"path": str(path), "config": cfg, "units": units, "lines": lines}


class _Unit:
    def __init__(self, uid: str):
        self.id = uid


def describe(key: tuple) -> str:
    """A condition key as the errors name it: ``unit u0 source 0 budget 256 format codes replicate 0``."""
    unit, kind, source, budget, fmt, replicate, control, variant = key
    parts = [f"unit {unit}"] + ([f"control {control}"] if kind == "control" else [])
    parts += [f"{name} {v}" for name, v in (("source", source), ("budget", budget), ("format", fmt),
                                             ("replicate", replicate), ("variant", variant)) if v is not None]
    return " ".join(parts)


def check_planned(path: Path, cfg: dict, units: list[dict], numbered: list[tuple[int, dict]]) -> None:
    """Every planned prompt (primary and control: study.json's grid over units.jsonl) answered exactly once.

    A responses file cut short (a study not finished, or a file truncated by hand) would make a report with
    fewer cells, and a duplicated line would count a prompt twice: each is one line naming the count and the
    first prompt."""
    try:
        sources, budgets, formats = cfg["sources"], cfg["budgets"], cfg["formats"]
        replicates = list(range(1 + len(cfg["seeds"])))
    except (KeyError, TypeError) as exc:
        raise UserError(f"{path.parent / STUDY}: field {exc}: missing or malformed; not a `fae study` "
                        "directory") from None
    planned: list[tuple] = []
    for u in units:
        planned += [c.key for c in primary_conditions(_Unit(u["id"]), sources, budgets, formats, replicates)]
    for u in units:
        if u.get("control"):
            planned += [c.key for c in control_conditions(_Unit(u["id"]), sources, budgets, formats)]
    plan = set(planned)
    first_line: dict[tuple, int] = {}
    duplicated: list[tuple[int, tuple]] = []
    for lineno, x in numbered:
        try:
            key = key_of(x)
        except KeyError as exc:
            raise UserError(f"{path}:{lineno}: field {exc}: missing; not a study response") from None
        if key not in plan:
            raise UserError(f"{path}:{lineno}: a prompt outside this study's plan ({describe(key)}); the file "
                            "belongs to another study or was edited")
        if key in first_line:
            duplicated.append((lineno, key))
        else:
            first_line[key] = lineno
    if duplicated:
        lineno, key = duplicated[0]
        raise UserError(f"{path}:{lineno}: {len(duplicated)} duplicated responses, the first {describe(key)} "
                        f"(also on line {first_line[key]}): each prompt is answered once; rerun `fae study` on "
                        "the study to rewrite the file")
    missing = [k for k in planned if k not in first_line]
    if missing:
        raise UserError(f"{path}: missing condition: {describe(missing[0])} ({len(missing)} of {len(planned)} "
                        "planned prompts missing; finish the study: rerun `fae study`)")


def check_together(studies: list[dict]) -> None:
    """Studies of one dataset share their pools and replicates; two of one dataset x model are refused."""
    seen, by_dataset = {}, {}
    for s in studies:
        c = s["config"]
        key = (c["dataset"], c["model"])
        if key in seen:
            raise UserError(f"{seen[key]} and {s['path']} are both {c['dataset']} x {c['model']}: give one")
        seen[key] = s["path"]
        first = by_dataset.setdefault(c["dataset"], s)
        fc = first["config"]
        if fc["pools_sha256"] != c["pools_sha256"]:
            raise UserError(f"{first['path']} and {s['path']} ({c['dataset']}) were run on different pools or "
                            "corpora (pools_sha256 differs): models are compared on the same units only")
        for k in ("seeds", "budgets", "formats", "sources", "limit", "sample"):
            if fc.get(k) != c.get(k):
                raise UserError(f"{first['path']} and {s['path']} ({c['dataset']}) differ in {k}: "
                                f"{fc.get(k)} vs {c.get(k)}; run every model with the same grid")


def known_units(studies: list[dict]) -> tuple[set[str], bool]:
    """The unit ids a families file may name: every pool's of the studies (study.json ``pool_units``; for an
    older study without it, its own units), and whether that is every pool's (False when such a study asked
    a subset: ``--sample`` or ``--limit``)."""
    known: set[str] = set()
    whole = True
    for s in studies:
        c = s["config"]
        known.update(c.get("pool_units") or [u["id"] for u in s["units"]])
        whole = whole and bool(c.get("pool_units") or not (c.get("sample") or c.get("limit")))
    return known, whole


def family_mapper(files: list[str] | None, studies: list[dict] | None = None):
    """unit -> family: the family file's entry for the unit id, else of another unit of its claim, else the claim.

    With ``studies`` each file's ids are checked against their pools' units: a file of another dataset or other
    pools is refused at its first foreign id; and the files together must put every studied unit in a family
    and each claim in one (:func:`~fae.comparison.families_file.check_covers`)."""
    fams: dict[str, str] = {}
    where: dict[str, tuple[str, str, int]] = {}
    for f in files or []:
        read = read_families(f)
        if studies is not None:
            known, whole = known_units(studies)
            if whole or not known.intersection(read):  # a subset of older studies: the file must name one unit
                check_known(f, read, known, "the pools of the studies given")
        fams.update({fid: fam for fid, (fam, _) in read.items()})
        where.update({fid: (fam, str(f), line) for fid, (fam, line) in read.items()})
    if files and studies is not None:
        check_covers(where, [(u["id"], u["claim_id"], s["path"]) for s in studies for u in s["units"]], files)

    claim_family: dict[str, str] = {}

    def family_of(unit: dict) -> str:
        if unit.get("id") in fams:
            claim_family.setdefault(unit["claim_id"], fams[unit["id"]])
            return "f:" + fams[unit["id"]]
        return "f:" + claim_family.get(unit["claim_id"], "claim:" + unit["claim_id"])
    return family_of, fams


def primary_answers(study: dict, reader=None) -> dict:
    """(unit, source, budget, format, replicate) -> the primary answer (``reader(line)`` when given), every
    condition of the plan checked present."""
    c = study["config"]
    answers = {(x["unit"], x["source"], x["budget"], x["format"], x["replicate"]): reader(x) if reader else x["answer"]
               for x in study["lines"] if x["kind"] == "primary"}
    analysis.check_complete(study["units"], answers, c["sources"], c["budgets"], c["formats"],
                            list(range(1 + len(c["seeds"]))), study["path"])
    return answers


def shown_evidence(study: dict):
    """(unit, source, budget) -> the evidence ids the model was shown (the primary lines' ``shown``, the same
    for every format and replicate), as a ``(unit, source, budget) -> ids`` reader for
    :func:`fae.study.analysis.eligibility_profiles`; None when a primary line has no ``shown`` (a study
    written by hand), so no visible profile is guessed."""
    shown = {}
    for x in study["lines"]:
        if x["kind"] == "primary":
            if not isinstance(x.get("shown"), list):
                return None
            shown.setdefault((x["unit"], x["source"], x["budget"]), x["shown"])
    return lambda unit, source, budget: shown[(unit["id"], source, budget)]


def eligibility_of(study: dict) -> dict:
    """A dataset's eligibility profiles (Figure 2, Appendix J): on the submitted prefix (the top-level
    profiles and changes), on the evidence shown (``visible``, the same helper on other ids), and the
    presentations whose complete gold group was shown but not submitted (``visible_not_submitted``)."""
    c = study["config"]
    metric, units = analysis.metric_of(c["dataset"]), study["units"]
    out = {**analysis.eligibility_profiles(units, metric, c["sources"], c["budgets"]), "evidence": "submitted"}
    shown = shown_evidence(study)
    out["visible"] = None if shown is None else analysis.eligibility_profiles(units, metric, c["sources"],
                                                                             c["budgets"], shown)
    out["visible_not_submitted"] = None if shown is None else analysis.visible_not_submitted(
        units, metric, c["sources"], c["budgets"], shown)
    return out


def panel_of(study: dict, family_of, reader=None) -> analysis.Panel:
    """The study's answers as an :class:`fae.study.analysis.Panel` (every condition checked present);
    ``reader(line)`` reads each primary line's answer another way (the lenient re-reading), else its saved one."""
    c = study["config"]
    metric = analysis.metric_of(c["dataset"])
    answers = primary_answers(study, reader)
    replicates = list(range(1 + len(c["seeds"])))
    notes = list(c.get("notes") or [])
    if len(c["sources"]) < 2:
        raise UserError(f"{study['path']}: the pools have one ordering only (no --reranker): there is no second "
                        "source, so no S_ab table")
    blocks = [(f, u, v) for f in c["formats"] for u in c["budgets"] for v in c["budgets"]]
    units = sorted(study["units"], key=lambda u: u["claim_id"])  # claim order for the family cache
    sums, _ = analysis.build_sums(units, answers, blocks, replicates, metric, family_of, c.get("missed_relevant") or {})
    return analysis.Panel(c["dataset"], c["model"], metric, c["formats"], c["budgets"], replicates[1:], blocks, sums,
                    len(units), notes)


def diagnostics(study: dict) -> dict:
    """Answer accuracy and invalid rate per format x budget x source, sampled replicates and greedy apart."""
    gold = {u["id"]: u["gold_label"] for u in study["units"]}
    acc: dict = defaultdict(lambda: [0, 0, 0])
    for x in study["lines"]:
        if x["kind"] != "primary":
            continue
        k = f"{x['format']}/{x['budget']}/source{x['source']}/{'greedy' if x['replicate'] == 0 else 'sampled'}"
        acc[k][0] += 1
        acc[k][1] += x["answer"] == gold[x["unit"]]
        acc[k][2] += x["answer"] == INVALID
    return {k: {"n": n, "answer_accuracy": 100.0 * a / n, "invalid_rate": 100.0 * i / n}
            for k, (n, a, i) in sorted(acc.items())}


def lenient_reader(dataset: str):
    """A primary line's answer as the lenient reader reads its raw ``response``; a line without raw text (a
    study made by hand) keeps its saved answer."""
    def read(line: dict) -> str:
        text = line.get("response")
        return answer_format(line["format"]).parse_lenient(text, dataset) if isinstance(text, str) else line["answer"]
    return read


def lenient_sensitivity(study: dict, family_of, strict: dict) -> dict:
    """The primary contrasts with every response re-read leniently (point estimates: a sensitivity check, no
    interval), beside the strict ones, and the invalid rate per format under both readers (every primary
    response, greedy included)."""
    c = study["config"]
    read = lenient_reader(c["dataset"])
    lenient = analysis.analyse_panel(panel_of(study, family_of, read), 1, 0)
    contrasts = {name: {"strict": strict["values"][name]["estimate"], "lenient": lenient["values"][name]["estimate"]}
                 for name in strict["primary"]}
    invalid: dict = defaultdict(lambda: {"responses": 0, "strict_invalid": 0, "lenient_invalid": 0, "no_raw_text": 0})
    for x in study["lines"]:
        if x["kind"] != "primary":
            continue
        row = invalid[x["format"]]
        row["responses"] += 1
        row["strict_invalid"] += x["answer"] == INVALID
        row["lenient_invalid"] += read(x) == INVALID
        row["no_raw_text"] += not isinstance(x.get("response"), str)
    rates = {f: {**r, "strict_invalid_rate": 100.0 * r["strict_invalid"] / r["responses"],
                 "lenient_invalid_rate": 100.0 * r["lenient_invalid"] / r["responses"]}
             for f, r in sorted(invalid.items())}
    return {"contrasts": contrasts, "invalid": rates}


def partition(result: dict, panel: analysis.Panel, n_claims: int) -> dict:
    """The per-claim partition by identical valid answers (Table 20) per format x budget and its mean over
    them: the share of claims whose every unit has the same valid answer under both sources, and E0 and E1
    split into those claims' part and the rest (full denominators: the parts sum to the whole)."""
    v = result["values"]
    rows = {}
    for f in panel.formats:
        for b in panel.budgets:
            key = f"{f}/{b}"
            row = {"identical_claims": v[f"{key}/identical_claims"]["estimate"]}
            for e in ("E0", "E1"):
                whole, same = v[f"{key}/{e}"]["estimate"], v[f"{key}/{e}_identical_answers"]["estimate"]
                row[e] = {"identical": same, "changed": None if whole is None or same is None else whole - same,
                          "total": whole}
            rows[key] = row

    def mean(get):
        xs = [get(r) for r in rows.values()]
        return None if any(x is None for x in xs) or not xs else float(np.mean(xs))
    rows["mean"] = {"identical_claims": mean(lambda r: r["identical_claims"]),
                    **{e: {k: mean(lambda r, e=e, k=k: r[e][k]) for k in ("identical", "changed", "total")}
                       for e in ("E0", "E1")}}
    return {"claims": n_claims, "conditions": rows}


def descriptive(study: dict) -> dict:
    """A panel's descriptive secondary tables, from its saved responses and units: where source 1 adds
    eligibility (``added_eligibility``, Table 9), INVALID responses cut off at the generation limit
    (``truncation``, Table 22, with study.json's ``max_new_tokens``), and claim-condition observations with
    any INVALID response (``invalid_observations``, Table 25)."""
    c = study["config"]
    answers = primary_answers(study)
    replicates = list(range(1 + len(c["seeds"])))
    units = sorted(study["units"], key=lambda u: u["claim_id"])
    return {"added_eligibility": analysis.added_eligibility(units, answers, analysis.metric_of(c["dataset"]),
                                                            c["formats"], c["budgets"], replicates[1:],
                                                            c.get("missed_relevant") or {}),
            "truncation": {"max_new_tokens": c.get("max_new_tokens"),
                           "formats": analysis.truncated_invalid(study["lines"], c["formats"])},
            "invalid_observations": analysis.invalid_observations(units, answers, c["formats"], c["budgets"],
                                                                  replicates, c["sources"])}


def family_record(family: str, k: int, draws: int, seed: int) -> dict:
    """What a family's intervals are: its comparisons over every panel (K), the level, the draws and batches."""
    level = analysis.family_level(k)
    batches = analysis.family_batches(family, draws, seed)
    return {"comparisons": k, "paper_comparisons": analysis.PAPER_K[family], "bonferroni_k": level["bonferroni_k"],
            "confidence": level["confidence"], "tail": level["tail"], "draws": draws, "generator": "PCG64",
            "seed": seed, "batches": [{"draws": n, "seed": s} for n, s in batches],
            "seed_derivation": (f"batch b: SeedSequence({seed}, spawn_key=({analysis.FAMILY_STREAM[family]}, b))"
                                ".generate_state(1)[0]" if family in analysis.FAMILY_STREAM else "the seed itself")}


def controls(study: dict) -> dict:
    """Per control: planned and feasible prompts; accuracy (claim only, gold) or agreement with the
    canonical greedy answer of the same unit, source, budget and format (mapping, swap, order)."""
    gold = {u["id"]: u["gold_label"] for u in study["units"]}
    canon = {(x["unit"], x["source"], x["budget"], x["format"]): x["answer"] for x in study["lines"]
             if x["kind"] == "primary" and x["replicate"] == 0}
    out: dict = defaultdict(lambda: {"planned": 0, "feasible": 0, "hits": 0, "invalid": 0, "valid_pairs": 0,
                                     "valid_hits": 0})
    for x in study["lines"]:
        if x["kind"] != "control":
            continue
        row = out[x["control"]]
        row["planned"] += 1
        if x["answer"] == "INFEASIBLE":
            continue
        row["feasible"] += 1
        row["invalid"] += x["answer"] == "INVALID"
        if x["control"] in ("claim_only", "gold"):
            row["hits"] += x["answer"] == gold[x["unit"]]
            continue
        canonical = canon.get((x["unit"], x["source"], x["budget"], x["format"]))
        row["hits"] += x["answer"] == canonical
        if x["answer"] != "INVALID" and canonical not in (None, "INVALID"):  # two INVALIDs agree on nothing
            row["valid_pairs"] += 1
            row["valid_hits"] += x["answer"] == canonical
    return {k: control_rates(k, v) for k, v in sorted(out.items())}


def control_rates(name: str, counts: dict) -> dict:
    """A control's counts with its rates: accuracy or agreement over the feasible prompts, and agreement
    over the pairs where both answers are valid (None for the accuracy controls and without such pairs)."""
    accuracy = name in ("claim_only", "gold")
    return {**counts, "measure": "answer accuracy" if accuracy else "agreement with canonical",
            "rate": 100.0 * counts["hits"] / counts["feasible"] if counts["feasible"] else None,
            "valid_rate": None if accuracy or not counts["valid_pairs"]
            else 100.0 * counts["valid_hits"] / counts["valid_pairs"]}


def run(config: StudyReportConfig) -> CommandResult:
    """`fae study-report` as a function: the JSON report, its markdown and figure in ``config.output``
    (``summary`` the report); studies that cannot be analysed together are one :class:`UserError`."""
    out = Path(config.output)
    if out.exists() and not out.is_dir():
        raise UserError(f"--output {out} is a file; give a directory")
    guard = claim_dir(out, "fae study-report", inputs=[*config.studies, config.families],
                      legacy=only_names(REPORT_JSON, REPORT_MD, FIGURE))
    studies = [load_study(p) for p in config.studies]
    check_together(studies)
    family_of, _ = family_mapper(config.families, studies)
    panels = [panel_of(s, family_of) for s in studies]
    k = sum(len(analysis.primary_names(p)) for p in panels)
    k_family = {f: sum(len(analysis.family_names(p, f)) for p in panels) for f in ("exploratory", "post_hoc")}
    draws = {"exploratory": config.exploratory_draws, "post_hoc": config.post_hoc_draws}
    results = [analysis.analyse_panel(p, k, config.draws, config.seed) for p in panels]
    for r, s, p in zip(results, studies, panels):
        r["study"] = s["path"]
        r["diagnostics"] = diagnostics(s)
        r["controls"] = controls(s)
        for family in ("exploratory", "post_hoc"):
            r[family] = analysis.analyse_family(p, family, k_family[family], draws[family], config.seed,
                                          f"--{family.replace('_', '-')}-draws")
        r["lenient"] = lenient_sensitivity(s, family_of, r)
        r["partition"] = partition(r, p, len({u["claim_id"] for u in s["units"]}))
        r.update(descriptive(s))
    eligibility = {}
    for s in studies:
        if s["config"]["dataset"] not in eligibility:
            eligibility[s["config"]["dataset"]] = eligibility_of(s)
    report = {"panels": results, "primary_contrasts": k, "decision": analysis.decision(results),
              "bootstrap": {"draws": config.draws, "generator": "PCG64", "seed": config.seed,
                            "bonferroni_k": k, "tail": analysis.ALPHA / (2 * max(k, 1))},
              "secondary": {f: family_record(f, k_family[f], draws[f], config.seed) for f in k_family},
              "eligibility": eligibility}
    guard.mark()
    atomic_write_json(out / REPORT_JSON, report)
    atomic_write_text(out / REPORT_MD, render_markdown(report))
    write_figure(report, out / FIGURE)
    print(f"fae study-report: {len(results)} panels, decision: {report['decision']['label']} -> {out}")
    return CommandResult(outputs={"json": str(out / REPORT_JSON), "markdown": str(out / REPORT_MD),
                                  "figure": str(out / FIGURE)}, summary=report)


def _f(x, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _interval(v: dict) -> str:
    return f"{_f(v['estimate'])} [{_f(v['ci_low'])}, {_f(v['ci_high'])}]"


def unanswered_lines(decision: dict) -> list[str]:
    """The markdown lines naming the formats whose answers are mostly INVALID (none when there are none)."""
    silent = decision.get("unanswered") or []
    if not silent:
        return []
    names = "; ".join(f"{x['dataset']} {portable_name(x['model'])} {x['format']} ({100 * x['invalid_share']:.1f}% "
                      "INVALID)" for x in silent)
    return [f"Mostly unanswered (more than half INVALID: its E0 is about answering, not evidence): {names}.", ""]


def _header(*columns: str) -> list[str]:
    """A markdown table's header and rule."""
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def _panel_rows(panels, cells) -> list[str]:
    """One markdown row per panel x entry of ``cells(panel)``: the panel's dataset and model, then the entry's
    cells (each written with ``str``)."""
    return ["| " + " | ".join([p["dataset"], portable_name(p["model"]), *map(str, row)]) + " |"
            for p in panels for row in cells(p)]


def _contrast_rows(panels, items) -> list[str]:
    """Rows of contrasts with their adjusted intervals and seed-sign agreement: ``items(panel)`` gives
    (name, value) pairs."""
    return _panel_rows(panels, lambda p: ((name, _interval(v), f"{v['seed_signs_agreeing']}/{p['seeds']}")
                                          for name, v in items(p)))


def render_markdown(report: dict) -> str:
    """The paper's tables: primary contrasts (Table 15), scores by budget (Table 6), crossing (Table 28),
    product/covariance (Table 10), controls (Table 18), diagnostics; then the secondary inference, marked as
    such: the exploratory family (Table 7), the post-hoc family (Table 24) and its batches' endpoints (Table
    27), the lenient re-reading (Table 26), truncated INVALID responses (Table 22), flagged observations
    (Table 25), eligibility profiles submitted and visible (Figure 2, Appendix J), where source 1 adds
    eligibility (Table 9) and the per-claim identical-answer partition (Table 20)."""
    b = report["bootstrap"]
    lines = ["# Evaluation-choice study", "",
             f"Decision rule: **{report['decision']['label']}**. Intervals: {b['draws']} family x seed draws, "
             f"NumPy PCG64 seed {b['seed']}, percentile bounds at {b['tail']:.5f} and {1 - b['tail']:.5f} "
             f"(Bonferroni over K = {b['bonferroni_k']} primary contrasts).", "",
             *unanswered_lines(report["decision"]),
             "## Primary contrasts", "",
             *_header("Dataset", "Model", "Contrast", "Effect [adjusted interval]", "Seed signs")]
    lines += _contrast_rows(report["panels"], lambda p: ((name, p["values"][name]) for name in p["primary"]))
    lines += ["", "## Scores and evidence gain per format and budget (mean over sampled seeds)", "",
              *_header("Dataset", "Model", "Budget", "Format", *analysis.CELL_NAMES, "E0 of identical valid answers")]

    def scores(p):
        v = p["values"]
        for key in sorted({k.rsplit("/", 1)[0] for k in v if k.count("/") == 2 and not k.startswith("budget")}):
            f, budget = key.split("/")
            yield (budget, f, *(_f(v[f"{key}/{q}"]["estimate"]) for q in analysis.CELL_NAMES),
                   _f(v[key + "/E0_identical_answers"]["estimate"]))
    lines += _panel_rows(report["panels"], scores)
    lines += crossing_table(report) + control_table(report) + secondary_sections(report)
    return "\n".join(lines) + "\n"


def _level(family: dict) -> str:
    """How a secondary family's intervals were made, in one sentence."""
    return (f"Bonferroni over K = {family['comparisons']} comparisons (the paper's {family['paper_comparisons']} are "
            f"for 3 datasets x 2 models), percentile bounds at {family['tail']:.6f} and {1 - family['tail']:.6f}, "
            f"{family['draws']} family x seed draws in {len(family['batches'])} independently seeded batch(es) "
            f"derived from seed {family['seed']}")


def crossing_table(report: dict) -> list[str]:
    """Table 28: both orders of the crossed budgets; the intervals are the post-hoc family's (the paper's
    42-comparison adjustment), not the primary family's."""
    post = (report.get("secondary") or {}).get("post_hoc")
    lines = ["", "## Budget crossing and product/covariance" + (" (post hoc)" if post else ""), ""]
    if post:
        lines += [f"Post-hoc intervals: {_level(post)}.", ""]

    def orders(p):
        v = p["post_hoc"]["values"] if "post_hoc" in p else p["values"]
        if "crossing/input_first.input" not in v:
            return
        for order in ("input_first", "scoring_first"):
            yield (order.replace("_", " "), _interval(v[f"crossing/{order}.input"]),
                   _interval(v[f"crossing/{order}.scoring"]))

    def budgets(p):
        v = p["values"]
        for key in sorted({k.rsplit("/", 1)[0] for k in v if k.startswith("budget/")}, key=lambda k: int(k[7:])):
            yield key[7:], *(_f(v[f"{key}/{q}"]["estimate"], 3) for q in ("E0", "E0_product", "E0_covariance"))
    lines += _header("Dataset", "Model", "Path order", "Input component [CI]", "Scoring component [CI]")
    lines += _panel_rows(report["panels"], orders)
    lines += ["", *_header("Dataset", "Model", "Budget", "E0", "Product", "Covariance")]
    return lines + _panel_rows(report["panels"], budgets)


def control_table(report: dict) -> list[str]:
    """The markdown of the greedy controls (agreement or accuracy per control), then accuracy and invalid
    rate per condition, for every panel."""
    lines = ["", "## Greedy controls", "", "Agreement counts two INVALID answers as agreeing; *valid pairs* and their "
             "agreement leave them out.", "",
             *_header("Dataset", "Model", "Control", "Planned", "Feasible", "Invalid", "Measure", "Rate", "Valid pairs",
                      "Their agreement")]
    lines += _panel_rows(report["panels"], lambda p: (
        (name, c["planned"], c["feasible"], c["invalid"], c["measure"], _f(c["rate"]),
         "" if c["measure"] == "answer accuracy" else c["valid_pairs"], _f(c["valid_rate"]))
        for name, c in p["controls"].items()))
    lines += ["", "## Answer accuracy and invalid rate", "",
              *_header("Dataset", "Model", "Condition", "n", "Accuracy", "Invalid")]
    return lines + _panel_rows(report["panels"], lambda p: (
        (k, d["n"], _f(d["answer_accuracy"]), _f(d["invalid_rate"])) for k, d in p["diagnostics"].items()))


def write_figure(report: dict, path: Path) -> None:
    """The primary contrasts with their adjusted intervals, one row per dataset x model x contrast."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(f"{p['dataset']} {portable_name(p['model'])} {n}", p["values"][n]) for p in report["panels"] for n in p["primary"]]
    fig, ax = plt.subplots(figsize=(6.5, 0.45 * len(rows) + 1.2))
    for i, (label, v) in enumerate(rows):
        est = v["estimate"] if v["estimate"] is not None else np.nan
        lo = v["ci_low"] if v["ci_low"] is not None else est
        hi = v["ci_high"] if v["ci_high"] is not None else est
        ax.errorbar([est], [i], xerr=[[est - lo], [hi - est]], fmt="o", color="black", capsize=3)
    ax.axvline(0, color="grey", lw=0.8)
    for x in (-2, 2):
        ax.axvline(x, color="grey", lw=0.6, ls="--")
    ax.set_yticks(range(len(rows)), [r[0] for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("effect on E0 (points), Bonferroni-adjusted interval")
    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)


def _family_rows(report: dict, family: str, shown=lambda name: True) -> list[str]:
    """One secondary family's table rows: every panel's comparisons with their adjusted intervals."""
    return _contrast_rows(report["panels"], lambda p: ((n, v) for n, v in p[family]["values"].items() if shown(n)))


def secondary_sections(report: dict) -> list[str]:
    """The secondary inference, each table marked exploratory, post hoc or sensitivity, with its level."""
    sec = report.get("secondary")
    if not sec:
        return []
    lines = ["", "## Secondary inference (exploratory and post hoc)", "",
             "Two families apart from the primary one and from each other, each adjusted over its own "
             "comparisons: their guarantees do not combine, and none enters the decision rule.", "",
             "### Exploratory family: E1, E_avg = (E0 + E1)/2, endpoints and source gain", "",
             f"{_level(sec['exploratory'])}.", "",
             *_header("Dataset", "Model", "Comparison", "Effect [adjusted interval]", "Seed signs")]
    lines += _family_rows(report, "exploratory")
    lines += ["", "### Post-hoc family: input-scoring interaction and the direct E1 - E0 changes", "",
              f"{_level(sec['post_hoc'])}; the crossed-budget components above belong to this family. "
              "interaction = T(l,l) - T(l,s) - T(s,l) + T(s,s).", "",
              *_header("Dataset", "Model", "Comparison", "Effect [adjusted interval]", "Seed signs")]
    # the crossed-budget components have their own table (crossing_table): only the interaction here
    lines += _family_rows(report, "post_hoc",
                          shown=lambda name: not name.startswith("crossing/") or name == "crossing/interaction")
    lines += batch_table(report)
    lines += ["", "### Lenient re-reading (sensitivity check, point estimates)", "",
              "Every saved response re-read by the lenient reader (case, spaces/underscores, surrounding "
              "punctuation, quotes and markdown folded; a leading answer with an unambiguous explanation "
              "accepted; gold never consulted), the primary contrasts recomputed.", "",
              *_header("Dataset", "Model", "Contrast", "Strict", "Lenient")]
    lines += _panel_rows(report["panels"], lambda p: (
        (name, _f(c["strict"]), _f(c["lenient"])) for name, c in p["lenient"]["contrasts"].items()))
    lines += ["", *_header("Dataset", "Model", "Format", "Responses", "Invalid, strict (%)", "Invalid, lenient (%)",
                           "Without raw text")]
    lines += _panel_rows(report["panels"], lambda p: (
        (fmt, r["responses"], _f(r["strict_invalid_rate"]), _f(r["lenient_invalid_rate"]), r["no_raw_text"])
        for fmt, r in p["lenient"]["invalid"].items()))
    lines += truncation_table(report) + invalid_observation_table(report)
    lines += ["", "### Evidence eligibility profiles (descriptive; no answers involved)", "",
              "Per claim: 0/1 for FEVER-style datasets (NOT_ENOUGH_INFO gold is eligible), the number of eligible "
              "retrieved abstracts for SciFact. Gain: source 1 higher at one or both budgets and lower at "
              "neither; loss the reverse.", "",
              "Submitted: the prefix the scorer receives; visible: the evidence the model was shown (the same "
              "eligibility rule on other ids). Shown, not submitted: presentations (unit x source x budget) whose "
              "complete gold group was visible but fell outside the submitted prefix.", "",
              "| Dataset | Source | Budget | Claims | Eligible, submitted | Per claim | Eligible, visible | Per claim "
              "| Shown, not submitted |", "|---|---|---|---|---|---|---|---|---|"]
    for dataset, e in report["eligibility"].items():
        visible = {(r["source"], r["budget"]): r for r in (e.get("visible") or {}).get("profiles", [])}
        missed = {(r["source"], r["budget"]): r for r in (e.get("visible_not_submitted") or {}).get("conditions", [])}
        for r in e["profiles"]:
            v, m = visible.get((r["source"], r["budget"])), missed.get((r["source"], r["budget"]))
            lines.append(f"| {dataset} | {r['source']} | {r['budget']} | {r['claims']} | {r['eligible']:g} | "
                         f"{_f(r['per_claim'], 3)} | {'–' if v is None else format(v['eligible'], 'g')} | "
                         f"{_f(v and v['per_claim'], 3)} | "
                         f"{'–' if m is None else str(m['count']) + ' of ' + str(m['presentations'])} |")
    lines += ["", "| Dataset | Gain | Loss | Mixed | Unchanged |", "|---|---|---|---|---|"]
    for dataset, e in report["eligibility"].items():
        c = e["changes"]
        lines.append(f"| {dataset} | {c['gain']} | {c['loss']} | {c['mixed']} | {c['unchanged']} |")
    lines += added_eligibility_table(report)
    lines += ["", "### Identical valid answers, per claim (post hoc, descriptive)", "",
              "Claims whose every unit (SciFact: all three abstracts) has the same valid answer under both sources, "
              "and their part of E0 and E1 on the full denominator (the parts sum to the whole).", "",
              *_header("Dataset", "Model", "Condition", "Identical claims (%)", "E0 identical", "E0 changed",
                       "E1 identical", "E1 changed")]
    return lines + _panel_rows(report["panels"], lambda p: (
        (cond, _f(r["identical_claims"]), *(_f(r[e][part]) for e in ("E0", "E1") for part in ("identical", "changed")))
        for cond, r in p["partition"]["conditions"].items()))


def batch_table(report: dict) -> list[str]:
    """Table 27: each secondary comparison's interval beside the endpoints of every batch of draws it pools,
    all at the family's own tail level."""
    lines = ["", "### Monte Carlo batches of the secondary families (post hoc, descriptive)", "",
             "Each batch's own lower and upper percentile endpoints at its family's tail probability, in batch "
             "order (seeds under `secondary.<family>.batches`), beside the interval that pools them.", "",
             *_header("Dataset", "Model", "Family", "Comparison", "Pooled interval", "Batch endpoints")]

    def batches(p):
        for family in ("exploratory", "post_hoc"):
            for name, ends in (p.get(family) or {}).get("batch_endpoints", {}).items():
                v = p[family]["values"][name]
                yield (family.replace("_", " "), name, f"[{_f(v['ci_low'])}, {_f(v['ci_high'])}]",
                       "; ".join(f"[{_f(e['ci_low'])}, {_f(e['ci_high'])}]" for e in ends))
    return lines + _panel_rows(report["panels"], batches)


def truncation_table(report: dict) -> list[str]:
    """Table 22: INVALID primary responses cut off at the generation limit, per panel x format."""
    lines = ["", "### INVALID responses cut off at the generation limit (descriptive)", "",
             "Among the INVALID primary responses, those whose generation stopped at max_new_tokens "
             "(finish_reason `length`); the share is of the INVALID responses. Unknown: INVALID responses saved "
             "without a finish reason.", "",
             *_header("Dataset", "Model", "Format", "max_new_tokens", "Invalid, sampled", "Cut off", "Share (%)",
                      "Invalid, with greedy", "Cut off", "Share (%)", "Unknown")]

    def formats(p):
        t = p.get("truncation") or {"formats": {}}
        for fmt, r in t["formats"].items():
            a, g = r["sampled"], r["all"]
            yield (fmt, t["max_new_tokens"], a["invalid"], a["length"], _f(a["length_share"]), g["invalid"],
                   g["length"], _f(g["length_share"]), g["unknown"])
    return lines + _panel_rows(report["panels"], formats)


def invalid_observation_table(report: dict) -> list[str]:
    """Table 25: claim-condition observations with any INVALID response, per panel x format."""
    lines = ["", "### Claim-condition observations with an INVALID response (descriptive)", "",
             "An observation is a claim x format x budget x replicate, flagged when any of its responses is "
             "INVALID (both sources; SciFact every abstract of the claim); rates pool the budgets, over the sampled "
             "replicates and with greedy added (the paper pools six replicates, greedy included).", "",
             *_header("Dataset", "Model", "Format", "Observations, sampled", "Flagged", "Rate (%)",
                      "Observations, with greedy", "Flagged", "Rate (%)")]
    return lines + _panel_rows(report["panels"], lambda p: (
        (fmt, *(x for r in (obs["sampled"], obs["all"]) for x in (r["observations"], r["flagged"], _f(r["rate"]))))
        for fmt, obs in (p.get("invalid_observations") or {}).items()))


def added_eligibility_table(report: dict) -> list[str]:
    """Table 9: the post-hoc union of claims where source 1 adds eligibility, the accuracy of answers made
    with each source's evidence within it, and its part of E0 and of the input component."""
    lines = ["", "### Where source 1 adds eligibility (post hoc, descriptive)", "",
             "Claims whose source-1 submitted evidence has more eligible units than source 0's (the profiles' "
             "count) at the smallest budget, the largest, both, and their union. Within the union: answer "
             "accuracy with each source's evidence as input (mean over formats and sampled seeds), and the "
             "union's part of E0 (input = scoring budget) and of the input component E0(largest input, v) - "
             "E0(smallest input, v) at each scoring budget v, on the full denominator; the rest of the claims "
             "add up to the whole.", "",
             *_header("Dataset", "Model", "Claims", "Adds, smallest", "Adds, largest", "Both", "Union")]
    panels = [p for p in report["panels"] if p.get("added_eligibility")]
    lines += _panel_rows(panels, lambda p: [tuple(p["added_eligibility"][k] for k in (
        "claims", "adds_smallest", "adds_largest", "adds_both", "union"))])
    lines += ["", *_header("Dataset", "Model", "Budget", "Accuracy, source 0 evidence", "Accuracy, source 1 evidence",
                           "E0: union", "E0: rest", "E0", "Input component at this scoring budget: union", "rest",
                           "whole")]

    def budgets(p):
        a = p["added_eligibility"]
        for b, e in a["E0"].items():
            i = a["input_component"].get(b) or {}
            yield (b, _f(a["accuracy"]["source0"][b]), _f(a["accuracy"]["source1"][b]),
                   *(_f(e[k], 3) for k in ("group", "rest", "total")),
                   *(_f(i.get(k), 3) for k in ("group", "rest", "total")))
    return lines + _panel_rows(panels, budgets)
