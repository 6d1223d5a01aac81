"""On-policy evidence ablation (SPEC §4, ``trainer: grpo``): TRL's ``GRPOTrainer`` with FAE in the reward.

REAL's pairs remove the evidence an annotator chose before training; FAE removes what the verifier
itself cites. Here the verifier is trained on its own ablations: for each prompt (a row of a pairs
dataset: a record shown with some pool, and the answer that pool calls for) ``num_generations``
answers ``(l, E)`` are sampled, and each is scored by named, weighted terms (:data:`REWARD_TERMS`),
each one TRL reward function, so TRL logs ``rewards/<term>/mean`` beside the loss:

``format``       the answer parses (SPEC §3) and cites only lines of the pool shown;
``label``        ``l`` is the row's target label;
``necessity``    the current policy answers NOT_ENOUGH_INFO on the pool without ``E``;
``sufficiency``  it answers ``l`` on ``E`` alone;
``control``      it still answers ``l`` when as many lines neither cited nor in the target evidence
                 are removed instead, drawn as FAE's matched control draws them (the same gap kind),
                 so an answer is not rewarded for a verifier that grows unsure on any shorter pool
                 (where the pool has too few such lines no control exists: the term repeats necessity);
``precision``    the share of ``E`` inside the row's target evidence (enhanced or gold).

The evidence terms (the last four) are earned only by a right answer: citing well never pays for a
wrong label. A right NOT_ENOUGH_INFO earns them with an empty ``E`` (nothing to cite); a right verdict
with no citation earns none. "The current policy answers" is its label with the highest teacher-forced
probability right after the answer prefix (``{"label": "``, :mod:`fae.backends.label_probs`), i.e. the
label greedy decoding starts, read without generating: one forward per distinct pool per step
(:class:`PolicyJudge`, batched and cached), never an answer's sampled text.
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol, Sequence

from real_fae_core.errors import UserError
from real_fae_core.hashing import derived_seed
from real_fae_core.labels import LABELS
from data_prep.prompts import DEFAULT_LINE_IDS, ShownPool, encode_chat, number_lines, parse_shown_answer, \
    render_evidence_prompt
from data_prep.records import ClaimRecord
from fae.ablation.engine import matched_control_removal
from fae.backends.label_probs import teacher_forced_label_probs

logger = logging.getLogger("real.train")

NEI = "NOT_ENOUGH_INFO"
REWARD_TERMS = ("format", "label", "necessity", "sufficiency", "control", "precision")
EVIDENCE_TERMS = REWARD_TERMS[2:]
# A right, minimal, necessary and sufficient citation scores 1 on every term: 5.0 in all. Format and
# precision weigh half: a parsable answer is a floor, and the target evidence (an annotator's choice)
# should not outvote what the verifier's own ablations show.
DEFAULT_REWARD_WEIGHTS = (0.5, 1.0, 1.0, 1.0, 1.0, 0.5)
# The columns of a pairs dataset a prompt needs (`real-data pairs` writes them on every row).
PROMPT_COLUMNS = ("prompt", "record_id", "label", "evidence", "pool_ids")


@dataclass(frozen=True)
class Target:
    """One prompt: the record, the pool it shows (record ids, reading order) and the answer it calls for."""

    record: ClaimRecord
    pool: tuple[int, ...]
    label: str
    evidence: tuple[int, ...]  # record ids; empty for NOT_ENOUGH_INFO


class PoolJudge(Protocol):
    """What the reward asks of a verifier: its label on each (record, pool)."""

    def labels(self, asks: Sequence[tuple[ClaimRecord, tuple[int, ...]]]) -> list[str]:
        """The verifier's label on each (record, pool its record ids show), in the order asked."""
        ...


@dataclass
class Scored:
    """The terms of a batch of answers (one list per term, answer order) and what they cost."""

    terms: dict[str, list[float]]
    judge_asks: int = 0  # pools the terms needed (before dedup)
    uncontrolled: int = 0  # answers too long for their pool to draw a control: the control repeated necessity


