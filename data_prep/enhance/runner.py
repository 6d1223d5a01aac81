"""`real-data enhance`: annotate evidence with several LLMs and keep the majority picks: its options
(:class:`EnhanceConfig`) and its run (:func:`run`), cache look-ups, async requests, votes, outputs.

    real-data enhance --records in.jsonl --annotators recipes/annotators/paper.yaml --output out.jsonl
    real-data enhance ... --dry-run                 # request count + token estimate, nothing sent
    real-data enhance --records out.jsonl --revote --min-votes 1 --output out2.jsonl   # no requests

Re-running the same command resumes: answers come from the cache, only what
is missing is requested. Exit codes (docs/errors.md): 0 complete, 1 some
requests failed (everything else written; run again to retry them), 2 bad
input or the output/cache is in use by another enhance, 130 interrupted,
143 terminated; on 130/143 one line says what was kept and the command to resume.

Files next to ``--output OUT``:

- ``OUT.partial``: one line per claim as soon as all its annotators answered
  (completion order); rewritten in input order if the run ends with failures;
  removed after a complete run.
- ``OUT``: every input record in input order, written atomically only when
  no request failed.
- ``OUT.summary.json``: request, token, agreement and vote statistics.
- ``OUT.cache.sqlite`` (default ``--cache``): the answers; what makes a
  re-run or a resumed run send no request twice.
- ``OUT.lock`` and ``CACHE.lock``: held for the whole run, so a second enhance
  on the same output or the same cache stops at once naming the holder
  instead of interleaving two runs.

Locks, cache, de-duplication, counting, interrupts and the summary write are
:mod:`data_prep.llm.requests` (shared with ``real-data counterfactual``);
this module keeps the annotation prompts, the vote and the outputs.

Claim counts (summary and printed line): ``claims_total`` claims are sent to
the annotators (SUPPORT/REFUTE; NOT_ENOUGH_INFO too with ``--include-nei``);
each ends either ``claims_annotated`` (every annotator answered or abstained,
so it has an output line) or ``claims_failed`` (some request exhausted its
retries; retried by the next run). ``claims_annotated + claims_failed =
claims_total``; NOT_ENOUGH_INFO records passed through unchanged are counted
apart.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path


from real_fae_core.command import CommandConfig, CommandResult, command_line, option
from real_fae_core.errors import UserError
from real_fae_core.outputs import claim_file
from data_prep.llm.cache import ABSTAIN, OK, AnswerCache, request_key
from data_prep.llm.client import AnnotatorClient, AnnotatorStats
from data_prep.llm.config import AnnotatorConfig, ConfigError, load_annotators
from real_fae_core.progress import progress_bar
from data_prep.llm.requests import (
    RequestTable,
    RequestUsage,
    default_cache_path,
    run_locks,
    run_requests,
    summary_path,
    write_summary,
)
from data_prep.records import (
    NOT_ENOUGH_INFO,
    ClaimRecord,
    RecordError,
    iter_with_lines,
    load_records_or_fail,
    save_records,
)

from .prompt import annotation_check, estimate_tokens, parse_annotation, render_annotator_prompt
from .vote import enhanced_evidence, vote_summary, votes_needed


@dataclass
class EnhanceConfig(CommandConfig):
    """`real-data enhance`: enhanced evidence by a majority vote of annotator LLMs."""

    records: str = option(help="input claim records (JSONL)")
    output: str = option(help="output JSONL; the summary goes to OUTPUT.summary.json")
    annotators: str | None = option(None, help="annotators YAML (recipes/annotators/*.yaml); not needed with --revote")
    cache: str | None = option(None, help="SQLite answer cache (default: OUTPUT.cache.sqlite); reuse it to resume")
    dry_run: bool = option(False, help="print the number of requests and an input-token estimate; send nothing")
    min_votes: int | None = option(None, min=1, metavar="K", help="votes a sentence needs (default: strict majority "
                                   "of the configured annotators)")
    revote: bool = option(False, help="recompute enhanced_evidence from the 'annotations' of an enhanced file; "
                                      "no requests")
    include_nei: bool = option(False, help="also annotate NOT_ENOUGH_INFO claims (default: passed through unchanged)")
    retry_abstentions: bool = option(False,
                                     help="re-ask annotators whose cached answer was an abstention (malformed answer)")
    max_in_flight: int | None = option(None, min=1, metavar="N", help="at most N requests in flight over all "
                                       "annotators (each also has max_concurrency)")
    no_progress: bool = option(False, help="no progress bar")


def resume_command(config: EnhanceConfig) -> str:
    """The command line that resumes this run (same records, annotators, output, cache, options)."""
    return command_line("real-data enhance", config)


def check_options(config: EnhanceConfig) -> None:
    """The checks across fields: --revote with --dry-run, --annotators missing, --output = --records."""
    if config.revote and config.dry_run:
        raise UserError("--revote sends no requests; --dry-run does not apply")
    if not config.revote and config.annotators is None:
        raise UserError("--annotators is required (unless --revote)")
    if Path(config.records).resolve() == Path(config.output).resolve():
        raise UserError("--output must differ from --records")
    claim_file(config.output, "real-data enhance", inputs=[config.records, config.annotators])


def partial_path(output: Path) -> Path:
    """``OUT.partial``: the records finished so far when a run ends with failed claims (removed once complete)."""
    return output.with_name(output.name + ".partial")


@dataclass
class EnhanceJob:
    records: Path
    annotators: Path
    output: Path
    cache: Path | None = None
    min_votes: int | None = None
    include_nei: bool = False
    retry_abstentions: bool = False
    max_in_flight: int | None = None  # cap over all annotators together
    progress: bool = True
    resume_command: str | None = None  # shown on Ctrl-C / SIGTERM: how to pick up where it stopped

    @property
    def cache_path(self) -> Path:
        """The LLM answer cache: ``cache`` when given, else the default one beside ``output``."""
        return Path(self.cache) if self.cache else default_cache_path(Path(self.output))


def build_output(rec: ClaimRecord, annotations: dict, min_votes: int | None) -> dict:
    """The input record (all fields kept) + ``enhanced_evidence`` + ``annotations``."""
    out = rec.to_dict()
    out.pop("enhanced_evidence", None)  # re-added last: same key order on every (re)vote
    out.pop("annotations", None)
    out["enhanced_evidence"] = enhanced_evidence(rec.gold_ids, annotations, min_votes)
    out["annotations"] = {k: (None if v is None else sorted(v)) for k, v in annotations.items()}
    return out


def _check_min_votes(min_votes: int | None, n: int) -> int:
    need = votes_needed(n) if min_votes is None else min_votes
    if not 1 <= need <= n:
        raise UserError(f"--min-votes must be between 1 and the number of annotators ({n}), got {need}")
    return need


# ---------------------------------------------------------------------------
# enhance
# ---------------------------------------------------------------------------


def _load_inputs(job: EnhanceJob) -> tuple[list[ClaimRecord], list[AnnotatorConfig]]:
    records = load_records_or_fail(job.records)
    try:
        annotators = load_annotators(job.annotators)
    except ConfigError as exc:
        raise UserError(str(exc)) from None
    return records, annotators


def _plan(records, annotators, targets, cache_keys: set[str], job: EnhanceJob, cache: AnswerCache | None):
    """Per annotator: requests still to send and their estimated input tokens."""
    todo = {a.name: 0 for a in annotators}
    tokens = {a.name: 0 for a in annotators}
    seen: set[str] = set()  # identical prompts (duplicate claims) are asked once
    for i in targets:
        msgs = render_annotator_prompt(records[i])
        est = None
        for a in annotators:
            key = request_key(a.model, msgs, a.decoding())
            if key in seen:
                continue
            seen.add(key)
            if key in cache_keys:
                if not job.retry_abstentions or cache is None or cache.get(key).status != ABSTAIN:
                    continue
            todo[a.name] += 1
            est = estimate_tokens(msgs) if est is None else est
            tokens[a.name] += est
    return todo, tokens


def dry_run(job: EnhanceJob) -> int:
    """Print what a run would send (requests not in the cache, estimated tokens per annotator, unset API key
    variables) without sending anything or writing; exit code 0."""
    records, annotators = _load_inputs(job)
    _check_min_votes(job.min_votes, len(annotators))
    targets = [i for i, r in enumerate(records) if job.include_nei or r.label != NOT_ENOUGH_INFO]
    cache = AnswerCache(job.cache_path) if job.cache_path.exists() else None
    keys = cache.keys() if cache else set()
    try:
        todo, tokens = _plan(records, annotators, targets, keys, job, cache)
    finally:
        if cache:
            cache.close()
    total = len(targets) * len(annotators)
    n_todo = sum(todo.values())
    print(f"dry run: {len(targets)} claims x {len(annotators)} annotators = {total} requests "
          f"({total - n_todo} served from cache, {n_todo} to send; retries not included); "
          f"{len(records) - len(targets)} NOT_ENOUGH_INFO records passed through")
    for a in annotators:
        missing = "" if a.api_key_env is None or os.environ.get(a.api_key_env) \
            else f"  [{a.api_key_env} is not set]"
        print(f"  {a.name:<24} {a.model:<36} {todo[a.name]:>8} requests  ~{tokens[a.name]:,} input tokens  "
              f"<= {todo[a.name] * a.max_tokens:,} output tokens{missing}")
    print(f"  total ~{sum(tokens.values()):,} input tokens (estimate: ~4 characters per token)")
    return 0


def _finished_claims(job: EnhanceJob) -> str:
    """For the interrupt note: the claims already in ``OUT.partial``."""
    part = partial_path(Path(job.output))
    try:
        with part.open("rb") as fh:
            claims = sum(1 for line in fh if line.endswith(b"\n"))
    except OSError:
        claims = 0
    return f" and {claims} finished claims in {part}"


def enhance(job: EnhanceJob) -> tuple[int, dict]:
    """Run (or resume) the annotation under the output and cache locks; returns (exit code, summary)."""
    with run_locks("real-data enhance", Path(job.output), job.cache_path):
        return _enhance_locked(job)


def _enhance_locked(job: EnhanceJob) -> tuple[int, dict]:
    t0 = time.monotonic()
    records, annotators = _load_inputs(job)
    need = _check_min_votes(job.min_votes, len(annotators))
    output = Path(job.output)
    targets = [i for i, r in enumerate(records) if job.include_nei or r.label != NOT_ENOUGH_INFO]
    cache = AnswerCache(job.cache_path)
    try:
        todo, _ = _plan(records, annotators, targets, cache.keys(), job, cache)
        # Keys are only needed by annotators that still have requests to send,
        # and all are checked before the first request goes out.
        try:
            keys = {a.name: a.api_key() for a in annotators if todo[a.name]}
        except ConfigError as exc:
            raise UserError(str(exc)) from None
        output.parent.mkdir(parents=True, exist_ok=True)
        state = run_requests(_enhance_async(job, records, annotators, targets, need, cache, keys), cache,
                             job.resume_command, lambda: _finished_claims(job))
    finally:
        cache.close()
    outputs, failures, stats = state["outputs"], state["failures"], state["stats"]

    complete, part = _write_outputs(records, outputs, failures, targets, output)
    claims = [
        (records[i].gold_ids, outputs[i]["enhanced_evidence"], outputs[i]["annotations"])
        for i in targets if i in outputs
    ]
    votes = vote_summary(claims, [a.name for a in annotators])
    usage = RequestUsage()
    for a in annotators:
        usage.add(a.name, stats[a.name])
    per_ann = {a.name: _annotator_summary(a.model, stats[a.name], votes["annotators"][a.name]) for a in annotators}
    summary = {
        "complete": complete,
        "records_file": str(job.records),
        "annotators_file": str(job.annotators),
        "output": str(output) if complete else None,
        "partial_output": None if complete else str(part),
        "cache": str(job.cache_path),
        "records": len(records),
        "claims_total": len(targets),
        "claims_annotated": len(targets) - len(failures),
        "claims_failed": len(failures),
        "claims_passed_through_nei": len(records) - len(targets),
        "failed_claim_ids": sorted(failures, key=str),
        "failure_examples": {k: failures[k]["errors"] for k in sorted(failures, key=str)[:5]},
        "n_annotators": len(annotators),
        "votes_needed": need,
        "requests": usage.requests(),
        "annotators": per_ann,
        "claims_enhanced_differs_from_gold": votes["claims_enhanced_differs_from_gold"],
        "sentences_added": votes["sentences_added"],
        "elapsed_s": round(time.monotonic() - t0, 3),
    }
    write_summary(summary, output)
    return (0 if complete else 1), summary


def _write_outputs(records, outputs: dict, failures: dict, targets: list[int], output: Path) -> tuple[bool, Path]:
    """Every record in input order to ``output`` when no claim failed, else the finished ones to the partial file.

    Returns (complete, partial file path). NOT_ENOUGH_INFO records not asked about pass through unchanged.
    """
    target_set = set(targets)
    ordered: list[dict | None] = []
    for i, rec in enumerate(records):
        if i in outputs:
            ordered.append(outputs[i])
        else:  # passed through (NOT_ENOUGH_INFO), or None for a failed claim
            ordered.append(None if i in target_set else rec.to_dict())
    complete = not failures
    part = partial_path(output)
    if complete:
        save_records(ordered, output)
        if part.exists():
            part.unlink()
    else:
        save_records([o for o in ordered if o is not None], part)
    return complete, part


def _annotator_summary(model: str, st: AnnotatorStats, agreement: dict) -> dict:
    """One annotator's line of the summary: requests, cache hits, failures, tokens and its agreement."""
    return {
        "model": model,
        "requests_made": st.requests,
        "served_from_cache": st.from_cache,
        "failed": st.failed,
        "answered_this_run": st.answered,
        "abstained_this_run": st.abstained,
        "transport_retries": st.transport_retries,
        "malformed_answers": st.malformed_answers,
        "invented_ids_dropped": st.invented_ids,
        "tokens_in": st.tokens_in,
        "tokens_out": st.tokens_out,
        "tokens_in_incl_cache": st.tokens_in_all,
        "tokens_out_incl_cache": st.tokens_out_all,
        "errors": dict(sorted(st.errors.items())),
        **agreement,
    }


