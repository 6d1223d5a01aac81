"""`real-data counterfactual`: counter-entity and counter-semantic evidence pools for `fae pave`: its
options (:class:`CounterfactualConfig`) and its run (:func:`run`), claim-aware swaps and LLM rewrites,
each label-checked.

    real-data counterfactual --records in.jsonl --output cf.jsonl --kinds entity        # rules, no model
    real-data counterfactual --records in.jsonl --output cf.jsonl \\
        --annotators recipes/annotators/local.yaml                                      # + LLM semantic

Each SUPPORT/REFUTE record gains ``counterfactual_sentences: {"entity": [...],
"semantic": [...]}``: its gold sentences transformed so that they carry the
opposite verdict (checked by rule or by an LLM judge), ids and docs kept.
Re-running resumes from the answer cache. Exit codes: 0 done, 1 some
requests failed (answers so far are cached; run again), 2 bad input,
130/143 interrupted.

Every counterfactual sentence must carry the verdict opposite to its
claim's gold label (PAVE's label consistency): REFUTE for a SUPPORT claim,
SUPPORT for a REFUTE claim. Rule-based swaps of a value the claim states
prove it by rule; every other candidate (a name swap, an LLM rewrite) goes
to an LLM judge that sees the claim and the new sentence, and is kept only
when the judge reads the intended verdict. Dropped sentences are counted by
reason in the summary.

LLM requests go through the shared LLM layer, :mod:`data_prep.llm`: the annotator YAML
(``data_prep.llm.config``), the async client with its concurrency limit,
retries and backoff (``client.AnnotatorClient``, here sending each request a
seed derived from what it asks when the temperature is above 0), and
:mod:`data_prep.llm.requests` (locks, the SQLite answer cache so re-runs and
resumed runs send nothing twice, de-duplication, token counts, interrupts,
the atomic summary). Files next to ``--output OUT``: ``OUT`` (every input record, written
atomically once no request failed), ``OUT.summary.json`` (per-kind counts,
dropped sentences by reason, requests and tokens), ``OUT.cache.sqlite``
(default ``--cache``), ``OUT.lock``/``CACHE.lock``.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal


from real_fae_core.command import CommandConfig, CommandResult, command_line, option
from real_fae_core.errors import UserError
from real_fae_core.flags import SpacedList
from real_fae_core.hashing import sha256_seed
from real_fae_core.outputs import claim_file
from data_prep.llm import requests as llm_requests
from data_prep.llm.cache import OK, AnswerCache, CachedAnswer, request_key
from data_prep.llm.client import AnnotatorClient, AnnotatorStats
from data_prep.llm.config import ConfigError, load_annotators
from data_prep.llm.requests import summary_path
from real_fae_core.progress import progress_bar
from data_prep.records import (
    REFUTE,
    SUPPORT,
    ClaimRecord,
    Sentence,
    load_records_or_fail,
    save_records,
)

from . import KINDS
from .entity import SpanCorpus, claim_aware_swap
from .rewrite import (
    MIN_OVERLAP,
    OPPOSITE,
    judge_messages,
    parse_rewrite,
    parse_verdict,
    rewrite_messages,
    rewrite_problem,
    verdict_problem,
)


@dataclasses.dataclass
class CounterfactualConfig(CommandConfig):
    """`real-data counterfactual`: counterfactual evidence pools for `fae pave`."""

    records: str = option(help="input claim records (JSONL)")
    output: str = option(help="output JSONL (summary: OUTPUT.summary.json)")
    kinds: list[str] = option(default_factory=lambda: list(KINDS), action=SpacedList, metavar="KIND",
                              help=f"kinds to build: {', '.join(KINDS)} (default all: --kinds {' '.join(KINDS)})")
    entity_method: Literal["rules", "llm"] = option(
        "rules", help="rules: swap spans from the records' own sentences, no model (default); llm: ask the annotator")
    annotators: str | None = option(None, help="annotators YAML, as for `real-data enhance` (needed for semantic and "
                                               "--entity-method llm)")
    annotator: str | None = option(None, metavar="NAME", help="which entry of --annotators to use (default: the first)")
    judge: str | None = option(None, metavar="NAME", help="entry of --annotators that checks each counterfactual's "
                                                          "verdict (default: --annotator)")
    cache: str | None = option(None, help="SQLite answer cache (default OUTPUT.cache.sqlite)")
    seed: int = option(0, help="seed of the rule-based swaps and of the requests' seeds at temperature > 0")
    min_overlap: float | None = option(None, min=0, max=1, metavar="FRACTION", help="share of the original's content "
                                       "words a semantic rewrite must keep (default 0.3)")
    no_progress: bool = option(False)

FIELD = "counterfactual_sentences"


@dataclass
class CounterfactualJob:
    records: Path
    output: Path
    kinds: tuple[str, ...] = ("entity", "semantic")
    entity_method: str = "rules"  # or "llm"
    annotators: Path | None = None
    annotator: str | None = None  # entry name; default the first
    judge: str | None = None  # entry name of the label-consistency judge; default the annotator
    cache: Path | None = None
    seed: int = 0
    min_overlap: float | None = None  # semantic rewrites; None = MIN_OVERLAP["semantic"]
    progress: bool = True
    resume_command: str | None = None

    @property
    def cache_path(self) -> Path:
        """The LLM answer cache: ``cache`` when given, else the default one beside ``output``."""
        return Path(self.cache) if self.cache else llm_requests.default_cache_path(Path(self.output))

    def llm_kinds(self) -> list[str]:
        """The kinds an LLM writes (semantic always, entity with ``entity_method`` llm), in ``kinds``' order."""
        return [k for k in self.kinds if k == "semantic" or (k == "entity" and self.entity_method == "llm")]

    def overlap(self, kind: str) -> float:
        """The least topic overlap a rewrite of ``kind`` must keep (``min_overlap`` overrides the semantic one)."""
        return self.min_overlap if kind == "semantic" and self.min_overlap is not None else MIN_OVERLAP[kind]