def completion_text(completion) -> str:
    """A TRL completion as text: a string, or a conversational list of messages (the assistant's content)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return ""


def control_removal(target: Target, cited: Sequence[int], line_ids: str, seed: int) -> list[int] | None:
    """The lines the control removes for an answer citing ``cited``: as many as it cites, drawn among the
    lines neither cited nor in the target evidence as FAE's matched control draws them (the same gap kind
    where one exists); None when the pool has too few such lines (the citation cannot be controlled)."""
    full = list(target.pool)
    ablated = [i for i in full if i not in set(cited)]
    rng = random.Random(derived_seed(seed, target.record.id, "onpolicy-control", tuple(sorted(cited))))
    removed, _, _, _ = matched_control_removal(full, ablated, set(cited) | set(target.evidence), rng, line_ids)
    return removed


def score_answers(targets: Sequence[Target], texts: Sequence[str], judge: PoolJudge, *,
                  line_ids: str = DEFAULT_LINE_IDS, control_seed: int = 0) -> Scored:
    """Every term of :data:`REWARD_TERMS` for each answer ``texts[i]`` to the prompt ``targets[i]``.

    The pools the evidence terms need are collected first and asked of ``judge`` in one call, so a
    pool that several answers need (G answers of one prompt often cite the same lines) costs one
    forward.
    """
    n = len(texts)
    terms = {t: [0.0] * n for t in REWARD_TERMS}
    asks: list[tuple[ClaimRecord, tuple[int, ...]]] = []
    pending: list[tuple[int, str, int]] = []  # (answer, term, index into asks)
    uncontrolled: list[int] = []  # answers whose control could not be drawn
    for i, (target, text) in enumerate(zip(targets, texts)):
        shown: ShownPool = number_lines(target.pool, line_ids)
        parsed, _ = parse_shown_answer(text, shown)
        if not parsed.valid or parsed.hallucinated:
            continue  # every term 0: an unreadable answer, or one citing a line the pool does not show
        terms["format"][i] = 1.0
        label, cited = parsed.label, [c for c in parsed.cited if c is not None]
        if label != target.label:
            continue
        terms["label"][i] = 1.0
        if label == NEI:
            if not cited:  # a right abstention cites nothing: full evidence credit
                for t in EVIDENCE_TERMS:
                    terms[t][i] = 1.0
            continue
        if not cited:
            continue
        keep = set(cited)
        terms["precision"][i] = len(keep & set(target.evidence)) / len(keep)
        without = tuple(j for j in target.pool if j not in keep)
        alone = tuple(j for j in target.pool if j in keep)
        pending.append((i, "necessity", len(asks)))
        asks.append((target.record, without))
        pending.append((i, "sufficiency", len(asks)))
        asks.append((target.record, alone))
        removed = control_removal(target, cited, line_ids, control_seed)
        if removed is None:
            # Too few other lines to remove as many: no control can challenge the necessity result, so the
            # term repeats it (marked in ``uncontrolled``). A 0 here would pay a verifier to cite less of a
            # proof in a short pool, where only a shorter citation leaves room for a control.
            uncontrolled.append(i)
            pending.append((i, "control", len(asks)))
            asks.append((target.record, without))
        else:
            pending.append((i, "control", len(asks)))
            asks.append((target.record, tuple(j for j in target.pool if j not in set(removed))))
    answers = judge.labels(asks) if asks else []
    skip = set(uncontrolled)
    for i, term, k in pending:
        want = NEI if term == "necessity" or (term == "control" and i in skip) else targets[i].label
        terms[term][i] = 1.0 if answers[k] == want else 0.0
    return Scored(terms, judge_asks=len(asks), uncontrolled=len(skip))


def total_reward(terms: Mapping[str, Sequence[float]], weights: Sequence[float] = DEFAULT_REWARD_WEIGHTS
                 ) -> list[float]:
    """The weighted sum TRL forms from the terms (``reward_weights``), for tests and reports."""
    n = len(next(iter(terms.values())))
    return [sum(w * terms[t][i] for t, w in zip(REWARD_TERMS, weights)) for i in range(n)]


class PolicyJudge:
    """The current policy's label on pools: the argmax of its teacher-forced label probabilities.

    Bound to the model being trained (:meth:`bind`); asked in eval mode (no dropout) without gradients,
    in batches of ``batch_size`` prompts; a pool already judged at this optimizer step is answered from
    the cache (the G answers of a prompt, and the terms of one answer, share pools). ``calls`` counts
    forwards, ``asked`` the pools asked: their ratio is the cache's saving (logged as ``onpolicy/*``).
    """

    def __init__(self, tokenizer, line_ids: str = DEFAULT_LINE_IDS, batch_size: int = 32):
        self.tokenizer = tokenizer
        self.line_ids = line_ids
        self.batch_size = max(1, int(batch_size))
        self.model = None
        self.step: int | None = None
        self._cache: dict[tuple, str] = {}
        self.calls = 0
        self.asked = 0
        self.pools = 0

    def bind(self, model) -> None:
        """Judge with ``model`` (the one being trained); :meth:`labels` refuses until bound."""
        self.model = model

    def at_step(self, step: int) -> None:
        """The policy changed (a new optimizer step): its earlier judgements no longer hold."""
        if step != self.step:
            self.step = step
            self._cache.clear()

    def labels(self, asks: Sequence[tuple[ClaimRecord, tuple[int, ...]]]) -> list[str]:
        """The policy's label on each (record, pool), in order: the argmax of its label probabilities
        (NOT_ENOUGH_INFO when it has none); the model's train/eval mode is left as found."""
        import torch

        if self.model is None:
            raise RuntimeError("PolicyJudge.bind(model) was not called")
        keys = [(record.id, tuple(pool)) for record, pool in asks]
        self.asked += len(keys)
        todo: dict[tuple, tuple[ClaimRecord, tuple[int, ...]]] = {}
        for key, ask in zip(keys, asks):
            if key not in self._cache and key not in todo:
                todo[key] = ask
        model = self.model
        was_training = model.training
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        items = list(todo.items())
        try:
            model.eval()
            with torch.no_grad():
                for start in range(0, len(items), self.batch_size):
                    chunk = items[start:start + self.batch_size]
                    ids = [encode_chat(self.tokenizer, render_evidence_prompt(rec, pool, self.line_ids))
                           for _, (rec, pool) in chunk]
                    rows = teacher_forced_label_probs(model, self.tokenizer, ids, pad)
                    self.calls += 1
                    for (key, _), (probs, _) in zip(chunk, rows):
                        self._cache[key] = max(LABELS, key=lambda lab: probs[lab]) if probs else NEI
        finally:
            model.train(was_training)
        self.pools += len(items)
        return [self._cache[k] for k in keys]


