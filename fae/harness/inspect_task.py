"""FAE as an Inspect AI task: samples, the ablation solver, the scorer and its metrics (SPEC §6).

Everything FAE-specific is the project's own code, called from Inspect's hooks:

- the samples are our records (SPEC §2, :func:`data_prep.records.load_records`), NEI-gold ones
  left out and counted as ``fae run`` does (:func:`fae.ablation.population.fae_claims`);
- the solver asks round 0 on the full pool and each later round on the pool minus what the
  previous answer cited, with :func:`data_prep.prompts.render_evidence_prompt` for the prompt,
  :func:`fae.ablation.engine.make_round` (the strict parser) for the answer and
  :func:`fae.ablation.engine.advance` for the schedule, so a round whose pool did not change is
  copied with ``reused: true`` exactly as ``fae run`` copies it;
- the scorer turns the rounds into the claims.jsonl entry (:func:`fae.ablation.engine.claim_entry`)
  and the metric computes Acc, Strict, FEVER, IS, ER, IO with :func:`fae.ablation.metrics.compute_metrics`.

A round whose generate fails (a provider error after Inspect's retries, a limit reached) ends
the sample with an error that names the claim and the round: Inspect does not score an errored
sample, so a claim whose rounds did not all complete never enters the metrics. The rounds that
did complete stay in the sample's store (:data:`STORE_KEY`), visible in ``inspect view``.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from inspect_ai import Task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.model import ChatMessageSystem, ChatMessageUser, GenerateConfig
from inspect_ai.scorer import SampleScore, Score, Target, metric, scorer
from inspect_ai.solver import Generate, TaskState, solver

from real_fae_core.errors import UserError
from real_fae_core.hashing import sha256_file
from data_prep.prompts import PROMPT_FORMAT_VERSION, render_evidence_prompt
from data_prep.records import ClaimRecord, load_records_or_fail
from fae.ablation.engine import advance, claim_entry, make_round
from fae.ablation.metrics import compute_metrics, nei_exclusion_note, round_accuracy, strict_accuracy
from fae.ablation.population import fae_claims

TASK_NAME = "real_fae/fae"
# Where a sample keeps its rounds (the sample's store, saved in the log even when the sample errs)
STORE_KEY = "real_fae:rounds"
# Sample metadata: the record itself, so the solver needs nothing but the sample
RECORD_KEY = "record"
# Score metadata: the claims.jsonl entry of the claim (SPEC §6, docs/fae.md)
CLAIM_KEY = "fae_claim"
# fae run's default answer length cap (fae.backends.BackendOptions.max_new_tokens)
DEFAULT_MAX_TOKENS = 64
# The metrics the task reports, as Inspect names them, and the metrics.json key of each
METRIC_NAMES = {"accuracy": "label_accuracy", "strict": "strict_accuracy", "fever": "fever_score",
                "IS": "IS", "ER": "ER", "IO": "IO"}
TASK_OPTIONS = ("records", "rounds", "max_tokens")


class RoundError(RuntimeError):
    """A round of a claim did not complete: the sample ends in error and is not scored."""


# ---------------------------------------------------------------------------
# samples
# ---------------------------------------------------------------------------


def chat_messages(messages: Sequence[dict[str, str]]) -> list[ChatMessageSystem | ChatMessageUser]:
    """Our rendered prompt (system + user dicts) as Inspect chat messages, text unchanged."""
    kinds = {"system": ChatMessageSystem, "user": ChatMessageUser}
    return [kinds[m["role"]](content=m["content"]) for m in messages]


def record_sample(record: ClaimRecord) -> Sample:
    """One record as a sample: input = the round-0 prompt, target = the gold label, the record in metadata."""
    return Sample(
        id=record.id,
        input=chat_messages(render_evidence_prompt(record)),
        target=record.label,
        metadata={RECORD_KEY: record.to_dict()},
    )


def check_options(records: Any, rounds: Any, max_tokens: Any,
                  unknown: dict[str, Any] | None = None) -> tuple[Path, int, int]:
    """The task options, checked: one line naming the option and what is wrong."""
    extra = sorted(k for k in (unknown or {}) if k != "model")  # Inspect may pass the model along
    if extra:
        raise UserError(f"unknown task option {extra[0]!r} (the options are {', '.join(TASK_OPTIONS)})")
    if records is None:
        raise UserError("task option records is required: -T records=FILE.jsonl")
    if not isinstance(records, (str, os.PathLike)) or not str(records):
        raise UserError(f"task option records: give the records .jsonl file (got {records!r})")
    for name, value, low in (("rounds", rounds, 0), ("max_tokens", max_tokens, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise UserError(f"task option {name}: expected an integer >= {low} (got {value!r})")
    path = Path(records)
    if path.is_dir():
        raise UserError(f"task option records: {path} is a directory; give the records .jsonl file")
    return path, int(rounds), int(max_tokens)


def load_samples(path: Path) -> tuple[list[Sample], int]:
    """(samples of the SUPPORT/REFUTE records, number of NEI-gold records left out); bad records: UserError."""
    records = load_records_or_fail(path)
    kept, n_nei = fae_claims(records, source=str(path))
    if not kept:
        raise UserError(f"{path}: no records")
    return [record_sample(r) for r in kept], n_nei


def fae_task(records: str | None, rounds: int = 4, max_tokens: int = DEFAULT_MAX_TOKENS,
             unknown: dict[str, Any] | None = None) -> Task:
    """The FAE task over a records file: R = ``rounds`` ablation rounds after round 0, greedy answers
    of at most ``max_tokens`` tokens (the defaults of ``fae run``). ``unknown``: options the task does
    not have, refused with one line."""
    path, rounds, max_tokens = check_options(records, rounds, max_tokens, unknown)
    samples, n_nei = load_samples(path)
    if n_nei:
        print(f"{TASK_NAME}: {nei_exclusion_note(n_nei, str(path))}", file=sys.stderr)
    location = str(path.resolve())
    return Task(
        dataset=MemoryDataset(samples, name=path.stem, location=location),
        solver=fae_ablation(rounds),
        scorer=fae_scorer(rounds),
        config=GenerateConfig(temperature=0.0, max_tokens=max_tokens),
        epochs=1,
        metadata={
            "records": location,
            "records_sha256": sha256_file(path),
            "rounds": rounds,
            "max_tokens": max_tokens,
            "n_excluded_nei": n_nei,
            "prompt_format_version": PROMPT_FORMAT_VERSION,
        },
    )


# ---------------------------------------------------------------------------
# the solver
# ---------------------------------------------------------------------------


def truncated_of(stop_reason: str | None) -> bool | None:
    """Whether the answer hit the token cap: Inspect's ``max_tokens`` stop; None when the provider did not say."""
    if stop_reason == "max_tokens":
        return True
    if stop_reason in ("stop", "content_filter", "tool_calls"):
        return False
    return None