def gold_sentences(rec: ClaimRecord):
    """The record's gold sentences, in pool order: the ones a counterfactual is made from."""
    gold = set(rec.gold_ids)
    return [s for s in rec.sentences if s.id in gold]


def run_counterfactual(job: CounterfactualJob) -> tuple[int, dict]:
    """Counterfactual sentences for the SUPPORT/REFUTE records with gold evidence, holding the output's
    (and cache's) locks: (exit code, summary); 1 when requests failed (their answers so far are cached)."""
    records = load_records_or_fail(job.records)
    targets = [i for i, r in enumerate(records) if r.label in (SUPPORT, REFUTE) and r.gold_ids]
    with llm_requests.run_locks("real-data counterfactual", Path(job.output),
                   job.cache_path if job.annotators is not None else None):
        return _run_locked(job, records, targets)


# ---------------------------------------------------------------------------
# The command's run: its options checked, the job, what it prints
# ---------------------------------------------------------------------------

def _job(config: CounterfactualConfig) -> CounterfactualJob:
    """The job for ``config``, after the checks of its options."""
    kinds = tuple(config.kinds)
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise UserError(f"--kinds: unknown kind {bad[0] if bad else '(none)'!r}; choose from {', '.join(KINDS)}")
    if Path(config.records).resolve() == Path(config.output).resolve():
        raise UserError("--output must differ from --records")
    claim_file(config.output, "real-data counterfactual", inputs=[config.records, config.annotators])
    job = CounterfactualJob(records=Path(config.records), output=Path(config.output), kinds=kinds,
                            entity_method=config.entity_method, annotators=_path(config.annotators),
                            annotator=config.annotator, judge=config.judge, cache=_path(config.cache),
                            seed=config.seed, min_overlap=config.min_overlap, progress=not config.no_progress)
    job.resume_command = command_line("real-data counterfactual", config)
    if config.judge and config.annotators is None:
        raise UserError("--judge needs --annotators")
    if job.llm_kinds() and config.annotators is None:
        raise UserError(f"--annotators is required for {', '.join(job.llm_kinds())} "
                        "(or use --kinds entity with the default --entity-method rules)")
    return job


