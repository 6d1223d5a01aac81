"""FAE as an Inspect AI task: samples, the ablation solver, the scorer and its metrics (SPEC §6).

Everything FAE-specific is the project's own code, called from Inspect's hooks:

- the samples are our records (SPEC §2, :func:`data_prep.records.load_records`), NEI-gold ones
  left out and counted as ``fae run`` does (:func:`fae.ablation.population.fae_claims`);
- the solver asks every question ``fae run`` asks about the claim, stepping with
  :class:`fae.ablation.engine.ClaimSchedule` (the one schedule): round 0 on the full pool, each
  later round on the pool minus what the previous answer cited, and with the task's arms
  (:class:`fae.ablation.engine.Arms`: ``control``, ``control_seed``, ``gold_only``, ``line_ids``)
  the control pool of every round r >= 1 and the gold-only pool; the prompt is
  :func:`data_prep.prompts.render_evidence_prompt`, the answer goes through the strict parser
  (:func:`fae.ablation.engine.make_round`), and a question whose pool was already answered is
  copied with ``reused: true`` exactly as ``fae run`` copies it;
- the scorer takes the claims.jsonl entry (:meth:`ClaimSchedule.entry`) and the metric computes
  Acc, Strict, FEVER, IS, ER, IO and the control / gold-only metrics with
  :func:`fae.ablation.metrics.compute_metrics`.

Answers are greedy whatever the provider: a provider that would sample (Inspect's ``hf`` provider
unless ``-M do_sample=false``, or a ``--temperature`` above 0) is refused with one line saying what to
pass, before anything is asked where the model is known when the task is made (``inspect eval``), else
at the sample's first question. Each sample's store keeps the dtype the provider ran the weights in
(:data:`DTYPE_KEY`: the loaded torch model's for ``hf``, ``server`` for a provider whose weights are
elsewhere), which ``fae from-inspect`` writes into config.json's ``decoding`` as ``fae run`` does, so
``fae compare`` can refuse two runs made in different dtypes.

A question whose generate fails (a provider error after Inspect's retries, a limit reached) ends
the sample with an error that names the claim and the question: Inspect does not score an errored
sample, so a claim whose questions were not all answered never enters the metrics. The partial
entry (the rounds, control and gold-only answers that did complete) stays in the sample's store
(:data:`STORE_KEY`), visible in ``inspect view``.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from inspect_ai import Task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.model import ChatMessageSystem, ChatMessageUser, GenerateConfig, get_model
from inspect_ai.scorer import SampleScore, Score, Target, metric, scorer
from inspect_ai.solver import Generate, TaskState, solver

from real_fae_core.errors import UserError
from real_fae_core.hashing import sha256_file
from data_prep.prompts import PROMPT_FORMAT_VERSION, render_evidence_prompt
from data_prep.records import ClaimRecord, load_records_or_fail
from fae.ablation.engine import ABLATION_ONLY, ARM_FIELDS, DEFAULT_ARMS, ArmError, Arms, ClaimSchedule, Request
from fae.backends import ANSWER_MAX_NEW_TOKENS, Generation
from fae.ablation.metrics import (compute_metrics, nei_exclusion_note, round_accuracy, round_label, same_label,
                                  strict_accuracy)
from fae.ablation.population import fae_claims

TASK_NAME = "real_fae/fae"
# Where a sample keeps its partial claims.jsonl entry: the rounds, control and gold-only answers
# completed so far (the sample's store, saved in the log even when the sample errs)
STORE_KEY = "real_fae:claim"
# Also read: a store that holds the completed rounds as a list under this key (logs written without STORE_KEY)
OLD_STORE_KEY = "real_fae:rounds"
# Where a sample keeps the dtype its model provider ran the weights in (config.json's decoding.dtype)
DTYPE_KEY = "real_fae:dtype"
# ... for a provider whose weights are not in this process (an API, a server): their dtype is the server's
SERVER_DTYPE = "server"
# Sample metadata: the record itself, so the solver needs nothing but the sample
RECORD_KEY = "record"
# Score metadata: the claims.jsonl entry of the claim (SPEC §6, docs/fae.md)
CLAIM_KEY = "fae_claim"
# fae run's default answer length cap
DEFAULT_MAX_TOKENS = ANSWER_MAX_NEW_TOKENS
# The metrics the task reports, as Inspect names them, and the metrics.json key of each
METRIC_NAMES = {"accuracy": "label_accuracy", "strict": "strict_accuracy", "fever": "fever_score",
                "IS": "IS", "ER": "ER", "IO": "IO"}
# ... and of the control arm and the gold-only pool: (metrics.json block, key in it)
ARM_METRIC_NAMES = {"IS_ctrl": ("control", "IS_ctrl"), "IS_minus_IS_ctrl": ("control", "IS_minus_IS_ctrl"),
                    "gold_only_accuracy": ("gold_only", "label_accuracy"),
                    "gold_only_nei": ("gold_only", "nei_answer_rate"),
                    "cited_only_accuracy": ("cited_only", "label_accuracy"),
                    "cited_only_nei": ("cited_only", "nei_answer_rate"),
                    "sweep_accuracy": ("size_sweep", "sweep_accuracy"),
                    "sweep_lowest_accuracy": ("size_sweep", "min_accuracy")}
# The options beside records/rounds/max_tokens: fae run's arms (fae.ablation.engine.Arms), its defaults
ARM_OPTIONS = {name: getattr(DEFAULT_ARMS, name) for name in ARM_FIELDS}
TASK_OPTIONS = ("records", "rounds", "max_tokens", *ARM_OPTIONS)


class RoundError(RuntimeError):
    """A round of a claim did not complete: the sample ends in error and is not scored."""


# ---------------------------------------------------------------------------
# samples
# ---------------------------------------------------------------------------


def chat_messages(messages: Sequence[dict[str, str]]) -> list[ChatMessageSystem | ChatMessageUser]:
    """Our rendered prompt (system + user dicts) as Inspect chat messages, text unchanged."""
    kinds = {"system": ChatMessageSystem, "user": ChatMessageUser}
    return [kinds[m["role"]](content=m["content"]) for m in messages]


def record_sample(record: ClaimRecord, line_ids: str = DEFAULT_ARMS.line_ids) -> Sample:
    """One record as a sample: input = the round-0 prompt, target = the gold label, the record in metadata."""
    return Sample(
        id=record.id,
        input=chat_messages(render_evidence_prompt(record, None, line_ids)),
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


def check_arms(**options: Any) -> Arms:
    """The arm options (:data:`ARM_OPTIONS`; an option not given takes its default), checked by ``fae run``'s
    own check (:class:`Arms`); a bad value is one line naming the task option."""
    try:
        return Arms(**options)
    except ArmError as exc:
        if exc.choice:
            raise UserError(f"task option {exc.name}: {exc.value!r}; {exc.problem}") from None
        raise UserError(f"task option {exc.name}: {exc.problem} (got {exc.value!r})") from None


def load_samples(path: Path, line_ids: str = DEFAULT_ARMS.line_ids) -> tuple[list[Sample], int]:
    """(samples of the SUPPORT/REFUTE records, number of NEI-gold records left out); bad records: UserError."""
    records = load_records_or_fail(path)
    kept, n_nei = fae_claims(records, source=str(path))
    if not kept:
        raise UserError(f"{path}: no records")
    return [record_sample(r, line_ids) for r in kept], n_nei


def sampling_problem(model: Any) -> str | None:
    """Why ``model`` would not answer greedily, with what to pass instead; None when it would.

    Inspect's ``hf`` provider samples unless its model args say ``do_sample=false`` (the task's
    temperature 0 then makes transformers refuse the call); a ``--temperature`` above 0 on the command
    line overrides the task's 0 for every provider. FAE's answers are greedy (``fae run``'s are), so
    either would make numbers no ``fae run`` makes."""
    if model is None:
        return None
    if getattr(getattr(model, "api", None), "do_sample", False):
        return "the hf provider samples unless told not to: pass -M do_sample=false (FAE's answers are greedy)"
    temperature = getattr(getattr(model, "config", None), "temperature", None)
    if temperature not in (None, 0):
        return f"--temperature {temperature}: FAE's answers are greedy (the task sets temperature 0); drop it"
    return None


def provider_dtype(model: Any) -> str:
    """The dtype the provider runs the weights in: the loaded torch model's (``float32``, ``bfloat16``:
    Inspect's ``hf`` provider), else :data:`SERVER_DTYPE` (an API or server keeps its weights elsewhere)."""
    weights = getattr(getattr(model, "api", None), "model", None)
    dtype = getattr(weights, "dtype", None)
    if type(dtype).__module__ == "torch" and type(dtype).__name__ == "dtype":
        return str(dtype).removeprefix("torch.")
    return SERVER_DTYPE


def fae_task(records: str | None, rounds: int = 4, max_tokens: int = DEFAULT_MAX_TOKENS,
             unknown: dict[str, Any] | None = None, model: Any = None, **arm_options: Any) -> Task:
    """The FAE task over a records file: R = ``rounds`` ablation rounds after round 0, greedy answers
    of at most ``max_tokens`` tokens, and ``fae run``'s arms (:data:`ARM_OPTIONS`: ``control``,
    ``control_seed``, ``gold_only``, ``line_ids``), all with the defaults of ``fae run``. An arm option
    may come as a keyword or in ``unknown`` (a task function that takes ``**unknown``); the rest of
    ``unknown``, options the task does not have, is refused with one line. ``model``: the model under
    evaluation when it is known already (``inspect eval`` loads it first): one that would sample is refused
    here, before anything is asked (:func:`sampling_problem`)."""
    problem = sampling_problem(model)
    if problem:
        raise UserError(problem)
    unknown = dict(unknown or {})
    for name in ARM_OPTIONS:
        if name in unknown:
            arm_options[name] = unknown.pop(name)
    path, rounds, max_tokens = check_options(records, rounds, max_tokens, {**unknown, **{
        k: v for k, v in arm_options.items() if k not in ARM_OPTIONS}})
    arms = check_arms(**arm_options)
    samples, n_nei = load_samples(path, arms.line_ids)
    if n_nei:
        print(f"{TASK_NAME}: {nei_exclusion_note(n_nei, str(path))}", file=sys.stderr)
    location = str(path.resolve())
    return Task(
        dataset=MemoryDataset(samples, name=path.stem, location=location),
        solver=fae_ablation(rounds, **arms_args(arms)),
        scorer=fae_scorer(rounds, **arms_args(arms)),
        config=GenerateConfig(temperature=0.0, max_tokens=max_tokens),
        epochs=1,
        metadata={
            "records": location,
            "records_sha256": sha256_file(path),
            "rounds": rounds,
            "max_tokens": max_tokens,
            "n_excluded_nei": n_nei,
            "prompt_format_version": PROMPT_FORMAT_VERSION,
            **arms.record(),  # the arms as config.json records them (fae from-inspect)
        },
    )


def arms_args(arms: Arms) -> dict[str, Any]:
    """The solver's and scorer's arm arguments (plain values, as Inspect records them in the log)."""
    return {name: getattr(arms, name) for name in ARM_FIELDS}


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
    """The claim record an Inspect sample carries in its metadata; a sample of another task is a RoundError."""
    rec = (state.metadata or {}).get(RECORD_KEY)
    if rec is None:
        raise RoundError(f"sample {state.sample_id!r} has no {RECORD_KEY!r} in its metadata: "
                         f"the fae solver runs on samples of {TASK_NAME} only")
    return ClaimRecord.from_dict(rec)


def finish_reason_of(stop_reason: str | None) -> str | None:
    """Inspect's stop reason as ``fae run``'s finish reason (``length``: cut off at the cap; None: unknown)."""
    truncated = truncated_of(stop_reason)
    return None if truncated is None else ("length" if truncated else "stop")


def question_name(req: Request, rounds: int) -> str:
    """How an error names the question that failed."""
    if req.arm == "rounds":
        return f"round {req.r} of rounds 0..{rounds}"
    if req.arm == "control":
        return f"the control of round {req.r}"
    if req.arm == "size_sweep":
        return f"the size sweep's pool at k = {req.r}"
    return {"gold_only": "the gold-only question", "cited_only": "the cited-only question"}[req.arm]


@solver
def fae_ablation(rounds: int = 4, control: str = DEFAULT_ARMS.control, control_seed: int = DEFAULT_ARMS.control_seed,
                 gold_only: bool = DEFAULT_ARMS.gold_only, cited_only: bool = DEFAULT_ARMS.cited_only,
                 size_sweep: bool = DEFAULT_ARMS.size_sweep, sweep_seed: int = DEFAULT_ARMS.sweep_seed,
                 line_ids: str = DEFAULT_ARMS.line_ids):
    """Every question ``fae run`` asks about one claim (SPEC §6): rounds 0..R (ask, parse, drop the cited
    lines, ask again) and, with the arms, each round's control and the gold-only, cited-only and size-sweep
    pools."""
    arms = Arms(control=control, control_seed=control_seed, gold_only=gold_only, cited_only=cited_only,
                size_sweep=size_sweep, sweep_seed=sweep_seed, line_ids=line_ids)

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        record = sample_record(state)
        model = get_model()  # the model under evaluation
        problem = sampling_problem(model)
        if problem:
            raise RoundError(f"claim {record.id!r}: not asked: {problem}")
        state.store.set(DTYPE_KEY, provider_dtype(model))
        schedule = ClaimSchedule(record, rounds, arms)
        state.store.set(STORE_KEY, schedule.entry())
        while reqs := schedule.next_requests():
            for req in reqs:
                state.messages = chat_messages(render_evidence_prompt(record, req.pool, arms.line_ids))
                what = question_name(req, rounds)
                try:
                    state = await generate(state)
                except Exception as exc:  # a provider error after retries, a limit: the claim is incomplete
                    # the cause is in the message; its stack (the provider's internals) would bury it
                    raise RoundError(f"claim {record.id!r}: {what} did not complete: "
                                     f"{describe_error(exc)}") from None
                output = state.output
                if output.error:
                    raise RoundError(f"claim {record.id!r}: {what} did not complete: "
                                     f"the model returned an error: {output.error}")
                stop = output.stop_reason if output.choices else None
                schedule.answer(req, Generation(output.completion, finish_reason_of(stop)))
                state.store.set(STORE_KEY, schedule.entry())
        state.store.set(STORE_KEY, schedule.entry())
        return state

    return solve


# ---------------------------------------------------------------------------
# the scorer and its metrics
# ---------------------------------------------------------------------------


def round_table(claim: dict) -> str:
    """A Markdown table of the claim's rounds: why its verdict was kept or dropped (the score's explanation),
    and one of the control and gold-only questions when the task asked them."""
    gold = {i for g in claim["gold_groups"] for i in g}
    acc = round_accuracy([claim])
    lines = [f"gold {claim['gold_label']}, gold ids {sorted(gold)}", "",
             "| round | pool | answer | label | cited | hallucinated | correct | note |",
             "|---|---|---|---|---|---|---|---|"]
    for rnd, ok in zip(claim["rounds"], acc):
        lines.append(f"| {rnd['round']} | {rnd['pool_ids']} | {table_text(rnd['raw_output'], 80)} | "
                     f"{round_cells(rnd, ok)} |")
    arms = [(f"control {c['round']}", c) for c in claim.get("control") or [] if c]
    if claim.get("gold_only"):
        arms.append(("gold-only", claim["gold_only"]))
    if claim.get("cited_only"):
        arms.append(("cited-only", claim["cited_only"]))
    sweep = claim.get("size_sweep") or {}
    if "skipped" in sweep:
        arms.append(("size sweep", sweep))
    arms += [(f"sweep k = {rd['k']}", rd) for rd in sweep.get("rounds") or [] if rd]
    if arms:
        lines += ["", "Beside the ablation: the control of round r (the full pool minus as many lines as the "
                  "ablation removed, never cited nor gold), the gold-only pool, the lines round 0 cited alone, "
                  "and the gold lines plus k others (the size sweep).", "",
                  "| question | pool | answer | label | cited | hallucinated | correct | note |",
                  "|---|---|---|---|---|---|---|---|"]
        for name, rnd in arms:
            if "skipped" in rnd:
                lines.append(f"| {name} | | | | | | | {table_text('not asked: ' + rnd['skipped'])} |")
                continue
            ok = same_label(round_label(rnd), claim["gold_label"])
            lines.append(f"| {name} | {rnd['pool_ids']} | {table_text(rnd['raw_output'], 80)} | "
                         f"{round_cells(rnd, ok, 'reused (same pool answered)')} |")
    return "\n".join(lines)


def round_cells(rnd: dict, ok: bool, reused: str = "reused (pool unchanged)") -> str:
    """label | cited | hallucinated | correct | note of one answered question."""
    label = rnd["label"] if rnd["valid"] else "invalid"
    note = reused if rnd["reused"] else (rnd.get("error") or "")
    if rnd.get("truncated"):
        note = (note + "; " if note else "") + "cut off at max_tokens"
    return f"{label} | {rnd['cited']} | {rnd['hallucinated']} | {'yes' if ok else 'no'} | {table_text(note)}"


def table_text(text: str, limit: int | None = None) -> str:
    """``text`` as one Markdown table cell: one line, no cell separator or code marks, at most ``limit`` characters."""
    text = " ".join(str(text).split()).replace("|", "/").replace("`", "'")
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


def stored_rounds(store: Any) -> list:
    """The rounds a sample's store holds (its partial entry's, or the list under ``OLD_STORE_KEY``)."""
    store = store or {}
    entry = store.get(STORE_KEY)
    if isinstance(entry, dict):
        return list(entry.get("rounds") or [])
    old = store.get(OLD_STORE_KEY)
    return list(old) if isinstance(old, list) else []


def incomplete_reason(entry: Any, rounds: int, arms: Arms) -> str | None:
    """Why ``entry`` is not a finished claims.jsonl entry under ``rounds`` and ``arms``; None when it is:
    every round 0..R answered, and with the arms every control of rounds 1..R, the gold-only and cited-only
    questions and every pool of the size sweep."""
    if not isinstance(entry, dict):
        return "no entry"
    n = len(entry.get("rounds") or [])
    if n != rounds + 1:
        return f"{n} rounds, expected {rounds + 1}"
    if arms.control != "none":
        control = entry.get("control")
        if not isinstance(control, list) or len(control) != rounds or any(c is None for c in control):
            done = sum(c is not None for c in control) if isinstance(control, list) else 0
            return f"{done} of {rounds} controls"
    elif "control" in entry:
        return "a control the task did not ask"
    if arms.gold_only:
        if entry.get("gold_only") is None:
            return "no gold-only answer"
    elif "gold_only" in entry:
        return "a gold-only answer the task did not ask"
    if arms.cited_only:
        if entry.get("cited_only") is None:
            return "no cited-only answer"
    elif "cited_only" in entry:
        return "a cited-only answer the task did not ask"
    if arms.size_sweep:
        sweep = entry.get("size_sweep")
        if not isinstance(sweep, dict) or ("skipped" not in sweep and (
                not isinstance(sweep.get("rounds"), list) or any(rd is None for rd in sweep["rounds"]))):
            return "the size sweep is not finished"
    elif "size_sweep" in entry:
        return "a size sweep the task did not ask"
    return None


def complete_claim(state: TaskState, rounds: int, arms: Arms | None = None) -> dict | None:
    """The claims.jsonl entry of a sample whose every question (rounds 0..R and, with ``arms``, the controls
    and the gold-only pool) was answered; None otherwise. ``arms``: the ablation alone when not given."""
    entry = state.store.get(STORE_KEY)
    if incomplete_reason(entry, rounds, arms or ABLATION_ONLY) is not None:
        return None
    return dict(entry)


def task_metrics(m: dict) -> dict[str, float | None]:
    """The task's metrics (Inspect's names) from :func:`compute_metrics`' output; None where undefined."""
    out = {name: m[key] for name, key in METRIC_NAMES.items()}
    for name, (block, key) in ARM_METRIC_NAMES.items():
        out[name] = (m.get(block) or {}).get(key)
    return out


@metric
def fae_metrics():
    """Acc, Strict, FEVER (round 0), IS, ER, IO and, when the task asked them, IS_ctrl, IS - IS_ctrl
    (the control arm) and the gold-only pool's accuracy and NOT_ENOUGH_INFO share, over the scored
    claims, by :func:`compute_metrics`.

    Fractions in [0, 1] as in metrics.json; a value that is undefined (IS/ER/IO when a_0 = 0 or
    R = 0, a control metric without the control) is left out rather than shown as a number.
    """

    def compute(scores: list[SampleScore]) -> dict[str, float | None]:
        claims = [s.score.metadata[CLAIM_KEY] for s in scores
                  if s.score.metadata and CLAIM_KEY in s.score.metadata]
        if not claims:
            return dict.fromkeys([*METRIC_NAMES, *ARM_METRIC_NAMES])
        return task_metrics(compute_metrics(claims))

    return compute


@scorer(metrics=[fae_metrics()])
def fae_scorer(rounds: int = 4, control: str = DEFAULT_ARMS.control, control_seed: int = DEFAULT_ARMS.control_seed,
               gold_only: bool = DEFAULT_ARMS.gold_only, cited_only: bool = DEFAULT_ARMS.cited_only,
               size_sweep: bool = DEFAULT_ARMS.size_sweep, sweep_seed: int = DEFAULT_ARMS.sweep_seed,
               line_ids: str = DEFAULT_ARMS.line_ids):
    """Per claim: round-0 correctness and Strict, whether each round still had the gold label, and the
    claims.jsonl entry (metadata ``fae_claim``: rounds, and control / gold-only as the arms ask); a claim
    with a question unanswered scores NaN, which Inspect leaves out of every metric (the solver already
    ends such a sample in error)."""
    arms = Arms(control=control, control_seed=control_seed, gold_only=gold_only, cited_only=cited_only,
                size_sweep=size_sweep, sweep_seed=sweep_seed, line_ids=line_ids)

    async def score(state: TaskState, target: Target) -> Score:
        claim = complete_claim(state, rounds, arms)
        if claim is None:
            return Score(value=math.nan, explanation="incomplete: not every question was answered; not scored")
        per_round = round_accuracy([claim])
        value: dict[str, float] = {"strict": float(strict_accuracy([claim]) or 0.0)}
        value.update({f"r{r}": float(a or 0.0) for r, a in enumerate(per_round)})
        r0 = claim["rounds"][0]
        return Score(value=value, answer=r0["label"] if r0["valid"] else "invalid",
                     explanation=round_table(claim), metadata={CLAIM_KEY: claim})

    return score