def describe_error(exc: BaseException) -> str:
    """``Type: message`` of the error behind ``exc``: the last attempt's error of a retry wrapper
    (tenacity's ``RetryError`` says only ``RetryError[<Future ...>]``)."""
    for _ in range(5):
        attempt = getattr(exc, "last_attempt", None)
        inner = attempt.exception() if attempt is not None and hasattr(attempt, "exception") else None
        if not isinstance(inner, BaseException):
            break
        exc = inner
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def sample_record(state: TaskState) -> ClaimRecord:
    rec = (state.metadata or {}).get(RECORD_KEY)
    if rec is None:
        raise RoundError(f"sample {state.sample_id!r} has no {RECORD_KEY!r} in its metadata: "
                         f"the fae solver runs on samples of {TASK_NAME} only")
    return ClaimRecord.from_dict(rec)


@solver
def fae_ablation(rounds: int = 4):
    """Rounds 0..R of one claim: ask, parse, drop the cited lines, ask again (SPEC §6)."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        record = sample_record(state)
        done: list[dict] = []
        state.store.set(STORE_KEY, [])
        while (pool := advance(done, record.pool_ids, rounds)) is not None:
            r = len(done)
            state.messages = chat_messages(render_evidence_prompt(record, pool))
            try:
                state = await generate(state)
            except Exception as exc:  # a provider error after retries, a limit: the claim is incomplete
                # the cause is in the message; its stack (the provider's internals) would bury it
                raise RoundError(f"claim {record.id!r}: round {r} of rounds 0..{rounds} did not complete: "
                                 f"{describe_error(exc)}") from None
            output = state.output
            if output.error:
                raise RoundError(f"claim {record.id!r}: round {r} of rounds 0..{rounds} did not complete: "
                                 f"the model returned an error: {output.error}")
            stop = output.stop_reason if output.choices else None
            done.append(make_round(r, pool, output.completion, truncated_of(stop)))
            state.store.set(STORE_KEY, list(done))
        state.store.set(STORE_KEY, list(done))
        return state

    return solve


# ---------------------------------------------------------------------------
# the scorer and its metrics
# ---------------------------------------------------------------------------


def round_table(claim: dict) -> str:
    """A Markdown table of the claim's rounds: why its verdict was kept or dropped (the score's explanation)."""
    gold = {i for g in claim["gold_groups"] for i in g}
    acc = round_accuracy([claim])
    lines = [f"gold {claim['gold_label']}, gold ids {sorted(gold)}", "",
             "| round | pool | answer | label | cited | hallucinated | correct | note |",
             "|---|---|---|---|---|---|---|---|"]
    for rnd, ok in zip(claim["rounds"], acc):
        label = rnd["label"] if rnd["valid"] else "invalid"
        note = "reused (pool unchanged)" if rnd["reused"] else (rnd.get("error") or "")
        if rnd.get("truncated"):
            note = (note + "; " if note else "") + "cut off at max_tokens"
        lines.append(f"| {rnd['round']} | {rnd['pool_ids']} | {table_text(rnd['raw_output'], 80)} | {label} | "
                     f"{rnd['cited']} | {rnd['hallucinated']} | {'yes' if ok else 'no'} | {table_text(note)} |")
    return "\n".join(lines)


def table_text(text: str, limit: int | None = None) -> str:
    """``text`` as one Markdown table cell: one line, no cell separator or code marks, at most ``limit`` characters."""
    text = " ".join(str(text).split()).replace("|", "/").replace("`", "'")
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


def complete_claim(state: TaskState, rounds: int) -> dict | None:
    """The claims.jsonl entry of a sample whose rounds 0..R all completed; None otherwise."""
    done = state.store.get(STORE_KEY)
    if not isinstance(done, list) or len(done) != rounds + 1:
        return None
    return claim_entry(sample_record(state), list(done))


@metric
def fae_metrics():
    """Acc, Strict, FEVER (round 0) and IS, ER, IO over the scored claims, by :func:`compute_metrics`.

    Fractions in [0, 1] as in metrics.json; a value that is undefined (IS/ER/IO when a_0 = 0 or
    R = 0) is left out rather than shown as a number.
    """

    def compute(scores: list[SampleScore]) -> dict[str, float | None]:
        claims = [s.score.metadata[CLAIM_KEY] for s in scores
                  if s.score.metadata and CLAIM_KEY in s.score.metadata]
        if not claims:
            return dict.fromkeys(METRIC_NAMES)
        m = compute_metrics(claims)
        return {name: m[key] for name, key in METRIC_NAMES.items()}

    return compute


@scorer(metrics=[fae_metrics()])
def fae_scorer(rounds: int = 4):
    """Per claim: round-0 correctness and Strict, whether each round still had the gold label, and the
    rounds themselves (metadata ``fae_claim``); a claim without all rounds 0..R scores NaN, which
    Inspect leaves out of every metric (the solver already ends such a sample in error)."""

    async def score(state: TaskState, target: Target) -> Score:
        claim = complete_claim(state, rounds)
        if claim is None:
            return Score(value=math.nan, explanation="incomplete: not every round completed; not scored")
        per_round = round_accuracy([claim])
        value: dict[str, float] = {"strict": float(strict_accuracy([claim]) or 0.0)}
        value.update({f"r{r}": float(a or 0.0) for r, a in enumerate(per_round)})
        r0 = claim["rounds"][0]
        return Score(value=value, answer=r0["label"] if r0["valid"] else "invalid",
                     explanation=round_table(claim), metadata={CLAIM_KEY: claim})

    return score