def run(config: CounterfactualConfig) -> CommandResult:
    """`real-data counterfactual` as a function: the records with counterfactual evidence and the summary
    file; exit code 1 when requests failed (rerun the same command to finish)."""
    code, summary = run_counterfactual(_job(config))
    for kind, k in summary["kinds"].items():
        why = "; ".join(f"{n} {reason}" for reason, n in k["dropped_by_reason"].items())
        print(f"{kind} ({k['method']}): {k['kept']}/{k['sentences']} gold sentences kept with the opposite verdict "
              f"({k['label_check']['rule']} by rule, {k['label_check']['judge']} by the judge), "
              f"{k['dropped']} dropped{': ' + why if why else ''}; "
              f"{k['records_with_pool']}/{summary['claims']} claims have a pool")
    if summary["requests_by_task"]:
        r, t = summary["requests"], summary["tokens"]
        print(f"requests: {r['made']} made, {r['served_from_cache']} served from cache, {r['failed']} failed; "
              f"tokens in/out {t['in']}/{t['out']}")
    output = Path(config.output)
    print(f"summary: {summary_path(output)}")
    if code:
        print(f"counterfactual: {summary['transport_failures']} requests failed "
              f"({'; '.join(summary['failure_examples'][:1])}); answers so far are cached, "
              "run the same command again", file=sys.stderr)
    outputs = {"records": str(summary["output"])} if summary.get("output") else {}
    outputs["summary"] = str(summary_path(output))
    return CommandResult(exit_code=code, outputs=outputs, summary=summary)


def _path(value: str | None) -> Path | None:
    return None if value is None else Path(value)


@dataclass
class Candidate:
    """One counterfactual sentence waiting for (or past) its label-consistency check."""

    index: int  # into records
    kind: str
    sentence: Sentence
    text: str
    check: str | None = None  # "rule" when the swap proves the flip; "judge" once the judge agreed
    swaps: tuple = ()


def _reason_category(reason: str) -> str:
    """A dropped sentence's reason without its particulars, for counting."""
    return re.sub(r"\s*\([^()]*\)$", "", reason)


@dataclass
class _Pass:
    """One counterfactual pass: the candidates at each stage, what was dropped and why, the requests made."""

    job: CounterfactualJob
    records: list[ClaimRecord]
    targets: list[int]
    dropped: dict[str, list[dict]] = dataclasses.field(default_factory=dict)
    checked: list[Candidate] = dataclasses.field(default_factory=list)
    unchecked: list[Candidate] = dataclasses.field(default_factory=list)
    transport: list[str] = dataclasses.field(default_factory=list)  # requests that failed in transport
    usage: llm_requests.RequestUsage = dataclasses.field(default_factory=llm_requests.RequestUsage)
    ann: AnnotatorClient | None = None
    judge: AnnotatorClient | None = None

    def drop(self, i: int, kind: str, sent: Sentence, reason: str) -> None:
        self.dropped.setdefault(kind, []).append({"id": self.records[i].id, "sentence": sent.id, "reason": reason})

    def gold(self):
        """(record index, record, gold sentence) of every target claim."""
        return [(i, self.records[i], sent) for i in self.targets for sent in gold_sentences(self.records[i])]


def _run_locked(job: CounterfactualJob, records: list[ClaimRecord], targets: list[int]) -> tuple[int, dict]:
    t0 = time.monotonic()
    run = _Pass(job, records, targets, dropped={k: [] for k in job.kinds})
    if "entity" in job.kinds and job.entity_method == "rules":
        swap_claimed_values(run)
    if job.annotators is not None:
        run.ann = _annotator(job, job.annotator, "--annotator")
        run.judge = _annotator(job, job.judge, "--judge") if job.judge else run.ann
    if job.llm_kinds():
        rewrite_with_llm(run)
    check_labels_with_judge(run)
    pools = counterfactual_pools(run)
    outputs = records_with_pools(job, records, pools)
    complete = not run.transport
    if complete:
        save_records(outputs, job.output)
    summary = pass_summary(run, pools, complete, time.monotonic() - t0)
    llm_requests.write_summary(summary, job.output)
    return (0 if complete else 1), summary