@dataclass
class OnPolicyReward:
    """The reward: :func:`score_answers` once per batch, served to TRL as one function per term."""

    records: Mapping[str, ClaimRecord]
    judge: PoolJudge
    line_ids: str = DEFAULT_LINE_IDS
    control_seed: int = 0
    _memo: tuple | None = field(default=None, repr=False)

    def targets(self, record_id, label, evidence, pool_ids) -> list[Target]:
        """One :class:`Target` per prompt of the batch (TRL's dataset columns); a record id the records file does
        not hold is a :class:`UserError`."""
        out = []
        for rid, lab, ev, pool in zip(record_id, label, evidence, pool_ids):
            record = self.records.get(rid)
            if record is None:
                raise UserError(f"on-policy training: the pairs name record {rid!r}, which the records file "
                                "(records) does not hold; give the records the pairs were built from")
            out.append(Target(record, tuple(int(i) for i in pool), str(lab), tuple(int(i) for i in ev or ())))
        return out

    def scored(self, completions, record_id, label, evidence, pool_ids, trainer_state=None) -> Scored:
        """Every term's scores of a batch of completions, computed once per batch and step: TRL calls one
        function per term with the same arguments, and each reuses this result."""
        texts = tuple(completion_text(c) for c in completions)
        step = getattr(trainer_state, "global_step", None)
        key = (step, texts, tuple(record_id), tuple(map(tuple, pool_ids)))
        if self._memo is not None and self._memo[0] == key:
            return self._memo[1]
        if hasattr(self.judge, "at_step") and step is not None:
            self.judge.at_step(step)
        result = score_answers(self.targets(record_id, label, evidence, pool_ids), texts, self.judge,
                               line_ids=self.line_ids, control_seed=self.control_seed)
        self._memo = (key, result)
        return result

    def functions(self) -> list[Callable]:
        """One TRL reward function per term, named after it (TRL logs ``rewards/<name>/mean``)."""

        def make(term: str):
            def reward(prompts=None, completions=None, record_id=None, label=None, evidence=None, pool_ids=None,
                       trainer_state=None, log_metric=None, **_):
                result = self.scored(completions, record_id, label, evidence, pool_ids, trainer_state)
                if term == REWARD_TERMS[0] and log_metric is not None and hasattr(self.judge, "calls"):
                    log_metric("onpolicy/judge_pools_asked", float(result.judge_asks))
                    log_metric("onpolicy/judge_forwards_total", float(self.judge.calls))
                    log_metric("onpolicy/uncontrolled_share", result.uncontrolled / max(1, len(result.terms[term])))
                return result.terms[term]

            reward.__name__ = term
            return reward

        return [make(t) for t in REWARD_TERMS]