async def _enhance_async(job, records, annotators, targets, need, cache, keys):
    stats = {a.name: AnnotatorStats() for a in annotators}
    global_limit = asyncio.Semaphore(job.max_in_flight) if job.max_in_flight else None
    clients = {
        a.name: AnnotatorClient(a, keys[a.name], global_limit=global_limit) for a in annotators if a.name in keys
    }
    for name, c in clients.items():
        c.stats = stats[name]
    outputs: dict[int, dict] = {}
    failures: dict[str, dict] = {}
    part = partial_path(Path(job.output))
    window_size = max(64, 4 * sum(a.max_concurrency for a in annotators))
    window = asyncio.Semaphore(window_size)
    table = RequestTable(cache, "enhance", retry_abstentions=job.retry_abstentions)

    def one(a: AnnotatorConfig, msgs, pool):
        key = request_key(a.model, msgs, a.decoding())
        return table.ask(key, a.model, lambda: clients[a.name].annotate(msgs, pool, annotation_check(pool)), stats[a.name], a.name)

    # OUT.partial is the run's append-only log of finished claims (rewritten whole at the end)
    with part.open("w", encoding="utf-8") as fh, progress_bar(
        total=len(targets), desc="enhance", unit="claim", enabled=job.progress
    ) as bar:

        async def process(i: int) -> None:
            rec = records[i]
            msgs = render_annotator_prompt(rec)
            pool = rec.pool_ids
            answers = await asyncio.gather(*(one(a, msgs, pool) for a in annotators))
            bad = [x for x in answers if isinstance(x, str)]
            if bad:
                failures[rec.id] = {"errors": bad}
            else:
                annotations = {}
                for a, ans in zip(annotators, answers):
                    if ans.status == OK:
                        parsed = parse_annotation(ans.content, pool)
                        stats[a.name].invented_ids += len(parsed.invented)
                        annotations[a.name] = parsed.ids
                    else:
                        annotations[a.name] = None
                out = build_output(rec, annotations, need)
                outputs[i] = out
                fh.write(json.dumps(out, ensure_ascii=False) + "\n")
                fh.flush()
            bar.update(1)

        tasks = []
        try:
            for i in targets:
                await window.acquire()
                t = asyncio.create_task(process(i))
                t.add_done_callback(lambda _t: window.release())
                tasks.append(t)
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            for c in clients.values():
                await c.close()
    return {"outputs": outputs, "failures": failures, "stats": stats}