def swap_claimed_values(run: _Pass) -> None:
    """Entity kind by rules: swap a span the claim states; proved flips are checked, the rest await the judge."""
    corpus = SpanCorpus.from_texts(s.text for r in run.records for s in r.sentences)
    for i, rec, sent in run.gold():
        swap, why = claim_aware_swap(rec.claim, rec.label, sent.text, corpus, seed=run.job.seed,
                                     record_id=rec.id, sentence_id=sent.id)
        if swap is None:
            run.drop(i, "entity", sent, why)
            continue
        cand = Candidate(i, "entity", sent, swap.text, "rule" if swap.proved else None, swap.swaps)
        (run.checked if swap.proved else run.unchecked).append(cand)


def rewrite_with_llm(run: _Pass) -> None:
    """LLM kinds: one rewrite request per gold sentence and kind; usable rewrites await the judge."""
    items, owners = [], []
    for kind in run.job.llm_kinds():
        for i, rec, sent in run.gold():
            items.append(_rewrite_request(run.job, run.ann, kind, rec, sent))
            owners.append((i, kind, sent))
    for (i, kind, sent), ans in zip(owners, _ask(run.job, run.ann, items, run.usage, "rewrite")):
        if isinstance(ans, str):
            run.transport.append(ans)
            continue
        problem = rewrite_problem(sent.text, ans.content, run.job.overlap(kind)) if ans.status == OK else ans.error
        if problem:
            run.drop(i, kind, sent, f"rewrite failed: {problem}")
        else:
            run.unchecked.append(Candidate(i, kind, sent, parse_rewrite(ans.content)[0]))


def check_labels_with_judge(run: _Pass) -> None:
    """Keep an unproved candidate only when the judge reads the verdict opposite to the claim's gold label."""
    if run.unchecked and run.judge is None:
        for c in run.unchecked:
            run.drop(c.index, c.kind, c.sentence, "a name swap, not provable by rule, and no judge (give --annotators)")
        return
    if not run.unchecked:
        return
    items = [_judge_request(run.job, run.judge, c, run.records[c.index]) for c in run.unchecked]
    for c, ans in zip(run.unchecked, _ask(run.job, run.judge, items, run.usage, "judge")):
        if isinstance(ans, str):
            run.transport.append(ans)
            continue
        verdict, problem = parse_verdict(ans.content) if ans.status == OK else (None, ans.error)
        want = OPPOSITE[run.records[c.index].label]
        if verdict is None:
            run.drop(c.index, c.kind, c.sentence, f"label check: the judge's answer is unusable ({problem})")
        elif verdict != want:
            run.drop(c.index, c.kind, c.sentence, f"label check: the judge reads {verdict}, not {want}")
        else:
            c.check = "judge"
            run.checked.append(c)


def counterfactual_pools(run: _Pass) -> dict[int, dict[str, list[dict]]]:
    """Record index -> kind -> the checked sentences, in kind order then sentence id."""
    pools: dict[int, dict[str, list[dict]]] = {i: {} for i in run.targets}
    for c in sorted(run.checked, key=lambda c: (c.index, run.job.kinds.index(c.kind), c.sentence.id)):
        item = {"id": c.sentence.id, "text": c.text}
        if c.sentence.doc is not None:
            item["doc"] = c.sentence.doc
        item["check"] = c.check
        pools[c.index].setdefault(c.kind, []).append(item)
    return pools


def records_with_pools(job: CounterfactualJob, records: list[ClaimRecord], pools: dict) -> list[dict]:
    """Every input record, with this pass's kinds replaced in its counterfactual field (other kinds kept)."""
    outputs = []
    for i, rec in enumerate(records):
        out = rec.to_dict()
        if i in pools:
            old = out.get(FIELD)
            merged = dict(old) if isinstance(old, dict) else {}  # kinds not asked for this time are kept
            for kind in job.kinds:
                merged.pop(kind, None)
                if pools[i].get(kind):
                    merged[kind] = pools[i][kind]
            out.pop(FIELD, None)
            if merged:
                out[FIELD] = merged
        outputs.append(out)
    return outputs