def check_weights(weights: Sequence[float] | None) -> tuple[float, ...]:
    """The reward weights in :data:`REWARD_TERMS` order (TRL's ``reward_weights``), checked."""
    if weights is None:
        return DEFAULT_REWARD_WEIGHTS
    if len(weights) != len(REWARD_TERMS):
        raise UserError(f"reward_weights: {len(weights)} values for the {len(REWARD_TERMS)} terms "
                        f"{', '.join(REWARD_TERMS)} (in that order)")
    if any(w < 0 for w in weights):
        raise UserError("reward_weights: a term's weight must be >= 0")
    return tuple(float(w) for w in weights)


def pairs_line_ids(dataset_path: str) -> str:
    """The line numbering the pairs were rendered with (their stats.json), so ablated pools render alike."""
    from pathlib import Path

    stats = Path(dataset_path) / "stats.json"
    try:
        return json.loads(stats.read_text(encoding="utf-8")).get("line_ids") or DEFAULT_LINE_IDS
    except (OSError, ValueError, AttributeError):
        return DEFAULT_LINE_IDS


def seeded_sampling_trainer(base):
    """A subclass of TRL's ``GRPOTrainer`` (``base``) whose answers are drawn per prompt, each prompt's
    ``num_generations`` answers from a seed named by (seed, optimizer step, the prompt's tokens, its
    occurrence in the step): what is sampled then depends neither on the batch around a prompt (its padding,
    its row in the sampler's draw) nor on which process generates it, so two DDP processes draw the answers
    one process draws. One ``generate`` call per prompt instead of one per batch: slower on an accelerator,
    which is why it is an option (``seeded_sampling``), off by default."""
    import torch

    class SeededSamplingGRPOTrainer(base):
        def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations,
                                  has_tool_images=False):
            if images is not None or multimodal_fields or getattr(self, "use_vllm", False):
                return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations,
                                                     has_tool_images)
            completions, logprobs, seen = [], [], {}
            start = 0
            while start < len(prompt_ids):
                end = start + 1
                while end < len(prompt_ids) and prompt_ids[end] == prompt_ids[start]:
                    end += 1
                key = tuple(prompt_ids[start])
                seen[key] = seen.get(key, -1) + 1
                seed = derived_seed(self.args.seed, self.state.global_step, key, seen[key])
                devices = [self.accelerator.device] if self.accelerator.device.type == "cuda" else []
                with torch.random.fork_rng(devices=devices):
                    torch.manual_seed(seed)
                    ids, lps = super()._generate_single_turn(prompt_ids[start:end], images, multimodal_fields,
                                                             num_generations, has_tool_images)
                completions += ids
                logprobs = None if lps is None or logprobs is None else logprobs + lps
                start = end
            return completions, logprobs

    return SeededSamplingGRPOTrainer