# ---------------------------------------------------------------------------
# revote
# ---------------------------------------------------------------------------


def _check_annotations(rec: ClaimRecord, path, line) -> dict | None:
    ann = rec.extra.get("annotations")
    if ann is None:
        return None

    def bad(reason):
        raise UserError(str(RecordError(reason, field="annotations", path=path, line=line, record_id=rec.id)))

    if not isinstance(ann, dict) or not ann:
        bad("must be an object {annotator name: [ids] or null}")
    pool = set(rec.pool_ids)
    for name, ids in ann.items():
        if ids is None:
            continue
        if not isinstance(ids, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
            bad(f"annotator {name!r}: must be a list of sentence ids or null")
        unknown = sorted(set(ids) - pool)
        if unknown:
            bad(f"annotator {name!r}: ids {unknown} are not in the pool")
    return ann


def revote(records_path: Path, output: Path, min_votes: int | None) -> tuple[int, dict]:
    """Recompute ``enhanced_evidence`` from stored ``annotations``: no request is sent."""
    with run_locks("real-data enhance --revote", output, None):
        return _revote_locked(records_path, output, min_votes)


def _revote_locked(records_path: Path, output: Path, min_votes: int | None) -> tuple[int, dict]:
    outs: list[dict] = []
    claims = []
    names: list[str] | None = None
    need_seen: set[int] = set()
    try:
        rows = list(iter_with_lines(records_path, None))
    except FileNotFoundError:
        raise UserError(f"{records_path}: records file not found") from None
    except RecordError as exc:
        raise UserError(str(exc)) from None
    for line, rec in rows:
        ann = _check_annotations(rec, records_path, line)
        if ann is None:  # passed through by the enhancer (NOT_ENOUGH_INFO)
            outs.append(rec.to_dict())
            continue
        if names is None:
            names = list(ann)
        elif set(ann) != set(names):
            raise UserError(str(RecordError(
                f"annotators {sorted(ann)} differ from {sorted(names)} on earlier records",
                field="annotations", path=records_path, line=line, record_id=rec.id)))
        need = _check_min_votes(min_votes, len(ann))
        need_seen.add(need)
        out = build_output(rec, ann, need)
        outs.append(out)
        claims.append((rec.gold_ids, out["enhanced_evidence"], ann))
    if names is None:
        raise UserError(f"{records_path}: no record has 'annotations'; run `real-data enhance` on it first")
    save_records(outs, output)
    votes = vote_summary(claims, names)
    summary = {
        "complete": True,
        "revote_of": str(records_path),
        "output": str(output),
        "records": len(outs),
        "claims_total": len(claims),
        "claims_annotated": len(claims),
        "claims_failed": 0,
        "claims_passed_through_nei": len(outs) - len(claims),
        "n_annotators": len(names),
        "votes_needed": sorted(need_seen)[0],
        "requests": {"made": 0, "served_from_cache": 0, "failed": 0},
        "annotators": votes["annotators"],
        "claims_enhanced_differs_from_gold": votes["claims_enhanced_differs_from_gold"],
        "sentences_added": votes["sentences_added"],
    }
    write_summary(summary, output)
    return 0, summary


def format_summary(summary: dict) -> str:
    """Human-readable summary lines (the JSON file has everything)."""
    req = summary["requests"]
    total = summary.get("claims_total", summary["claims_annotated"])
    nei = summary.get("claims_passed_through_nei", 0)
    lines = [
        f"claims: {total} to annotate = {summary['claims_annotated']} annotated + "
        f"{summary.get('claims_failed', 0)} failed; {nei} NOT_ENOUGH_INFO passed through; "
        f"votes needed: {summary['votes_needed']} of {summary['n_annotators']}",
        f"requests: {req['made']} made, {req['served_from_cache']} served from cache, {req['failed']} failed",
    ]
    for name, a in summary["annotators"].items():
        p = "n/a" if a["precision"] is None else f"{a['precision']:.3f}"
        r = "n/a" if a["recall"] is None else f"{a['recall']:.3f}"
        tok = f", tokens in/out {a['tokens_in']}/{a['tokens_out']}" if "tokens_in" in a else ""
        reqs = f", requests {a['requests_made']} (+{a['served_from_cache']} cached, {a['failed']} failed)" \
            if "requests_made" in a else ""
        lines.append(f"  {name}: precision {p}, recall {r}, abstentions {a['abstentions']}{reqs}{tok}")
    sa = summary["sentences_added"]
    lines.append(
        f"sentences added: {sa['total']} ({sa['mean_per_claim']:.2f} per claim); "
        f"claims whose enhanced set differs from gold: {summary['claims_enhanced_differs_from_gold']}"
    )
    return "\n".join(lines)


def run(config: EnhanceConfig) -> CommandResult:
    """`real-data enhance` as a function: annotate, vote, write; the summary and the files written."""
    check_options(config)
    output = Path(config.output)
    if config.revote:
        code, summary = revote(Path(config.records), output, config.min_votes)
    else:
        job = EnhanceJob(
            records=Path(config.records),
            annotators=Path(config.annotators),
            output=output,
            cache=None if config.cache is None else Path(config.cache),
            min_votes=config.min_votes,
            include_nei=config.include_nei,
            retry_abstentions=config.retry_abstentions,
            max_in_flight=config.max_in_flight,
            progress=not config.no_progress,
            resume_command=resume_command(config),
        )
        if config.dry_run:
            return CommandResult(exit_code=dry_run(job), summary={"dry_run": True})
        # Ctrl-C / SIGTERM propagate to the top-level handler (exit 130 / 143), which
        # prints the note the runner leaves: what was kept and the command to resume.
        code, summary = enhance(job)
    print(format_summary(summary))
    print(f"summary: {summary_path(output)}")
    outputs = {name: str(summary[key]) for name, key in (("records", "output"), ("partial", "partial_output"),
                                                         ("cache", "cache")) if summary.get(key)}
    outputs["summary"] = str(summary_path(output))
    if code:
        print(
            f"enhance: {summary['claims_failed']} claims failed (requests exhausted their retries); "
            f"completed records are in {summary['partial_output']}. Run the same command again to retry them.",
            file=sys.stderr,
        )
    return CommandResult(exit_code=code, outputs=outputs, summary=summary)