def kind_summary(run: _Pass, kind: str, pools: dict) -> dict:
    """One kind's counts: kept (by check), dropped (by reason), records that got a pool (by label)."""
    records, targets, job = run.records, run.targets, run.job
    kept = [c for c in run.checked if c.kind == kind]
    reasons: dict[str, int] = {}
    for d in run.dropped[kind]:
        cat = _reason_category(d["reason"])
        reasons[cat] = reasons.get(cat, 0) + 1
    out = {
        "method": "llm" if kind in job.llm_kinds() else "rules",
        "sentences": len(run.gold()),
        "kept": len(kept),
        "label_check": {"rule": sum(c.check == "rule" for c in kept),
                        "judge": sum(c.check == "judge" for c in kept)},
        "dropped": len(run.dropped[kind]),
        "dropped_by_reason": dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
        "records_with_pool": sum(1 for i in targets if pools[i].get(kind)),
        "records_with_pool_by_label": {
            label: sum(1 for i in targets if pools[i].get(kind) and records[i].label == label)
            for label in (SUPPORT, REFUTE)},
        "dropped_sentences": run.dropped[kind],
    }
    if kind == "entity" and job.entity_method == "rules":
        swapped: dict[str, int] = {}
        for c in run.checked:
            for sw in c.swaps:
                swapped[sw.kind] = swapped.get(sw.kind, 0) + 1
        out["swapped_span_kinds"] = dict(sorted(swapped.items()))
    return out


def pass_summary(run: _Pass, pools: dict, complete: bool, seconds: float) -> dict:
    """OUT.summary.json: per-kind counts, the models asked, requests, tokens and transport failures."""
    job, records, targets = run.job, run.records, run.targets
    model = {"name": run.ann.name, "model": run.ann.model} if run.ann is not None else None
    judge_model = {"name": run.judge.name, "model": run.judge.model} if run.judge is not None else None
    return {
        "complete": complete,
        "records_file": str(job.records),
        "output": str(job.output) if complete else None,
        "records": len(records),
        "claims": len(targets),
        "claims_by_label": {label: sum(1 for i in targets if records[i].label == label) for label in (SUPPORT, REFUTE)},
        "seed": job.seed,
        "intended_verdict": {SUPPORT: OPPOSITE[SUPPORT], REFUTE: OPPOSITE[REFUTE]},
        "kinds": {kind: kind_summary(run, kind, pools) for kind in job.kinds},
        "annotator": model,
        "judge": judge_model,
        "request_seeds": _seed_note(run.ann, run.judge),
        "cache": str(job.cache_path) if run.ann is not None else None,
        "requests": run.usage.requests(),
        "requests_by_task": run.usage.by_task,
        "tokens": run.usage.tokens,
        "transport_failures": len(run.transport),
        "failure_examples": sorted(set(run.transport))[:5],
        "elapsed_s": round(seconds, 3),
    }


def _seed_note(*anns) -> str | None:
    hot = sorted({a.name for a in anns if a is not None and a.temperature > 0})
    if not hot:
        return None
    return (f"temperature > 0 ({', '.join(hot)}): each request's seed is derived from (--seed, record id, "
            "sentence id, task, attempt), so a resumed or reordered run asks the same questions with the same "
            "seeds (the same answers where the server honours seeds)")


def _annotator(job: CounterfactualJob, name: str | None, flag: str):
    try:
        anns = load_annotators(job.annotators)
    except ConfigError as exc:
        raise UserError(str(exc)) from None
    if name is None:
        return anns[0]
    for a in anns:
        if a.name == name:
            return a
    raise UserError(f"{flag} {name!r} is not in {job.annotators} (names: {', '.join(a.name for a in anns)})")


def request_seed(seed: int, record_id: str, sentence_id: int, task: str, attempt: int) -> int:
    """The ``seed`` of one request: a function of what is asked, never of the order of asking."""
    return sha256_seed(seed, record_id, sentence_id, task, attempt, bits=31)  # every server's integer seed accepts 31


@dataclass
class Request:
    messages: list[dict[str, str]]
    key: str
    check: Callable[[str | None], str | None]
    seed_of: Callable[[int], int] | None  # attempt -> request seed; None at temperature 0


