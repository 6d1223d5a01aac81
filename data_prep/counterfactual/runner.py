"""`real-data counterfactual` orchestration: rule-based swaps and LLM rewrites into records.

LLM requests reuse the enhancement machinery unchanged: the annotator YAML
(``data_prep.enhance.config``), the async client with its concurrency limit,
retries and backoff (``client.AnnotatorClient``, whose answer check is this
package's topic check), the SQLite answer cache (re-runs and resumed runs
send nothing twice) and its token counts. Files next to ``--output OUT``:
``OUT`` (every input record, written atomically once no request failed),
``OUT.summary.json`` (per-kind counts, failed rewrites, requests and tokens),
``OUT.cache.sqlite`` (default ``--cache``), ``OUT.lock``/``CACHE.lock``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from data_prep.core.cli import set_interrupt_note
from data_prep.core.errors import Terminated, UserError
from data_prep.core.runlock import RunLock
from data_prep.core.secrets import scrub
from data_prep.enhance.cache import OK, AnswerCache, request_key
from data_prep.enhance.client import AnnotatorClient, TransportFailure
from data_prep.enhance.config import ConfigError, load_annotators
from data_prep.enhance.runner import TERMINATED, cancel_on_sigterm
from data_prep.records import (
    REFUTE,
    SUPPORT,
    ClaimRecord,
    load_records_or_fail,
    save_records,
)

from .entity import SpanCorpus, entity_swap
from .rewrite import MIN_OVERLAP, parse_rewrite, rewrite_messages, rewrite_problem

FIELD = "counterfactual_sentences"


@dataclass
class CounterfactualJob:
    records: Path
    output: Path
    kinds: tuple[str, ...] = ("entity", "semantic")
    entity_method: str = "rules"  # or "llm"
    annotators: Path | None = None
    annotator: str | None = None  # entry name; default the first
    cache: Path | None = None
    seed: int = 0
    swaps: int = 1
    min_overlap: float | None = None  # semantic rewrites; None = MIN_OVERLAP["semantic"]
    progress: bool = True
    resume_command: str | None = None

    @property
    def cache_path(self) -> Path:
        return Path(self.cache) if self.cache else self.output.with_name(self.output.name + ".cache.sqlite")

    def llm_kinds(self) -> list[str]:
        return [k for k in self.kinds if k == "semantic" or (k == "entity" and self.entity_method == "llm")]

    def overlap(self, kind: str) -> float:
        return self.min_overlap if kind == "semantic" and self.min_overlap is not None else MIN_OVERLAP[kind]


def gold_sentences(rec: ClaimRecord):
    gold = set(rec.gold_ids)
    return [s for s in rec.sentences if s.id in gold]


def summary_path(output: Path) -> Path:
    return output.with_name(output.name + ".summary.json")


def run_counterfactual(job: CounterfactualJob) -> tuple[int, dict]:
    records = load_records_or_fail(job.records)
    targets = [i for i, r in enumerate(records) if r.label in (SUPPORT, REFUTE) and r.gold_ids]
    locks = [RunLock(job.output, "real-data counterfactual", is_dir=False)]
    if job.llm_kinds():
        locks.append(RunLock(job.cache_path, "real-data counterfactual", is_dir=False))
    try:
        for lock in locks:
            lock.acquire()
        return _run_locked(job, records, targets)
    finally:
        for lock in reversed(locks):
            lock.release()


def _run_locked(job: CounterfactualJob, records: list[ClaimRecord], targets: list[int]) -> tuple[int, dict]:
    t0 = time.monotonic()
    pools: dict[int, dict[str, list[dict]]] = {i: {} for i in targets}
    failed: dict[str, list[dict]] = {k: [] for k in job.kinds}
    swapped_kinds: dict[str, int] = {}

    def add(i, kind, sent, text):
        s = {"id": sent.id, "text": text}
        if sent.doc is not None:
            s["doc"] = sent.doc
        pools[i].setdefault(kind, []).append(s)

    if "entity" in job.kinds and job.entity_method == "rules":
        corpus = SpanCorpus.from_texts(s.text for r in records for s in r.sentences)
        for i in targets:
            for sent in gold_sentences(records[i]):
                got = entity_swap(sent.text, corpus, seed=job.seed, record_id=records[i].id,
                                  sentence_id=sent.id, swaps=job.swaps)
                if got is None:
                    failed["entity"].append({"id": records[i].id, "sentence": sent.id,
                                             "reason": "no salient span with an alternative in the corpus"})
                    continue
                add(i, "entity", sent, got[0])
                for sw in got[1]:
                    swapped_kinds[sw.kind] = swapped_kinds.get(sw.kind, 0) + 1

    requests = {"made": 0, "served_from_cache": 0, "failed": 0}
    tokens = {"in": 0, "out": 0, "in_incl_cache": 0, "out_incl_cache": 0}
    model = None
    transport: list[str] = []
    if job.llm_kinds():
        ann = _annotator(job)
        model = {"name": ann.name, "model": ann.model}
        jobs = [(i, kind, sent) for kind in job.llm_kinds() for i in targets for sent in gold_sentences(records[i])]
        answers, stats = _ask(job, ann, jobs)
        requests = {"made": stats.requests, "served_from_cache": stats.from_cache, "failed": stats.failed}
        tokens = {"in": stats.tokens_in, "out": stats.tokens_out,
                  "in_incl_cache": stats.tokens_in_all, "out_incl_cache": stats.tokens_out_all}
        for (i, kind, sent), ans in zip(jobs, answers):
            if isinstance(ans, str):
                transport.append(ans)
                continue
            problem = rewrite_problem(sent.text, ans.content, job.overlap(kind)) if ans.status == OK else ans.error
            if problem:
                failed[kind].append({"id": records[i].id, "sentence": sent.id, "reason": problem})
            else:
                add(i, kind, sent, parse_rewrite(ans.content)[0])

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
    complete = not transport
    if complete:
        save_records(outputs, job.output)
    per_kind = {}
    for kind in job.kinds:
        n_sent = sum(len(gold_sentences(records[i])) for i in targets)
        per_kind[kind] = {
            "method": "llm" if kind in job.llm_kinds() else "rules",
            "sentences": n_sent,
            "rewritten": sum(len(pools[i].get(kind, [])) for i in targets),
            "failed": len(failed[kind]),
            "records_with_pool": sum(1 for i in targets if pools[i].get(kind)),
            "failed_rewrites": failed[kind],
        }
        if kind == "entity" and job.entity_method == "rules":
            per_kind[kind]["swapped_span_kinds"] = dict(sorted(swapped_kinds.items()))
    summary = {
        "complete": complete,
        "records_file": str(job.records),
        "output": str(job.output) if complete else None,
        "records": len(records),
        "claims": len(targets),
        "seed": job.seed,
        "kinds": per_kind,
        "annotator": model,
        "cache": str(job.cache_path) if job.llm_kinds() else None,
        "requests": requests,
        "tokens": tokens,
        "transport_failures": len(transport),
        "failure_examples": sorted(set(transport))[:5],
        "elapsed_s": round(time.monotonic() - t0, 3),
    }
    path = summary_path(job.output)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return (0 if complete else 1), summary


def _annotator(job: CounterfactualJob):
    if job.annotators is None:
        raise UserError(f"--annotators is required for LLM kinds ({', '.join(job.llm_kinds())})")
    try:
        anns = load_annotators(job.annotators)
    except ConfigError as exc:
        raise UserError(str(exc)) from None
    if job.annotator is None:
        return anns[0]
    for a in anns:
        if a.name == job.annotator:
            return a
    raise UserError(f"--annotator {job.annotator!r} is not in {job.annotators} "
                    f"(names: {', '.join(a.name for a in anns)})")


def _ask(job: CounterfactualJob, ann, jobs):
    """One answer per job (CachedAnswer, or an error string for a transport failure)."""
    cache = AnswerCache(job.cache_path)
    try:
        # The topic check's threshold decides whether an answer was kept or abstained, so it is part of
        # the key: a rerun with another --min-overlap asks again instead of replaying old verdicts.
        keys = [request_key(ann.model, rewrite_messages(kind, sent.text),
                            {**ann.decoding(), "rewrite_min_overlap": job.overlap(kind)})
                for _, kind, sent in jobs]
        need_key = any(cache.get(k) is None for k in keys)
        try:
            api_key = ann.api_key() if need_key else None
        except ConfigError as exc:
            raise UserError(str(exc)) from None
        try:
            state = asyncio.run(cancel_on_sigterm(_ask_async(job, ann, api_key, jobs, keys, cache)))
            if state is TERMINATED:
                raise Terminated()
        except KeyboardInterrupt:
            set_interrupt_note(f"kept {len(cache)} answers in the cache {job.cache_path}; resume with: "
                               f"{job.resume_command or 'the same command'}")
            raise
        return state
    finally:
        cache.close()


async def _ask_async(job, ann, api_key, jobs, keys, cache):
    from data_prep.enhance.client import AnnotatorStats

    stats = AnnotatorStats()
    # The annotator schema ({"evidence": [...]}) does not fit a rewrite ({"sentence": ...}):
    # rewrites are never sent with the annotators' constrained decoding.
    ann = dataclasses.replace(ann, constrained_decoding=False)
    client = AnnotatorClient(ann, api_key) if api_key is not None else None
    if client is not None:
        client.stats = stats
    inflight: dict[str, asyncio.Future] = {}

    async def fetch(kind, sent, key):
        msgs = rewrite_messages(kind, sent.text)
        try:
            ans = await client.annotate(msgs, [], check=lambda c: rewrite_problem(sent.text, c, job.overlap(kind)))
        except TransportFailure as exc:
            return scrub(f"{ann.name}: {exc}")
        cache.put(key, ann.model, ans)
        if ans.status == OK:
            stats.answered += 1
        else:
            stats.abstained += 1
        return ans

    async def one(job_item, key):
        _, kind, sent = job_item
        hit = cache.get(key)
        if hit is None and key in inflight:
            hit = await inflight[key]
        elif hit is None:
            inflight[key] = asyncio.ensure_future(fetch(kind, sent, key))
            hit = await inflight[key]
            if isinstance(hit, str):
                stats.failed += 1
                return hit
            stats.tokens_in_all += hit.prompt_tokens
            stats.tokens_out_all += hit.completion_tokens
            return hit
        if isinstance(hit, str):
            stats.failed += 1
            return hit
        stats.from_cache += 1
        stats.tokens_in_all += hit.prompt_tokens
        stats.tokens_out_all += hit.completion_tokens
        return hit

    try:
        with tqdm(total=len(jobs), desc="counterfactual", unit="sentence",
                  disable=None if job.progress else True) as bar:
            async def tracked(item, key):
                try:
                    return await one(item, key)
                finally:
                    bar.update(1)

            answers = await asyncio.gather(*(tracked(j, k) for j, k in zip(jobs, keys)))
    finally:
        if client is not None:
            await client.close()
    return list(answers), stats