def _request(job, ann, messages, check, task: str, rec: ClaimRecord, sent: Sentence, key_extra: dict) -> Request:
    seed_of = None
    decoding = {**ann.decoding(), "malformed_retries": ann.malformed_retries, **key_extra}
    if ann.temperature > 0:
        def seed_of(attempt, _args=(job.seed, rec.id, sent.id, task)):
            return request_seed(*_args, attempt)
        decoding["seed"] = seed_of(0)  # later attempts' seeds follow from it
    # Every setting that changes what is kept is in the key: a rerun with another one asks again.
    return Request(messages, request_key(ann.model, messages, decoding), check, seed_of)


def _rewrite_request(job, ann, kind: str, rec: ClaimRecord, sent: Sentence) -> Request:
    messages = rewrite_messages(kind, sent.text, rec.claim, OPPOSITE[rec.label])
    overlap = job.overlap(kind)
    return _request(job, ann, messages, lambda c: rewrite_problem(sent.text, c, overlap), f"rewrite-{kind}",
                    rec, sent, {"rewrite_min_overlap": overlap})


def _judge_request(job, ann, cand: Candidate, rec: ClaimRecord) -> Request:
    return _request(job, ann, judge_messages(rec.claim, cand.text), verdict_problem, f"judge-{cand.kind}",
                    rec, cand.sentence, {"task": "label-check"})


_ATTEMPT: contextvars.ContextVar[list | None] = contextvars.ContextVar("counterfactual_attempt", default=None)


class SeededClient(AnnotatorClient):
    """The shared LLM client, sending each request the seed of its (record, sentence, task, attempt).

    The seed rides in a context variable of the request's own task, so
    concurrent requests never see each other's; a transport retry resends the
    same attempt's seed, a malformed answer's re-ask moves to the next.
    """

    def request_options(self, pool_ids, reask: int = 0) -> dict:
        """The client's request options plus the seed of this task's current attempt (none outside
        :meth:`annotate_seeded`)."""
        kwargs = super().request_options(pool_ids, reask)
        state = _ATTEMPT.get()
        if state is not None:
            seed_of, attempt = state
            kwargs["seed"] = seed_of(attempt)
        return kwargs

    async def annotate_seeded(self, req: Request) -> CachedAnswer:
        """The cached or fresh answer to ``req``, each attempt sent with ``req.seed_of(attempt)`` (no seed when the
        request has none); a re-ask after a malformed answer is the next attempt."""
        if req.seed_of is None:
            return await self.annotate(req.messages, [], check=req.check)
        state = [req.seed_of, 0]
        _ATTEMPT.set(state)

        def check(content):
            state[1] += 1  # an answer arrived: a re-ask is the next attempt
            return req.check(content)

        return await self.annotate(req.messages, [], check=check)


def _ask(job: CounterfactualJob, ann, items: list[Request], usage: llm_requests.RequestUsage, task: str):
    """One answer per request (CachedAnswer, or an error string for a transport failure)."""
    cache = AnswerCache(job.cache_path)
    try:
        need_key = any(cache.get(r.key) is None for r in items)
        try:
            api_key = ann.api_key() if need_key else None
        except ConfigError as exc:
            raise UserError(str(exc)) from None
        answers, stats = llm_requests.run_requests(_ask_async(job, ann, api_key, items, cache, task), cache,
                                                   job.resume_command)
        usage.add(task, stats)
        return answers
    finally:
        cache.close()


async def _ask_async(job, ann, api_key, items: list[Request], cache, task: str):
    stats = AnnotatorStats()
    # The annotator schema ({"evidence": [...]}) fits neither a rewrite ({"sentence": ...}) nor a verdict:
    # these requests are never sent with the annotators' constrained decoding.
    ann = dataclasses.replace(ann, constrained_decoding=False)
    client = SeededClient(ann, api_key) if api_key is not None else None
    if client is not None:
        client.stats = stats
    table = llm_requests.RequestTable(cache, "counterfactual")

    try:
        with progress_bar(total=len(items), desc=f"counterfactual {task}", unit="sentence",
                          enabled=job.progress) as bar:
            async def tracked(req: Request):
                try:
                    return await table.ask(req.key, ann.model, lambda: client.annotate_seeded(req), stats, ann.name)
                finally:
                    bar.update(1)

            answers = await asyncio.gather(*(tracked(r) for r in items))
    finally:
        if client is not None:
            await client.close()
    return list(answers), stats
